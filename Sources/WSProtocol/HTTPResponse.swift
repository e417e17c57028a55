/// Builders for HTTP/1.1 response heads and small responses.
public enum HTTPResponse {
    /// `HTTP/1.1 <status> <reason>`, the headers, and the body. `Content-Length` is added unless the
    /// status forbids a body (1xx, 204, 304) or `headers` already carries one.
    public static func make(status: Int, headers: [(String, String)], body: [UInt8]) -> [UInt8] {
        var head = "HTTP/1.1 \(status) \(reasonPhrase(status))\r\n"
        var hasLength = false
        for (name, value) in headers {
            if HTTPHeaders.equalsIgnoringCase(name, "Content-Length") { hasLength = true }
            head += "\(name): \(value)\r\n"
        }
        let bodyAllowed = !(100...199 ~= status || status == 204 || status == 304)
        if bodyAllowed && !hasLength { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        var out = Array(head.utf8)
        if bodyAllowed { out += body }
        return out
    }

    /// A response with `Content-Type: application/json` and `body` (already JSON).
    public static func json(status: Int, body: String, headers: [(String, String)] = []) -> [UInt8] {
        make(status: status, headers: [("Content-Type", "application/json")] + headers, body: Array(body.utf8))
    }

    /// The standard reason phrase for `status` (RFC 9110 section 15), or "Unknown".
    public static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 100: return "Continue"
        case 101: return "Switching Protocols"
        case 200: return "OK"
        case 201: return "Created"
        case 202: return "Accepted"
        case 204: return "No Content"
        case 301: return "Moved Permanently"
        case 302: return "Found"
        case 304: return "Not Modified"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 408: return "Request Timeout"
        case 409: return "Conflict"
        case 413: return "Content Too Large"
        case 414: return "URI Too Long"
        case 426: return "Upgrade Required"
        case 429: return "Too Many Requests"
        case 431: return "Request Header Fields Too Large"
        case 500: return "Internal Server Error"
        case 501: return "Not Implemented"
        case 502: return "Bad Gateway"
        case 503: return "Service Unavailable"
        case 505: return "HTTP Version Not Supported"
        default: return "Unknown"
        }
    }

    /// `s` as a JSON string literal (RFC 8259: quote, backslash and control characters escaped).
    public static func jsonString(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{08}": out += "\\b"
            case "\u{0C}": out += "\\f"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "\""
        return out
    }
}
