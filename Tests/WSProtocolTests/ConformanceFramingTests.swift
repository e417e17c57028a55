import Testing
@testable import WSProtocol

// Autobahn|Testsuite-style categories 1-4, driven through MessageReader (server role) at every split.

func bytes(_ n: Int, _ fill: UInt8 = 0x2A) -> [UInt8] { [UInt8](repeating: fill, count: n) }

@Suite("Autobahn 1 Framing")
struct Autobahn1Framing {
    static let cases: [WireCase] = [0, 125, 126, 127, 128].flatMap { n in [
        WireCase("1.1 text \(n)", wsFrame(0x1, bytes(n)), [.text(bytes(n))]),
        WireCase("1.2 binary \(n)", wsFrame(0x2, bytes(n, 0xFE)), [.binary(bytes(n, 0xFE))]),
    ] } + [
        WireCase("1.1.8 two texts in one buffer", text("Hello") + text("World"), [.text("Hello"), .text("World")]),
        WireCase("unmasked text from a client", wsFrame(0x1, Array("Hello".utf8), key: nil), error: .unmaskedClientFrame, code: 1002),
    ]

    @Test(arguments: cases) func framing(_ c: WireCase) { checkEverySplit(c) }

    @Test(arguments: [65535, 65536])
    func largeFramesWithRandomSplits(n: Int) {
        let seed = UInt64(n)
        var rng = SplitMix64(seed: seed)
        let payload = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let wire = wsFrame(0x2, payload) + wsFrame(0x1, bytes(n))
        for _ in 0..<5 {
            let out = readAll(randomSplit(wire, maxChunk: 9000, using: &rng))
            #expect(out.error == nil, "seed \(seed)")
            #expect(out.messages == [.binary(payload), .text(bytes(n))], "seed \(seed)")
        }
    }
}

@Suite("Autobahn 2 Pings and pongs")
struct Autobahn2Pings {
    static let cases: [WireCase] = [
        WireCase("2.1 ping without payload", wsFrame(0x9, []), [.ping([])]),
        WireCase("2.2 ping with text payload", wsFrame(0x9, Array("Hello, world!".utf8)), [.ping(Array("Hello, world!".utf8))]),
        WireCase("2.3 ping with binary payload", wsFrame(0x9, [0x00, 0xFF, 0xFE, 0xFD, 0xFC, 0xFB, 0x00, 0xFF]),
                 [.ping([0x00, 0xFF, 0xFE, 0xFD, 0xFC, 0xFB, 0x00, 0xFF])]),
        WireCase("2.4 ping with 125-byte payload", wsFrame(0x9, bytes(125, 0xFE)), [.ping(bytes(125, 0xFE))]),
        WireCase("2.5 ping with 126-byte payload", wsFrame(0x9, bytes(126, 0xFE)), error: .controlFrameTooLong(126), code: 1002),
        WireCase("2.7 unsolicited pong without payload", wsFrame(0xA, []), [.pong([])]),
        WireCase("2.8 unsolicited pong with payload", wsFrame(0xA, Array("unsolicited pong payload".utf8)), [.pong(Array("unsolicited pong payload".utf8))]),
        WireCase("2.9 unsolicited pong then ping", wsFrame(0xA, Array("pong".utf8)) + wsFrame(0x9, Array("ping".utf8)),
                 [.pong(Array("pong".utf8)), .ping(Array("ping".utf8))]),
        WireCase("2.10 ten pings", (0..<10).flatMap { wsFrame(0x9, [UInt8($0)]) }, (0..<10).map { .ping([UInt8($0)]) }),
        WireCase("unmasked ping", wsFrame(0x9, [], key: nil), error: .unmaskedClientFrame, code: 1002),
    ]

    @Test(arguments: cases) func pings(_ c: WireCase) { checkEverySplit(c) }
}

@Suite("Autobahn 3 Reserved bits")
struct Autobahn3ReservedBits {
    static let cases: [WireCase] = [
        WireCase("3.1 small text with RSV=1", wsFrame(0x1, Array("Hello".utf8), rsv: 0x10), error: .reservedBitsSet, code: 1002),
        WireCase("3.2 text, then text with RSV=2, then ping", text("Hello") + wsFrame(0x1, Array("Hello".utf8), rsv: 0x20) + wsFrame(0x9, []),
                 [.text("Hello")], error: .reservedBitsSet, code: 1002),
        WireCase("3.3 text, text RSV=3, ping", text("Hello") + wsFrame(0x1, Array("Hello".utf8), rsv: 0x30) + wsFrame(0x9, []),
                 [.text("Hello")], error: .reservedBitsSet, code: 1002),
        WireCase("3.4 text with RSV=4 (no extension)", wsFrame(0x1, Array("Hello".utf8), rsv: 0x40), error: .reservedBitsSet, code: 1002),
        WireCase("3.5 binary with RSV=5", wsFrame(0x2, bytes(8), rsv: 0x50), error: .reservedBitsSet, code: 1002),
        WireCase("3.6 ping with RSV=6", wsFrame(0x9, Array("Hello".utf8), rsv: 0x60), error: .reservedBitsSet, code: 1002),
        WireCase("3.7 close with RSV=7", wsFrame(0x8, [], rsv: 0x70), error: .reservedBitsSet, code: 1002),
    ]

    @Test(arguments: cases) func reservedBits(_ c: WireCase) { checkEverySplit(c) }

    static let compressedCases: [WireCase] = [
        WireCase("RSV1 on a text message with a decompressor", wsFrame(0x1, Array("Hello".utf8), rsv: 0x40), [.text("Hello")]),
        WireCase("RSV1 on a fragmented message's first frame", wsFrame(0x1, Array("Hel".utf8), fin: false, rsv: 0x40) + cont("lo"), [.text("Hello")]),
        WireCase("RSV1 on a continuation", text("Hel", fin: false) + wsFrame(0x0, Array("lo".utf8), rsv: 0x40), error: .reservedBitsSet, code: 1002),
        WireCase("RSV1 on a ping", wsFrame(0x9, [], rsv: 0x40), error: .reservedBitsSet, code: 1002),
        WireCase("RSV1 on a close", wsFrame(0x8, [], rsv: 0x40), error: .reservedBitsSet, code: 1002),
        WireCase("RSV2 even with a decompressor", wsFrame(0x1, [], rsv: 0x20), error: .reservedBitsSet, code: 1002),
        WireCase("uncompressed message still plain", text("plain"), [.text("plain")]),
    ]

    @Test(arguments: compressedCases) func rsv1WithDecompressor(_ c: WireCase) {
        checkEverySplit(c, decompressor: CopyDecompressor())
    }
}

@Suite("Autobahn 4 Opcodes")
struct Autobahn4Opcodes {
    static let cases: [WireCase] = [UInt8](3...7).map { op in
        WireCase("4.1 non-control opcode \(op) between texts", text("a") + wsFrame(op, Array("reserved".utf8)) + wsFrame(0x9, []),
                 [.text("a")], error: .reservedOpcode(op), code: 1002)
    } + [UInt8](0xB...0xF).map { op in
        WireCase("4.2 control opcode \(op) between texts", text("a") + wsFrame(op, Array("reserved".utf8)) + wsFrame(0x9, []),
                 [.text("a")], error: .reservedOpcode(op), code: 1002)
    }

    @Test(arguments: cases) func opcodes(_ c: WireCase) { checkEverySplit(c) }
}
