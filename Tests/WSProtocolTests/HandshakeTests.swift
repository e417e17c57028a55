import Foundation
import Testing
@testable import WSProtocol

@Test func rfc6455AcceptExample() {
    #expect(WebSocketHandshake.acceptValue(forKey: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
}

@Test func full101Response() {
    let bytes = WebSocketHandshake.response101(key: Array("dGhlIHNhbXBsZSBub25jZQ==".utf8)[...], subprotocol: "chat",
                                               extensions: "permessage-deflate", extraHeaders: [("X-Hub", "1")])
    let expected = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
        "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Protocol: chat\r\n" +
        "Sec-WebSocket-Extensions: permessage-deflate\r\nX-Hub: 1\r\n\r\n"
    #expect(String(decoding: bytes, as: UTF8.self) == expected)
    let bare = WebSocketHandshake.response101(key: Array("dGhlIHNhbXBsZSBub25jZQ==".utf8)[...], subprotocol: nil, extensions: nil)
    #expect(String(decoding: bare, as: UTF8.self) == "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n" +
        "Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
}

/// The 101 written into a buffer made at its size (the hub's outbound chunk): the size asked for is the size written
/// (a buffer pre-filled with 0xAA keeps none of it) and the bytes are the response spelled out by hand, with and
/// without a subprotocol, extensions and an extra header, for keys of several lengths.
@Test func response101IntoABufferIsExactlyTheResponse() {
    for key in ["dGhlIHNhbXBsZSBub25jZQ==", "AAAAAAAAAAAAAAAAAAAAAA==", "x3JJHMbDL1EzLkh9GBhXDw=="] {
        for subprotocol in [nil, "chat", "hub.v1"] as [String?] {
            for extensions in [nil, "permessage-deflate; client_max_window_bits=10"] as [String?] {
                for extra in [[], [("X-Hub", "1")]] as [[(String, String)]] {
                    var expected = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        + "Sec-WebSocket-Accept: \(WebSocketHandshake.acceptValue(forKey: key))\r\n"
                    if let subprotocol { expected += "Sec-WebSocket-Protocol: \(subprotocol)\r\n" }
                    if let extensions { expected += "Sec-WebSocket-Extensions: \(extensions)\r\n" }
                    for (name, value) in extra { expected += "\(name): \(value)\r\n" }
                    expected += "\r\n"
                    let written = WebSocketHandshake.response101(key: Array(key.utf8)[...], subprotocol: subprotocol,
                                                                 extensions: extensions, extraHeaders: extra) {
                        count, fill -> [UInt8] in
                        var out = [UInt8](repeating: 0xAA, count: count)
                        out.withUnsafeMutableBytes { fill($0) }
                        return out
                    }
                    #expect(written == Array(expected.utf8), "\(key) \(String(describing: subprotocol)) \(String(describing: extensions))")
                }
            }
        }
    }
}

@Test func sha1AndBase64Vectors() {
    #expect(Base64.encode(SHA1.hash(Array("abc".utf8))) == "qZk+NkcGgWq6PiVxeFDCbJzQ2J0=")
    #expect(Base64.encode(Array("".utf8)) == "")
    #expect(Base64.encode(Array("f".utf8)) == "Zg==")
    #expect(Base64.encode(Array("fo".utf8)) == "Zm8=")
    #expect(Base64.encode(Array("foobar".utf8)) == "Zm9vYmFy")
    for length in 0...40 {  // both forms (one loop) against Foundation's encoder, padding included
        let input = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
        let expected = Data(input).base64EncodedString()
        var out = [UInt8](repeating: 0, count: (length + 2) / 3 * 4)
        let n = input.withUnsafeBufferPointer { src in
            out.withUnsafeMutableBufferPointer { dst in dst.baseAddress.map { Base64.encode(src, to: $0) } ?? 0 }
        }
        #expect(n == out.count && String(decoding: out, as: UTF8.self) == expected, "length \(length)")
        var appended = Array("prefix".utf8)
        Base64.encode(input, into: &appended)
        #expect(appended == Array(("prefix" + expected).utf8), "length \(length)")
        #expect(Base64.encode(input) == expected, "length \(length)")
    }
    #expect(Base64.decode("Zm8=") == Array("fo".utf8))
    #expect(Base64.decode("Zg==") == Array("f".utf8))
    for bad in ["Zg=", "Z===", "Zh==", "Zm9=", "Zg==Zg==", "Zm 8", "Zm8*"] { #expect(Base64.decode(bad) == nil, "\(bad)") }
}

/// The accept value is hashed and encoded in place from the key's bytes; checked against the definition,
/// Base64(SHA-1(key + GUID)) built from `String`s and arrays (Foundation's Base64), for keys of every length up to 64.
@Test func acceptValueMatchesItsDefinition() {
    var rng = SystemRandomNumberGenerator()
    for length in 0...64 {
        let key = String((0..<length).map { _ in Character(Unicode.Scalar(UInt8.random(in: 0x21...0x7E, using: &rng))) })
        let expected = Data(SHA1.hash(Array((key + "\(WebSocketHandshake.guid)").utf8))).base64EncodedString()
        #expect(WebSocketHandshake.acceptValue(forKey: key) == expected, "\(key)")
        let bytes = WebSocketHandshake.withAcceptValue(forKey: Array(key.utf8)[...]) { Array($0) }
        #expect(bytes == Array(expected.utf8))
    }
}

/// `decodedCount` (the key check, which keeps no bytes) accepts exactly what `decode` accepts, with its length.
@Test func base64DecodedCountAgreesWithDecode() {
    var rng = SystemRandomNumberGenerator()
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=*".utf8)
    var valid = 0
    for _ in 0..<20_000 {
        let text = (0..<Int.random(in: 0...12, using: &rng)).map { _ in alphabet.randomElement(using: &rng) ?? 0 }
        let decoded = Base64.decode(String(decoding: text, as: UTF8.self))
        #expect(Base64.decodedCount(text[...]) == decoded?.count, "\(String(decoding: text, as: UTF8.self))")
        if decoded != nil { valid += 1 }
    }
    #expect(valid > 100, "the random texts include valid ones")
    let key = Array("xx dGhlIHNhbXBsZSBub25jZQ== yy".utf8)
    #expect(Base64.decodedCount(key[3..<27]) == 16, "a slice that does not start at 0")
}

private func head(_ lines: [String], method: String = "GET", version: String = "HTTP/1.1") throws -> HTTPRequestHead {
    let wire = "\(method) /ws \(version)\r\n" + lines.map { $0 + "\r\n" }.joined() + "\r\n"
    return try parseRequestChunks([Array(wire.utf8)]).get().0
}

private let goodLines = ["Host: hub.example", "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                 "Sec-WebSocket-Version: 13"]

@Test func validUpgradeIsAccepted() throws {
    let lines = ["host: hub.example", "upgrade: WebSocket", "connection: keep-alive, Upgrade", "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
                 "sec-websocket-version: 13", "Sec-WebSocket-Protocol: Chat.v2, json", "Sec-WebSocket-Protocol: msgpack",
                 "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits, x-foo; a=\"1\"; b=c",
                 "Sec-WebSocket-Extensions: permessage-deflate;server_max_window_bits=\"10\""]
    let request = try WebSocketHandshake.validateUpgrade(head(lines))
    #expect(request.key == "dGhlIHNhbXBsZSBub25jZQ==")
    #expect(request.subprotocols == ["Chat.v2", "json", "msgpack"])
    #expect(request.extensions == [
        ExtensionOffer(name: "permessage-deflate", parameters: [.init(name: "client_max_window_bits")]),
        ExtensionOffer(name: "x-foo", parameters: [.init(name: "a", value: "1"), .init(name: "b", value: "c")]),
        ExtensionOffer(name: "permessage-deflate", parameters: [.init(name: "server_max_window_bits", value: "10")]),
    ])
}

struct UpgradeCase: Sendable, CustomTestStringConvertible {
    let name: String, lines: [String], method: String, version: String, status: Int, code: String, header: (String, String)?
    var testDescription: String { name }
    init(_ name: String, _ lines: [String], method: String = "GET", version: String = "HTTP/1.1",
         _ status: Int, _ code: String, header: (String, String)? = nil) {
        self.name = name; self.lines = lines; self.method = method; self.version = version
        self.status = status; self.code = code; self.header = header
    }
}

private func replacing(_ name: String, with line: String?) -> [String] {
    goodLines.compactMap { $0.hasPrefix(name + ":") ? line : $0 }
}

private let upgradeCases: [UpgradeCase] = [
    .init("POST", goodLines, method: "POST", 405, "METHOD_NOT_ALLOWED", header: ("Allow", "GET")),
    .init("HTTP/1.0", goodLines, version: "HTTP/1.0", 505, "VERSION_NOT_SUPPORTED"),
    .init("no Host", replacing("Host", with: nil), 400, "BAD_REQUEST"),
    .init("two Hosts", goodLines + ["Host: other"], 400, "BAD_REQUEST"),
    .init("no Upgrade", replacing("Upgrade", with: nil), 426, "UPGRADE_REQUIRED", header: ("Upgrade", "websocket")),
    .init("Upgrade: h2c", replacing("Upgrade", with: "Upgrade: h2c"), 426, "UPGRADE_REQUIRED", header: ("Upgrade", "websocket")),
    .init("no Connection upgrade", replacing("Connection", with: "Connection: keep-alive"), 426, "UPGRADE_REQUIRED",
          header: ("Upgrade", "websocket")),
    .init("version 8", replacing("Sec-WebSocket-Version", with: "Sec-WebSocket-Version: 8"), 426, "UNSUPPORTED_WEBSOCKET_VERSION",
          header: ("Sec-WebSocket-Version", "13")),
    .init("no version", replacing("Sec-WebSocket-Version", with: nil), 426, "UNSUPPORTED_WEBSOCKET_VERSION",
          header: ("Sec-WebSocket-Version", "13")),
    .init("versions 13, 8", replacing("Sec-WebSocket-Version", with: "Sec-WebSocket-Version: 13, 8"), 426,
          "UNSUPPORTED_WEBSOCKET_VERSION", header: ("Sec-WebSocket-Version", "13")),
    .init("no key", replacing("Sec-WebSocket-Key", with: nil), 400, "BAD_REQUEST"),
    .init("two keys", goodLines + ["Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="], 400, "BAD_REQUEST"),
    .init("key of 15 bytes", replacing("Sec-WebSocket-Key", with: "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25j"), 400, "BAD_REQUEST"),
    .init("key of 17 bytes", replacing("Sec-WebSocket-Key", with: "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZTE="), 400, "BAD_REQUEST"),
    .init("key not base64", replacing("Sec-WebSocket-Key", with: "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ!!"), 400, "BAD_REQUEST"),
    .init("bad extension syntax", goodLines + ["Sec-WebSocket-Extensions: permessage-deflate; =1"], 400, "BAD_REQUEST"),
    .init("unterminated quote", goodLines + ["Sec-WebSocket-Extensions: a; b=\"1"], 400, "BAD_REQUEST"),
    .init("quoted non-token", goodLines + ["Sec-WebSocket-Extensions: a; b=\"1 2\""], 400, "BAD_REQUEST"),
    .init("bad subprotocol", goodLines + ["Sec-WebSocket-Protocol: a b"], 400, "BAD_REQUEST"),
]

@Test(arguments: upgradeCases)
func invalidUpgradesAreRefused(_ c: UpgradeCase) throws {
    let h = try head(c.lines, method: c.method, version: c.version)
    do {
        _ = try WebSocketHandshake.validateUpgrade(h)
        Issue.record("accepted")
    } catch {
        #expect(error.status == c.status)
        #expect(error.code == c.code)
        if let header = c.header {
            #expect(error.headers.contains { $0.0 == header.0 && $0.1 == header.1 })
        }
        let response = String(decoding: error.response(), as: UTF8.self)
        #expect(response.hasPrefix("HTTP/1.1 \(c.status) "))
        #expect(response.contains("\r\nConnection: close\r\n"))
        #expect(response.contains("\"code\":\"\(c.code)\""))
    }
}

@Test func subprotocolSelectionFollowsServerPreference() {
    #expect(WebSocketHandshake.selectSubprotocol(offered: ["json", "msgpack"], supported: ["msgpack", "json"]) == "msgpack")
    #expect(WebSocketHandshake.selectSubprotocol(offered: ["JSON"], supported: ["json"]) == nil)
    #expect(WebSocketHandshake.selectSubprotocol(offered: [], supported: ["json"]) == nil)
}

@Test func errorResponseBytesAndJSONEscaping() {
    let e = HTTPError(status: 405, code: "METHOD_NOT_ALLOWED", message: "say \"GET\"\\\n\u{01}é", headers: [("Allow", "GET")])
    let body = "{\"error\":{\"code\":\"METHOD_NOT_ALLOWED\",\"message\":\"say \\\"GET\\\"\\\\\\n\\u0001é\"}}"
    let expected = "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: application/json\r\nAllow: GET\r\nConnection: close\r\n" +
        "Content-Length: \(body.utf8.count)\r\n\r\n" + body
    #expect(String(decoding: e.response(), as: UTF8.self) == expected)
}

@Test func responseBuilder() {
    #expect(String(decoding: HTTPResponse.make(status: 204, headers: [], body: []), as: UTF8.self) == "HTTP/1.1 204 No Content\r\n\r\n")
    #expect(String(decoding: HTTPResponse.make(status: 200, headers: [("Content-Length", "2")], body: Array("ok".utf8)), as: UTF8.self)
        == "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    #expect(String(decoding: HTTPResponse.json(status: 404, body: "{}"), as: UTF8.self)
        == "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    #expect(HTTPResponse.reasonPhrase(431) == "Request Header Fields Too Large")
    #expect(HTTPResponse.reasonPhrase(599) == "Unknown")
}

// MARK: - Client side

private func parseResponse(_ wire: [UInt8]) throws(HTTPError) -> (HTTPResponseHead, Int) {
    var parser = HTTPResponseParser()
    var consumed = 0
    for (i, byte) in wire.enumerated() {
        if case .complete(let head, let c) = try parser.parse([byte]) {
            consumed = i + c
            return (head, consumed)
        }
    }
    throw HTTPError(status: 0, code: "INCOMPLETE", message: "")
}

@Test func clientServerRoundTrip() throws {
    let key = ClientHandshake.makeKey()
    #expect(Base64.decode(key)?.count == 16)
    #expect(ClientHandshake.makeKey() != key)
    let deflate = PerMessageDeflateConfiguration(clientMaxWindowBits: 12)
    let request = ClientHandshake.request(host: "hub:8080", path: "/ws?t=1", key: key, subprotocols: ["v2", "v1"],
                                          extraHeaders: [("Authorization", "Bearer x")], deflate: deflate)
    let upgrade = try WebSocketHandshake.validateUpgrade(parseRequestChunks([request]).get().0)
    #expect(upgrade.head.queryValue("t") == "1")
    #expect(upgrade.head.headers[first: "authorization"] == "Bearer x")
    let proto = WebSocketHandshake.selectSubprotocol(offered: upgrade.subprotocols, supported: ["v1", "v2"])
    let negotiated = try #require(PerMessageDeflate.negotiate(offers: upgrade.extensions, configuration: PerMessageDeflateConfiguration()))
    let wire = WebSocketHandshake.response101(key: upgrade.keyBytes, subprotocol: proto, extensions: negotiated.responseHeaderValue)
    let (response, consumed) = try parseResponse(wire + [0x81, 0x00])
    #expect(consumed == wire.count)
    #expect(response.status == 101 && response.reason == "Switching Protocols")
    let result = try ClientHandshake.verify(response, key: key, offeredSubprotocols: ["v2", "v1"], deflate: deflate)
    #expect(result.subprotocol == "v1")
    #expect(result.deflate == negotiated.parameters)
    #expect(result.deflate?.clientMaxWindowBits == 12)
}

struct VerifyCase: Sendable, CustomTestStringConvertible {
    let name: String, wire: String, error: ClientHandshakeError
    var testDescription: String { name }
}

private let accept = "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
private let verifyCases: [VerifyCase] = [
    .init(name: "status 200", wire: "HTTP/1.1 200 OK\r\n\r\n", error: .unexpectedStatus(200)),
    .init(name: "no Upgrade", wire: "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n" + accept + "\r\n", error: .missingUpgrade),
    .init(name: "no Connection", wire: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n" + accept + "\r\n",
          error: .missingConnection),
    .init(name: "wrong accept", wire: "HTTP/1.1 101 x\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Accept: AAAA\r\n\r\n",
          error: .invalidAccept),
    .init(name: "unoffered subprotocol",
          wire: "HTTP/1.1 101 x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n" + accept + "Sec-WebSocket-Protocol: v3\r\n\r\n",
          error: .unexpectedSubprotocol("v3")),
    .init(name: "unoffered extension",
          wire: "HTTP/1.1 101 x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n" + accept + "Sec-WebSocket-Extensions: x-foo\r\n\r\n",
          error: .invalidExtensions("the server answered with extensions that were not offered")),
    .init(name: "window above request",
          wire: "HTTP/1.1 101 x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n" + accept +
              "Sec-WebSocket-Extensions: permessage-deflate; server_max_window_bits=15\r\n\r\n",
          error: .invalidExtensions("server_max_window_bits=15 exceeds the requested 10")),
    .init(name: "client bits without value",
          wire: "HTTP/1.1 101 x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n" + accept +
              "Sec-WebSocket-Extensions: permessage-deflate; server_max_window_bits=10; client_max_window_bits\r\n\r\n",
          error: .invalidExtensions("client_max_window_bits in a response needs a value")),
    .init(name: "unknown parameter",
          wire: "HTTP/1.1 101 x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n" + accept +
              "Sec-WebSocket-Extensions: permessage-deflate; server_max_window_bits=10; foo\r\n\r\n",
          error: .invalidExtensions("invalid permessage-deflate parameters")),
]

@Test(arguments: verifyCases)
func clientRejectsBadResponses(_ c: VerifyCase) throws {
    let (response, _) = try parseResponse(Array(c.wire.utf8))
    #expect(throws: c.error) {
        try ClientHandshake.verify(response, key: "dGhlIHNhbXBsZSBub25jZQ==", offeredSubprotocols: ["v1"],
                                   deflate: PerMessageDeflateConfiguration(serverMaxWindowBits: 10))
    }
}

@Test func clientAcceptsDeclinedDeflate() throws {
    let (response, _) = try parseResponse(Array(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
        accept + "\r\n").utf8))
    let r = try ClientHandshake.verify(response, key: "dGhlIHNhbXBsZSBub25jZQ==", offeredSubprotocols: [],
                                       deflate: PerMessageDeflateConfiguration())
    #expect(r == ClientHandshakeResult(subprotocol: nil, deflate: nil))
}

@Test(arguments: ["HTTP/1.1 101\r\n\r\n", "HTTP/1.1 101 \r\n\r\n"])
func statusLineWithoutReason(_ wire: String) throws {
    let (r, _) = try parseResponse(Array(wire.utf8))
    #expect(r.status == 101 && r.reason == "")
}

@Test(arguments: ["HTTP/1.1 10\r\n\r\n", "HTTP/1.1 abc OK\r\n\r\n", "HTTP/2.0 101 x\r\n\r\n", "HTTP/1.1 101x\r\n\r\n",
                  "HTTP/1.1 099 x\r\n\r\n", "HTTP/1.1 101 ok\nUpgrade: x\r\n\r\n"])
func malformedStatusLines(_ wire: String) {
    #expect(throws: HTTPError.self) { try parseResponse(Array(wire.utf8)) }
}
