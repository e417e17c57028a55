// One input of the cluster wire fuzzer (`Fuzz/ClusterWireFuzz.swift`), also replayed by `swift test`
// (`ClusterWireTests`). The fuzz build compiles this file together with Sources/Hub/Redis/ClusterWire.swift.
#if canImport(HubCluster)
@testable import HubCluster
#endif

/// The input is a fan-out message's bytes as another node (or anything on the Redis channel) could send them.
/// Invariants: no crash; a message that decodes re-encodes to exactly its bytes, its ranges inside the input; the
/// same for the event inside it when that decodes.
enum ClusterWireScenario {
    static func run(_ input: [UInt8]) -> String? {
        input.withUnsafeBytes { b -> String? in
            guard let m = ClusterWire.message(b) else { return nil }
            for r in [m.epoch, m.streamID, m.event] where r.lowerBound < 0 || r.upperBound > b.count {
                return "a range outside the input: \(r)"
            }
            var again: [UInt8] = []
            ClusterWire.appendMessage(epoch: b[m.epoch], seq: m.seq, streamID: b[m.streamID], event: b[m.event], to: &again)
            guard again == input else { return "the message re-encodes to other bytes" }
            guard let e = ClusterWire.event(m.event, in: b) else { return nil }
            guard e.type.lowerBound >= m.event.lowerBound, e.data.upperBound == m.event.upperBound else { return "event ranges outside the event" }
            var event: [UInt8] = []
            ClusterWire.appendEvent(type: b[e.type], wallMillis: e.wallMillis, data: b[e.data], to: &event)
            return event == Array(b[m.event]) ? nil : "the event re-encodes to other bytes"
        }
    }
}
