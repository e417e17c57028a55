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

/// `isAtRest` is what lets the hub drop an idle connection's reader (ClientConnection) and make a fresh one for the
/// next bytes: a reader replaced by a fresh one whenever it says it is at rest must read every stream, split any
/// way, exactly as one reader kept throughout: the same messages, the same violation.
@Suite("MessageReader at rest")
struct MessageReaderAtRestTests {
    static func read(_ chunks: [[UInt8]], dropAtRest: Bool) -> (messages: [Msg], error: ProtocolViolation?, drops: Int) {
        let configuration = MessageReaderConfiguration(role: .server, maxFrameSize: 300, maxMessageSize: 300)
        var reader: MessageReader? = nil
        var messages: [Msg] = []
        var drops = 0
        for chunk in chunks {
            var copy = chunk
            var r = reader ?? MessageReader(configuration: configuration)
            do {
                _ = try copy.withUnsafeMutableBytes { raw in try r.read(raw) { messages.append(Msg($0)); return .continue } }
            } catch let error as ProtocolViolation {
                return (messages, error, drops)
            } catch {
                Issue.record("unexpected error \(error)")
                return (messages, nil, drops)
            }
            if dropAtRest && r.isAtRest { reader = nil; drops += 1 } else { reader = r }
        }
        return (messages, nil, drops)
    }

    @Test func aReaderDroppedAtRestReadsLikeOneKeptThroughout() {
        var rng = SplitMix64(seed: 12)
        var dropped = 0
        for round in 0..<400 {
            var wire: [UInt8] = []
            for _ in 0..<Int.random(in: 1...8, using: &rng) {
                switch Int.random(in: 0..<6, using: &rng) {
                case 0: wire += text(String(repeating: "a", count: Int.random(in: 0...200, using: &rng)))
                case 1: wire += text("frag", fin: false) + wsFrame(0x9, [1, 2]) + cont("ment")
                case 2: wire += wsFrame(0x9, Array(repeating: 7, count: Int.random(in: 0...125, using: &rng)))
                case 3: wire += wsFrame(0xA, [])
                case 4: wire += wsFrame(0x2, Array(repeating: 1, count: Int.random(in: 0...290, using: &rng)))
                default: wire += textBytes([0xC3], fin: false) + contBytes([0xA9])  // "é" split across fragments
                }
            }
            switch round % 4 {
            case 0: wire += wsFrame(0x8, closeBody(1000)) + text("after close")  // a frame after close: 1002
            case 1: wire += textBytes([0xFF])  // invalid UTF-8: 1007
            case 2: wire += text(String(repeating: "b", count: 301))  // over the limit: 1009
            default: break
            }
            let chunks = randomSplit(wire, maxChunk: Int.random(in: 1...40, using: &rng), using: &rng)
            let kept = Self.read(chunks, dropAtRest: false)
            let fresh = Self.read(chunks, dropAtRest: true)
            #expect(fresh.messages == kept.messages, "round \(round)")
            #expect(fresh.error == kept.error, "round \(round)")
            dropped += fresh.drops
        }
        #expect(dropped > 100, "readers were dropped \(dropped) times")  // 261 with this seed
    }

    @Test func notAtRestWhileAnythingIsPending() throws {
        var reader = MessageReader(configuration: .init(role: .server))
        #expect(reader.isAtRest)
        func feed(_ bytes: [UInt8]) throws {
            var copy = bytes
            _ = try copy.withUnsafeMutableBytes { raw in try reader.read(raw) { _ in .continue } }
        }
        let ping = wsFrame(0x9, [1, 2, 3])
        try feed(Array(ping.prefix(1)))  // half a header
        #expect(!reader.isAtRest)
        try feed(Array(ping.dropFirst()))
        #expect(reader.isAtRest)
        let whole = text("hello")
        try feed(Array(whole.prefix(8)))  // header and part of the payload
        #expect(!reader.isAtRest)
        try feed(Array(whole.dropFirst(8)))
        #expect(reader.isAtRest)
        try feed(text("one", fin: false))  // a fragmented message begun
        #expect(!reader.isAtRest)
        try feed(cont("two"))
        #expect(reader.isAtRest)
        try feed(wsFrame(0x8, closeBody(1000)))  // after a close, every frame is a violation: keep that knowledge
        #expect(!reader.isAtRest)
        var poisoned = MessageReader(configuration: .init(role: .server))
        var bad = textBytes([0xFF])
        _ = try? bad.withUnsafeMutableBytes { raw in try poisoned.read(raw) { _ in .continue } }
        #expect(poisoned.violation != nil && !poisoned.isAtRest)
        #expect(!MessageReader(configuration: .init(role: .server), decompressor: CopyDecompressor()).isAtRest)
    }
}
