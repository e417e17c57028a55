import Foundation
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

@Suite("Redis streams: key layout")
struct RedisStreamsKeyTests {
    @Test func everyKeyOfAStreamSharesItsShardsHashTag() {
        let streams = RedisStreams(shards: 16)
        for i in 0..<200 {
            let stream = RedisStreams.Stream(channel: "wallet_updates", account: i % 7 == 0 ? nil : "acc_\(i)")
            let shard = streams.shard(of: stream)
            #expect((0..<16).contains(shard))
            let tag = "{\(shard)}"
            #expect(streams.metaKey(stream).contains(tag) && streams.historyKey(stream).contains(tag))
            #expect(streams.fanoutChannel(shard: shard).contains(tag))
        }
        #expect(Set((0..<200).map { streams.shard(of: .init(channel: "c", account: "acc_\($0)")) }).count == 16, "spread over every shard")
    }

    @Test func noTwoStreamsShareAKey() {
        let streams = RedisStreams()
        let tricky: [RedisStreams.Stream] = [
            .init(channel: "a:1", account: "x"), .init(channel: "a", account: "1:x"), .init(channel: "a", account: nil),
            .init(channel: "a", account: ""), .init(channel: "a:", account: nil), .init(channel: "b:1:a", account: nil),
            .init(channel: "Å", account: "x"), .init(channel: "A\u{30A}", account: "x"),
        ]
        #expect(Set(tricky.map(streams.metaKey)).count == tricky.count)
        #expect(Set(tricky.map(streams.historyKey)).count == tricky.count)
    }

    /// Fan-out messages are length-prefixed (`ClusterWire`): a newline in an account id (the second red team's
    /// `victim\nEVIL\n1700000000000`) or in the event is a byte like any other.
    @Test func fanoutMessagesParseWithNewlinesInTheIdAndTheEvent() {
        let streams = RedisStreams()
        let id = "a:3:abc:victim\nEVIL\n1700000000000"
        let event = "{\"type\":\"x\",\n\"data\":1}"
        let payload = Array("6:EPOCH142:\(id.utf8.count):\(id)\(event)".utf8)
        let push = RESPValue.push([.bulk(Array("message".utf8)), .bulk(Array("hub:{3}:fan".utf8)), .bulk(payload)])
        #expect(streams.message(from: push) == .init(epoch: "EPOCH1", seq: 42, streamID: ExactString(id), event: Array(event.utf8)))
        #expect(streams.message(from: .push([.bulk(Array("subscribe".utf8)), .bulk([]), .integer(1)])) == nil)
        #expect(streams.message(from: .push([.bulk(Array("message".utf8)), .bulk([]), .bulk(Array("x\ny".utf8))])) == nil)
        // The old newline-separated layout is not read as this one.
        #expect(streams.message(from: .push([.bulk(Array("message".utf8)), .bulk([]), .bulk(Array("EPOCH1\n42\na:3:abc:acc\n{}".utf8))])) == nil)
    }
}

@Suite("Redis streams against a real redis-server", .serialized)
struct RedisStreamsTests {
    private func publish(_ r: RedisOnLoop, _ streams: RedisStreams, _ stream: RedisStreams.Stream, _ events: [String],
                         epoch: String) throws -> [Result<RedisStreams.Numbered, RedisError>] {
        try r.onLoop { redis, done in
            var results: [Result<RedisStreams.Numbered, RedisError>] = []
            for event in events {
                streams.publish(event, to: stream, candidateEpoch: epoch, on: redis) { result in
                    results.append(result)
                    if results.count == events.count { done(results) }
                }
            }
        }
    }

    private func read(_ r: RedisOnLoop, _ streams: RedisStreams, _ stream: RedisStreams.Stream, after: UInt64, limit: Int) throws
        -> Result<RedisStreams.Read, RedisError> {
        try r.onLoop { redis, done in streams.read(stream, after: after, limit: limit, on: redis) { done($0) } }
    }

    @Test("three connections publish to one stream at once: one contiguous numbering, one epoch, a capped history, every message fanned out in order",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func concurrentPublishers() throws {
        let server = try RedisServer()
        let endpoint = RedisEndpoint(address: .unix(path: server.socketPath))
        let streams = RedisStreams(shards: 4, historySize: 100)
        let stream = RedisStreams.Stream(channel: "wallet_updates", account: "acc_1")
        let subscriber = try RedisOnLoop(endpoint, onReady: ["SUBSCRIBE"] + streams.fanoutChannels)
        let publishers = try (0..<3).map { _ in try RedisOnLoop(endpoint) }
        #expect(subscriber.waitFor { subscriber.pushed.count == 4 && publishers.allSatisfy { $0.readyCount == 1 } })

        let results = Mutex<[Result<RedisStreams.Numbered, RedisError>]>([])
        let threads = publishers.enumerated().map { k, p in
            Thread {
                let mine = (try? self.publish(p, streams, stream, (0..<300).map { "{\"from\":\(k),\"n\":\($0)}" }, epoch: "E\(k)")) ?? []
                results.withLock { $0 += mine }
            }
        }
        threads.forEach { $0.start() }
        #expect(eventually(timeout: 20) { results.withLock { $0.count } == 900 })
        let numbered = results.withLock { $0 }.compactMap { try? $0.get() }
        #expect(numbered.count == 900)
        #expect(numbered.map(\.seq).sorted() == Array(1...900))
        #expect(Set(numbered.map(\.epoch)).count == 1, "the first publish's candidate epoch is the stream's")

        let all = try read(publishers[0], streams, stream, after: 0, limit: 10_000).get()
        #expect(all.epoch == numbered.first?.epoch)
        #expect(all.seq == 900)
        #expect(all.entries.count >= 100 && all.entries.count < 900, "MAXLEN ~ 100 keeps at least 100: \(all.entries.count)")
        #expect(all.entries.map(\.seq) == Array((901 - UInt64(all.entries.count))...900), "contiguous up to the top")
        #expect(all.firstRetained == all.entries.first?.seq)

        // The subscriber saw every event of the stream once, in seq order, with its event text.
        #expect(subscriber.waitFor(20) { subscriber.pushed.count == 4 + 900 })
        let messages = subscriber.pushed.compactMap(streams.message)
        #expect(messages.map(\.seq) == Array(1...900))
        #expect(messages.allSatisfy { $0.streamID == ExactString(stream.id) && $0.epoch == all.epoch })
        #expect(Set(messages.map(\.event)).count == 900)
    }

    @Test("reads: after a position, at the top, past the top, a stream Redis does not have",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func reads() throws {
        let server = try RedisServer()
        let r = try RedisOnLoop.ready(server)
        let streams = RedisStreams(historySize: 1000)
        let stream = RedisStreams.Stream(channel: "profile_updates", account: nil)
        _ = try publish(r, streams, stream, (1...10).map { "event \($0)" }, epoch: "EPOCH")
        let after7 = try read(r, streams, stream, after: 7, limit: 100).get()
        #expect(after7 == .init(epoch: "EPOCH", seq: 10, firstRetained: 1, entries: (8...10).map { .init(seq: $0, event: Array("event \($0)".utf8)) }))
        #expect(try read(r, streams, stream, after: 3, limit: 2).get().entries.map(\.seq) == [4, 5], "limit")
        #expect(try read(r, streams, stream, after: 10, limit: 100).get().entries.isEmpty)
        #expect(try read(r, streams, stream, after: 15, limit: 100).get().entries.isEmpty)
        #expect(try read(r, streams, stream, after: 0, limit: 0).get().entries.isEmpty, "position only")
        let missing = try read(r, streams, .init(channel: "profile_updates", account: "nobody"), after: 0, limit: 10).get()
        #expect(missing == .init(epoch: nil, seq: 0, firstRetained: 0, entries: []))
    }

    @Test("Redis loses the data (FLUSHALL, SCRIPT FLUSH): numbering restarts at 1 under a new epoch, scripts are loaded again",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func dataLoss() throws {
        let server = try RedisServer()
        let r = try RedisOnLoop.ready(server)
        let streams = RedisStreams()
        let stream = RedisStreams.Stream(channel: "wallet_updates", account: "acc_9")
        let first = try publish(r, streams, stream, ["a", "b"], epoch: "OLD").map { try $0.get() }
        #expect(first == [.init(seq: 1, epoch: "OLD"), .init(seq: 2, epoch: "OLD")])
        _ = try r.call(["FLUSHALL"]).get()
        _ = try r.call(["SCRIPT", "FLUSH"]).get()
        let again = try publish(r, streams, stream, ["c"], epoch: "NEW").map { try $0.get() }
        #expect(again == [.init(seq: 1, epoch: "NEW")])
        #expect(try read(r, streams, stream, after: 0, limit: 10).get().entries == [.init(seq: 1, event: Array("c".utf8))])
    }

    @Test("an idempotency key: a repeat within the window gets the first seq and changes nothing; other keys, other streams and an expired key are new",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func idempotency() throws {
        let server = try RedisServer()
        let r = try RedisOnLoop.ready(server)
        let streams = RedisStreams()
        let a = RedisStreams.Stream(channel: "wallet_updates", account: "acc_1")
        let b = RedisStreams.Stream(channel: "wallet_updates", account: "acc_2")
        func publish(_ stream: RedisStreams.Stream, _ event: String, key: String?, window: Int = 60_000) throws -> RedisStreams.Numbered {
            try r.onLoop { redis, done in
                streams.publish(event, to: stream, candidateEpoch: "E", idempotencyKey: key, windowMillis: window, on: redis) { done($0) }
            }.get()
        }
        #expect(try publish(a, "first", key: "k1") == .init(seq: 1, epoch: "E", duplicate: false))
        #expect(try publish(a, "retry", key: "k1") == .init(seq: 1, epoch: "E", duplicate: true))
        #expect(try publish(a, "second", key: "k2") == .init(seq: 2, epoch: "E", duplicate: false))
        #expect(try publish(b, "other stream", key: "k1") == .init(seq: 1, epoch: "E", duplicate: false))
        #expect(try publish(a, "no key", key: nil) == .init(seq: 3, epoch: "E", duplicate: false))
        #expect(try read(r, streams, a, after: 0, limit: 10).get().entries.map(\.event) == ["first", "second", "no key"].map { Array($0.utf8) },
                "the retry was neither kept nor numbered")
        #expect(try publish(a, "short window", key: "k3", window: 100).seq == 4)
        usleep(300_000)
        #expect(try publish(a, "after the window", key: "k3") == .init(seq: 5, epoch: "E", duplicate: false))
    }

    @Test("a batch is one script call: each stream numbered in order, a repeat key inside the batch is a duplicate, one event that fails leaves the others numbered and published",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func batch() throws {
        let server = try RedisServer()
        let endpoint = RedisEndpoint(address: .unix(path: server.socketPath))
        let streams = RedisStreams(shards: 4, historySize: 100, layout: .streams)
        let a = RedisStreams.Stream(channel: "wallet_updates", account: "acc_1")
        let b = RedisStreams.Stream(channel: "wallet_updates", account: "acc_2")
        let broken = RedisStreams.Stream(channel: "wallet_updates", account: "acc_3")
        let subscriber = try RedisOnLoop(endpoint, onReady: ["SUBSCRIBE", streams.streamChannel(a), streams.streamChannel(b),
                                                             streams.streamChannel(broken)])
        let r = try RedisOnLoop.ready(server)
        #expect(subscriber.waitFor { subscriber.pushed.count == 3 })
        // Its meta key is a string, not a hash: HMGET fails for that event only.
        _ = try r.call(["SET", streams.metaKey(broken), "not a hash"]).get()
        let batch: [RedisStreams.Publication] = [
            .init("a1", to: a, idempotencyKey: "k"), .init("b1", to: b), .init("x", to: broken), .init("a1 again", to: a, idempotencyKey: "k"),
            .init("a2", to: a), .init("b2", to: b),
        ]
        let calls = try r.call(["INFO", "commandstats"]).get().string ?? ""
        let results = try r.onLoop { redis, done in streams.publish(batch, candidateEpoch: "E", on: redis) { done($0) } }.get()
        let after = try r.call(["INFO", "commandstats"]).get().string ?? ""
        func evalshaCalls(_ info: String) -> Int {
            guard let line = info.split(whereSeparator: \.isNewline).first(where: { $0.hasPrefix("cmdstat_evalsha:") }),
                  let range = line.range(of: "calls="), let end = line[range.upperBound...].firstIndex(of: ",") else { return 0 }
            return Int(line[range.upperBound..<end]) ?? 0
        }
        #expect(evalshaCalls(after) - evalshaCalls(calls) == 1, "six events, one script call")
        #expect(results.count == 6)
        #expect(try results[0].get() == .init(seq: 1, epoch: "E"))
        #expect(try results[1].get() == .init(seq: 1, epoch: "E"))
        guard case .failure(let error) = results[2] else { Issue.record("the broken stream's event was numbered"); return }
        #expect(error.kind == .scriptFailed && error.message.contains("WRONGTYPE"), "\(error)")
        #expect(try results[3].get() == .init(seq: 1, epoch: "E", duplicate: true))
        #expect(try results[4].get() == .init(seq: 2, epoch: "E"))
        #expect(try results[5].get() == .init(seq: 2, epoch: "E"))
        #expect(try read(r, streams, a, after: 0, limit: 10).get().entries.map(\.event) == ["a1", "a2"].map { Array($0.utf8) })
        #expect(subscriber.waitFor { subscriber.pushed.count == 3 + 4 })
        let messages = subscriber.pushed.compactMap(streams.message(from:))
        #expect(messages.map(\.event) == ["a1", "b1", "a2", "b2"].map { Array($0.utf8) }, "published in the batch's order")
        #expect(messages.map(\.seq) == [1, 1, 2, 2])
    }

    @Test("cluster presence: listed nodes count, an unlisted node counts only if its field was written after the list, and is removed otherwise",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func presenceAgainstAListOfLiveNodes() throws {
        let server = try RedisServer()
        let r = try RedisOnLoop.ready(server)
        let streams = RedisStreams()
        let nodes = RedisNodes(staleMillis: 5_000)
        let stream = RedisStreams.Stream(channel: "wallet_updates", account: "acc_1")
        func presence(_ node: String, _ count: Int) throws {
            _ = try r.onLoop { redis, done in streams.setPresence(stream, node: node, count: count, stamped: true, on: redis) { done($0) } }.get()
        }
        func delivered(_ live: (ids: [String], asOf: Int64)?) throws -> Int {
            try r.onLoop { redis, done in
                streams.publish("e", to: stream, candidateEpoch: "E", liveNodes: live, on: redis) { done($0) }
            }.get().delivered
        }
        func live() throws -> (ids: [String], asOf: Int64) {
            try r.onLoop { redis, done in nodes.live(on: redis) { done($0) } }.get()
        }
        // A, B and the dead D registered; D's beat goes stale.
        for id in ["A", "B"] { _ = try r.onLoop { redis, done in nodes.heartbeat(id: id, info: "{}", on: redis) { done($0) } }.get() }
        try presence("A", 2)
        try presence("B", 3)
        try presence("D", 7)
        #expect(try r.call(["HGET", streams.presenceKey(stream), "A"]).get().string?.hasPrefix("2:") == true, "stamped COUNT:MS")
        #expect(try delivered(nil) == 12, "no list: every field counts")
        let listed = try live()
        #expect(Set(listed.ids) == ["A", "B"])
        usleep(5_000)
        // C joined after the list was taken: its field is newer than the list, so it counts; D's is older: removed.
        try presence("C", 4)
        #expect(try delivered(listed) == 9)
        #expect(try r.call(["HEXISTS", streams.presenceKey(stream), "D"]).get().int == 0, "the dead node's field is removed")
        #expect(try r.call(["HEXISTS", streams.presenceKey(stream), "C"]).get().int == 1, "the new node's field stays")
        // A later list without C (it never beat): its field is now older than the list.
        usleep(5_000)
        #expect(try delivered(try live()) == 5)
        // 0 removes the field; unstamped fields (a single Redis) still count.
        try presence("A", 0)
        _ = try r.call(["HSET", streams.presenceKey(stream), "B", "3"]).get()
        #expect(try delivered(nil) == 3)
    }

    @Test("a stream idle past its TTL is gone (so its next publish starts a new epoch)",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func ttl() throws {
        let server = try RedisServer()
        let r = try RedisOnLoop.ready(server)
        let streams = RedisStreams(ttlMillis: 300)
        let stream = RedisStreams.Stream(channel: "c", account: "a")
        _ = try publish(r, streams, stream, ["x"], epoch: "E1")
        #expect(try read(r, streams, stream, after: 0, limit: 1).get().epoch == "E1")
        #expect(r.waitFor(5) { (try? read(r, streams, stream, after: 0, limit: 1).get().epoch) == .some(nil) })
        #expect(try publish(r, streams, stream, ["y"], epoch: "E2").map { try $0.get() } == [.init(seq: 1, epoch: "E2")])
    }

    @Test("sharded pub/sub: SSUBSCRIBE to the shard channels receives every event as smessage",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func sharded() throws {
        let server = try RedisServer()
        let endpoint = RedisEndpoint(address: .unix(path: server.socketPath))
        let streams = RedisStreams(shards: 8, sharded: true)
        let subscriber = try RedisOnLoop(endpoint, onReady: ["SSUBSCRIBE"] + streams.fanoutChannels)
        let r = try RedisOnLoop(endpoint)
        #expect(subscriber.waitFor { subscriber.readyCount == 1 && r.readyCount == 1 && subscriber.log.contains("subscribed: ok") },
                "\(subscriber.log)")
        let counts = try r.call(["PUBSUB", "SHARDNUMSUB"] + streams.fanoutChannels).get().elements ?? []
        #expect(counts.count == 16)
        #expect(stride(from: 1, to: counts.count, by: 2).allSatisfy { counts[$0] == .integer(1) }, "\(counts)")
        let accounts = (0..<20).map { "acc_\($0)" }
        for a in accounts { _ = try publish(r, streams, .init(channel: "wallet_updates", account: a), ["{}"], epoch: "E") }
        #expect(subscriber.waitFor { subscriber.pushed.compactMap(streams.message).count == 20 }, "\(subscriber.pushed.suffix(3))")
        #expect(subscriber.pushed.filter { $0.elements?.first?.string == "smessage" }.count == 20)
    }
}
