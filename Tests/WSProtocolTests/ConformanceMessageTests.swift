import Testing
@testable import WSProtocol

// Autobahn|Testsuite-style categories 5-7, driven through MessageReader (server role) at every split.

func closeBody(_ code: UInt16, _ reason: [UInt8] = []) -> [UInt8] { [UInt8(code >> 8), UInt8(code & 0xFF)] + reason }

@Suite("Autobahn 5 Fragmentation")
struct Autobahn5Fragmentation {
    static let cases: [WireCase] = [
        WireCase("5.1 ping in 2 fragments", wsFrame(0x9, Array("frag".utf8), fin: false) + cont("ment"), error: .fragmentedControlFrame, code: 1002),
        WireCase("5.2 pong in 2 fragments", wsFrame(0xA, Array("frag".utf8), fin: false) + cont("ment"), error: .fragmentedControlFrame, code: 1002),
        WireCase("5.3 text in 2 fragments", text("frag", fin: false) + cont("ment"), [.text("fragment")]),
        WireCase("5.5 text in 2 fragments (1 byte reads via splits)", text("f", fin: false) + cont("ragment"), [.text("fragment")]),
        WireCase("5.6 text, ping in between", text("frag", fin: false) + wsFrame(0x9, Array("ping".utf8)) + cont("ment"),
                 [.ping(Array("ping".utf8)), .text("fragment")]),
        WireCase("5.8 text, pong and ping in between", text("fr", fin: false) + wsFrame(0xA, []) + cont("ag", fin: false) + wsFrame(0x9, []) + cont("ment"),
                 [.pong([]), .ping([]), .text("fragment")]),
        WireCase("5.9 unexpected continuation (fin)", cont("fragment") + text("after"), error: .unexpectedContinuation, code: 1002),
        WireCase("5.12 unexpected continuation (no fin)", cont("fragment", fin: false), error: .unexpectedContinuation, code: 1002),
        WireCase("5.15 text, continuation, then continuation of nothing", text("fr", fin: false) + cont("ag") + cont("ment", fin: false) + cont("x"),
                 [.text("frag")], error: .unexpectedContinuation, code: 1002),
        WireCase("5.18 text without fin, then a new text", text("fr", fin: false) + text("ag"), error: .expectedContinuation, code: 1002),
        WireCase("5.x binary without fin, then a new text", wsFrame(0x2, [1], fin: false) + text("x"), error: .expectedContinuation, code: 1002),
        WireCase("5.19 text in 5 fragments, pings between", text("f", fin: false) + cont("r", fin: false) + wsFrame(0x9, [1])
                 + cont("a", fin: false) + cont("g", fin: false) + wsFrame(0x9, [2]) + cont("ment"),
                 [.ping([1]), .ping([2]), .text("fragment")]),
        WireCase("empty fragments form an empty message", text("", fin: false) + cont("", fin: false) + cont(""), [.text("")]),
        WireCase("binary in 3 fragments", wsFrame(0x2, [1, 2], fin: false) + contBytes([3], fin: false) + contBytes([4, 5]), [.binary([1, 2, 3, 4, 5])]),
        WireCase("close between fragments", text("fr", fin: false) + wsFrame(0x8, closeBody(1000)) + cont("ag"),
                 [.close(1000, [])], error: .frameAfterClose, code: 1002),
    ]

    @Test(arguments: cases) func fragmentation(_ c: WireCase) { checkEverySplit(c) }
}

@Suite("Autobahn 6 UTF-8 handling")
struct Autobahn6UTF8 {
    static let kosme: [UInt8] = Array("κόσμε".utf8)
    static let cases: [WireCase] = [
        WireCase("6.1.1 empty text", text(""), [.text("")]),
        WireCase("6.1.2 three empty fragments", text("", fin: false) + cont("", fin: false) + cont(""), [.text("")]),
        WireCase("6.2.1 valid UTF-8 in one fragment", text("Hello-µ@ßöäüàá-UTF-8!!"), [.text("Hello-µ@ßöäüàá-UTF-8!!")]),
        WireCase("6.2.3 valid UTF-8 split inside code points", textBytes(Array(kosme[0..<1]), fin: false) + contBytes(Array(kosme[1..<4]), fin: false)
                 + contBytes(Array(kosme[4...])), [.text(kosme)]),
        WireCase("6.2.4 4-byte code point in 4 fragments", textBytes([0xF0], fin: false) + contBytes([0x9D], fin: false)
                 + contBytes([0x84], fin: false) + contBytes([0x9E]), [.text([0xF0, 0x9D, 0x84, 0x9E])]),
        WireCase("6.3.1 invalid (surrogate) in one frame", textBytes(kosme + [0xED, 0xA0, 0x80] + Array("edited".utf8)), error: .invalidUTF8, code: 1007),
        WireCase("6.3.2 invalid, split into fragments", textBytes(Array(kosme[0..<3]), fin: false) + contBytes(Array(kosme[3...]) + [0xED, 0xA0], fin: false)
                 + contBytes([0x80] + Array("edited".utf8)), error: .invalidUTF8, code: 1007),
        // 6.4.x fail fast: the stream stops right after the bad fragment; the message is never finished.
        WireCase("6.4.1 fail fast on the fragment holding the invalid byte", textBytes(kosme, fin: false) + contBytes([0xF4, 0x90, 0x80, 0x80], fin: false),
                 error: .invalidUTF8, code: 1007),
        WireCase("6.4.2 fail fast on the invalid byte (fragmented)", textBytes(kosme + [0xF4], fin: false) + contBytes([0x90], fin: false),
                 error: .invalidUTF8, code: 1007),
        // Single frame cut off after the invalid byte: the frame is not complete, yet it fails.
        WireCase("6.4.3 fail fast mid-frame", Array(textBytes(kosme + [0xF4, 0x90, 0x80, 0x80] + bytes(50, 0x41)).prefix(6 + kosme.count + 2)),
                 error: .invalidUTF8, code: 1007),
        WireCase("6.4.4 fail fast mid-frame, bad byte last", Array(textBytes([0xCE, 0xBA, 0xE1, 0xBD, 0xB9, 0xCF, 0x83, 0xCE, 0xBC, 0xCE, 0xB5, 0xF4, 0x90] + bytes(40)).prefix(6 + 13)),
                 error: .invalidUTF8, code: 1007),
        WireCase("6.6 truncated code point at message end", textBytes(Array(kosme.dropLast())), error: .invalidUTF8, code: 1007),
        WireCase("6.6 truncated code point at end of fragmented message", textBytes([0x41], fin: false) + contBytes([0xE2, 0x82]), error: .invalidUTF8, code: 1007),
        WireCase("6.8 U+10FFFF ok", textBytes([0xF4, 0x8F, 0xBF, 0xBF]), [.text([0xF4, 0x8F, 0xBF, 0xBF])]),
        WireCase("6.8 U+110000 invalid", textBytes([0xF4, 0x90, 0x80, 0x80]), error: .invalidUTF8, code: 1007),
        WireCase("6.9 overlong slash", textBytes([0xC0, 0xAF]), error: .invalidUTF8, code: 1007),
        WireCase("6.10 overlong 3 bytes", textBytes([0xE0, 0x80, 0xAF]), error: .invalidUTF8, code: 1007),
        WireCase("6.11 lone continuation", textBytes([0x80]), error: .invalidUTF8, code: 1007),
        WireCase("6.12 FE", textBytes([0xFE]), error: .invalidUTF8, code: 1007),
        WireCase("6.13 max surrogate DFFF", textBytes([0xED, 0xBF, 0xBF]), error: .invalidUTF8, code: 1007),
        WireCase("binary is not validated", wsFrame(0x2, [0xFF, 0xED, 0xA0, 0x80]), [.binary([0xFF, 0xED, 0xA0, 0x80])]),
        WireCase("ping between fragments does not disturb UTF-8 state", textBytes([0xE2], fin: false) + wsFrame(0x9, [0xFF]) + contBytes([0x82, 0xAC]),
                 [.ping([0xFF]), .text([0xE2, 0x82, 0xAC])]),
    ]

    @Test(arguments: cases) func utf8(_ c: WireCase) { checkEverySplit(c) }
}

@Suite("Autobahn 7 Close handling")
struct Autobahn7Close {
    static let cases: [WireCase] = [
        WireCase("7.1.1 text then close", text("Hello") + wsFrame(0x8, closeBody(1000)), [.text("Hello"), .close(1000, [])]),
        WireCase("7.1.2 close twice", wsFrame(0x8, closeBody(1000)) + wsFrame(0x8, closeBody(1000)), [.close(1000, [])], error: .frameAfterClose, code: 1002),
        WireCase("7.1.3 ping after close", wsFrame(0x8, closeBody(1000)) + wsFrame(0x9, []), [.close(1000, [])], error: .frameAfterClose, code: 1002),
        WireCase("7.1.4 text after close", wsFrame(0x8, []) + text("x"), [.close(nil, [])], error: .frameAfterClose, code: 1002),
        WireCase("7.1.5 fragment, close, continuation", text("fr", fin: false) + wsFrame(0x8, closeBody(1000)) + cont("ag"),
                 [.close(1000, [])], error: .frameAfterClose, code: 1002),
        WireCase("7.3.1 close with empty body", wsFrame(0x8, []), [.close(nil, [])]),
        WireCase("7.3.2 close with 1-byte body", wsFrame(0x8, [0x03]), error: .invalidCloseBodyLength, code: 1002),
        WireCase("7.3.3 close with code only", wsFrame(0x8, closeBody(1000)), [.close(1000, [])]),
        WireCase("7.3.4 close with code and reason", wsFrame(0x8, closeBody(1000, Array("Hello World!".utf8))), [.close(1000, Array("Hello World!".utf8))]),
        WireCase("7.3.5 close with 123-byte reason", wsFrame(0x8, closeBody(1000, bytes(123))), [.close(1000, bytes(123))]),
        WireCase("7.3.6 close with 124-byte reason", wsFrame(0x8, closeBody(1000, bytes(124))), error: .controlFrameTooLong(126), code: 1002),
        WireCase("7.5.1 close reason with invalid UTF-8", wsFrame(0x8, closeBody(1000, Array("κόσμε".utf8) + [0xED, 0xA0, 0x80])), error: .invalidUTF8, code: 1007),
        WireCase("close reason with truncated UTF-8", wsFrame(0x8, closeBody(1000, [0xCE])), error: .invalidUTF8, code: 1007),
    ] + [UInt16](arrayLiteral: 1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999).map { code in
        WireCase("7.7 valid close code \(code)", wsFrame(0x8, closeBody(code)), [.close(code, [])])
    } + [UInt16](arrayLiteral: 0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535).map { code in
        WireCase("7.9 invalid close code \(code)", wsFrame(0x8, closeBody(code)), error: .invalidCloseCode(code), code: 1002)
    }

    @Test(arguments: cases) func close(_ c: WireCase) { checkEverySplit(c) }
}

@Suite("Close frame and handshake")
struct CloseHandshakeTests {
    @Test func closePayloadEncodesCodeAndReason() {
        #expect(closePayload(code: .normalClosure, reason: "") == [0x03, 0xE8])
        #expect(closePayload(code: .messageTooBig, reason: "big") == [0x03, 0xF1] + Array("big".utf8))
    }

    @Test func closePayloadTruncatesAtACharacterBoundary() {
        // 61 two-byte characters = 122 bytes, then a 4-byte one that does not fit in 123.
        let reason = String(repeating: "é", count: 61) + "𝄞" + "tail"
        let body = closePayload(code: .goingAway, reason: reason)
        #expect(body.count == 2 + 122)
        #expect(String(validating: body[2...], as: UTF8.self) == String(repeating: "é", count: 61))
        let ascii = closePayload(code: .goingAway, reason: String(repeating: "a", count: 200))
        #expect(ascii.count == 125)
        // And the reader accepts what we build.
        let out = readAll([wsFrame(0x8, body)])
        #expect(out.error == nil)
        #expect(out.messages == [.close(1001, Array(body[2...]))])
    }

    @Test func serverEchoesAndClosesTCP() {
        var h = CloseHandshake(role: .server)
        #expect(h.peerSentClose(code: 1000) == .sendClose(code: .normalClosure, thenCloseTCP: true))
        #expect(h.state == .closed)
        #expect(h.close(code: .goingAway) == .none)
        #expect(h.peerSentClose(code: 1000) == .none)
    }

    @Test func serverInitiatedClosesTCPOnReply() {
        var h = CloseHandshake(role: .server)
        #expect(h.close(code: .goingAway) == .sendClose(code: .goingAway, thenCloseTCP: false))
        #expect(h.state == .closeSent)
        #expect(h.close(code: .goingAway) == .none, "close is sent once")
        #expect(h.peerSentClose(code: 1001) == .closeTCP)
    }

    @Test func clientWaitsForServerToCloseTCP() {
        var a = CloseHandshake(role: .client)
        #expect(a.peerSentClose(code: nil) == .sendClose(code: nil, thenCloseTCP: false))
        var b = CloseHandshake(role: .client)
        _ = b.close(code: .normalClosure)
        #expect(b.peerSentClose(code: 1000) == .awaitTCPClose)
    }

    @Test func violationFailsTheConnection() {
        var h = CloseHandshake(role: .server)
        #expect(h.violation(ProtocolViolation(.invalidUTF8)) == .sendClose(code: .invalidPayloadData, thenCloseTCP: true))
        var s = CloseHandshake(role: .server)
        _ = s.close(code: .goingAway)
        #expect(s.violation(ProtocolViolation(.frameAfterClose)) == .closeTCP)
    }
}
