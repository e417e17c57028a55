import Foundation
import Synchronization
import Testing
@testable import HubCluster
@testable import HubEngine
@testable import HubRouting

/// The cluster broker hands what it receives from Redis to the loops through the same `Fanout` as the local
/// broker: one batch per flush, to the loops that follow its streams only, each event marked with its loops.
@Suite(.serialized, .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
struct RedisBrokerFanoutTests {
    /// A loop's shard that records, per batch handed to it, the accounts of the events it is marked for.
    final class LoopRecorder: FanoutShard {
        let index: Int
        let seen = Mutex<[[String?]]>([])
        init(index: Int) { self.index = index }

        func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void) {
            let mine = batch.events.indices.filter { batch.reaches($0, loop: index) }.map { batch.events[$0].account?.string }
            seen.withLock { $0.append(mine) }
            done(batch.events.map { _ in 0 })
        }
    }

    @Test func receivedEventsReachOnlyTheLoopsThatFollowTheirStreams() throws {
        let server = try RedisServer()
        let loop = try EventLoop(configuration: testLoopConfiguration(tickMillis: 10))
        defer { loop.stop(); loop.join() }
        let shards = (0..<3).map { LoopRecorder(index: $0) }
        let broker = RedisBroker(channelNames: ["c"], shards: shards,
                                 options: RedisBrokerOptions(endpoint: RedisEndpoint(address: .unix(path: server.socketPath))),
                                 loop: loop, log: { _ in })
        broker.start()
        defer { broker.shutdown() }
        #expect(eventually(timeout: 10) { broker.statistics().cluster?.healthy == true })
        func key(_ account: String) -> StreamKey { StreamKey(channel: 0, account: AccountID(account)) }
        let attached = DispatchSemaphore(value: 0)
        broker.attach([StreamRead(stream: key("a"), follow: true, resume: nil, limit: 0, loop: 0),
                       StreamRead(stream: key("b"), follow: true, resume: nil, limit: 0, loop: 2),
                       StreamRead(stream: key("b"), follow: true, resume: nil, limit: 0, loop: 2)]) { _ in attached.signal() }
        #expect(attached.wait(timeout: .now() + 10) == .success)
        let published = DispatchSemaphore(value: 0)
        let replies = Mutex<[PublishReply]>([])
        let data = Array("{}".utf8)
        data.withUnsafeBytes { raw in
            let drafts = ["a", "b", "z", "a"].map { EventDraft(channel: 0, account: AccountID($0), type: "t", data: raw) }
            broker.publish(drafts) { outcome in
                replies.withLock { $0 = outcome.replies }
                published.signal()
            }
        }
        #expect(published.wait(timeout: .now() + 10) == .success)
        #expect(replies.withLock { $0.map(\.delivered) } == [1, 2, 0, 1], "presence: one follower of a, two of b")
        #expect(eventually(timeout: 5) { shards[0].seen.withLock { $0.flatMap { $0 } }.count == 2 && !shards[2].seen.withLock { $0.isEmpty } })
        #expect(shards[0].seen.withLock { $0.flatMap { $0 } } == ["a", "a"])
        #expect(shards[2].seen.withLock { $0.flatMap { $0 } } == ["b"])
        #expect(shards[1].seen.withLock { $0.isEmpty }, "loop 1 follows nothing: never handed a batch")
        // Unfollowed on loop 2 (twice): b's events reach no loop any more.
        broker.detach([key("b"), key("b")], loop: 2)
        let again = DispatchSemaphore(value: 0)
        data.withUnsafeBytes { raw in
            broker.publish([EventDraft(channel: 0, account: AccountID("b"), type: "t", data: raw),
                            EventDraft(channel: 0, account: AccountID("a"), type: "t", data: raw)]) { _ in again.signal() }
        }
        #expect(again.wait(timeout: .now() + 10) == .success)
        #expect(eventually(timeout: 5) { shards[0].seen.withLock { $0.flatMap { $0 } }.count == 3 })
        #expect(shards[2].seen.withLock { $0.flatMap { $0 } } == ["b"], "\(shards[2].seen.withLock { $0 })")
        #expect(shards[1].seen.withLock { $0.isEmpty })
    }
}
