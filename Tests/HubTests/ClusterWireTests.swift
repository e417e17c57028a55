import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// The cluster wire format (`ClusterWire`): length-prefixed fields, so an id's bytes can never end a field early.
@Suite struct ClusterWireTests {
    static func encodeMessage(epoch: [UInt8], seq: UInt64, id: [UInt8], type: [UInt8], wall: UInt64, data: [UInt8]) -> [UInt8] {
        var event: [UInt8] = []
        ClusterWire.appendEvent(type: type, wallMillis: wall, data: data, to: &event)
        var out: [UInt8] = []
        ClusterWire.appendMessage(epoch: epoch, seq: seq, streamID: id, event: event, to: &out)
        return out
    }

    /// Random fields of every kind of byte (newlines, NUL, the format's ':' and digits, invalid UTF-8) round-trip,
    /// seeded and replayable.
    @Test func randomFieldsRoundTrip() {
        var rng = SplitMix64(seed: 0xC1A5_7E12)
        let alphabet: [UInt8] = [0x0A, 0x00, 0x3A, 0x30, 0x31, 0x39, 0x61, 0xC3, 0xA9, 0xFF, 0x0D, 0x2D]
        func bytes(_ max: Int) -> [UInt8] {
            (0..<Int.random(in: 0...max, using: &rng)).map { _ in alphabet[Int.random(in: 0..<alphabet.count, using: &rng)] }
        }
        for _ in 0..<5_000 {
            let (epoch, id, type, data) = (bytes(12), bytes(40), bytes(10), bytes(30))
            let seq = UInt64.random(in: 0...UInt64.max / 2, using: &rng), wall = UInt64.random(in: 0...(1 << 45), using: &rng)
            let wire = Self.encodeMessage(epoch: epoch, seq: seq, id: id, type: type, wall: wall, data: data)
            wire.withUnsafeBytes { b in
                guard let m = ClusterWire.message(b), let e = ClusterWire.event(m.event, in: b) else {
                    Issue.record("did not decode \(wire)")
                    return
                }
                #expect(Array(b[m.epoch]) == epoch && m.seq == seq && Array(b[m.streamID]) == id)
                #expect(Array(b[e.type]) == type && e.wallMillis == wall && Array(b[e.data]) == data)
            }
        }
    }

    /// Not the format: the old newline layout, leading zeros (not canonical), a length past the end, 20 digits,
    /// a missing colon, an empty number.
    @Test func malformedInputIsRefused() {
        for text in ["EPOCH1\n42\na:3:abc:acc\n{}", "06:EPOCH142:1:x", "6:EPOCH1042:1:x", "6:EPOCH142:9:x", "6:EPOCH1",
                     "99999999999999999999:x", ":x", "6:EPOCH1:1:x", "6:EPOCH142"] {
            let refused = Array(text.utf8).withUnsafeBytes { ClusterWire.message($0) == nil }
            #expect(refused, "\(text.debugDescription) decoded")
        }
        #expect(Array("3:abc07:{}".utf8).withUnsafeBytes { ClusterWire.event(0..<$0.count, in: $0) } == nil, "leading zero")
        #expect(Array("3:abc0:{}".utf8).withUnsafeBytes { ClusterWire.event(0..<$0.count, in: $0) }?.wallMillis == 0)
    }

    /// The fuzz target's corpus (`Fuzz/ClusterWireFuzz.swift`), replayed with its invariant: whatever decodes
    /// re-encodes to the same bytes.
    @Test func fuzzCorpusReplays() {
        let corpus = ConnectionFuzzReplayTests.corpus("clusterwire")
        #expect(corpus.count >= 10)
        for (name, input) in corpus {
            let problem = ClusterWireScenario.run(input)
            #expect(problem == nil, "\(name): \(problem ?? "")")
        }
    }
}
