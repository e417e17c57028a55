import Foundation
import COpenSSL
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubRouting
@testable import HubSupport

// The local broker's publish and attach paths, without sockets.

/// A fan-out shard that holds deliveries until the test releases them (each counts one connection per event).
final class HeldShard: FanoutShard {
    private let held = Mutex<[(EventBatch, @Sendable ([Int]) -> Void)]>([])

    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void) {
        held.withLock { $0.append((batch, done)) }
    }

    func release() {
        let all = held.withLock { h in defer { h.removeAll() }; return h }
        for (batch, done) in all { done(batch.events.map { _ in 1 }) }
    }
}

/// A fan-out shard that counts the batches handed to it and reports a delivery for each event of an account (or a
/// broadcast, nil) it holds.
final class RecordingShard: FanoutShard {
    let batches = Mutex(0)
    let holds = Mutex<[String?]>([])
    /// The last batch's per-event loops (`EventBatch.loops`).
    let lastLoops = Mutex<[UInt64]>([])

    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void) {
        batches.withLock { $0 += 1 }
        lastLoops.withLock { $0 = batch.loops }
        let held = holds.withLock { $0 }
        done(batch.events.map { event in held.contains(event.account?.string) ? 1 : 0 })
    }
}

final class Outcomes: Sendable {
    private let all = Mutex<[PublishOutcome]>([])
    var list: [PublishOutcome] { all.withLock { $0 } }
    func record(_ o: PublishOutcome) { all.withLock { $0.append(o) } }
}

@Suite struct LocalBrokerTests {
    static let options = LocalBrokerOptions(history: HistoryLimits(size: 100, ttlNanos: 600 * 1_000_000_000, memoryBytes: 64 << 20),
                                            idempotencyWindowNanos: 300 * 1_000_000_000, idempotencyMaxKeys: 1000)

    static func publish(_ broker: LocalBroker, _ drafts: [(account: String?, key: String?)], into outcomes: Outcomes) {
        let data = Array("{}".utf8)
        data.withUnsafeBytes { raw in
            let list = drafts.map { EventDraft(channel: 0, account: $0.account.map { AccountID($0) }, type: "t", data: raw,
                                               idempotencyKey: $0.key.map { ExactString($0) }) }
            broker.publish(list) { outcomes.record($0) }
        }
    }

    @Test func aRepeatedKeyIsNotDeliveredAgainAndWaitsForTheFirst() {
        let shard = HeldShard()
        let broker = LocalBroker(channelNames: ["c"], shards: [shard], options: Self.options)
        // Connections of loop 0 follow both accounts: a loop is handed only the events of streams it follows.
        _ = broker.attach(["a", "b"].map { StreamRead(stream: StreamKey(channel: 0, account: AccountID($0)), follow: true,
                                                      resume: nil, limit: 0, loop: 0) })
        let first = Outcomes(), second = Outcomes(), third = Outcomes()
        // The same key twice in one batch, and again in a second batch while the first is in flight.
        Self.publish(broker, [("a", "k"), ("a", "k"), ("b", "k"), ("a", nil)], into: first)
        Self.publish(broker, [("a", "k")], into: second)
        #expect(first.list.isEmpty && second.list.isEmpty)
        shard.release()
        #expect(first.list.count == 1 && second.list.count == 1)
        #expect(first.list.first?.replies == [
            PublishReply(seq: 1, delivered: 1, duplicate: false), PublishReply(seq: 1, delivered: 1, duplicate: true),
            PublishReply(seq: 1, delivered: 1, duplicate: false), PublishReply(seq: 2, delivered: 1, duplicate: false),
        ])
        #expect(first.list.first?.events.map(\.seq) == [1, 1, 2])
        #expect(second.list.first?.replies == [PublishReply(seq: 1, delivered: 1, duplicate: true)])
        #expect(second.list.first?.events.isEmpty == true)
        // Once known, a repeat completes at once, without any fan-out.
        Self.publish(broker, [("a", "k")], into: third)
        #expect(third.list.first?.replies == [PublishReply(seq: 1, delivered: 1, duplicate: true)])
        #expect(broker.statistics().duplicates == 3)
    }

    @Test func attachReadsPositionsAndReplaysOnlyWithTheRightGeneration() throws {
        let shard = HeldShard()
        let broker = LocalBroker(channelNames: ["c"], shards: [shard], options: Self.options)
        let outcomes = Outcomes()
        let a = StreamKey(channel: 0, account: "a")
        let start = broker.attach([StreamRead(stream: a, follow: true, resume: nil, limit: 10)])
        #expect(start.first?.seq == 0)
        let epoch = try #require(start.first?.epoch)
        Self.publish(broker, [("a", nil), ("a", nil), ("a", nil)], into: outcomes)
        shard.release()
        let read = broker.attach([
            StreamRead(stream: a, follow: false, resume: ResumePoint(epoch: epoch, seq: 1), limit: 10),
            StreamRead(stream: a, follow: false, resume: ResumePoint(epoch: epoch + "0", seq: 1), limit: 10),
            StreamRead(stream: a, follow: false, resume: ResumePoint(epoch: epoch, seq: 0), limit: 2),
        ])
        #expect(read.map(\.seq) == [3, 3, 3])
        #expect(read[0].replay.map { $0 == .success(broker.history(a, after: 1)?.events ?? []) } == true)
        #expect(read[1].replay.map { $0 == .failure(.epochChanged) } == true)
        #expect(read[2].replay.map { $0 == .failure(.tooMany) } == true)
        broker.detach([a])
    }

    /// A batch reaches only the loops with followers of its streams (every loop for a follower whose loop is
    /// unknown); an event nobody follows reaches none and completes at once.
    @Test func aBatchIsHandedOnlyToTheLoopsThatFollowItsStreams() {
        let shards = (0..<6).map { _ in RecordingShard() }
        let broker = LocalBroker(channelNames: ["c"], shards: shards, options: Self.options)
        func key(_ account: String?) -> StreamKey { StreamKey(channel: 0, account: account.map { AccountID($0) }) }
        func follow(_ account: String?, loop: Int) {
            _ = broker.attach([StreamRead(stream: key(account), follow: true, resume: nil, limit: 0, loop: loop)])
            if loop >= 0 { shards[loop].holds.withLock { $0.append(account) } }
        }
        func handed(_ accounts: [String?]) -> (loops: [Int], delivered: [Int]) {
            for shard in shards { shard.batches.withLock { $0 = 0 } }
            let outcomes = Outcomes()
            Self.publish(broker, accounts.map { ($0, nil) }, into: outcomes)
            let loops = shards.indices.filter { shards[$0].batches.withLock { $0 } > 0 }
            return (loops, outcomes.list.first?.replies.map(\.delivered) ?? [])
        }
        follow("a", loop: 1)
        follow("b", loop: 5)
        follow("b", loop: 2)
        #expect(handed(["a"]) == ([1], [1]))
        #expect(handed(["b"]) == ([2, 5], [2]))
        #expect(handed(["z"]) == ([], [0]))  // nobody follows: no loop, completed at once
        #expect(handed(["a", "z", "b"]) == ([1, 2, 5], [1, 0, 2]))
        broker.detach([key("a")], loop: 1)
        #expect(handed(["a"]) == ([], [0]))
        broker.detach([key("b")], loop: 5)
        #expect(handed(["b"]) == ([2], [1]))
        broker.detach([key("b")], loop: 0)  // not a follower there: changes nothing
        #expect(handed(["b"]) == ([2], [1]))
        // A follower whose loop is not known: every loop.
        _ = broker.attach([StreamRead(stream: key(nil), follow: true, resume: nil, limit: 0)])
        #expect(handed([nil]).loops == [0, 1, 2, 3, 4, 5])
    }

    /// A batch whose events go to different loops says, per event, which loops follow its stream, and a loop skips
    /// the events it does not follow; a batch whose events all go to the same loops says nothing per event.
    @Test func aBatchSaysWhichLoopsFollowEachEvent() {
        let shards = (0..<3).map { _ in RecordingShard() }
        let broker = LocalBroker(channelNames: ["c"], shards: shards, options: Self.options)
        func key(_ account: String) -> StreamKey { StreamKey(channel: 0, account: AccountID(account)) }
        for (account, loop) in [("a", 0), ("b", 2), ("c", 0), ("c", 2)] {
            _ = broker.attach([StreamRead(stream: key(account), follow: true, resume: nil, limit: 0, loop: loop)])
        }
        func loops(_ accounts: [String]) -> [UInt64] {
            for shard in shards { shard.lastLoops.withLock { $0 = [99] } }
            Self.publish(broker, accounts.map { ($0, nil) }, into: Outcomes())
            return shards.lazy.map { $0.lastLoops.withLock { $0 } }.first { $0 != [99] } ?? [99]  // the one batch, as handed
        }
        #expect(loops(["a", "a"]) == [])
        #expect(loops(["c", "c"]) == [])
        #expect(loops(["a", "b", "z", "c"]) == [0b001, 0b100, 0, 0b101])
        #expect(loops(["b", "a"]) == [0b100, 0b001])
        let batch = EventBatch(events: [], loops: [0b001, 0b100, 0, 0b101])
        #expect([0, 1, 2, 3].map { batch.reaches($0, loop: 0) } == [true, false, false, true])
        #expect([0, 1, 2, 3].map { batch.reaches($0, loop: 2) } == [false, true, false, true])
        #expect(!batch.reaches(3, loop: 64))
        #expect(EventBatch(events: []).reaches(0, loop: 70), "no per-event loops: every loop it is handed")
    }

    /// Random follows and unfollows (some of them for a loop with no follower) on up to 8 loops against per-loop
    /// counts: the mask is exactly the loops with followers, and the total matches.
    @Test func loopFollowersNeverLeaveOutALoopWithFollowers() {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            let loops = Int.random(in: 1...8, using: &rng)
            var f = LoopFollowers()
            var model = [Int](repeating: 0, count: loops)
            for _ in 0..<200 {
                let loop = Int.random(in: 0..<loops, using: &rng)
                if Bool.random(using: &rng) {
                    f.add(loop: loop)
                    model[loop] += 1
                } else {
                    #expect(f.remove(loop: loop) == (model[loop] > 0))
                    if model[loop] > 0 { model[loop] -= 1 }
                }
                let mask = f.mask(loops: loops)
                for i in 0..<loops { #expect(mask >> UInt64(i) & 1 == (model[i] > 0 ? 1 : 0)) }
                #expect(mask >> UInt64(loops) == 0)
                #expect(f.total == model.reduce(0, +))
                #expect(f.isEmpty == model.allSatisfy { $0 == 0 })
                // Asked for fewer loops than the counts name: every one of them, never fewer.
                if loops > 1, model[loops - 1] > 0 { #expect(f.mask(loops: loops - 1) == (1 << UInt64(loops - 1)) - 1) }
            }
        }
    }

    /// 16 bytes inline (a stream per account and channel carries them); past 65 534 followers of one loop, or a
    /// loop from 4 up, or an unknown loop, the counts move aside and stay exact, and come back inline once empty.
    @Test func loopFollowersStayCompactAndExactPastTheInlineCounts() {
        #expect(MemoryLayout<LoopFollowers>.size == 16)
        var f = LoopFollowers()
        for _ in 0..<70_000 { f.add(loop: 0) }
        f.add(loop: 3)
        #expect(f.total == 70_001 && f.mask(loops: 4) == 0b1001)
        f.add(loop: -1)
        #expect(f.mask(loops: 4) == 0b1111)
        var removed = [f.remove(loop: -1), f.remove(loop: -1), f.remove(loop: 2)]
        #expect(removed == [true, false, false])
        var all = true
        for _ in 0..<70_000 { all = f.remove(loop: 0) && all }
        removed = [all, f.remove(loop: 0)]
        #expect(removed == [true, false] && f.mask(loops: 4) == 0b1000 && f.total == 1)
        removed = [f.remove(loop: 3)]
        #expect(removed == [true] && f.isEmpty && f.mask(loops: 4) == 0)
        f.add(loop: 1)
        #expect(f.mask(loops: 2) == 0b10 && f.total == 1)
        // A stream's object stays in glibc's 112-byte chunks (104 usable), as before the per-loop counts.
        let stream = StreamState(key: StreamKey(channel: 0, account: "acc_1"), generation: 1, now: 0)
        #expect(malloc_usable_size(Unmanaged.passUnretained(stream).toOpaque()) == 104)
    }

    @Test func stateRoundTripsThroughTheFile() throws {
        let shard = HeldShard()
        let broker = LocalBroker(channelNames: ["c", "d"], shards: [shard], options: Self.options)
        let outcomes = Outcomes()
        // A connection of loop 0 follows a's stream: its first publish is delivered once (the key remembers it).
        _ = broker.attach([StreamRead(stream: StreamKey(channel: 0, account: "a"), follow: true, resume: nil, limit: 0, loop: 0)])
        Self.publish(broker, [("a", "k1"), ("a", nil), (nil, nil), ("b", "k2")], into: outcomes)
        shard.release()
        let a = StreamKey(channel: 0, account: "a")
        let epoch = try #require(broker.attach([StreamRead(stream: a, follow: false, resume: nil, limit: 0)]).first?.epoch)
        let saved = try StateFile.decode(StateFile.encode(broker.exportState()))
        #expect(saved.hubEpoch == broker.epoch && saved.events.count == 4 && saved.keys.count == 2)

        // Restored with the channels in another order: matched by name.
        let restored = LocalBroker(channelNames: ["d", "c"], shards: [shard], options: Self.options, restoring: saved)
        #expect(restored.epoch == broker.epoch)
        let moved = StreamKey(channel: 1, account: "a")
        let read = restored.attach([StreamRead(stream: moved, follow: true, resume: ResumePoint(epoch: epoch, seq: 0), limit: 10)])
        #expect(read.first?.seq == 2)
        guard case .success(let events)? = read.first?.replay else { Issue.record("no replay: \(String(describing: read.first?.replay))"); return }
        #expect(events.map(\.seq) == [1, 2])
        #expect(String(decoding: events[0].payload, as: UTF8.self) == #"{"type":"t","channel":"c","seq":1,"data":{}}"#)
        #expect(String(decoding: events[0].data, as: UTF8.self) == "{}")
        let after = Outcomes()
        let data = Array("{}".utf8)
        data.withUnsafeBytes { raw in
            restored.publish([EventDraft(channel: 1, account: "a", type: "t", data: raw),
                              EventDraft(channel: 1, account: "a", type: "t", data: raw, idempotencyKey: "k1")]) { after.record($0) }
        }
        shard.release()
        #expect(after.list.first?.replies == [PublishReply(seq: 3, delivered: 1, duplicate: false),
                                             PublishReply(seq: 1, delivered: 1, duplicate: true)])
    }

    @Test func expiredEventsAreDroppedOnLoadButNumberingGoesOn() throws {
        var saved = StateFileTests.sample
        saved.channelNames = ["wallet_updates"]
        saved.streams = [saved.streams[0]]
        saved.events[0].wallTime = wallClockSeconds() - 3600
        saved.keys[0].wallTime = wallClockSeconds() - 3600
        let broker = LocalBroker(channelNames: ["wallet_updates"], shards: [HeldShard()], options: Self.options, restoring: saved)
        let stats = broker.statistics()
        #expect(stats.events == 0 && stats.idempotencyKeys == 0 && stats.streams == 1)
        let read = broker.attach([StreamRead(stream: StreamKey(channel: 0, account: "acc_1"), follow: false,
                                             resume: ResumePoint(epoch: "3", seq: 6), limit: 10)])
        #expect(read.first?.seq == 7)
        #expect(read.first?.replay.map { $0 == .failure(.tooOld) } == true)
    }
}
