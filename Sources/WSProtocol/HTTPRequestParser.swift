import Glibc

/// Limits applied while reading an HTTP/1.1 message head. Going over any of them is an error,
/// never an unbounded buffer.
public struct HTTPParserLimits: Sendable {
    /// Longest start line or header line, excluding its CRLF. Over it: 414 (request line) or 431 (header line).
    public var maxLineLength: Int
    /// Most header fields. Over it: 431.
    public var maxHeaderCount: Int
    /// Most bytes in the whole head, start line through the blank line's CRLF. Over it: 431.
    public var maxHeadSize: Int

    public init(maxLineLength: Int = 8 * 1024, maxHeaderCount: Int = 64, maxHeadSize: Int = 16 * 1024) {
        self.maxLineLength = maxLineLength
        self.maxHeaderCount = maxHeaderCount
        self.maxHeadSize = maxHeadSize
    }
}

/// What one call to an incremental head parser produced.
public enum HTTPParseResult<Head> {
    /// Every byte given was consumed and remembered; call again with more.
    case needMoreData
    /// The head is complete. Exactly `consumed` bytes of the latest input belong to it; anything after
    /// (a client may pipeline WebSocket frames behind its request) is still the caller's.
    case complete(Head, consumed: Int)
}

extension HTTPParseResult: Sendable where Head: Sendable {}

/// A parsed HTTP/1.x request head.
public struct HTTPRequestHead: Sendable {
    public var method: String
    /// The request-target as sent (origin-form usually: `/path?query`; absolute-form `http://host/path?query`
    /// is accepted too, RFC 9112 section 3.2.2).
    public var target: String
    /// The path of `target`: before the first `?`, without the scheme and authority of an absolute-form target.
    public var path: String
    /// `target` after the first `?`, or nil when there is no `?` (made on each call; `queryValue` reads the target
    /// in place).
    public var query: String? {
        guard let q = target.utf8.firstIndex(of: UInt8(ascii: "?")) else { return nil }
        return String(target.utf8[target.utf8.index(after: q)...])
    }
    public var versionMajor: Int
    public var versionMinor: Int
    public var headers: HTTPHeaders

    public init(method: String, target: String, versionMajor: Int = 1, versionMinor: Int = 1, headers: HTTPHeaders) {
        self.method = method
        self.target = target
        // Origin-form, the usual target, has no scheme to strip: its path ends at the first `?` (found by `memchr`).
        if target.utf8.first == UInt8(ascii: "/"), let path = target.utf8.withContiguousStorageIfAvailable({ bytes in
            guard let q = ByteScan.firstIndex(of: UInt8(ascii: "?"), in: UnsafeRawBufferPointer(bytes)) else { return target }
            return String(decoding: UnsafeBufferPointer(rebasing: bytes[..<q]), as: UTF8.self)
        }) {
            self.path = path
        } else {
            let originForm = Self.originForm(of: target)
            if let q = originForm.utf8.firstIndex(of: UInt8(ascii: "?")) {
                path = String(originForm[..<q])
            } else {
                path = String(originForm)
            }
        }
        self.versionMajor = versionMajor
        self.versionMinor = versionMinor
        self.headers = headers
    }

    /// `http://host:port/path?q` → `/path?q` (and `http://host?q` → `/?q`); any other target as it is.
    static func originForm(of target: String) -> Substring {
        let utf8 = target.utf8
        let schemeLength: Int
        if utf8.starts(with: "http://".utf8) || utf8.starts(with: "HTTP://".utf8) {
            schemeLength = 7
        } else if utf8.starts(with: "https://".utf8) || utf8.starts(with: "HTTPS://".utf8) {
            schemeLength = 8
        } else {
            return target[...]
        }
        let afterScheme = target.utf8.index(target.startIndex, offsetBy: schemeLength)
        let rest = target[afterScheme...]
        guard let slash = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) else { return "/" }
        if rest[slash] == "?" { return Substring("/" + rest[slash...]) }
        return rest[slash...]
    }

    /// RFC 9112 section 3.2: an HTTP/1.1 request carries exactly one Host header (400 otherwise); an HTTP/1.0
    /// request at most one.
    public func validateHost() throws(HTTPError) {
        let hosts = headers.count(of: "Host")
        if versionMajor > 1 || (versionMajor == 1 && versionMinor >= 1) {
            guard hosts == 1, headers.firstValueBytes("Host")?.isEmpty == false else {
                throw .badRequest("exactly one non-empty Host header is required")
            }
        } else {
            guard hosts <= 1 else { throw .badRequest("at most one Host header is allowed") }
        }
    }

    /// The first value of query parameter `name` (`application/x-www-form-urlencoded` rules:
    /// `+` is a space, `%XX` is decoded; a malformed escape is kept literally). Nil when absent.
    public func queryValue(_ name: String) -> String? {
        withRawQueryValue(name) { $0.map(Self.formDecode) }
    }

    /// `queryValue` without a `String`: `body` gets the value's decoded bytes (the target's own when nothing needs
    /// decoding, as in a JWT), or nil when the parameter is absent. The handshake reads `access_token` this way.
    public func withQueryValue<R>(_ name: String, _ body: (UnsafeBufferPointer<UInt8>?) -> R) -> R {
        withRawQueryValue(name) { raw in
            guard let raw else { return body(nil) }
            let bytes = UnsafeRawBufferPointer(raw)
            if !ByteScan.contains(UInt8(ascii: "+"), in: bytes) && !ByteScan.contains(UInt8(ascii: "%"), in: bytes) {
                return body(raw)
            }
            return Self.decodeFormBytes(raw).withUnsafeBufferPointer { body($0) }
        }
    }

    /// Calls `body` with the first value of `name` as it stands in the target (not yet form-decoded), or nil.
    private func withRawQueryValue<R>(_ name: String, _ body: (UnsafeBufferPointer<UInt8>?) -> R) -> R {
        var utf8 = name, target = self.target
        return utf8.withUTF8 { nameBytes in
            target.withUTF8 { targetBytes in
                let range = Self.queryValueRange(named: nameBytes, name, in: targetBytes)
                return body(range.map { UnsafeBufferPointer(rebasing: targetBytes[$0]) })
            }
        }
    }

    /// Where the first value of `name` (`nameBytes`, its UTF-8) is in `target`, undecoded; nil when absent.
    /// `String ==` is canonical equivalence, under which a non-ASCII key can equal an ASCII name (U+212A KELVIN
    /// SIGN is `K`): bytes decide only between ASCII strings; other keys are decoded and compared as `String`s.
    /// Only the matching value is decoded (this runs once per handshake, for `access_token`). A function of its
    /// own, not a closure nested in `withRawQueryValue`: that one cost an allocation per call.
    private static func queryValueRange(named nameBytes: UnsafeBufferPointer<UInt8>, _ name: String,
                                        in target: UnsafeBufferPointer<UInt8>) -> Range<Int>? {
        // The query is the target after its first `?` (in absolute form too: an authority has no `?`).
        let raw = UnsafeRawBufferPointer(target)
        guard let q = ByteScan.firstIndex(of: UInt8(ascii: "?"), in: raw, from: 0) else { return nil }
        let nameIsASCII = ByteScan.all(UnsafeRawBufferPointer(nameBytes), in: 0...0x7F)
        var i = q + 1
        while i < target.count {
            let end = ByteScan.firstIndex(of: UInt8(ascii: "&"), in: raw, from: i) ?? target.count
            if end > i {
                let eq = ByteScan.firstIndex(of: UInt8(ascii: "="), in: UnsafeRawBufferPointer(rebasing: raw[..<end]), from: i) ?? end
                let key = UnsafeBufferPointer(rebasing: target[i..<eq])
                let plain = nameIsASCII && !key.contains { $0 == UInt8(ascii: "%") || $0 == UInt8(ascii: "+") || $0 >= 0x80 }
                if plain ? key.elementsEqual(nameBytes) : formDecode(key) == name {
                    return min(eq + 1, end)..<end
                }
            }
            i = end + 1
        }
        return nil
    }

    /// `formDecode` of a buffer: the search for something to decode is two `memchr`s.
    static func formDecode(_ bytes: UnsafeBufferPointer<UInt8>) -> String {
        let raw = UnsafeRawBufferPointer(bytes)
        if !ByteScan.contains(UInt8(ascii: "+"), in: raw) && !ByteScan.contains(UInt8(ascii: "%"), in: raw) {
            return String(decoding: bytes, as: UTF8.self)
        }
        return decodeForm(bytes)
    }

    static func formDecode<Bytes: Collection>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        // Nothing to decode (a JWT never needs escaping): the bytes are the value.
        if !bytes.contains(where: { $0 == UInt8(ascii: "+") || $0 == UInt8(ascii: "%") }) {
            return String(decoding: bytes, as: UTF8.self)
        }
        return decodeForm(bytes)
    }

    /// `+` as a space, `%XX` as its byte, a malformed escape kept literally.
    private static func decodeForm<Bytes: Collection>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        String(decoding: decodeFormBytes(bytes), as: UTF8.self)
    }

    private static func decodeFormBytes<Bytes: Collection>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = bytes.startIndex
        while i != bytes.endIndex {
            let b = bytes[i]
            if b == UInt8(ascii: "+") {
                out.append(0x20)
            } else if b == UInt8(ascii: "%"),
                      let h1 = bytes.index(i, offsetBy: 1, limitedBy: bytes.endIndex), h1 != bytes.endIndex,
                      let h2 = bytes.index(i, offsetBy: 2, limitedBy: bytes.endIndex), h2 != bytes.endIndex,
                      let hi = hexValue(bytes[h1]), let lo = hexValue(bytes[h2]) {
                out.append(hi << 4 | lo)
                i = h2
            } else {
                out.append(b)
            }
            i = bytes.index(after: i)
        }
        return out
    }

    @inline(__always) static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return b - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return b - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

/// Incremental HTTP/1.x request-head parser.
///
/// Each byte is looked at exactly once, whatever the chunking (no rescanning), and only the current
/// line is buffered. Lines must end in CRLF: a bare LF or a bare CR is rejected with 400. RFC 9112
/// section 2.2 lets a recipient accept bare LF; we do not, because a WebSocket client always sends
/// CRLF and a lenient reading is what request smuggling feeds on.
///
/// After `.complete` the parser is back in its initial state and may be reused. After a throw it must
/// be discarded: the caller answers with ``HTTPError/response()`` and closes the connection.
public struct HTTPRequestParser: Sendable {
    public let limits: HTTPParserLimits
    private var scanner: HeadScanner
    private var method = ""
    private var target = ""
    private var major = 1
    private var minor = 1

    public init(limits: HTTPParserLimits = HTTPParserLimits()) {
        self.limits = limits
        scanner = HeadScanner(limits: limits, startLineTooLong: .uriTooLong("request line too long"), isResponse: false)
    }

    public mutating func parse(_ bytes: UnsafeRawBufferPointer) throws(HTTPError) -> HTTPParseResult<HTTPRequestHead> {
        var parsedStart: (String, String, Int, Int)? = nil
        let consumed = try scanner.feed(bytes) { (line: UnsafeRawBufferPointer) throws(HTTPError) in
            parsedStart = try HTTPRequestParser.parseRequestLine(line)
        }
        if let (m, t, ma, mi) = parsedStart { method = m; target = t; major = ma; minor = mi }
        guard let consumed else { return .needMoreData }
        let head = HTTPRequestHead(method: method, target: target, versionMajor: major, versionMinor: minor,
                                   headers: scanner.takeHeaders())
        return .complete(head, consumed: consumed)
    }

    /// Whether no byte has been fed yet: the next one is the first of the request (a caller can recognise another
    /// protocol there, such as a TLS ClientHello sent to a plain port).
    public var isAtStart: Bool { scanner.isAtStart }

    /// Convenience for `[UInt8]` input; same contract as ``parse(_:)-(UnsafeRawBufferPointer)``.
    public mutating func parse(_ bytes: [UInt8]) throws(HTTPError) -> HTTPParseResult<HTTPRequestHead> {
        try bytes.withUnsafeBytes { raw in Result { () throws(HTTPError) in try self.parse(raw) } }.get()
    }

    /// `method SP request-target SP HTTP-version` (RFC 9112 section 3).
    /// The line as read, where it lies (in the read buffer, or in the scanner's line buffer when it came in parts).
    static func parseRequestLine(_ line: UnsafeRawBufferPointer) throws(HTTPError) -> (String, String, Int, Int) {
        guard let sp1 = ByteScan.firstIndex(of: 0x20, in: line, from: 0) else { throw .badRequest("malformed request line") }
        guard let sp2 = ByteScan.firstIndex(of: 0x20, in: line, from: sp1 + 1) else { throw .badRequest("malformed request line") }
        let method = UnsafeRawBufferPointer(rebasing: line[..<sp1])
        let target = UnsafeRawBufferPointer(rebasing: line[(sp1 + 1)..<sp2])
        let version = line[(sp2 + 1)...]
        guard !method.isEmpty, method.allSatisfy(HTTPHeaders.isTokenChar) else { throw .badRequest("invalid method") }
        guard !target.isEmpty, ByteScan.all(target, in: 0x21...0x7E) else {
            throw .badRequest("invalid request target")
        }
        let (major, minor) = try parseVersion(UnsafeRawBufferPointer(rebasing: version), error: .badRequest("malformed HTTP version"))
        guard major == 1 else { throw .versionNotSupported("HTTP/\(major).\(minor) is not supported") }
        return (String(decoding: method, as: UTF8.self), String(decoding: target, as: UTF8.self), major, minor)
    }

    /// `HTTP/D.D`, exactly (read in place in the start line).
    static func parseVersion(_ v: UnsafeRawBufferPointer, error: HTTPError) throws(HTTPError) -> (Int, Int) {
        guard v.count == 8, v.starts(with: "HTTP/".utf8) else { throw error }
        let d1 = v[5], dot = v[6], d2 = v[7]
        guard (0x30...0x39) ~= d1, dot == UInt8(ascii: "."), (0x30...0x39) ~= d2 else { throw error }
        return (Int(d1 - 0x30), Int(d2 - 0x30))
    }
}

/// The part shared by the request and response parsers: splits CRLF lines one byte at a time,
/// enforces the limits, and parses header lines as they complete.
struct HeadScanner: Sendable {
    let limits: HTTPParserLimits
    let startLineTooLong: HTTPError
    /// Malformed lines are 400 for a request, 502 for a response.
    let isResponse: Bool
    private var line: [UInt8] = []
    private var sawCR = false
    private var sawStartLine = false
    private var headSize = 0
    private var headers = HTTPHeaders()

    init(limits: HTTPParserLimits, startLineTooLong: HTTPError, isResponse: Bool) {
        self.limits = limits
        self.startLineTooLong = startLineTooLong
        self.isResponse = isResponse
    }

    private func badLine(_ message: String) -> HTTPError { isResponse ? .badResponse(message) : .badRequest(message) }

    /// No byte fed yet.
    var isAtStart: Bool { headSize == 0 && line.isEmpty && !sawCR && !sawStartLine }

    /// Feeds bytes; returns how many of them complete the head, or nil if all were consumed and more are needed.
    mutating func feed(_ bytes: UnsafeRawBufferPointer,
                       startLine: (UnsafeRawBufferPointer) throws(HTTPError) -> Void) throws(HTTPError) -> Int? {
        var i = 0
        let count = bytes.count
        while i < count {
            if !sawCR {
                // The run of ordinary bytes up to the next CR or LF is appended in one go (a byte at a time cost ~40
                // instructions a byte, most of the parser's time). The limits are checked as if byte by
                // byte: the first byte past a limit throws, and where one byte passes both, the head limit wins.
                let j = HeadScanner.firstLineBreak(in: bytes, from: i)
                let run = j - i
                if run > 0 {
                    let headRoom = limits.maxHeadSize - headSize
                    let lineRoom = limits.maxLineLength - line.count
                    if run > headRoom || run > lineRoom {
                        if headRoom <= lineRoom { throw .headerTooLarge("message head larger than \(limits.maxHeadSize) bytes") }
                        throw sawStartLine ? .headerTooLarge("header line longer than \(limits.maxLineLength) bytes") : startLineTooLong
                    }
                }
                // A whole start line in this read, the usual case: parsed where it is, not copied into `line`
                // first (with a token in the query it is a few hundred bytes). Its CR and LF count towards the
                // head's size as they would one by one.
                if !sawStartLine && line.isEmpty && run > 0 && j + 1 < count && bytes[j] == 0x0D && bytes[j + 1] == 0x0A {
                    headSize += run + 2
                    if headSize > limits.maxHeadSize { throw .headerTooLarge("message head larger than \(limits.maxHeadSize) bytes") }
                    try startLine(UnsafeRawBufferPointer(rebasing: bytes[i..<j]))
                    sawStartLine = true
                    i = j + 2
                    continue
                }
                // Likewise a whole header line (or the blank line).
                if sawStartLine && line.isEmpty && j + 1 < count && bytes[j] == 0x0D && bytes[j + 1] == 0x0A {
                    headSize += run + 2
                    if headSize > limits.maxHeadSize { throw .headerTooLarge("message head larger than \(limits.maxHeadSize) bytes") }
                    let text = UnsafeRawBufferPointer(rebasing: bytes[i..<j])
                    i = j + 2
                    if try headerLine(text) {
                        reset()
                        return i
                    }
                    continue
                }
                if run > 0 {
                    line.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[i..<j]))
                    headSize += run
                    i = j
                    if i == count { break }
                }
            }
            let b = bytes[i]
            i += 1
            headSize += 1
            if headSize > limits.maxHeadSize { throw .headerTooLarge("message head larger than \(limits.maxHeadSize) bytes") }
            if sawCR {
                guard b == 0x0A else { throw badLine("bare CR in message head") }
                sawCR = false
                if try endLine(startLine: startLine) {
                    reset()
                    return i
                }
                continue
            }
            // Only CR or LF reach here (every other byte is part of a run above).
            if b == 0x0D {
                sawCR = true
            } else {
                throw badLine("bare LF in message head (lines must end in CRLF)")
            }
        }
        return nil
    }

    /// The index of the first CR or LF in `bytes` at or after `start`, or `bytes.count`: `memchr` for the CR, then
    /// for an LF before it (glibc's vectorised search; a byte-at-a-time loop cost ~9 instructions a byte: ~2 000 of
    /// the ~16 700 the parser spent on a request carrying a 200-byte token in its query).
    static func firstLineBreak(in bytes: UnsafeRawBufferPointer, from start: Int) -> Int {
        let cr = ByteScan.firstIndex(of: 0x0D, in: bytes, from: start) ?? bytes.count
        guard cr > start else { return cr }
        return ByteScan.firstIndex(of: 0x0A, in: UnsafeRawBufferPointer(rebasing: bytes[..<cr]), from: start) ?? cr
    }

    /// Returns true when the blank line ending the head was seen.
    private mutating func endLine(startLine: (UnsafeRawBufferPointer) throws(HTTPError) -> Void) throws(HTTPError) -> Bool {
        if !sawStartLine {
            defer { line.removeAll(keepingCapacity: true) }
            guard !line.isEmpty else { throw badLine("empty start line") }
            try line.withUnsafeBufferPointer { (raw) throws(HTTPError) in try startLine(UnsafeRawBufferPointer(raw)) }
            sawStartLine = true
            return false
        }
        // Moved out while `headerLine` (which mutates `self`) reads it, and back with its capacity.
        var text: [UInt8] = []
        swap(&text, &line)
        defer {
            text.removeAll(keepingCapacity: true)
            line = text
        }
        return try text.withUnsafeBufferPointer { (t) throws(HTTPError) in try headerLine(UnsafeRawBufferPointer(t)) }
    }

    /// One header line without its CRLF; returns true for the blank line that ends the head.
    private mutating func headerLine(_ text: UnsafeRawBufferPointer) throws(HTTPError) -> Bool {
        if text.isEmpty { return true }
        guard headers.count < limits.maxHeaderCount else { throw .headerTooLarge("more than \(limits.maxHeaderCount) header fields") }
        if text[0] == 0x20 || text[0] == 0x09 { throw badLine("obsolete line folding in header") }
        guard let colon = ByteScan.firstIndex(of: UInt8(ascii: ":"), in: text) else {
            throw badLine("header line without colon")
        }
        guard colon > 0 else { throw badLine("empty header name") }
        for k in 0..<colon where !HTTPHeaders.isTokenChar(text[k]) { throw badLine("invalid character in header name") }
        var start = colon + 1, end = text.count
        while start < end, text[start] == 0x20 || text[start] == 0x09 { start += 1 }
        while end > start, text[end - 1] == 0x20 || text[end - 1] == 0x09 { end -= 1 }
        let value = UnsafeRawBufferPointer(rebasing: text[start..<end])
        // field-value: VCHAR, SP, HTAB and obs-text; no NUL, no other control characters, no DEL. Printable ASCII,
        // the usual value, is checked by the word.
        guard ByteScan.all(value, in: 0x20...0x7E)
                || value.allSatisfy({ $0 >= 0x20 && $0 != 0x7F || $0 == 0x09 }) else {
            throw badLine("control character in header value")
        }
        headers.add(name: UnsafeRawBufferPointer(rebasing: text[..<colon]), value: value)
        return false
    }

    mutating func takeHeaders() -> HTTPHeaders {
        defer { headers = HTTPHeaders() }
        return headers
    }

    private mutating func reset() {
        line.removeAll(keepingCapacity: false)
        sawCR = false
        sawStartLine = false
        headSize = 0
    }
}
