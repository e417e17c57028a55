import Testing
@testable import WSProtocol

@Suite("MessageReader")
struct MessageReaderTests {
    @Test func singleFrameMessageIsZeroCopy() throws {
        var wire = text("Hello") + wsFrame(0x2, [1, 2, 3]) + wsFrame(0x9, [9])
        var reader = MessageReader(configuration: .init(role: .server))
        var inside = 0
        try wire.withUnsafeMutableBytes { raw in
            let range = UInt(bitPattern: raw.baseAddress!)..<UInt(bitPattern: raw.baseAddress! + raw.count)
            let consumed = try reader.read(raw) { message in
                switch message {
                case .text(let p), .binary(let p), .ping(let p):
                    if range.contains(UInt(bitPattern: p.baseAddress!)) { inside += 1 }
                default: break
                }
                return .continue
            }
            #expect(consumed == raw.count)
        }
        #expect(inside == 3)
        #expect(Array(wire[6..<11]) == Array("Hello".utf8), "unmasked in place")
    }

    @Test func stopReturnsConsumedAndResumes() throws {
        var wire = text("one") + text("two") + text("three")
        var reader = MessageReader(configuration: .init(role: .server))
        var seen: [Msg] = []
        var offset = 0
        var calls = 0
        while offset < wire.count {
            calls += 1
            let consumed = try wire.withUnsafeMutableBytes { raw in
                try reader.read(UnsafeMutableRawBufferPointer(rebasing: raw[offset...])) { seen.append(Msg($0)); return .stop }
            }
            #expect(consumed > 0)
            offset += consumed
        }
        #expect(calls == 3)
        #expect(seen == [.text("one"), .text("two"), .text("three")])
    }

    @Test func readerIsReusableAcrossMessagesAndBuffers() {
        var rng = SplitMix64(seed: 7)
        var wire: [UInt8] = []
        var expected: [Msg] = []
        for i in 0..<200 {
            let s = String(repeating: "x", count: i)
            wire += text(String(s.prefix(i / 2)), fin: false) + cont(String(s.dropFirst(i / 2)))
            expected.append(.text(s))
        }
        let out = readAll(randomSplit(wire, maxChunk: 50, using: &rng))
        #expect(out.error == nil)
        #expect(out.messages == expected)
    }

    @Test func closeIsRememberedAndReported() throws {
        var wire = wsFrame(0x8, closeBody(4001, Array("bye".utf8)))
        var reader = MessageReader(configuration: .init(role: .server))
        #expect(!reader.hasReceivedClose)
        var got: Msg?
        _ = try wire.withUnsafeMutableBytes { raw in try reader.read(raw) { got = Msg($0); return .continue } }
        #expect(got == .close(4001, Array("bye".utf8)))
        #expect(reader.hasReceivedClose)
    }

    @Test func defaultsAreDocumentedValues() {
        let c = MessageReaderConfiguration(role: .server)
        #expect(c.maxFrameSize == 1 << 20)
        #expect(c.maxMessageSize == 1 << 20)
    }
}
