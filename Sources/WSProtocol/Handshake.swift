/// One parameter of an extension offer or response: `name` or `name=value` (quoted values unescaped).
public struct ExtensionParameter: Sendable, Equatable {
    /// Lowercased.
    public var name: String
    public var value: String?
    public init(name: String, value: String? = nil) { self.name = name; self.value = value }
}

/// One element of `Sec-WebSocket-Extensions` (RFC 6455 section 9.1): an extension name and its parameters.
public struct ExtensionOffer: Sendable, Equatable {
    /// Lowercased.
    public var name: String
    public var parameters: [ExtensionParameter]
    public init(name: String, parameters: [ExtensionParameter] = []) { self.name = name; self.parameters = parameters }

    /// Parses every `Sec-WebSocket-Extensions` value, in order. Throws on a syntax error:
    /// `extension = token *(";" token ["=" (token / quoted-string)])`, and a quoted value must
    /// unescape to a token (RFC 6455 section 9.1).
    public static func parse(_ values: [String]) throws(HTTPError) -> [ExtensionOffer] {
        var result: [ExtensionOffer] = []
        for value in values {
            var p = ExtensionListParser(Array(value.utf8))
            try p.parseList(into: &result)
        }
        return result
    }
}

/// A recursive-descent reader for one `Sec-WebSocket-Extensions` field value.
struct ExtensionListParser {
    let s: [UInt8]
    var i = 0
    init(_ s: [UInt8]) { self.s = s }

    private func error(_ what: String) -> HTTPError { .badRequest("invalid Sec-WebSocket-Extensions: \(what)") }

    mutating func skipOWS() { while i < s.count, s[i] == 0x20 || s[i] == 0x09 { i += 1 } }

    mutating func token() -> String? {
        let start = i
        while i < s.count, HTTPHeaders.isTokenChar(s[i]) { i += 1 }
        return i > start ? String(decoding: s[start..<i], as: UTF8.self).lowercased() : nil
    }

    mutating func quotedString() throws(HTTPError) -> String {
        i += 1  // opening quote
        var out: [UInt8] = []
        while i < s.count {
            let c = s[i]
            i += 1
            switch c {
            case UInt8(ascii: "\""):
                guard !out.isEmpty, out.allSatisfy(HTTPHeaders.isTokenChar) else { throw error("quoted value is not a token") }
                return String(decoding: out, as: UTF8.self)
            case UInt8(ascii: "\\"):
                guard i < s.count else { throw error("unterminated quoted string") }
                out.append(s[i])
                i += 1
            default:
                out.append(c)
            }
        }
        throw error("unterminated quoted string")
    }

    mutating func parseList(into result: inout [ExtensionOffer]) throws(HTTPError) {
        while true {
            skipOWS()
            if i == s.count { return }
            if s[i] == UInt8(ascii: ",") { i += 1; continue }  // empty list elements are allowed (RFC 9110 5.6.1)
            guard let name = token() else { throw error("expected extension name") }
            var offer = ExtensionOffer(name: name)
            skipOWS()
            while i < s.count, s[i] == UInt8(ascii: ";") {
                i += 1
                skipOWS()
                guard let pname = token() else { throw error("expected parameter name") }
                skipOWS()
                var pvalue: String? = nil
                if i < s.count, s[i] == UInt8(ascii: "=") {
                    i += 1
                    skipOWS()
                    if i < s.count, s[i] == UInt8(ascii: "\"") {
                        pvalue = try quotedString()
                    } else if let t = token() {
                        pvalue = t
                    } else {
                        throw error("expected parameter value")
                    }
                    skipOWS()
                }
                offer.parameters.append(ExtensionParameter(name: pname, value: pvalue))
            }
            result.append(offer)
            if i == s.count { return }
            guard s[i] == UInt8(ascii: ",") else { throw error("unexpected character") }
            i += 1
        }
    }
}

/// Writes bytes one after another into a buffer, never past its end (whatever a caller's count said).
struct ByteCursor {
    let out: UnsafeMutableRawBufferPointer
    private(set) var offset = 0
    init(_ out: UnsafeMutableRawBufferPointer) { self.out = out }

    mutating func put(_ bytes: UnsafeRawBufferPointer) {
        guard let source = bytes.baseAddress, let base = out.baseAddress, offset + bytes.count <= out.count else { return }
        (base + offset).copyMemory(from: source, byteCount: bytes.count)
        offset += bytes.count
    }

    mutating func put(_ text: StaticString) { put(UnsafeRawBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount)) }

    mutating func put(_ text: String) {
        var text = text
        text.withUTF8 { put(UnsafeRawBufferPointer($0)) }
    }
}

/// A request that passed ``WebSocketHandshake/validateUpgrade(_:)``.
public struct UpgradeRequest: Sendable {
    /// The `Sec-WebSocket-Key` value as sent (validated: Base64 of 16 bytes).
    public var key: String { String(decoding: keyBytes, as: UTF8.self) }
    /// The same, as bytes (what ``WebSocketHandshake/response101(key:subprotocol:extensions:extraHeaders:)`` takes).
    public var keyBytes: ArraySlice<UInt8>
    /// `Sec-WebSocket-Protocol` elements in the client's order, case preserved.
    public var subprotocols: [String]
    /// `Sec-WebSocket-Extensions` offers in the client's order.
    public var extensions: [ExtensionOffer]
    public var head: HTTPRequestHead
}

/// The server side of the RFC 6455 opening handshake (section 4.2).
public enum WebSocketHandshake {
    static let guid: StaticString = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// `Sec-WebSocket-Accept` for a key: Base64(SHA-1(key + GUID)).
    public static func acceptValue(forKey key: String) -> String {
        withAcceptValue(forKey: Array(key.utf8)[...]) { String(decoding: $0, as: UTF8.self) }
    }

    /// Calls `body` with `Sec-WebSocket-Accept` for a key (28 bytes): the key and the GUID are hashed from a stack
    /// buffer and the digest is encoded in it (a `String` concatenation, two arrays and a `String` before).
    static func withAcceptValue<R>(forKey key: ArraySlice<UInt8>, _ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
        let guidBytes = UnsafeBufferPointer(start: guid.utf8Start, count: guid.utf8CodeUnitCount)
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: key.count + guidBytes.count + 20 + 28) { buffer in
            var n = key.withUnsafeBufferPointer { UnsafeMutableBufferPointer(rebasing: buffer[...]).initialize(from: $0).1 }
            n += UnsafeMutableBufferPointer(rebasing: buffer[n...]).initialize(from: guidBytes).1
            let digest = UnsafeMutableBufferPointer(rebasing: buffer[n..<(n + 20)])
            SHA1.hash(UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: buffer[..<n])), into: UnsafeMutableRawBufferPointer(digest))
            let text = buffer.baseAddress! + n + 20  // the buffer is not empty: it holds at least the GUID
            let count = Base64.encode(UnsafeBufferPointer(digest), to: text)
            return body(UnsafeBufferPointer(start: text, count: count))
        }
    }

    /// The `101 Switching Protocols` response completing the handshake, written into a buffer made at its final size
    /// by `make` (called once with the size and a function that fills a buffer of that size): the hub's outbound
    /// chunk, without an array to copy it from.
    public static func response101<R>(key: ArraySlice<UInt8>, subprotocol: String?, extensions: String?,
                                      extraHeaders: [(String, String)] = [],
                                      make: (Int, (UnsafeMutableRawBufferPointer) -> Void) -> R) -> R {
        let statusAndAccept: StaticString = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
        let protocolName: StaticString = "Sec-WebSocket-Protocol: "
        let extensionsName: StaticString = "Sec-WebSocket-Extensions: "
        let crlf: StaticString = "\r\n", colon: StaticString = ": "  // typed: a bare literal would pick `put(String)`
        return withAcceptValue(forKey: key) { accept in
            var count = statusAndAccept.utf8CodeUnitCount + accept.count + 2 + 2
            if let subprotocol { count += protocolName.utf8CodeUnitCount + subprotocol.utf8.count + 2 }
            if let extensions { count += extensionsName.utf8CodeUnitCount + extensions.utf8.count + 2 }
            for (name, value) in extraHeaders { count += name.utf8.count + 2 + value.utf8.count + 2 }
            return make(count) { out in
                var w = ByteCursor(out)
                w.put(statusAndAccept)
                w.put(UnsafeRawBufferPointer(accept))
                w.put(crlf)
                if let subprotocol { w.put(protocolName); w.put(subprotocol); w.put(crlf) }
                if let extensions { w.put(extensionsName); w.put(extensions); w.put(crlf) }
                for (name, value) in extraHeaders { w.put(name); w.put(colon); w.put(value); w.put(crlf) }
                w.put(crlf)
                let o = w.offset
                assert(o == count, "101 response: wrote \(o) of \(count) bytes")
            }
        }
    }

    /// Checks that `head` is a WebSocket upgrade request. The thrown error carries the status and
    /// headers to answer with:
    /// - method not GET: 405 `METHOD_NOT_ALLOWED` with `Allow: GET`;
    /// - HTTP/1.0: 505 `VERSION_NOT_SUPPORTED` (an upgrade needs HTTP/1.1);
    /// - no `Host`: 400 `BAD_REQUEST`;
    /// - no `Upgrade: websocket` or no `Connection: upgrade`: 426 `UPGRADE_REQUIRED` with `Upgrade: websocket`
    ///   (the request is a plain HTTP request to a WebSocket-only endpoint, RFC 9110 section 15.5.22);
    /// - `Sec-WebSocket-Version` other than exactly 13: 426 `UNSUPPORTED_WEBSOCKET_VERSION` with
    ///   `Sec-WebSocket-Version: 13` (RFC 6455 section 4.4);
    /// - `Sec-WebSocket-Key` missing, repeated, or not Base64 of 16 bytes: 400 `BAD_REQUEST`;
    /// - malformed `Sec-WebSocket-Protocol` or `Sec-WebSocket-Extensions`: 400 `BAD_REQUEST`.
    public static func validateUpgrade(_ head: HTTPRequestHead) throws(HTTPError) -> UpgradeRequest {
        guard head.method == "GET" else {
            throw HTTPError(status: 405, code: "METHOD_NOT_ALLOWED", message: "a WebSocket upgrade must use GET",
                            headers: [("Allow", "GET")])
        }
        guard head.versionMajor > 1 || (head.versionMajor == 1 && head.versionMinor >= 1) else {
            throw .versionNotSupported("a WebSocket upgrade requires HTTP/1.1")
        }
        let headers = head.headers
        try head.validateHost()
        guard headers.hasToken("Upgrade", "websocket", .contains), headers.hasToken("Connection", "upgrade", .contains) else {
            throw HTTPError(status: 426, code: "UPGRADE_REQUIRED",
                            message: "this endpoint only speaks WebSocket (Upgrade: websocket, Connection: Upgrade)",
                            headers: [("Upgrade", "websocket")])
        }
        guard headers.hasToken("Sec-WebSocket-Version", "13", .only) else {
            throw HTTPError(status: 426, code: "UNSUPPORTED_WEBSOCKET_VERSION",
                            message: "only WebSocket version 13 is supported",
                            headers: [("Sec-WebSocket-Version", "13")])
        }
        guard headers.count(of: "Sec-WebSocket-Key") == 1, let key = headers.firstValueBytes("Sec-WebSocket-Key") else {
            throw .badRequest("exactly one Sec-WebSocket-Key header is required")
        }
        guard Base64.decodedCount(key) == 16 else {
            throw .badRequest("Sec-WebSocket-Key must be the Base64 encoding of 16 bytes")
        }
        let subprotocols = headers.rawTokens("Sec-WebSocket-Protocol")
        guard subprotocols.allSatisfy(HTTPHeaders.isToken) else { throw .badRequest("invalid Sec-WebSocket-Protocol") }
        let extensions = try ExtensionOffer.parse(headers.values("Sec-WebSocket-Extensions"))
        return UpgradeRequest(keyBytes: key, subprotocols: subprotocols, extensions: extensions, head: head)
    }

    /// Picks the subprotocol to answer with, in the SERVER's preference order: the first entry of
    /// `supported` that the client offered (exact, case-sensitive match). The server decides because
    /// it knows which protocol versions it prefers; the client's order is only a hint. Nil when
    /// nothing matches: the handshake then proceeds without `Sec-WebSocket-Protocol`.
    public static func selectSubprotocol(offered: [String], supported: [String]) -> String? {
        supported.first { offered.contains($0) }
    }

    /// The same response as an array (the client's tests and the fuzz target's checks).
    public static func response101(key: ArraySlice<UInt8>, subprotocol: String?, extensions: String?,
                                   extraHeaders: [(String, String)] = []) -> [UInt8] {
        response101(key: key, subprotocol: subprotocol, extensions: extensions, extraHeaders: extraHeaders) { count, fill in
            var out = [UInt8](repeating: 0, count: count)
            out.withUnsafeMutableBytes(fill)
            return out
        }
    }
}
