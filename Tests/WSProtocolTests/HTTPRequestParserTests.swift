import Testing
@testable import WSProtocol

/// Feeds `chunks` one after another; returns the head and the total bytes consumed (across chunks).
func parseRequestChunks(_ chunks: [[UInt8]], limits: HTTPParserLimits = HTTPParserLimits()) -> Result<(HTTPRequestHead, Int), HTTPError> {
    var parser = HTTPRequestParser(limits: limits)
    var before = 0
    for chunk in chunks {
        do throws(HTTPError) {
            let result = try parser.parse(chunk)
            if case .complete(let head, let consumed) = result {
                #expect(consumed >= 0 && consumed <= chunk.count)
                return .success((head, before + consumed))
            }
        } catch {
            return .failure(error)
        }
        before += chunk.count
    }
    return .failure(HTTPError(status: 0, code: "INCOMPLETE", message: "ran out of input"))
}

private func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

private let validUpgrade = "GET /chat?room=a%20b&x=1+2 HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\n" +
    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: http://example.com\r\n" +
    "Sec-WebSocket-Protocol: chat, superchat\r\nSec-WebSocket-Version: 13\r\n\r\n"

@Test func parsesValidUpgradeRequest() throws {
    let (head, consumed) = try parseRequestChunks([bytes(validUpgrade)]).get()
    #expect(consumed == validUpgrade.utf8.count)
    #expect(head.method == "GET")
    #expect(head.target == "/chat?room=a%20b&x=1+2")
    #expect(head.path == "/chat")
    #expect(head.query == "room=a%20b&x=1+2")
    #expect(head.versionMajor == 1 && head.versionMinor == 1)
    #expect(head.headers.count == 7)
    #expect(head.headers[first: "host"] == "server.example.com")
    #expect(head.headers[first: "SEC-WEBSOCKET-KEY"] == "dGhlIHNhbXBsZSBub25jZQ==")
    #expect(head.headers.tokens("sec-websocket-protocol") == ["chat", "superchat"])
    #expect(head.queryValue("room") == "a b")
    #expect(head.queryValue("x") == "1 2")
    #expect(head.queryValue("missing") == nil)
}

@Test func queryValueDecoding() {
    let head = HTTPRequestHead(method: "GET", target: "/p?a=%41%zz&b&c=&a=second&%6Bey=v", headers: HTTPHeaders())
    #expect(head.queryValue("a") == "A%zz")
    #expect(head.queryValue("b") == "")
    #expect(head.queryValue("c") == "")
    #expect(head.queryValue("key") == "v")
    // The byte form the handshake reads `access_token` with gives the same values, and nil for an absent one.
    for (target, name) in [("/p?a=%41%zz&b&c=&a=second&%6Bey=v", "a"), ("/p?a=%41%zz&b&c=&a=second&%6Bey=v", "b"),
                           ("/p?a=%41%zz&b&c=&a=second&%6Bey=v", "key"), ("/p?a=%41%zz&b&c=&a=second&%6Bey=v", "nope"),
                           ("/ws?access_token=aaa.bbb.ccc", "access_token"), ("/ws?access_token=a+b%2E%ff", "access_token"),
                           ("/ws", "access_token"), ("/ws?", "access_token"), ("/ws?access_token", "access_token")] {
        let head = HTTPRequestHead(method: "GET", target: target, headers: HTTPHeaders())
        let bytes = head.withQueryValue(name) { $0.map { String(decoding: $0, as: UTF8.self) } }
        #expect(bytes == head.queryValue(name), "\(target) \(name)")
    }
    #expect(HTTPRequestHead(method: "GET", target: "/ws?access_token=a+b%2E", headers: HTTPHeaders())
        .withQueryValue("access_token") { $0.map(Array.init) } == Array("a b.".utf8))
    #expect(HTTPRequestHead(method: "GET", target: "/p", headers: HTTPHeaders()).query == nil)
    #expect(HTTPRequestHead(method: "GET", target: "/p?", headers: HTTPHeaders()).query == "")
    // Origin form: the path is the target up to its first `?`.
    for (target, path) in [("/p", "/p"), ("/p?", "/p"), ("/?a=1?b", "/"), ("/a/b?c=/d", "/a/b"), ("/", "/")] {
        #expect(HTTPRequestHead(method: "GET", target: target, headers: HTTPHeaders()).path == path, "\(target)")
    }
    // Absolute form: the query is the target's after its first `?`, with or without a path.
    for (target, path, query) in [("http://h:1/ws?a=1?b", "/ws", "a=1?b"), ("HTTPS://h?a=2", "/", "a=2"), ("http://h/x", "/x", nil)] {
        let absolute = HTTPRequestHead(method: "GET", target: target, headers: HTTPHeaders())
        #expect(absolute.path == path && absolute.query == query, "\(target)")
        #expect(absolute.queryValue("a") == query.map { String($0.dropFirst(2)) }, "\(target)")
    }
}

/// The in-place `queryValue` against the definition (split on `&`, form-decode every key, `String ==`), on random
/// queries over an alphabet that makes keys collide, escapes and non-ASCII.
@Test func queryValueMatchesTheDefinition() {
    func reference(_ query: String, _ name: String) -> String? {
        for pair in query.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let key = HTTPRequestHead.formDecode(parts[0].utf8)
            if key == name { return HTTPRequestHead.formDecode(parts.count > 1 ? parts[1].utf8 : ""[...].utf8) }
        }
        return nil
    }
    let alphabet = ["a", "b", "k", "=", "&", "%", "6", "B", "+", " ", "\u{212A}", "é", "e\u{301}", "%C3%A9"]
    let names = ["a", "ab", "k", "a b", "K", "é", "", "access_token"]
    var rng = SystemRandomNumberGenerator()
    for _ in 0..<3000 {
        let query = (0..<Int.random(in: 0...12, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
        let head = HTTPRequestHead(method: "GET", target: "/ws?" + query, headers: HTTPHeaders())
        for name in names {
            #expect(head.queryValue(name) == reference(query, name), "query \(query.debugDescription), name \(name.debugDescription)")
        }
    }
    let token = HTTPRequestHead(method: "GET", target: "/ws?x=1&access_token=abc.def.ghi&access_token=2", headers: HTTPHeaders())
    #expect(token.queryValue("access_token") == "abc.def.ghi")
}

@Test func oneByteAtATimeAndEverySplitGiveTheSameHead() throws {
    let wire = bytes(validUpgrade)
    let whole = try parseRequestChunks([wire]).get().0
    let (single, consumed1) = try parseRequestChunks(wire.map { [$0] }).get()
    #expect(consumed1 == wire.count)
    #expect(single.headers.entries == whole.headers.entries && single.target == whole.target)
    for cut in 0...wire.count {
        let (head, consumed) = try parseRequestChunks([Array(wire[..<cut]), Array(wire[cut...])]).get()
        #expect(consumed == wire.count, "split at \(cut)")
        #expect(head.headers.entries == whole.headers.entries, "split at \(cut)")
        #expect(head.method == "GET" && head.path == "/chat", "split at \(cut)")
    }
}

/// The parser appends runs of ordinary bytes in one go; fed one byte at a time, every run is one byte long, which is
/// the byte-by-byte reading the runs must agree with. Random heads around small limits, with stray CRs and LFs, must
/// give the same head or the same error (status, code and message: which limit is hit first) both ways, and at a
/// random split too.
@Test func runsAgreeWithByteAtATimeReading() {
    var rng = SystemRandomNumberGenerator()
    let pieces: [[UInt8]] = [Array("GET /a HTTP/1.1".utf8), Array("X: ".utf8), Array("vvvvvvv".utf8), Array("Host: h".utf8),
                             [0x0D, 0x0A], [0x0D, 0x0A], [0x0D, 0x0A], [0x0D], [0x0A], [0x20], Array(":".utf8), [0x00], [0xC3, 0xA9]]
    func outcome(_ r: Result<(HTTPRequestHead, Int), HTTPError>) -> String {
        switch r {
        case .success(let (head, consumed)):
            return "ok \(head.method) \(head.target) \(head.headers.entries.map { "\($0.name)=\($0.value)" }) \(consumed)"
        case .failure(let e): return "error \(e.status) \(e.code) \(e.message)"
        }
    }
    for _ in 0..<4_000 {
        var wire = Array("GET /a HTTP/1.1\r\n".utf8)
        for _ in 0..<Int.random(in: 0...12, using: &rng) { wire += pieces.randomElement(using: &rng)! }
        if Bool.random(using: &rng) { wire += [0x0D, 0x0A, 0x0D, 0x0A] }
        let limits = HTTPParserLimits(maxLineLength: Int.random(in: 1...40, using: &rng), maxHeaderCount: 8,
                                      maxHeadSize: Int.random(in: 1...90, using: &rng))
        let whole = outcome(parseRequestChunks([wire], limits: limits))
        let single = outcome(parseRequestChunks(wire.map { [$0] }, limits: limits))
        #expect(whole == single, "\(wire) \(limits.maxLineLength) \(limits.maxHeadSize)")
        let cut = Int.random(in: 0...wire.count, using: &rng)
        let split = outcome(parseRequestChunks([Array(wire[..<cut]), Array(wire[cut...])], limits: limits))
        #expect(whole == split, "\(wire) cut at \(cut)")
    }
}

/// Which limit a run of bytes hits first is decided as if byte by byte: the first byte past a limit throws, and a byte
/// past both is reported as too large a head (the head size is counted before the line is checked).
@Test func limitPrecedenceIsByteByByte() {
    let start = "GET /aaaaaaaa HTTP/1.1"  // 22 bytes
    func error(_ wire: String, line: Int, head: Int) -> String? {
        let limits = HTTPParserLimits(maxLineLength: line, maxHeaderCount: 8, maxHeadSize: head)
        for chunks in [[bytes(wire)], bytes(wire).map { [$0] }] {
            guard case .failure(let e) = parseRequestChunks(chunks, limits: limits) else { return nil }
            if chunks.count > 1 { return "\(e.status) \(e.code) \(e.message)" }
        }
        return nil
    }
    // The 11th byte passes both limits: the head's.
    #expect(error(start + "\r\n\r\n", line: 10, head: 10) == "431 HEADER_TOO_LARGE message head larger than 10 bytes")
    // The line's first (byte 11), the head's later.
    #expect(error(start + "\r\n\r\n", line: 10, head: 11)?.hasPrefix("414 URI_TOO_LONG") == true)
    // The head's first.
    #expect(error(start + "\r\n\r\n", line: 11, head: 10) == "431 HEADER_TOO_LARGE message head larger than 10 bytes")
    // A header line: past both at once (its 15th byte, the head's 31st), then the line's first.
    let headerLine = "GET / HTTP/1.1\r\nX: vvvvvvvvvvvvvvv\r\n\r\n"  // start line 16 bytes with its CRLF
    #expect(error(headerLine, line: 14, head: 30) == "431 HEADER_TOO_LARGE message head larger than 30 bytes")
    #expect(error(headerLine, line: 14, head: 100) == "431 HEADER_TOO_LARGE header line longer than 14 bytes")
    // A bare LF before either limit is the LF's error.
    #expect(error("GET /a\nHTTP/1.1\r\n\r\n", line: 10, head: 10)?.hasPrefix("400 BAD_REQUEST bare LF") == true)
}

@Test func bytesAfterTheHeadAreNotConsumed() throws {
    let frame: [UInt8] = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58]
    let wire = bytes(validUpgrade) + frame
    for cut in 0...wire.count {
        var parser = HTTPRequestParser()
        var total = 0
        var done = false
        for chunk in [Array(wire[..<cut]), Array(wire[cut...])] where !done {
            let r = try parser.parse(chunk)
            switch r {
            case .needMoreData: total += chunk.count
            case .complete(_, let consumed):
                total += consumed
                #expect(wire[total...].starts(with: chunk[consumed...]), "split at \(cut)")
                done = true
            }
        }
        #expect(done && total == wire.count - frame.count, "split at \(cut)")
    }
}

@Test func parserIsReusableAfterCompletion() throws {
    var parser = HTTPRequestParser()
    let two = bytes("GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.0\r\nHost: y\r\n\r\n")
    var heads: [HTTPRequestHead] = []
    var offset = 0
    while offset < two.count {
        let slice = Array(two[offset...])
        let r = try parser.parse(slice)
        guard case .complete(let head, let consumed) = r else { Issue.record("incomplete"); return }
        heads.append(head)
        offset += consumed
    }
    #expect(heads.map(\.path) == ["/a", "/b"])
    #expect(heads.map(\.versionMinor) == [1, 0])
    #expect(heads[1].headers[first: "Host"] == "y")
}

@Test func repeatedHeadersAndCaseInsensitiveNames() throws {
    let raw = "GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a:2, ,3 \r\nX-A:\r\nconnection: keep-alive, UPGRADE\r\nX-Tab:\ta\tb\t\r\n\r\n"
    let head = try parseRequestChunks([bytes(raw)]).get().0
    #expect(head.headers.values("x-A") == ["1", "2, ,3", ""])
    #expect(head.headers[first: "X-a"] == "1")
    #expect(head.headers.tokens("X-A") == ["1", "2", "3"])
    #expect(head.headers.tokens("Connection") == ["keep-alive", "upgrade"])
    #expect(head.headers[first: "x-tab"] == "a\tb")
    #expect(head.headers.entries.map(\.name) == ["Host", "X-A", "x-a", "X-A", "connection", "X-Tab"])
}

/// The fields are kept as bytes: counts and byte values without `String`s, values as sent (obs-text included),
/// and the `String` accessors repairing invalid UTF-8 as `String(decoding:)` does.
@Test func headersKeepBytesAndAnswerByName() throws {
    var raw = Array("GET / HTTP/1.1\r\nHost: h\r\nX-Key: abc\r\nx-key:  \r\nX-Obs: a".utf8)
    raw += [0xFF, 0xC3, 0xA9]
    raw += Array("\r\nEmpty:\r\n\r\n".utf8)
    let headers = try parseRequestChunks([raw]).get().0.headers
    #expect(headers.count == 5)
    #expect(headers.count(of: "X-KEY") == 2)
    #expect(headers.count(of: "X-Ke") == 0)
    #expect(headers.count(of: "missing") == 0)
    #expect(headers.firstValueBytes("x-key").map(Array.init) == Array("abc".utf8))
    #expect(headers.firstValueBytes("empty").map(Array.init) == [])
    #expect(headers.firstValueBytes("missing") == nil)
    #expect(headers.firstValueBytes("x-obs").map(Array.init) == [0x61, 0xFF, 0xC3, 0xA9])
    #expect(headers[first: "X-Obs"] == "a\u{FFFD}\u{E9}")
    #expect(headers.values("X-Key") == ["abc", ""])
    #expect(headers.entries == [.init(name: "Host", value: "h"), .init(name: "X-Key", value: "abc"), .init(name: "x-key", value: ""),
                                .init(name: "X-Obs", value: "a\u{FFFD}\u{E9}"), .init(name: "Empty", value: "")])
    // Built from Strings, the same answers.
    var built = HTTPHeaders([("Host", "h")])
    built.add(name: "Sec-WebSocket-Protocol", value: " a, B ,,c ")
    #expect(built.rawTokens("sec-websocket-protocol") == ["a", "B", "c"])
    #expect(built.entries.map(\.value) == ["h", " a, B ,,c "])
    #expect(HTTPHeaders().count(of: "Host") == 0 && HTTPHeaders().values("Host").isEmpty)
}

/// The scanner's search for the end of a run (two `memchr`s) finds what a byte-at-a-time loop finds.
@Test func firstLineBreakMatchesAByteLoop() {
    var rng = SystemRandomNumberGenerator()
    let alphabet: [UInt8] = [0x41, 0x20, 0x0D, 0x0A, 0x3A, 0xFF]
    for _ in 0..<5_000 {
        let count = Int.random(in: 0...80, using: &rng)
        // Mostly ordinary bytes, so runs are long enough to matter.
        let bytes = (0..<count).map { _ in Int.random(in: 0..<10, using: &rng) == 0 ? alphabet.randomElement(using: &rng) ?? 0 : 0x61 }
        let start = Int.random(in: 0...count, using: &rng)
        var expected = start
        while expected < count && bytes[expected] != 0x0D && bytes[expected] != 0x0A { expected += 1 }
        bytes.withUnsafeBytes { raw in
            #expect(HeadScanner.firstLineBreak(in: raw, from: start) == expected, "\(bytes) from \(start)")
        }
    }
}

/// `hasToken` (the allocation-free check the upgrade uses) answers what `tokens(_:)` answers for ASCII values.
@Test(arguments: [
    ("Connection: keep-alive, UPGRADE", "Connection", true, false),
    ("Connection: keep-alive\r\nConnection: Upgrade ", "Connection", true, false),
    ("Connection: upgrade", "Connection", true, true),
    ("Connection: ,\t upgrade\t, ", "Connection", true, true),
    ("Connection: upgrade, upgrade", "Connection", true, false),
    ("Connection: upgrader, xupgrade, up grade", "Connection", false, false),
    ("Connection: upgrade\r\nConnection: close", "Connection", true, false),
    ("X-Other: upgrade", "Connection", false, false),
    ("Connection:", "Connection", false, false),
])
func hasTokenMatchesTokens(field: String, name: String, contains: Bool, only: Bool) throws {
    let raw = "GET / HTTP/1.1\r\nHost: h\r\n\(field)\r\n\r\n"
    let head = try parseRequestChunks([bytes(raw)]).get().0
    #expect(head.headers.hasToken(name, "upgrade", .contains) == contains)
    #expect(head.headers.tokens(name).contains("upgrade") == contains)
    #expect(head.headers.hasToken(name, "upgrade", .only) == only)
    #expect((head.headers.tokens(name) == ["upgrade"]) == only)
}

@Test func headerNamesCompareASCIICaseInsensitively() {
    // Against the definition: same UTF-8 length, bytes equal after folding A-Z to a-z (nothing else is folded).
    var rng = SystemRandomNumberGenerator()
    let alphabet: [String] = ["a", "A", "k", "K", "\u{212A}", "-", "z", "Z", "[", "{", "@", "`", "\u{E9}", "\u{C9}"]
    func fold(_ b: UInt8) -> UInt8 { (0x41...0x5A).contains(b) ? b + 0x20 : b }
    for _ in 0..<3_000 {
        let a = (0..<Int.random(in: 0...20, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
        let b = Bool.random(using: &rng) ? String(a.map { c -> Character in Bool.random() ? Character(c.uppercased()) : c })
            : (0..<Int.random(in: 0...20, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
        let expected = a.utf8.count == b.utf8.count && zip(a.utf8, b.utf8).allSatisfy { fold($0) == fold($1) }
        #expect(HTTPHeaders.equalsIgnoringCase(a, b) == expected, "\(a) vs \(b)")
    }
    #expect(HTTPHeaders.equalsIgnoringCase("Sec-WebSocket-Key", "sec-websocket-key"))
    #expect(!HTTPHeaders.equalsIgnoringCase("Sec-WebSocket-Key", "sec-websocket-kez"))
}

@Test func hasTokenIsASCIIOnly() {
    // U+212A KELVIN SIGN lowercases to an ASCII "k": `tokens` would call this "websocket"; the upgrade must not.
    let headers = HTTPHeaders([("Upgrade", "websoc\u{212A}et")])
    #expect(headers.tokens("Upgrade") == ["websocket"])
    #expect(!headers.hasToken("Upgrade", "websocket", .contains))
    #expect(HTTPHeaders([("Upgrade", "WebSocket")]).hasToken("Upgrade", "websocket", .only))
}

struct BadRequestCase: Sendable, CustomTestStringConvertible {
    let name: String, wire: String, status: Int, code: String
    var testDescription: String { name }
}

private let badRequests: [BadRequestCase] = [
    .init(name: "no target", wire: "GET\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "missing version", wire: "GET /\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "double space", wire: "GET  / HTTP/1.1\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "trailing space", wire: "GET / HTTP/1.1 \r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "lowercase http", wire: "GET / http/1.1\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "two-digit minor", wire: "GET / HTTP/1.10\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "invalid method char", wire: "G(T / HTTP/1.1\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "control char in target", wire: "GET /\u{01} HTTP/1.1\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "HTTP/2.0", wire: "GET / HTTP/2.0\r\n\r\n", status: 505, code: "VERSION_NOT_SUPPORTED"),
    .init(name: "HTTP/0.9", wire: "GET / HTTP/0.9\r\n\r\n", status: 505, code: "VERSION_NOT_SUPPORTED"),
    .init(name: "empty line before request line", wire: "\r\nGET / HTTP/1.1\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "bare LF", wire: "GET / HTTP/1.1\nHost: a\n\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "bare LF in headers", wire: "GET / HTTP/1.1\r\nHost: a\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "bare CR", wire: "GET / HTTP/1.1\rHost: a\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "obs-fold", wire: "GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "tab fold", wire: "GET / HTTP/1.1\r\nX: a\r\n\tb\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "space before colon", wire: "GET / HTTP/1.1\r\nHost : a\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "invalid name char", wire: "GET / HTTP/1.1\r\nHo(st: a\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "empty name", wire: "GET / HTTP/1.1\r\n: a\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "no colon", wire: "GET / HTTP/1.1\r\nHost a\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "NUL in value", wire: "GET / HTTP/1.1\r\nX: a\u{0}b\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "control in value", wire: "GET / HTTP/1.1\r\nX: a\u{1B}b\r\n\r\n", status: 400, code: "BAD_REQUEST"),
    .init(name: "DEL in value", wire: "GET / HTTP/1.1\r\nX: a\u{7F}\r\n\r\n", status: 400, code: "BAD_REQUEST"),
]

@Test(arguments: badRequests)
func rejectsMalformedRequests(_ c: BadRequestCase) {
    let wire = bytes(c.wire)
    for cut in [0, 1, wire.count / 2, wire.count] {
        switch parseRequestChunks([Array(wire[..<cut]), Array(wire[cut...])]) {
        case .success: Issue.record("accepted \(c.name)")
        case .failure(let e):
            #expect(e.status == c.status, "split at \(cut)")
            #expect(e.code == c.code, "split at \(cut)")
        }
    }
}

@Test func http10IsParseable() throws {
    let head = try parseRequestChunks([bytes("GET / HTTP/1.0\r\n\r\n")]).get().0
    #expect(head.versionMajor == 1 && head.versionMinor == 0)
    #expect(head.headers.count == 0)
}

@Test func lineLengthLimits() {
    let limits = HTTPParserLimits(maxLineLength: 32, maxHeaderCount: 64, maxHeadSize: 16 * 1024)
    // Request line: "GET " + target + " HTTP/1.1" = 13 + target.
    let ok = "GET /" + String(repeating: "a", count: 18) + " HTTP/1.1"
    #expect(ok.utf8.count == 32)
    #expect((try? parseRequestChunks([bytes(ok + "\r\n\r\n")], limits: limits).get()) != nil)
    let long = "GET /" + String(repeating: "a", count: 19) + " HTTP/1.1"
    guard case .failure(let e1) = parseRequestChunks([bytes(long + "\r\n\r\n")], limits: limits) else { Issue.record("accepted"); return }
    #expect(e1.status == 414 && e1.code == "URI_TOO_LONG")
    // Header line exactly 32 bytes, then 33.
    let header32 = "X: " + String(repeating: "v", count: 29)
    #expect((try? parseRequestChunks([bytes("GET / HTTP/1.1\r\n" + header32 + "\r\n\r\n")], limits: limits).get()) != nil)
    guard case .failure(let e2) = parseRequestChunks([bytes("GET / HTTP/1.1\r\n" + header32 + "v\r\n\r\n")], limits: limits) else {
        Issue.record("accepted"); return
    }
    #expect(e2.status == 431 && e2.code == "HEADER_TOO_LARGE")
}

@Test func headerCountLimit() {
    let limits = HTTPParserLimits(maxLineLength: 100, maxHeaderCount: 3, maxHeadSize: 16 * 1024)
    let three = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n"
    #expect((try? parseRequestChunks([bytes(three + "\r\n")], limits: limits).get())?.0.headers.count == 3)
    guard case .failure(let e) = parseRequestChunks([bytes(three + "D: 4\r\n\r\n")], limits: limits) else { Issue.record("accepted"); return }
    #expect(e.status == 431 && e.code == "HEADER_TOO_LARGE")
}

@Test func headSizeLimit() {
    let wire = bytes(validUpgrade)
    let exact = HTTPParserLimits(maxLineLength: 1000, maxHeaderCount: 64, maxHeadSize: wire.count)
    #expect((try? parseRequestChunks([wire], limits: exact).get())?.1 == wire.count)
    // Bytes after the head do not count against it.
    #expect((try? parseRequestChunks([wire + [0x81, 0x80]], limits: exact).get())?.1 == wire.count)
    let under = HTTPParserLimits(maxLineLength: 1000, maxHeaderCount: 64, maxHeadSize: wire.count - 1)
    guard case .failure(let e) = parseRequestChunks(wire.map { [$0] }, limits: under) else { Issue.record("accepted"); return }
    #expect(e.status == 431 && e.code == "HEADER_TOO_LARGE")
}

@Test func endlessHeaderIsRejectedWithoutUnboundedBuffering() {
    var parser = HTTPRequestParser()
    let chunk = [UInt8](repeating: UInt8(ascii: "a"), count: 1024)
    var error: HTTPError?
    _ = try? parser.parse(bytes("GET / HTTP/1.1\r\nX: "))
    for _ in 0..<20 where error == nil {
        do throws(HTTPError) { _ = try parser.parse(chunk) } catch let e { error = e }
    }
    #expect(error?.status == 431)
}
