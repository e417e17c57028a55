import Foundation
import Synchronization
import Testing
import WSProtocol
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport
#if canImport(Glibc)
import Glibc
#endif

/// A real Redis Cluster of `masters` redis-servers (and optionally one replica each, nodes `masters..<2*masters`) on
/// loopback TCP ports, each also on a Unix socket for the test's own commands. Slots are split evenly over the
/// masters (CLUSTER ADDSLOTSRANGE), the nodes meet, replicas follow their master (CLUSTER REPLICATE), and the
/// cluster is ready when every node says `cluster_state:ok` and every replica is in sync. Killed by pid, directory
/// removed.
final class RedisClusterPeer: @unchecked Sendable {
    struct Node {
        let port: Int
        let busPort: Int
        let directory: String
        var socketPath: String { directory + "/redis.sock" }
        var address: String { "127.0.0.1:\(port)" }
    }

    let directory: String
    let masters: Int
    private(set) var nodes: [Node] = []
    private var processes: [InteropProcess?] = []

    init(masters: Int = 3, replicas: Bool = false) throws {
        guard RedisPeer.executable != nil else { throw HubTestError("no redis-server") }
        directory = try makeRedisDirectory()
        self.masters = masters
        for i in 0..<(replicas ? 2 * masters : masters) {
            let dir = directory + "/n\(i)"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            nodes.append(Node(port: try ListenOwnershipTests.freePort(), busPort: try ListenOwnershipTests.freePort(), directory: dir))
            processes.append(nil)
            try start(i)
        }
        let perNode = RedisSlot.count / masters
        for (i, node) in nodes.prefix(masters).enumerated() {
            let first = i * perNode
            let last = i == masters - 1 ? RedisSlot.count - 1 : first + perNode - 1
            let c = try RESPTestConnection(node.socketPath)
            #expect(try c.call(["CLUSTER", "ADDSLOTSRANGE", String(first), String(last)]) == .simple("OK"))
        }
        let first = try RESPTestConnection(nodes[0].socketPath)
        for node in nodes.dropFirst() {
            _ = try first.call(["CLUSTER", "MEET", "127.0.0.1", String(node.port), String(node.busPort)])
        }
        if replicas {
            let ids = try (0..<masters).map { try myID($0) }
            for r in masters..<(2 * masters) {
                let c = try connect(r)
                // The replica must know its master (gossip) before it can follow it.
                guard eventually(timeout: 10, { (try? c.call(["CLUSTER", "REPLICATE", ids[r - masters]])) == .simple("OK") }) else {
                    throw HubTestError("node \(r) could not become a replica of \(ids[r - masters])")
                }
            }
        }
        guard eventually(timeout: 30, { (try? self.allOK()) == true }) else {
            throw HubTestError("the Redis Cluster did not reach cluster_state:ok: \((try? self.info(0)) ?? "")")
        }
    }

    deinit {
        for p in processes { p?.kill() }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Starts node `i` (again, after `kill`: same ports, same nodes.conf, so it rejoins as itself; its data is gone).
    func start(_ i: Int) throws {
        let node = nodes[i]
        unlink(node.socketPath)
        let p = try InteropProcess(RedisPeer.executable ?? "redis-server", [
            "--port", String(node.port), "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-port", String(node.busPort),
            "--cluster-config-file", node.directory + "/nodes.conf", "--cluster-node-timeout", "2000",
            "--unixsocket", node.socketPath, "--unixsocketperm", "700",
            "--save", "", "--appendonly", "no", "--dir", node.directory, "--daemonize", "no",
        ])
        processes[i] = p
        guard eventually(timeout: 10, { p.process.isRunning && (try? RESPTestConnection(node.socketPath)) != nil }) else {
            p.kill()
            throw HubTestError("redis-server did not come up on \(node.socketPath)\n\(p.summary)")
        }
    }

    func kill(_ i: Int) {
        processes[i]?.kill()
        processes[i] = nil
        unlink(nodes[i].socketPath)
    }

    func connect(_ i: Int) throws -> RESPTestConnection { try RESPTestConnection(nodes[i].socketPath) }

    func info(_ i: Int) throws -> String { try connect(i).call(["CLUSTER", "INFO"]).string ?? "" }

    func allOK() throws -> Bool {
        for i in nodes.indices where processes[i] != nil {
            let c = try connect(i)
            guard (try c.call(["CLUSTER", "INFO"]).string ?? "").contains("cluster_state:ok") else { return false }
            // Every node must also know every master's slots (and, with replicas, each master's replica).
            let rows = try c.call(["CLUSTER", "SLOTS"]).elements ?? []
            guard rows.count == masters else { return false }
            if nodes.count > masters, rows.contains(where: { ($0.elements?.count ?? 0) < 4 }) { return false }
            if i >= masters, !(try c.call(["INFO", "replication"]).string ?? "").contains("master_link_status:up") { return false }
        }
        return true
    }

    /// `redis-cluster://` with every node as a seed, or only `seeds`.
    func url(seeds: [Int]? = nil) -> String {
        "redis-cluster://" + (seeds ?? Array(nodes.indices)).map { nodes[$0].address }.joined(separator: ",")
    }

    func myID(_ i: Int) throws -> String { try connect(i).call(["CLUSTER", "MYID"]).string ?? "" }

    /// The node (index) serving `slot`.
    func owner(of slot: Int) throws -> Int {
        guard let live = processes.firstIndex(where: { $0 != nil }) else { throw HubTestError("no node running") }
        let c = try connect(live)
        for row in try c.call(["CLUSTER", "SLOTS"]).elements ?? [] {
            guard let f = row.elements, let lo = f[0].int, let hi = f[1].int, let node = f[2].elements, let port = node[1].int else { continue }
            if slot >= lo && slot <= hi { return nodes.firstIndex { $0.port == port } ?? -1 }
        }
        return -1
    }

    /// Moves `slot` with its keys to node `to` as `redis-cli --cluster reshard` does: IMPORTING/MIGRATING, MIGRATE
    /// each key, then SETSLOT NODE on every node. `betweenKeys` runs after the first key moved (the slot is then
    /// half-migrated: a command for a moved key gets ASK).
    func migrate(slot: Int, to: Int, betweenKeys: () throws -> Void = {}) throws {
        let from = try owner(of: slot)
        guard from >= 0, from != to else { return }
        let source = try connect(from), target = try connect(to)
        let sourceID = try myID(from), targetID = try myID(to)
        #expect(try target.call(["CLUSTER", "SETSLOT", String(slot), "IMPORTING", sourceID]) == .simple("OK"))
        #expect(try source.call(["CLUSTER", "SETSLOT", String(slot), "MIGRATING", targetID]) == .simple("OK"))
        let keys = (try source.call(["CLUSTER", "GETKEYSINSLOT", String(slot), "1000"]).elements ?? []).compactMap(\.string)
        for (n, key) in keys.enumerated() {
            let moved = try source.call(["MIGRATE", "127.0.0.1", String(nodes[to].port), key, "0", "5000"])
            #expect(moved == .simple("OK"), "MIGRATE \(key): \(moved)")
            if n == 0 { try betweenKeys() }
        }
        for i in nodes.indices where processes[i] != nil {
            #expect(try connect(i).call(["CLUSTER", "SETSLOT", String(slot), "NODE", targetID]) == .simple("OK"))
        }
    }
}

extension RedisOnLoop {
    /// A `RedisClusterClient` on `url` (`redis-cluster://…`), on its own loop.
    convenience init(cluster url: String, subscriber: Bool = false) throws {
        try self.init(RedisEndpoint(parsing: url), backoff: RedisBackoff(initial: .milliseconds(20), maximum: .milliseconds(300)),
                      cluster: true, subscriber: subscriber)
    }

    func waitReady(_ timeout: Double = 10) throws {
        guard waitFor(timeout, { (try? state()) == .ready }) else { throw HubTestError("not ready: \(log)") }
    }

    /// The cluster client's masters, as "host:port".
    func masters() throws -> [String] {
        try onLoop { redis, done in done((redis as? RedisClusterClient)?.masterAddresses ?? []) }
    }

    /// A SUBSCRIBE-family command; nil when every channel is confirmed.
    func subscribe(_ arguments: [String]) throws -> RedisError? {
        try onLoop { redis, done in redis.subscribe(arguments) { done($0) } }
    }
}

@Suite("Redis Cluster: slots, URLs, redirects")
struct RedisClusterUnitTests {
    @Test func slotsAreCRC16XmodemOfTheKeyOrItsHashTag() {
        #expect(RedisSlot.crc16(Array("123456789".utf8)) == 0x31C3)  // the CRC16/XMODEM check value
        #expect(RedisSlot.of("foo") == 12_182)
        #expect(RedisSlot.of("{user1000}.following") == RedisSlot.of("{user1000}.followers"))
        #expect(RedisSlot.of("{user1000}.following") == RedisSlot.of("user1000"))
        #expect(RedisSlot.of("foo{}{bar}") == Int(RedisSlot.crc16(Array("foo{}{bar}".utf8)) & 0x3FFF))  // empty tag: the whole key
        #expect(RedisSlot.of("foo{{bar}}zap") == RedisSlot.of("{bar"))
        #expect(RedisSlot.of("foo{bar}{zap}") == RedisSlot.of("bar"))
        // The hub's stream keys: all of one stream in one slot, its shard's.
        let streams = RedisStreams(prefix: "hub", shards: 16, layout: .streams)
        let s = RedisStreams.Stream(channel: "wallet_updates", account: "acc_1")
        let slot = RedisSlot.of(streams.metaKey(s))
        for key in [streams.historyKey(s), streams.presenceKey(s), streams.streamChannel(s), streams.idempotencyKey(s, "k"),
                    streams.fanoutChannel(shard: streams.shard(of: s))] {
            #expect(RedisSlot.of(key) == slot, "\(key)")
        }
        #expect(RedisSlot.of(command: ["EVALSHA", "abc", "2", "{7}a", "{7}b", "x"]) == RedisSlot.of("{7}"))
        #expect(RedisSlot.of(command: ["EVALSHA", "abc", "0"]) == nil)
        #expect(RedisSlot.of(command: ["HSET", "{9}p", "n", "1"]) == RedisSlot.of("{9}"))
        #expect(RedisSlot.of(command: ["SPUBLISH", "hub:ctl:x", "m"]) == RedisSlot.of("hub:ctl:x"))
        #expect(RedisSlot.of(command: ["PING"]) == nil)
    }

    @Test func clusterURLs() throws {
        let e = try RedisEndpoint(parsing: "redis-cluster://:topsecret@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002")
        #expect(e.cluster)
        #expect(e.seeds == [.tcp(host: "127.0.0.1", port: 7000), .tcp(host: "127.0.0.1", port: 7001), .tcp(host: "[::1]", port: 7002)])
        #expect(e.password == "topsecret")
        #expect(e.description == "redis-cluster://:***@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002")
        #expect(e.node(.tcp(host: "127.0.0.1", port: 7005)) == RedisEndpoint(address: .tcp(host: "127.0.0.1", port: 7005), password: "topsecret"))
        #expect(try RedisEndpoint(parsing: "redis-cluster://127.0.0.1").seeds == [.tcp(host: "127.0.0.1", port: 6379)])
        #expect(try !RedisEndpoint(parsing: "redis://127.0.0.1:7000").cluster)
        for bad in ["redis-cluster://127.0.0.1:7000/2", "redis-cluster://127.0.0.1:7000,,127.0.0.1:7001", "redis-cluster://",
                    "redis-cluster://:topsecret@host.example:7000", "redis-cluster://127.0.0.1:0"] {
            var thrown: RedisError? = nil
            do { _ = try RedisEndpoint(parsing: bad) } catch { thrown = error }
            #expect(thrown?.kind == .badURL, "\(bad)")
            #expect(thrown?.message.contains("topsecret") == false)
        }
        // The hub's option: a bad URL is refused at startup with the forms it takes.
        #expect {
            _ = try HubConfiguration.parse(arguments: ["--broker", "redis-cluster://127.0.0.1:1/1"], environment: [:])
        } throws: { error in
            (error as? HubConfiguration.ConfigurationError)?.message.contains("redis-cluster://HOST:PORT[,HOST:PORT...]") == true
        }
        guard case .run(let c) = try HubConfiguration.parse(arguments: ["--broker", "redis-cluster://127.0.0.1:7000,127.0.0.1:7001"],
                                                            environment: [:]) else {
            Issue.record("expected run")
            return
        }
        #expect(c.broker?.cluster == true && c.broker?.seeds.count == 2)
    }

    @Test func redirectsAndSlotMaps() {
        #expect(RedisClusterClient.Redirect("MOVED 3999 127.0.0.1:6381") != nil)
        let moved = RedisClusterClient.Redirect("MOVED 3999 127.0.0.1:6381")
        #expect(moved?.moved == true && moved?.slot == 3999 && moved?.address == "127.0.0.1:6381")
        let ask = RedisClusterClient.Redirect("ASK 12 ::1:7000")
        #expect(ask?.moved == false && ask?.slot == 12 && ask?.address == "[::1]:7000")
        for text in ["MOVED", "MOVED x 1.2.3.4:5", "MOVED 1 1.2.3.4", "ERR MOVED 1 1.2.3.4:5", "NOSCRIPT No matching script"] {
            #expect(RedisClusterClient.Redirect(text) == nil, "\(text)")
        }
        let reply = RESPValue.array([
            .array([.integer(0), .integer(5460), .array([.bulk(Array("127.0.0.1".utf8)), .integer(7000), .bulk(Array("id0".utf8))])]),
            .array([.integer(5461), .integer(16383), .array([.bulk(Array("::1".utf8)), .integer(7001)]),
                    .array([.bulk(Array("127.0.0.1".utf8)), .integer(7004)])]),
        ])
        let parsed = try? RedisClusterClient.parseSlots(reply).get()
        #expect(parsed == [.init(first: 0, last: 5460, master: "127.0.0.1:7000"), .init(first: 5461, last: 16383, master: "[::1]:7001")])
        for bad: RESPValue in [.simple("OK"), .array([.array([.integer(5), .integer(2), .array([.bulk([0x61]), .integer(1)])])]),
                               .array([.array([.integer(0), .integer(16384), .array([.bulk([0x61]), .integer(1)])])]),
                               .array([.array([.integer(0), .integer(1), .array([.bulk([0x61]), .integer(0)])])]), .array([])] {
            #expect((try? RedisClusterClient.parseSlots(bad).get()) == nil, "\(bad)")
        }
    }
}

@Suite("Redis Cluster against real redis-servers", .serialized, .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
struct RedisClusterTests {
    @Test func slotsAgreeWithRedis() throws {
        let cluster = try RedisClusterPeer(masters: 1)
        let c = try cluster.connect(0)
        var keys = ["", "{", "}", "{}", "a{b}c", "{a}{b}", "é{ü}", "hub:{3}:m:a:14:wallet_updates:acc_1"]
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<300 {
            let bytes = (0..<Int.random(in: 1...24, using: &rng)).map { _ in UInt8.random(in: 0x20...0x7E, using: &rng) }
            keys.append(String(decoding: bytes, as: UTF8.self))
        }
        for key in keys {
            #expect(try c.call(["CLUSTER", "KEYSLOT", key]).int == Int64(RedisSlot.of(key)), "\(key)")
        }
    }

    @Test func commandsAreRoutedBySlotAndFollowMovedAndAsk() throws {
        let cluster = try RedisClusterPeer(masters: 3)
        // One seed is enough: the others are learnt from CLUSTER SLOTS. An unreachable first seed is skipped.
        let dead = try ListenOwnershipTests.freePort()
        let client = try RedisOnLoop(cluster: "redis-cluster://127.0.0.1:\(dead),\(cluster.nodes[1].address)")
        try client.waitReady()
        #expect(try client.masters() == cluster.nodes.map(\.address).sorted())
        let keys = (0..<300).map { "key:\($0)" }
        for result in try client.call(keys.map { ["SET", $0, "v-\($0)"] }) { #expect((try? result.get()) == .simple("OK"), "\(result)") }
        // Spread over all three masters, each key where Redis says its slot lives.
        for i in cluster.nodes.indices {
            let count = try cluster.connect(i).call(["DBSIZE"]).int ?? 0
            #expect(count > 50, "node \(i) holds \(count) of 300 keys")
        }
        // A script whose keys share a slot runs on that slot's master.
        let script = "return redis.call('GET', KEYS[1]) .. '|' .. redis.call('GET', KEYS[2])"
        _ = try client.call([["SET", "{t}a", "1"], ["SET", "{t}b", "2"]])
        #expect((try? client.call([["EVAL", script, "2", "{t}a", "{t}b"]])[0].get())?.string == "1|2")

        // A slot moves to another master: the next command gets MOVED, follows it, and the map is read again.
        let slot = RedisSlot.of("key:7")
        let from = try cluster.owner(of: slot)
        let to = (from + 1) % 3
        try cluster.migrate(slot: slot, to: to)
        #expect((try? client.call([["GET", "key:7"]])[0].get())?.string == "v-key:7")
        #expect(try cluster.connect(to).call(["GET", "key:7"]).string == "v-key:7", "the key lives on the new master")

        // Half-migrated: a key already moved is found through ASK, one not yet moved on the old master.
        let tagged = (0..<4).map { "{mig}k\($0)" }
        _ = try client.call(tagged.map { ["SET", $0, $0] })
        let migSlot = RedisSlot.of("{mig}")
        let migTo = (try cluster.owner(of: migSlot) + 1) % 3
        try cluster.migrate(slot: migSlot, to: migTo) {
            let got = try client.call(tagged.map { ["GET", $0] })
            for (key, result) in zip(tagged, got) { #expect((try? result.get())?.string == key, "\(key) while migrating: \(result)") }
        }
        let after = try client.call(tagged.map { ["GET", $0] })
        for (key, result) in zip(tagged, after) { #expect((try? result.get())?.string == key) }
    }

    @Test func aLostMasterFailsOnlyItsSlotsAndComesBack() throws {
        let cluster = try RedisClusterPeer(masters: 3)
        let client = try RedisOnLoop(cluster: cluster.url(seeds: [0]))
        try client.waitReady()
        let keys = (0..<60).map { "k\($0)" }
        _ = try client.call(keys.map { ["SET", $0, "1"] })
        let victim = 2
        cluster.kill(victim)
        #expect(eventually(timeout: 5) { (try? client.state()) != .ready }, "\(client.log)")
        let results = try client.call(keys.map { ["GET", $0] })
        for (key, result) in zip(keys, results) {
            let onVictim = try cluster.owner(of: RedisSlot.of(key)) == victim
            switch result {
            case .success(let value): #expect(!onVictim && value.string == "1", "\(key): \(value)")
            case .failure(let error):
                #expect(onVictim && error.kind == .unavailable, "\(key): \(error)")
                #expect(error.message.contains(cluster.nodes[victim].address), "\(error.message)")
            }
        }
        try cluster.start(victim)
        try client.waitReady(15)
        #expect(client.log.filter { $0 == "ready" }.count == 2, "\(client.log)")
        // Until the nodes agree again, Redis itself answers CLUSTERDOWN, passed on as a server error.
        let early = try client.call(keys.map { ["SET", $0, "2"] })
        for result in early {
            if case .failure(let error) = result { #expect(error.kind == .server && error.message.hasPrefix("CLUSTERDOWN"), "\(error)") }
        }
        #expect(eventually(timeout: 15) { (try? cluster.allOK()) == true })
        // Its data went with it (no persistence); its slots answer again.
        for result in try client.call(keys.map { ["SET", $0, "2"] }) { #expect((try? result.get()) == .simple("OK"), "\(result)") }
    }

    @Test func aFailoverToAReplicaIsFollowed() throws {
        let cluster = try RedisClusterPeer(masters: 3, replicas: true)
        let client = try RedisOnLoop(cluster: cluster.url(seeds: [1]))
        try client.waitReady()
        #expect(try client.masters() == cluster.nodes.prefix(3).map(\.address).sorted(), "replicas are not masters")
        let keys = (0..<60).map { "f\($0)" }
        for result in try client.call(keys.map { ["SET", $0, "v"] }) { #expect((try? result.get()) == .simple("OK")) }
        #expect(eventually(timeout: 10) {
            (0..<3).allSatisfy { m in (try? cluster.connect(m).call(["DBSIZE"]).int) == (try? cluster.connect(m + 3).call(["DBSIZE"]).int) }
        }, "replicas in sync")
        cluster.kill(0)
        // Redis promotes node 3 once node 0 has been silent for cluster-node-timeout (2 s); the client reads the new
        // map (CLUSTER SLOTS from a master that is up) after losing node 0, and again until node 3 serves its slots.
        let promoted = [cluster.nodes[1], cluster.nodes[2], cluster.nodes[3]].map(\.address).sorted()
        #expect(eventually(timeout: 30) { (try? client.masters()) == promoted && (try? client.state()) == .ready }, "\(client.log)")
        // Until the nodes agree on the promotion, Redis itself answers CLUSTERDOWN (passed on as a server error).
        var after: [Result<RESPValue, RedisError>] = []
        #expect(eventually(timeout: 15) {
            after = (try? client.call(keys.map { ["GET", $0] })) ?? []
            return after.count == keys.count && !after.contains { result in
                guard case .failure(let error) = result else { return false }
                return error.kind == .server && error.message.hasPrefix("CLUSTERDOWN")
            }
        })
        for (key, result) in zip(keys, after) {
            #expect((try? result.get())?.string == "v", "\(key) after the failover: \(result)")
        }
    }

    @Test func shardChannelsAreSubscribedOnTheirMastersAndAMovedSlotTakesTheSubscriberDownAndUp() throws {
        let cluster = try RedisClusterPeer(masters: 3)
        let sub = try RedisOnLoop(cluster: cluster.url(), subscriber: true)
        let pub = try RedisOnLoop(cluster: cluster.url())
        try sub.waitReady()
        try pub.waitReady()
        let channels = (0..<16).map { "hub:{\($0)}:fan" }
        #expect(try sub.subscribe(["SSUBSCRIBE"] + channels) == nil)
        for result in try pub.call(channels.map { ["SPUBLISH", $0, "m-\($0)"] }) {
            #expect((try? result.get())?.int == 1, "\(result)")
        }
        #expect(eventually { sub.pushed.filter { $0.elements?.first?.string == "smessage" }.count == 16 })
        let got = Set(sub.pushed.compactMap { p -> String? in
            guard let items = p.elements, items.first?.string == "smessage" else { return nil }
            return items[1].string
        })
        #expect(got == Set(channels))
        // The stall check's PING reaches every master.
        #expect((try? sub.call([["PING"]])[0].get()) == .simple("PONG"))

        // Redis takes a subscribed channel away when its slot moves: the link goes down and up (the broker then
        // subscribes again on the new master).
        let slot = RedisSlot.of(channels[5])
        try cluster.migrate(slot: slot, to: (try cluster.owner(of: slot) + 1) % 3)
        #expect(eventually(timeout: 10) { sub.log.filter { $0 == "ready" }.count == 2 }, "\(sub.log)")
        #expect(sub.log.contains { $0.contains("moved the slot of \(channels[5])") }, "\(sub.log)")
        #expect(try sub.subscribe(["SSUBSCRIBE", channels[5]]) == nil)
        #expect((try? pub.call([["SPUBLISH", channels[5], "again"]])[0].get())?.int == 1)
        #expect(eventually { sub.pushed.contains { $0.elements?.last?.string == "again" } })
    }
}

/// Hubs on a Redis Cluster (`--broker redis-cluster://…`), through real binaries: the same guarantees as on one Redis.
@Suite("Hubs on a Redis Cluster", .serialized, .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
struct HubsOnRedisClusterTests {
    static func hubs(_ count: Int, on cluster: RedisClusterPeer, seeds: [Int]? = nil,
                     layout: RedisStreams.FanoutLayout = .streams) throws -> ClusterTests.Cluster {
        var nodes: [HubProcess] = []
        for _ in 0..<count {
            let node = try HubProcess(["--broker", cluster.url(seeds: seeds), "--broker-fanout", layout.rawValue],
                                      environment: ["HUB_JWT_SECRET": ClusterTests.secret])
            guard eventually(timeout: 15, { node.log.contains("cluster: subscribed to") && node.log.contains("connected to Redis") }) else {
                throw HubTestError("node did not join the cluster:\n\(node.log)")
            }
            nodes.append(node)
        }
        return ClusterTests.Cluster(redis: nil, nodes: nodes)
    }

    @Test(arguments: RedisStreams.FanoutLayout.allCases)
    func eventsReachExactlyTheirAccountInOrderAcrossMastersWhileASlotMoves(layout: RedisStreams.FanoutLayout) throws {
        let redis = try RedisClusterPeer(masters: 3)
        let c = try Self.hubs(2, on: redis, seeds: [1], layout: layout)
        // 12 accounts: their streams fall in different shards, so on all three masters. Each has a client on each node.
        let accounts = (0..<12).map { "acc_\($0)" }
        let streams = RedisStreams(prefix: "hub", shards: RedisBroker.clusterShards, layout: .streams)
        let masters = Set(try accounts.map { try redis.owner(of: RedisSlot.of(streams.metaKey(.init(channel: "wallet_updates", account: $0)))) })
        #expect(masters.count == 3, "the accounts' streams should span every master: \(masters)")
        var clients: [(account: String, ws: TestWebSocket)] = []
        for account in accounts {
            for node in 0..<2 { clients.append((account, try c.client(node, account))) }
        }
        // Publishers on both nodes at once, in two rounds. Between them the slot of acc_0's stream moves to another
        // master (so every later acc_0 event comes from there); during the second, acc_1's slot moves too.
        let perPublisher = 120
        let failures = LockedValue<[String]>([])
        let replies = LockedValue<[[String: Any]]>([])
        @Sendable func slot(_ account: String) -> Int { RedisSlot.of(streams.metaKey(.init(channel: "wallet_updates", account: account))) }
        func round(_ range: Range<Int>, alongside: (@Sendable () throws -> Void)? = nil) {
            DispatchQueue.concurrentPerform(iterations: 3) { p in
                do {
                    if p == 2 {
                        usleep(20_000)
                        try alongside?()
                        return
                    }
                    let admin = try c.nodes[p].admin()
                    for n in range {
                        let account = accounts[n % accounts.count]
                        let line = #"{"op":"publish","channel":"wallet_updates","account":"\#(account)","type":"t","data":{"p":\#(p),"n":\#(n),"a":"\#(account)"},"id":\#(n)}"#
                        let reply = try parseObject(try admin.requests([line])[0])
                        replies.withLock { $0.append(reply) }
                        if n % 10 == 0 { usleep(10_000) }
                    }
                } catch {
                    failures.withLock { $0.append("\(p): \(error)") }
                }
            }
        }
        round(0..<perPublisher / 2)
        try redis.migrate(slot: slot("acc_0"), to: (try redis.owner(of: slot("acc_0")) + 1) % 3)
        round(perPublisher / 2..<perPublisher) {
            try redis.migrate(slot: slot("acc_1"), to: (try redis.owner(of: slot("acc_1")) + 1) % 3)
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        // Each node's subscriber link saw acc_0's channel (or its shard's) move and subscribed again.
        for node in c.nodes {
            #expect(eventually(timeout: 5) { node.log.contains("moved the slot of") || node.log.contains("slot map changed") }, "\(node.log)")
        }
        // Every publish acknowledged, counted on both nodes (delivered 2: one connection per node).
        for reply in replies.withLock({ $0 }) {
            #expect(reply["ok"] as? Bool == true && reply["delivered"] as? Int == 2, "\(reply)")
        }
        let perAccount = 2 * perPublisher / accounts.count
        for (account, ws) in clients {
            let events = try ClusterTests.events(ws, count: perAccount)
            let seqs = events.compactMap { $0["seq"] as? Int }
            #expect(seqs == Array(1...perAccount), "\(account): \(seqs)")
            for event in events {
                #expect((event["data"] as? [String: Any])?["a"] as? String == account, "\(account) got \(event)")
            }
            #expect(try ws.isQuiet(for: 0.1), "\(account) got more than its events")
        }
        // The cluster-wide admin views work over sharded pub/sub too.
        let connections = try c.nodes[0].request(#"{"op":"connections","id":"c"}"#)
        let answers = ((connections["cluster"] as? [String: Any])?["nodes"] as? [[String: Any]]) ?? []
        let remote = answers.flatMap { (($0["reply"] as? [String: Any])?["connections"] as? [[String: Any]]) ?? [] }
        #expect(remote.count == accounts.count, "\(connections)")
        let nodes = (try c.nodes[1].request(#"{"op":"nodes"}"#))["nodes"] as? [[String: Any]]
        #expect(nodes?.count == 2)
    }

    @Test func aLostMasterFailsOnlyItsStreamsAndTheHubSaysDegraded() throws {
        let redis = try RedisClusterPeer(masters: 3)
        let c = try Self.hubs(1, on: redis)
        let hub = c.nodes[0]
        let streams = RedisStreams(prefix: "hub", shards: RedisBroker.clusterShards, layout: .streams)
        let accounts = (0..<24).map { "acc_\($0)" }
        func owner(_ account: String) throws -> Int {
            try redis.owner(of: RedisSlot.of(streams.metaKey(.init(channel: "wallet_updates", account: account))))
        }
        for account in accounts { #expect(try hub.publish(channel: "wallet_updates", account: account)["ok"] as? Bool == true) }
        let owners = try Dictionary(uniqueKeysWithValues: accounts.map { ($0, try owner($0)) })
        // A subscribe reads the account's stream and the channel's broadcast stream: lose a master without the latter.
        let broadcastOwner = try redis.owner(of: RedisSlot.of(streams.metaKey(.init(channel: "wallet_updates", account: nil))))
        guard let victim = owners.values.first(where: { $0 != broadcastOwner }),
              let onLive = accounts.first(where: { owners[$0] != victim }), let onVictim = accounts.first(where: { owners[$0] == victim }) else {
            Issue.record("24 accounts should span the three masters: \(owners)")
            return
        }
        redis.kill(victim)
        #expect(eventually(timeout: 8) { !ClusterTests.healthy(hub) }, "\(hub.log)")
        var refused = 0
        for account in accounts {
            let reply = try hub.request(#"{"op":"publish","channel":"wallet_updates","account":"\#(account)","type":"t","data":{},"id":1}"#)
            if owners[account] == victim {
                refused += 1
                #expect((reply["error"] as? [String: Any])?["code"] as? String == "BROKER_UNAVAILABLE", "\(account): \(reply)")
            } else {
                #expect(reply["ok"] as? Bool == true, "\(account) is not on the lost master: \(reply)")
            }
        }
        #expect(refused > 0 && refused < accounts.count)
        // New subscribes too: served for a stream on a live master, refused (and the app told to retry) on the lost one.
        for (account, served) in [(onLive, true), (onVictim, false)] {
            let ws = try TestWebSocket.connect(port: hub.port, headers: [("Authorization", "Bearer \(try c.token(account))")])
            try IntegrationRecoveryTests.subscribe(ws)
            let answer = try ws.nextText()
            if served {
                #expect(answer.hasPrefix(#"{"type":"subscribed""#), "\(account): \(answer)")
            } else {
                #expect(answer.contains("BROKER_UNAVAILABLE"), "\(account): \(answer)")
            }
        }
        try redis.start(victim)
        #expect(eventually(timeout: 20) { ClusterTests.healthy(hub) && (try? redis.allOK()) == true }, "\(hub.log)")
        #expect(eventually(timeout: 10) { (try? hub.publish(channel: "wallet_updates", account: "acc_0"))?["ok"] as? Bool == true })
    }

    @Test func anAppSeesNoGapAcrossAFailoverToAReplica() throws {
        let redis = try RedisClusterPeer(masters: 3, replicas: true)
        let c = try Self.hubs(1, on: redis, seeds: [2])
        let hub = c.nodes[0]
        let streams = RedisStreams(prefix: "hub", shards: RedisBroker.clusterShards, layout: .streams)
        // An account whose stream lives on node 0, the master about to fail.
        let candidates = (0..<64).map { "acc_\($0)" }
        let owners = try candidates.map { try redis.owner(of: RedisSlot.of(streams.metaKey(.init(channel: "wallet_updates", account: $0)))) }
        guard let index = owners.firstIndex(of: 0) else {
            Issue.record("no account on node 0")
            return
        }
        let account = candidates[index]
        let ws = try c.client(0, account)
        for n in 1...3 { #expect(try hub.publish(channel: "wallet_updates", account: account, data: #"{"n":\#(n)}"#)["seq"] as? Int == n) }
        #expect(try ClusterTests.events(ws, count: 3).compactMap { $0["seq"] as? Int } == [1, 2, 3])
        #expect(eventually(timeout: 10) {
            (try? redis.connect(0).call(["DBSIZE"]).int) == (try? redis.connect(3).call(["DBSIZE"]).int)
        }, "replica in sync")
        redis.kill(0)
        #expect(eventually(timeout: 8) { !ClusterTests.healthy(hub) }, "\(hub.log)")
        // After the failover the node is healthy again, the stream's numbering went on (the replica had it), and the
        // app, still connected, gets the next event with the next seq: no epoch change, no gap.
        #expect(eventually(timeout: 30) { ClusterTests.healthy(hub) }, "\(hub.log)")
        var reply: [String: Any] = [:]
        #expect(eventually(timeout: 10) {
            reply = (try? hub.publish(channel: "wallet_updates", account: account, data: #"{"n":4}"#)) ?? [:]
            return reply["ok"] as? Bool == true
        }, "\(reply)")
        #expect(reply["seq"] as? Int == 4 && reply["delivered"] as? Int == 1, "\(reply)")
        #expect(try ClusterTests.events(ws, count: 1).compactMap { $0["seq"] as? Int } == [4])
        #expect(try ws.isQuiet(for: 0.2))
    }

    @Test func aSingleRedisURLPointedAtAClusterNodeSaysWhatToUse() throws {
        let redis = try RedisClusterPeer(masters: 1)
        let hub = try HubProcess(["--broker", "redis://\(redis.nodes[0].address)"], environment: ["HUB_JWT_SECRET": ClusterTests.secret])
        #expect(eventually(timeout: 10) { hub.log.contains("is a Redis Cluster node: use --broker redis-cluster://") }, "\(hub.log)")
    }
}
