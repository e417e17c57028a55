import Testing
@testable import WSProtocol

@Suite("Round trip")
struct RoundTripTests {
    /// Random messages, encoded with FrameEncoder (random fragmentation, control frames between
    /// fragments), decoded with MessageReader over random splits, masked (server reads) and unmasked (client reads).
    @Test(arguments: [Role.server, Role.client])
    func randomMessages(role: Role) {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("round trip seed \(seed) role \(role)")
        var rng = SplitMix64(seed: seed)
        let alphabet: [String] = ["a", "Z", " ", "é", "€", "𝄞", "κόσμε", "\u{10FFFF}", "{\"ev\":1}"]
        for iteration in 0..<150 {
            var expected: [Msg] = []
            var wire: [UInt8] = []
            for _ in 0..<Int.random(in: 1...6, using: &rng) {
                let isText = Bool.random(using: &rng)
                let size = [0, 1, 5, 125, 126, 127, 1000, 65535, 65536, 70000].randomElement(using: &rng)!
                var payload: [UInt8]
                if isText {
                    payload = []
                    while payload.count < size { payload += Array(alphabet.randomElement(using: &rng)!.utf8) }
                } else {
                    payload = (0..<size).map { _ in UInt8.random(in: 0...255, using: &rng) }
                }
                // Cut into 1...4 fragments at random points (possibly inside a code point).
                var cuts = (0..<Int.random(in: 0...3, using: &rng)).map { _ in Int.random(in: 0...payload.count, using: &rng) }.sorted()
                cuts.append(payload.count)
                var start = 0
                for (n, cut) in cuts.enumerated() {
                    let key: UInt32? = role == .server ? UInt32.random(in: 0...UInt32.max, using: &rng) : nil
                    FrameEncoder.encode(opcode: n == 0 ? (isText ? .text : .binary) : .continuation, payload: Array(payload[start..<cut]),
                                        fin: n == cuts.count - 1, maskKey: key, into: &wire)
                    // A ping between fragments is delivered before the message it interrupts.
                    if n < cuts.count - 1 && Int.random(in: 0..<3, using: &rng) == 0 {
                        let ping = (0..<Int.random(in: 0...125, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
                        FrameEncoder.encode(opcode: .ping, payload: ping, maskKey: key, into: &wire)
                        expected.append(.ping(ping))
                    }
                    start = cut
                }
                expected.append(isText ? .text(payload) : .binary(payload))
            }
            let maxChunk = [1, 3, 16, 1000, 100_000].randomElement(using: &rng)!
            let chunks = maxChunk == 1 && wire.count > 20000 ? [wire] : randomSplit(wire, maxChunk: maxChunk, using: &rng)
            let out = readAll(chunks, role: role)
            #expect(out.error == nil, "iteration \(iteration) seed \(seed)")
            #expect(out.messages == expected, "iteration \(iteration) seed \(seed)")
            if out.error != nil || out.messages != expected { return }
        }
    }

    @Test(arguments: [0, 125, 126, 65535, 65536])
    func encodeDecodeLengths(n: Int) {
        let payload = (0..<n).map { UInt8(truncatingIfNeeded: $0 * 7) }
        for key in [nil, UInt32(0x1234_5678)] as [UInt32?] {
            let frame = FrameEncoder.frame(opcode: .binary, payload: payload, maskKey: key)
            let out = readAll([frame], role: key == nil ? .client : .server)
            #expect(out.messages == [.binary(payload)])
        }
    }
}
