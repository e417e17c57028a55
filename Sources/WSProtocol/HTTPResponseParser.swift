/// A parsed HTTP/1.x response head (what a WebSocket client reads back).
public struct HTTPResponseHead: Sendable {
    public var status: Int
    public var reason: String
    public var versionMajor: Int
    public var versionMinor: Int
    public var headers: HTTPHeaders

    public init(status: Int, reason: String, versionMajor: Int = 1, versionMinor: Int = 1, headers: HTTPHeaders) {
        self.status = status
        self.reason = reason
        self.versionMajor = versionMajor
        self.versionMinor = versionMinor
        self.headers = headers
    }
}

/// Incremental HTTP/1.x response-head parser, with the same rules as ``HTTPRequestParser``
/// (CRLF only, exact `consumed`, limits). Errors carry status 502 and code `BAD_RESPONSE`
/// (or 431 `HEADER_TOO_LARGE` for the limits): they describe the server, not us.
public struct HTTPResponseParser: Sendable {
    public let limits: HTTPParserLimits
    private var scanner: HeadScanner
    private var status = 0
    private var reason = ""
    private var major = 1
    private var minor = 1

    public init(limits: HTTPParserLimits = HTTPParserLimits()) {
        self.limits = limits
        scanner = HeadScanner(limits: limits, startLineTooLong: .badResponse("status line too long"), isResponse: true)
    }

    public mutating func parse(_ bytes: UnsafeRawBufferPointer) throws(HTTPError) -> HTTPParseResult<HTTPResponseHead> {
        var parsed: (Int, String, Int, Int)? = nil
        let consumed = try scanner.feed(bytes) { (line: UnsafeRawBufferPointer) throws(HTTPError) in
            parsed = try HTTPResponseParser.parseStatusLine(line)
        }
        if let (s, r, ma, mi) = parsed { status = s; reason = r; major = ma; minor = mi }
        guard let consumed else { return .needMoreData }
        let head = HTTPResponseHead(status: status, reason: reason, versionMajor: major, versionMinor: minor,
                                    headers: scanner.takeHeaders())
        return .complete(head, consumed: consumed)
    }

    /// Convenience for `[UInt8]` input.
    public mutating func parse(_ bytes: [UInt8]) throws(HTTPError) -> HTTPParseResult<HTTPResponseHead> {
        try bytes.withUnsafeBytes { raw in Result { () throws(HTTPError) in try self.parse(raw) } }.get()
    }

    /// `HTTP-version SP 3DIGIT SP [reason]` (RFC 9112 section 4; a missing final SP is tolerated).
    static func parseStatusLine(_ line: UnsafeRawBufferPointer) throws(HTTPError) -> (Int, String, Int, Int) {
        let bad = HTTPError.badResponse("malformed status line")
        guard line.count >= 12, line[8] == 0x20 else { throw bad }
        let (major, minor) = try HTTPRequestParser.parseVersion(UnsafeRawBufferPointer(rebasing: line[0..<8]), error: bad)
        guard major == 1 else { throw bad }
        let digits = line[9..<12]
        guard digits.allSatisfy({ (0x30...0x39) ~= $0 }) else { throw bad }
        let status = digits.reduce(0) { $0 * 10 + Int($1 - 0x30) }
        guard status >= 100 else { throw bad }
        var reason = ""
        if line.count > 12 {
            guard line[12] == 0x20 else { throw bad }
            let r = line[13...]
            guard r.allSatisfy({ $0 >= 0x20 && $0 != 0x7F || $0 == 0x09 }) else { throw bad }
            reason = String(decoding: r, as: UTF8.self)
        }
        return (status, reason, major, minor)
    }
}
