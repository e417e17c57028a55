import Testing
@testable import WSProtocol

// Autobahn|Testsuite-style categories 9 (limits and large messages) and 10 (misc).

@Suite("Autobahn 9 Limits")
struct Autobahn9Limits {
    @Test(arguments: [64 << 10, 256 << 10, 1 << 20, 4 << 20])
    func largeMessagesWithRandomSplits(size: Int) {
        let seed = UInt64(size) ^ 0x9
        var rng = SplitMix64(seed: seed)
        let payload = (0..<size).map { UInt8(truncatingIfNeeded: ($0 % 95) + 32) }   // printable ASCII
        let single = textBytes(payload)
        let fragmented = stride(from: 0, to: size, by: 65536).flatMap { start -> [UInt8] in
            let end = min(start + 65536, size)
            return wsFrame(start == 0 ? 0x1 : 0x0, Array(payload[start..<end]), fin: end == size)
        }
        for wire in [single, fragmented] {
            let out = readAll(randomSplit(wire, maxChunk: 1 << 17, using: &rng), maxFrameSize: 16 << 20, maxMessageSize: 16 << 20)
            #expect(out.error == nil, "seed \(seed)")
            #expect(out.messages == [.text(payload)], "seed \(seed)")
        }
    }

    static let limitCases: [WireCase] = [
        WireCase("single frame at the message limit", wsFrame(0x2, bytes(1000)), [.binary(bytes(1000))]),
        WireCase("single frame one byte over the message limit", wsFrame(0x2, bytes(1001)), error: .frameTooLarge(1001), code: 1009),
        WireCase("fragments up to the limit", wsFrame(0x2, bytes(500), fin: false) + contBytes(bytes(500)), [.binary(bytes(1000))]),
        WireCase("fragment that would exceed the limit", wsFrame(0x2, bytes(500), fin: false) + contBytes(bytes(501)),
                 error: .messageTooLarge(1001), code: 1009),
        // Checked BEFORE the fragment's payload arrives: only its header is on the wire.
        WireCase("exceeding fragment rejected at its header", wsFrame(0x1, bytes(600, 0x41), fin: false) + Array(contBytes(bytes(600)).prefix(8)),
                 error: .messageTooLarge(1200), code: 1009),
        WireCase("control frames do not count towards the message", wsFrame(0x2, bytes(1000), fin: false) + wsFrame(0x9, bytes(100)) + contBytes([]),
                 [.ping(bytes(100)), .binary(bytes(1000))]),
    ]

    @Test(arguments: limitCases) func limits(_ c: WireCase) { checkEverySplit(c, maxMessageSize: 1000) }

    @Test func frameLimitBelowMessageLimit() {
        let out = readAll([wsFrame(0x2, bytes(300))], maxFrameSize: 200, maxMessageSize: 1000)
        #expect(out.error?.kind == .frameTooLarge(300))
        #expect(out.error?.closeCode == .messageTooBig)
        let ok = readAll([wsFrame(0x2, bytes(200), fin: false) + contBytes(bytes(200))], maxFrameSize: 200, maxMessageSize: 1000)
        #expect(ok.messages == [.binary(bytes(400))])
    }

    /// Inflates every byte to four, honouring the limit like the real permessage-deflate must.
    struct Expander: MessageDecompressor {
        mutating func decompressMessage(_ compressed: UnsafeRawBufferPointer, into output: inout [UInt8], limit: Int) throws(ProtocolViolation) {
            for b in compressed {
                if output.count + 4 > limit { throw ProtocolViolation(.decompressedTooLarge(output.count + 4)) }
                output += [b, b, b, b]
            }
        }
    }

    @Test func decompressedSizeIsLimitedToMaxMessageSize() {
        let ok = readAll([wsFrame(0x1, Array("ab".utf8), rsv: 0x40)], maxMessageSize: 500, decompressor: Expander())
        #expect(ok.messages == [.text("aaaabbbb")])
        // 200 compressed bytes (under the limit) inflate to 800 (over it): 1009, not an allocation.
        let out = readAll([wsFrame(0x2, bytes(100), fin: false, rsv: 0x40) + contBytes(bytes(100))], maxMessageSize: 500, decompressor: Expander())
        #expect(out.error?.kind == .decompressedTooLarge(504))
        #expect(out.error?.closeCode == .messageTooBig)
        // Compressed text is validated after inflation.
        let bad = readAll([wsFrame(0x1, [0xE2], rsv: 0x40)], decompressor: Expander())
        #expect(bad.error?.kind == .invalidUTF8)
    }

    /// 65 536 one-byte fragments form one 64 KiB message: no fragment limit, and not quadratic.
    @Test func sixtyFourKiBOfOneByteFragments() {
        let count = 65536
        var wire: [UInt8] = []
        wire.reserveCapacity(count * 7)
        for i in 0..<count {
            wire += wsFrame(i == 0 ? 0x1 : 0x0, [UInt8(0x61 + i % 26)], fin: i == count - 1)
        }
        let expected = (0..<count).map { UInt8(0x61 + $0 % 26) }
        let clock = ContinuousClock()
        let start = clock.now
        let whole = readAll([wire], maxMessageSize: 65536)
        let elapsed = clock.now - start
        #expect(whole.error == nil)
        #expect(whole.messages == [.text(expected)])
        #expect(elapsed < .seconds(20), "took \(elapsed)")
        var rng = SplitMix64(seed: 65536)
        let split = readAll(randomSplit(wire, maxChunk: 20, using: &rng), maxMessageSize: 65536)
        #expect(split.messages == [.text(expected)])
        // One more byte is over the limit.
        let over = readAll([Array(wire.dropLast(7)) + wsFrame(0x0, [0x61], fin: false) + wsFrame(0x0, [0x62])], maxMessageSize: 65536)
        #expect(over.error?.kind == .messageTooLarge(65537))
    }
}

@Suite("Autobahn 10 Misc")
struct Autobahn10Misc {
    @Test func sixtyFourKiBTextIn1300ByteFragments() {
        let payload = (0..<65536).map { UInt8(0x41 + $0 % 26) }
        var wire: [UInt8] = []
        var at = 0
        while at < payload.count {
            let end = min(at + 1300, payload.count)
            wire += wsFrame(at == 0 ? 0x1 : 0x0, Array(payload[at..<end]), fin: end == payload.count)
            at = end
        }
        var rng = SplitMix64(seed: 10)
        for chunks in [[wire], randomSplit(wire, maxChunk: 4096, using: &rng), randomSplit(wire, maxChunk: 7, using: &rng)] {
            let out = readAll(chunks)
            #expect(out.error == nil)
            #expect(out.messages == [.text(payload)])
        }
    }

    @Test func clientRoleRejectsMaskedAndAcceptsUnmasked() {
        #expect(readAll([wsFrame(0x1, Array("hi".utf8), key: nil)], role: .client).messages == [.text("hi")])
        #expect(readAll([wsFrame(0x1, Array("hi".utf8))], role: .client).error?.kind == .maskedServerFrame)
    }
}
