import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// Cluster mode with hostile identifiers, through real hubs and a real redis-server: the second red team's breaks
/// (canonically equivalent accounts merged inside a node; an account id with newlines filed under another account)
/// and the same property for every kind of byte-distinct id, in both fan-out layouts. And a publish caught in a
/// Redis stall, whose outcome is unknown rather than "nothing was published".
@Suite(.serialized, .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
struct ClusterIdentityTests {
    /// Byte-distinct account ids that `String` or a separator-based format would confuse: canonically equivalent
    /// pairs, newlines (one forging another account's stream id and a seq), NUL and control characters, the
    /// format's own separator, a one-byte id and a long one (4 000 bytes: a token carrying it stays under 8 KiB).
    static let accounts: [String] = [
        "caf\u{E9}", "cafe\u{301}", "\u{C5}", "\u{212B}",
        "victim", "victim\nEVIL\n1700000000000", "3:a:b\n", "a\u{0}b", "a\u{1}\u{7F}b", ":", "1:", "x",
        String(repeating: "L", count: 4_000),
    ]

    /// The fixed list, and byte-distinct random ids drawn from an alphabet of look-alikes and separators (seeded:
    /// the seed is in the failure message, so a failing draw can be replayed).
    static func accounts(seed: UInt64) -> [String] {
        var rng = SplitMix64(seed: seed)
        let pieces = ["a", "\u{E9}", "e\u{301}", "\u{C5}", "\u{212B}", "\n", "\u{0}", ":", "1", "\u{1F600}", "K", "\u{212A}"]
        var drawn: [String] = []
        var seen = Set(Self.accounts.map { Array($0.utf8) })
        while drawn.count < 8 {
            let id = (0..<Int.random(in: 1...6, using: &rng)).map { _ in pieces[Int.random(in: 0..<pieces.count, using: &rng)] }.joined()
            if seen.insert(Array(id.utf8)).inserted { drawn.append(id) }
        }
        return Self.accounts + drawn
    }

    enum Backend: String, CaseIterable, Sendable { case redis, redisCluster }

    /// Every account has a connection on node 1 and, for most, one on node 2; events for every account are published
    /// through node 0, interleaved. Each connection gets exactly its own account's events, in order, once; each
    /// `delivered` is exact; nothing is closed. On one Redis and on a Redis Cluster of three masters, both layouts.
    @Test(arguments: Backend.allCases, RedisStreams.FanoutLayout.allCases)
    func byteDistinctIdsAreDistinctAccountsOnEveryNode(backend: Backend, layout: RedisStreams.FanoutLayout) throws {
        let seed = UInt64(time(nil))
        let accounts = Self.accounts(seed: seed)
        let peer = backend == .redisCluster ? try RedisClusterPeer(masters: 3) : nil
        let c = try peer.map { try HubsOnRedisClusterTests.hubs(3, on: $0, layout: layout) } ?? ClusterTests.cluster(3, layout: layout)
        var clients: [(account: Int, ws: TestWebSocket)] = []
        for (i, account) in accounts.enumerated() {
            clients.append((i, try c.client(1, account)))
            if i % 3 != 2 { clients.append((i, try c.client(2, account))) }
        }
        let connections = accounts.indices.map { i in clients.filter { $0.account == i }.count }
        let rounds = 4
        var lines: [String] = []
        for round in 0..<rounds {
            for (i, account) in accounts.enumerated() {
                lines.append(#"{"op":"publish","channel":"wallet_updates","account":\#(jsonString(account)),"type":"t","data":{"a":\#(i),"r":\#(round)}}"#)
            }
        }
        let replies = try c.nodes[0].admin().requests(lines).map { try parseObject($0) }
        for (n, reply) in replies.enumerated() {
            let i = n % accounts.count
            #expect(reply["seq"] as? Int == n / accounts.count + 1, "seed \(seed), account \(i): \(reply)")
            #expect(reply["delivered"] as? Int == connections[i], "seed \(seed), account \(i): delivered \(reply["delivered"] ?? "nil"), expected \(connections[i])")
        }
        for (i, ws) in clients {
            let events = try ClusterTests.events(ws, count: rounds)
            let mine = events.map { (($0["data"] as? [String: Any])?["a"] as? Int, $0["seq"] as? Int) }
            #expect(mine.map(\.0) == Array(repeating: i, count: rounds), "seed \(seed), account \(i) got \(mine)")
            #expect(mine.map(\.1) == (1...rounds).map { $0 }, "seed \(seed), account \(i): seqs \(mine.map(\.1))")
            #expect(try ws.isQuiet(for: 0.2), "seed \(seed), account \(i) got more (or was closed)")
        }
        for node in c.nodes { #expect(!node.log.contains("restarted its numbering"), "\(node.log)") }
        withExtendedLifetime(peer) {}
    }

    /// Break 4: during a Redis stall longer than the stall check (3 s), a waiting publish was answered "nothing was
    /// published, retry", and its script ran when Redis woke. Now the answer is PUBLISH_OUTCOME_UNKNOWN; the event
    /// was in fact numbered and delivered, and the retry with the same key says so (a duplicate, same seq).
    @Test func aPublishCaughtInARedisStallIsUnknownNotRefused() throws {
        let c = try ClusterTests.cluster(2)
        let ws = try c.client(1, "acc_S")
        let redis = try #require(c.redis)
        let pid = redis.process.process.processIdentifier
        let line = #"{"op":"publish","channel":"wallet_updates","account":"acc_S","type":"t","data":{"n":1},"idempotencyKey":"stall-1","id":"p"}"#
        // Redis has the publish script cached (a first publish loads it: EVALSHA, NOSCRIPT, EVAL).
        #expect(try c.nodes[0].publish(channel: "wallet_updates", account: "acc_warm")["seq"] as? Int == 1)
        #expect(kill(pid, SIGSTOP) == 0)
        let reply = try? c.nodes[0].request(line)
        #expect(kill(pid, SIGCONT) == 0)
        let error = reply?["error"] as? [String: Any]
        #expect(error?["code"] as? String == "PUBLISH_OUTCOME_UNKNOWN", "\(reply ?? [:])")
        #expect((error?["message"] as? String)?.contains("idempotencyKey") == true)
        let events = try ClusterTests.events(ws, count: 1, timeout: 20)
        #expect(events.first?["seq"] as? Int == 1, "the stalled publish ran when Redis woke: \(events)")
        var retry: [String: Any] = [:]
        #expect(eventually(timeout: 15) {
            retry = (try? c.nodes[0].request(line)) ?? [:]
            return retry["seq"] != nil
        }, "\(retry)")
        #expect(retry["seq"] as? Int == 1 && retry["duplicate"] as? Bool == true, "\(retry)")
        #expect(try ws.isQuiet(for: 0.3), "delivered once")
        // While Redis is down for certain (not connected), the answer stays "nothing was published".
        redis.crash()
        #expect(eventually(timeout: 5) {
            let r = try? c.nodes[0].publish(channel: "wallet_updates", account: "acc_S")
            return (r?["error"] as? [String: Any])?["code"] as? String == "BROKER_UNAVAILABLE"
        })
    }
}

/// Break 3: a Redis restored from an older snapshot rewound a stream's seq within its epoch, and the next events were
/// numbered again (6-10 twice), dropped by followers as duplicates, with `recovered:true` for a resume past them.
/// Numbering is now bound to the Redis process (its run id): after a restart, a Redis that keeps everything it
/// acknowledged (append-only, `appendfsync always`) goes on; any other starts each stream anew under a new epoch,
/// so followers close with 1012 and resumes answer `epoch_changed`. Each persistence setting, Redis killed with
/// SIGKILL mid-stream and restarted from its files.
@Suite(.serialized, .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
struct ClusterRedisRestartTests {
    enum Persistence: String, CaseIterable, Sendable {
        case none, rdb, aofEverySecond, aofAlways
        var arguments: [String] {
            switch self {
            case .none, .rdb: return ["--save", ""]  // rdb: a SAVE mid-stream, as a snapshot schedule would
            case .aofEverySecond: return ["--appendonly", "yes", "--appendfsync", "everysec"]
            case .aofAlways: return ["--appendonly", "yes", "--appendfsync", "always"]
            }
        }
    }

    @Test(arguments: Persistence.allCases)
    func aRestartedRedisNeverNumbersTwoEventsAlike(_ persistence: Persistence) throws {
        let directory = try makeRedisDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var redis = try RedisServer(directory: directory, arguments: persistence.arguments)
        let c = try ClusterTests.cluster(2, redis: redis)
        let ws = try c.client(1, "acc_R")
        for i in 1...10 {
            #expect(try c.nodes[0].publish(channel: "wallet_updates", account: "acc_R")["seq"] as? Int == i)
            if i == 5 && persistence == .rdb { #expect(try redis.connect().call(["SAVE"]) == .simple("OK")) }
        }
        #expect(try ClusterTests.events(ws, count: 10).compactMap { $0["seq"] as? Int } == Array(1...10))
        let before = try IntegrationRecoveryTests.position(try parseObject(try {
            let probe = try c.client(0, "acc_R", channels: [])
            try IntegrationRecoveryTests.subscribe(probe)
            return try probe.nextText()
        }()))
        #expect(before.seq == 10)

        redis.crash()
        redis = try RedisServer(directory: directory, arguments: persistence.arguments)
        #expect(eventually(timeout: 15) { c.nodes.allSatisfy { $0.log.components(separatedBy: "cluster: subscribed to").count >= 3 } },
                "nodes did not resubscribe")
        var reply: [String: Any] = [:]
        #expect(eventually(timeout: 10) {
            reply = (try? c.nodes[0].publish(channel: "wallet_updates", account: "acc_R")) ?? [:]
            return reply["seq"] != nil
        }, "\(reply)")
        let resumer = try c.client(0, "acc_R", channels: [])
        try IntegrationRecoveryTests.subscribe(resumer, since: before)
        let resumed = try IntegrationRecoveryTests.position(try IntegrationRecoveryTests.readReplay(resumer).reply)
        if persistence == .aofAlways {
            // Nothing acknowledged was lost: numbering goes on, the follower is not disturbed, the resume holds.
            #expect(reply["seq"] as? Int == 11, "\(reply)")
            #expect(try ClusterTests.events(ws, count: 1).first?["seq"] as? Int == 11)
            #expect(resumed.recovered == true && resumed.seq == 11, "\(resumed)")
        } else {
            // A new numbering: seq 1 of a new epoch, never a second 6-10 of the old one.
            #expect(reply["seq"] as? Int == 1, "\(reply)")
            let closed = try ws.expectClose(timeout: 10)
            #expect(closed.code == 1012, "\(closed)")
            #expect(resumed.recovered == false && resumed.reason == "epoch_changed" && resumed.epoch != before.epoch, "\(resumed)")
        }
        _ = redis
    }
}
