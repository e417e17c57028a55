/// An HTTP-level refusal: the status, a stable machine-readable code, a human message and any
/// headers the response must carry (`Allow`, `Upgrade`, `Sec-WebSocket-Version`).
public struct HTTPError: Error, Sendable, CustomStringConvertible {
    public var status: Int
    public var code: String
    public var message: String
    public var headers: [(String, String)]

    public init(status: Int, code: String, message: String, headers: [(String, String)] = []) {
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
    }

    public var description: String { "\(status) \(code): \(message)" }

    /// The complete response: JSON body `{"error":{"code":…,"message":…}}`, `Content-Type`,
    /// `Content-Length` and `Connection: close` (the connection is closed after it is sent).
    public func response() -> [UInt8] {
        let body = "{\"error\":{\"code\":\(HTTPResponse.jsonString(code)),\"message\":\(HTTPResponse.jsonString(message))}}"
        return HTTPResponse.json(status: status, body: body, headers: headers + [("Connection", "close")])
    }

    public static func badRequest(_ message: String) -> HTTPError { HTTPError(status: 400, code: "BAD_REQUEST", message: message) }
    static func headerTooLarge(_ message: String) -> HTTPError { HTTPError(status: 431, code: "HEADER_TOO_LARGE", message: message) }
    static func uriTooLong(_ message: String) -> HTTPError { HTTPError(status: 414, code: "URI_TOO_LONG", message: message) }
    static func versionNotSupported(_ message: String) -> HTTPError {
        HTTPError(status: 505, code: "VERSION_NOT_SUPPORTED", message: message)
    }
    /// Used by the response parser (the client side): the server's answer is not valid HTTP.
    static func badResponse(_ message: String) -> HTTPError { HTTPError(status: 502, code: "BAD_RESPONSE", message: message) }
}
