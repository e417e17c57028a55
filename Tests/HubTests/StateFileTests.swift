import Foundation
import COpenSSL
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// The state file's encoding, without a process (IntegrationStateFileTests runs the hub).
@Suite struct StateFileTests {
    static let sample = SavedBrokerState(
        hubEpoch: "q1w2e3r4t5y", nextGeneration: 9, savedAt: 1_700_000_000.25, channelNames: ["wallet_updates", "profile_updates"],
        streams: [.init(channel: 0, account: "acc_1", generation: 3, lastSeq: 7), .init(channel: 1, account: nil, generation: 8, lastSeq: 2)],
        events: [.init(stream: 0, seq: 7, wallTime: 1_700_000_000, type: "t", payload: Array(#"{"type":"t","channel":"wallet_updates","seq":7,"data":{"x":"é"}}"#.utf8),
                       dataStart: 54, dataEnd: 64)],
        keys: [.init(channel: 0, account: "acc_1", key: "k-1", seq: 7, delivered: 2, wallTime: 1_700_000_000)])

    @Test func roundTrips() throws {
        let bytes = StateFile.encode(Self.sample)
        #expect(Array(bytes.prefix(8)) == Array("HUBSTATE".utf8))
        #expect(try StateFile.decode(bytes) == Self.sample)
    }

    @Test func corruptTruncatedAndForeignFilesAreRefusedWithAReason() {
        let bytes = StateFile.encode(Self.sample)
        func reason(_ b: [UInt8]) -> String {
            do { _ = try StateFile.decode(b); return "accepted" } catch { return error.description }
        }
        var flipped = bytes
        flipped[bytes.count - 5] ^= 0x01
        #expect(reason(flipped).contains("checksum"))
        #expect(reason(Array(bytes.dropLast(3))).contains("truncated"))
        #expect(reason(Array("#!/bin/sh\necho hello\n".utf8) + Array(repeating: 0, count: 40)).contains("not a hub state file"))
        #expect(reason([]).contains("too short"))
        var version = bytes
        version[8] = 2
        #expect(reason(version).contains("version 2"))
    }

    /// Garbage with a valid header and checksum is refused (or decoded), never a crash or a huge allocation.
    /// Damaged or random payloads behind a valid header and checksum: each is refused, or read as a state that
    /// writes back to a file that reads as the same state (nothing half-read gets through). Seeded.
    @Test func randomPayloadsWithValidChecksumsAreRefusedOrReadWhole() {
        var rng = SplitMix64(seed: 0x57A7E)
        var read = 0
        let valid = StateFile.encode(Self.sample)
        for i in 0..<3000 {
            var payload: [UInt8]
            if i % 2 == 0 {
                payload = Array(valid[StateFile.headerSize...])
                for _ in 0..<Int.random(in: 1...6, using: &rng) {
                    payload[Int.random(in: 0..<payload.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
                }
            } else {
                payload = (0..<Int.random(in: 0..<200, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            }
            var w = ByteWriter()
            w.raw(StateFile.magic)
            w.u32(StateFile.version)
            w.u32(0)
            w.u64(UInt64(payload.count))
            w.u32(StateFile.crc32(payload))
            w.raw(payload)
            if let state = try? StateFile.decode(w.bytes) {
                read += 1
                #expect((try? StateFile.decode(StateFile.encode(state))) == state, "payload \(i) read, but does not round-trip")
            }
        }
        #expect(read > 0, "no damaged payload was readable: the round trip was never checked")
    }
}
