import Foundation
import Glibc
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

/// Cluster mode through real binaries: three `hub --broker unix://…` processes sharing one real `redis-server`.
/// Isolation and per-stream order across nodes, truthful `delivered`, resume on another node, and Redis going away.
@Suite(.serialized, .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
struct ClusterTests {
    static let secret = "cluster-test-secret-0123456789abcdef0123"

    struct Cluster: @unchecked Sendable {
        let redis: RedisServer?  // nil: the test keeps its Redis (a Redis Cluster) itself
        let nodes: [HubProcess]

        func token(_ account: String) throws -> String {
            let now = Int64(time(nil))
            return try JWTSigner(key: .hmacSecret(Array(ClusterTests.secret.utf8))).sign(JWTClaims(sub: account, exp: now + 900, iat: now))
        }

        func client(_ node: Int, _ account: String, channels: [String] = ["wallet_updates"]) throws -> TestWebSocket {
            try nodes[node].client(account, channels: channels, token: token(account))
        }
    }

    /// Redis, then `count` hubs on it, each ready (subscribed to the fan-out channels).
    static func cluster(_ count: Int = 3, redis: RedisServer? = nil, layout: RedisStreams.FanoutLayout = .streams) throws -> Cluster {
        let redis = try redis ?? RedisServer()
        var nodes: [HubProcess] = []
        for _ in 0..<count {
            let node = try HubProcess(["--broker", "unix://" + redis.socketPath, "--broker-fanout", layout.rawValue],
                                      environment: ["HUB_JWT_SECRET": secret])
            guard eventually(timeout: 10, { node.log.contains("cluster: subscribed to") && node.log.contains("connected to Redis") }) else {
                throw HubTestError("node did not join the cluster:\n\(node.log)")
            }
            nodes.append(node)
        }
        return Cluster(redis: redis, nodes: nodes)
    }

    /// `/healthz` answers 200: the node is connected to Redis and subscribed.
    static func healthy(_ node: HubProcess) -> Bool {
        (try? rawHTTP(port: node.port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))?.status == 200
    }

    /// (seq, account-or-broadcast marker) of an event text.
    static func seq(_ text: String) -> Int? { IntegrationRecoveryTests.seqOf(text)?.seq }

    /// Reads events until `count` arrived or the connection went quiet.
    static func events(_ ws: TestWebSocket, count: Int, timeout: Double = 10) throws -> [[String: Any]] {
        var out: [[String: Any]] = []
        let deadline = Date().addingTimeInterval(timeout)
        while out.count < count, Date() < deadline {
            guard let text = try? ws.nextText(timeout: max(0.1, deadline.timeIntervalSinceNow)) else { break }
            out.append(try parseObject(text))
        }
        return out
    }

    @Test(arguments: RedisStreams.FanoutLayout.allCases)
    func eventsReachExactlyTheirAccountOnEveryNodeInOrder(layout: RedisStreams.FanoutLayout) throws {
        let c = try Self.cluster(layout: layout)
        // Account A on all three nodes, B on node 2 only; A's connection on node 0 also has profile_updates.
        let a0 = try c.client(0, "acc_A", channels: ["wallet_updates", "profile_updates"])
        let a1 = try c.client(1, "acc_A")
        let a2 = try c.client(2, "acc_A")
        let b2 = try c.client(2, "acc_B")
        // Publishers on two nodes at once, both streams, interleaved.
        let perPublisher = 200
        let failures = LockedValue<[String]>([])
        let replies = LockedValue<[Int: [[String: Any]]]>([:])
        DispatchQueue.concurrentPerform(iterations: 2) { p in
            do {
                let admin = try c.nodes[p].admin()
                var lines: [String] = []
                for n in 0..<perPublisher {
                    let account = n % 4 == 3 ? "acc_B" : "acc_A"
                    lines.append(#"{"op":"publish","channel":"wallet_updates","account":"\#(account)","type":"t","data":{"p":\#(p),"n":\#(n)},"id":\#(n)}"#)
                }
                let got = try admin.requests(lines).map { try parseObject($0) }
                replies.withLock { $0[p] = got }
            } catch {
                failures.withLock { $0.append("publisher \(p): \(error)") }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        let expectedA = 2 * perPublisher * 3 / 4
        let expectedB = 2 * perPublisher / 4
        for (name, ws, expected, account) in [("a0", a0, expectedA, "acc_A"), ("a1", a1, expectedA, "acc_A"), ("a2", a2, expectedA, "acc_A"),
                                              ("b2", b2, expectedB, "acc_B")] {
            let events = try Self.events(ws, count: expected)
            #expect(events.count == expected, "\(name) got \(events.count) of \(expected)")
            // Contiguous from 1, in order: the stream's seq is cluster-wide.
            let seqs = events.compactMap { $0["seq"] as? Int }
            #expect(seqs == Array(1...max(1, events.count)).prefix(events.count).map { $0 }, "\(name) seqs not contiguous: \(seqs.prefix(20))")
            for event in events {
                let data = event["data"] as? [String: Any]
                let n = data?["n"] as? Int ?? -1
                #expect((n % 4 == 3) == (account == "acc_B"), "\(name) (\(account)) got an event of the other account: \(event)")
            }
            #expect(try ws.isQuiet(for: 0.3), "\(name) got more than its events")
        }
        // delivered: A's stream has three connections cluster-wide, B's one.
        for (p, list) in replies.withLock({ $0 }) {
            for (n, reply) in list.enumerated() {
                #expect(reply["ok"] as? Bool == true, "publisher \(p) #\(n): \(reply)")
                let expected = n % 4 == 3 ? 1 : 3
                #expect(reply["delivered"] as? Int == expected, "publisher \(p) #\(n): delivered \(reply["delivered"] ?? "nil"), expected \(expected)")
            }
        }
    }

    @Test func anAppResumesOnAnotherNode() throws {
        let c = try Self.cluster(2)
        let ws = try TestWebSocket.connect(port: c.nodes[0].port, headers: [("Authorization", "Bearer \(try c.token("acc_R"))")])
        try IntegrationRecoveryTests.subscribe(ws)
        let start = try IntegrationRecoveryTests.position(try IntegrationRecoveryTests.readReplay(ws).reply)
        for n in 1...3 {
            let reply = try c.nodes[1].publish(channel: "wallet_updates", account: "acc_R", data: #"{"n":\#(n)}"#)
            #expect(reply["seq"] as? Int == n)
        }
        let live = try Self.events(ws, count: 3)
        #expect(live.compactMap { $0["seq"] as? Int } == [1, 2, 3])
        ws.shutdownTCP()
        // Missed while away: 4...8, published through node 0.
        for n in 4...8 { _ = try c.nodes[0].publish(channel: "wallet_updates", account: "acc_R", data: #"{"n":\#(n)}"#) }
        let back = try TestWebSocket.connect(port: c.nodes[1].port, headers: [("Authorization", "Bearer \(try c.token("acc_R"))")])
        var since = start
        since.seq = 3
        try IntegrationRecoveryTests.subscribe(back, since: since)
        let (replay, reply) = try IntegrationRecoveryTests.readReplay(back)
        let position = try IntegrationRecoveryTests.position(reply)
        #expect(position.recovered == true, "\(reply)")
        #expect(position.epoch == start.epoch)
        #expect(replay.compactMap(Self.seq) == [4, 5, 6, 7, 8])
        // An operator sees the same history through any node (read from Redis).
        let history = try c.nodes[1].request(#"{"op":"history","channel":"wallet_updates","account":"acc_R","since":3}"#)["history"] as? [String: Any]
        #expect((history?["events"] as? [[String: Any]])?.compactMap { $0["seq"] as? Int } == [4, 5, 6, 7, 8], "\(String(describing: history))")
        #expect(history?["seq"] as? Int == 8)
        // Live again after the replay, with no gap.
        _ = try c.nodes[0].publish(channel: "wallet_updates", account: "acc_R")
        #expect(try Self.events(back, count: 1).first?["seq"] as? Int == 9)
        // A position from another numbering is refused with the reason.
        let stranger = try TestWebSocket.connect(port: c.nodes[0].port, headers: [("Authorization", "Bearer \(try c.token("acc_R"))")])
        var wrong = start
        wrong.epoch = "r.nope.nope"
        try IntegrationRecoveryTests.subscribe(stranger, since: wrong)
        let refused = try IntegrationRecoveryTests.position(try IntegrationRecoveryTests.readReplay(stranger).reply)
        #expect(refused.recovered == false && refused.reason == "epoch_changed")
    }

    @Test func redisGoingAwayFailsPublishesClearlyAndNothingAcknowledgedIsLost() throws {
        let directory = try makeRedisDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // With an append-only file, as a production Redis keeping history should run.
        var redis: RedisServer? = try RedisServer(directory: directory, arguments: ["--appendonly", "yes", "--appendfsync", "always"])
        let c = try Self.cluster(2, redis: redis)
        let ws = try c.client(1, "acc_K")
        var acknowledged: [Int] = []
        for _ in 1...5 {
            let reply = try c.nodes[0].publish(channel: "wallet_updates", account: "acc_K")
            if let seq = reply["seq"] as? Int { acknowledged.append(seq) }
        }
        let health = { (node: HubProcess) in try? rawHTTP(port: node.port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") }
        #expect(health(c.nodes[0])?.status == 200)
        redis?.crash()
        redis = nil
        // Health says degraded (503), so a load balancer sends new clients elsewhere.
        #expect(eventually(timeout: 5) { health(c.nodes[0]).map { $0.status == 503 && $0.body.contains(#""status":"degraded""#) } ?? false })
        // Fails fast with the documented code; the client stays connected.
        let refused = try c.nodes[0].request(#"{"op":"publish","channel":"wallet_updates","account":"acc_K","type":"t","data":{},"id":"x"}"#)
        #expect(refused["ok"] as? Bool == false)
        #expect((refused["error"] as? [String: Any])?["code"] as? String == "BROKER_UNAVAILABLE", "\(refused)")
        redis = try RedisServer(directory: directory, arguments: ["--appendonly", "yes", "--appendfsync", "always"])
        #expect(eventually(timeout: 15) { c.nodes.allSatisfy { $0.log.components(separatedBy: "cluster: subscribed to").count >= 3 } },
                "nodes did not resubscribe:\n\(c.nodes.map(\.log).joined(separator: "\n---\n"))")
        var published = false
        _ = eventually(timeout: 10) {
            guard let reply = try? c.nodes[0].publish(channel: "wallet_updates", account: "acc_K"), let seq = reply["seq"] as? Int else { return false }
            acknowledged.append(seq)
            published = true
            return true
        }
        #expect(published)
        #expect(eventually(timeout: 10) { health(c.nodes[1])?.status == 200 })
        let seqs = try Self.events(ws, count: acknowledged.count).compactMap { $0["seq"] as? Int }
        #expect(seqs == acknowledged, "the client got \(seqs), acknowledged \(acknowledged)")
        #expect(acknowledged == Array(1...acknowledged.count), "numbering continued across the Redis restart: \(acknowledged)")
    }

    /// A publisher keeps publishing (each event with its own idempotency key, retried until acknowledged) while Redis
    /// is killed and restarted under it. The subscriber on another node gets every acknowledged event exactly once,
    /// in order: numbering continued (append-only file), and the node filled what it missed from the history.
    @Test(arguments: RedisStreams.FanoutLayout.allCases)
    func killingRedisMidStreamLosesNothingAcknowledged(layout: RedisStreams.FanoutLayout) throws {
        let directory = try makeRedisDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let arguments = ["--appendonly", "yes", "--appendfsync", "always"]
        let first = try RedisServer(directory: directory, arguments: arguments)
        let c = try Self.cluster(2, redis: first, layout: layout)
        let ws = try c.client(1, "acc_M")
        let acknowledged = LockedValue<[Int: Int]>([:])  // event number → seq
        let stop = Atomic<Bool>(false)
        let refusals = Atomic<Int>(0)
        let publisher = Thread {
            var n = 0
            while !stop.load(ordering: .relaxed) {
                n += 1
                let line = #"{"op":"publish","channel":"wallet_updates","account":"acc_M","type":"t","data":{"n":\#(n)},"idempotencyKey":"e\#(n)"}"#
                while !stop.load(ordering: .relaxed) {
                    if let reply = try? c.nodes[0].request(line), let seq = reply["seq"] as? Int {
                        acknowledged.withLock { $0[n] = seq }
                        break
                    }
                    refusals.add(1, ordering: .relaxed)
                    usleep(20_000)
                }
                usleep(2_000)
            }
        }
        publisher.start()
        usleep(300_000)
        first.crash()
        usleep(300_000)
        let second = try RedisServer(directory: directory, arguments: arguments)
        usleep(700_000)
        stop.store(true, ordering: .relaxed)
        usleep(100_000)
        let acked = acknowledged.withLock { $0 }
        let seqs = acked.values.sorted()
        #expect(refusals.load(ordering: .relaxed) > 0, "Redis was never seen down")
        #expect(seqs.count > 20)
        #expect(Set(seqs).count == seqs.count, "two events acknowledged with one seq")
        let received = try Self.events(ws, count: seqs.count).compactMap { $0["seq"] as? Int }
        #expect(received == seqs, "received \(received.count) of \(seqs.count); first difference at \(Array(zip(received, seqs)).firstIndex { $0.0 != $0.1 } ?? min(received.count, seqs.count))")
        #expect(seqs == Array(1...max(1, seqs.count)).prefix(seqs.count).map { $0 }, "numbering did not continue: \(seqs.prefix(30))")
        #expect(try ws.isQuiet(for: 0.3))
        _ = second
    }

    /// The registry lists every node with what it says of itself; a node killed with SIGKILL stops counting in
    /// `delivered` once its heartbeat is stale (5 s), and leaves the list; its client resumes on another node.
    @Test func nodesAreListedAndADeadNodeStopsCounting() throws {
        let c = try Self.cluster(3)
        func nodes(_ via: Int) -> [[String: Any]] {
            ((try? c.nodes[via].request(#"{"op":"nodes"}"#))?["nodes"] as? [[String: Any]]) ?? []
        }
        #expect(eventually(timeout: 5) { nodes(0).count == 3 }, "\(nodes(0))")
        let listens = Set(nodes(1).compactMap { ($0["info"] as? [String: Any])?["listen"] as? String })
        #expect(listens == Set(c.nodes.map { "127.0.0.1:\($0.port)" }))
        #expect(nodes(2).filter { $0["self"] as? Bool == true }.count == 1)

        let d1 = try c.client(1, "acc_D")
        let d2 = try TestWebSocket.connect(port: c.nodes[2].port, headers: [("Authorization", "Bearer \(try c.token("acc_D"))")])
        try IntegrationRecoveryTests.subscribe(d2)
        let start = try IntegrationRecoveryTests.position(try IntegrationRecoveryTests.readReplay(d2).reply)
        // Any node shows the whole cluster (from the registry, refreshed at each heartbeat): node 0 has no client.
        func clusterSubscribers() -> Int? {
            let channels = (try? c.nodes[0].request(#"{"op":"channels"}"#))?["channels"] as? [[String: Any]]
            return channels?.first { $0["name"] as? String == "wallet_updates" }?["clusterSubscribers"] as? Int
        }
        #expect(eventually(timeout: 5) { clusterSubscribers() == 2 }, "\(String(describing: clusterSubscribers()))")
        // connections and channel ask every other node (over Redis) and append their answers.
        let connections = try c.nodes[0].request(#"{"op":"connections","id":"c"}"#)
        #expect((connections["connections"] as? [Any])?.count == 0 && connections["id"] as? String == "c")
        let answers = ((connections["cluster"] as? [String: Any])?["nodes"] as? [[String: Any]]) ?? []
        #expect(answers.count == 2 && (connections["cluster"] as? [String: Any])?["missing"] as? [Any] != nil, "\(connections)")
        let accounts = answers.flatMap { (($0["reply"] as? [String: Any])?["connections"] as? [[String: Any]]) ?? [] }.compactMap { $0["account"] as? String }
        #expect(accounts == ["acc_D", "acc_D"], "\(connections)")
        let channel = try c.nodes[1].request(#"{"op":"channel","channel":"wallet_updates"}"#)
        let views = ((channel["cluster"] as? [String: Any])?["nodes"] as? [[String: Any]]) ?? []
        let subscribers = views.compactMap { (($0["reply"] as? [String: Any])?["channel"] as? [String: Any])?["subscribers"] as? Int }
        #expect((channel["channel"] as? [String: Any])?["subscribers"] as? Int == 1 && subscribers.sorted() == [0, 1], "\(channel)")
        let cluster = (try c.nodes[0].stats())["cluster"] as? [String: Any]
        #expect(cluster?["nodes"] as? Int == 3 && cluster?["clusterConnections"] as? Int == 2, "\(String(describing: cluster))")
        #expect(try c.nodes[0].publish(channel: "wallet_updates", account: "acc_D")["delivered"] as? Int == 2)
        #expect(try Self.events(d2, count: 1).count == 1)
        c.nodes[2].stop(signal: SIGKILL)
        // The dead node's count goes once its heartbeat is stale.
        var delivered: [Int] = []
        #expect(eventually(timeout: 10) {
            let n = (try? c.nodes[0].publish(channel: "wallet_updates", account: "acc_D"))?["delivered"] as? Int ?? -1
            delivered.append(n)
            if n != 1 { usleep(250_000) }  // a few dozen events at most: the resume below stays under --recovery-max
            return n == 1
        }, "delivered stayed \(delivered.suffix(3))")
        #expect(eventually(timeout: 5) { nodes(0).count == 2 })
        // Its client reconnects to node 1 and gets what it missed.
        let back = try TestWebSocket.connect(port: c.nodes[1].port, headers: [("Authorization", "Bearer \(try c.token("acc_D"))")])
        var since = start
        since.seq = 1
        try IntegrationRecoveryTests.subscribe(back, since: since)
        let (replay, reply) = try IntegrationRecoveryTests.readReplay(back)
        #expect(try IntegrationRecoveryTests.position(reply).recovered == true)
        #expect(replay.compactMap(Self.seq) == Array(2...(1 + delivered.count)))
        #expect(try Self.events(d1, count: 1 + delivered.count).count == 1 + delivered.count)
    }

    /// `hubctl disconnect` and `tail` on one node act on the whole cluster: an account's connections closed on every
    /// node (the count is the cluster's), a connection closed on the node named, and a tail on one node showing the
    /// events published on the others (each with its node).
    @Test func disconnectAndTailReachEveryNode() throws {
        let c = try Self.cluster(2)
        func nodeID(_ i: Int) throws -> String {
            let nodes = try c.nodes[i].request(#"{"op":"nodes"}"#)["nodes"] as? [[String: Any]] ?? []
            return try #require(nodes.first { $0["self"] as? Bool == true }?["id"] as? String)
        }
        let (n0, n1) = (try nodeID(0), try nodeID(1))
        let x0 = try c.client(0, "acc_X"), x1 = try c.client(1, "acc_X"), y1 = try c.client(1, "acc_Y")

        // A tail on node 0 gets node 1's events once node 1 has heard of it (it is told when the tail starts).
        let tail = try c.nodes[0].admin()
        tail.readTimeout = 10
        #expect(String(decoding: try tail.request(#"{"op":"tail","channel":"wallet_updates"}"#), as: UTF8.self)
                == #"{"ok":true,"tailing":"wallet_updates"}"#)
        let yTail = try c.nodes[0].admin()
        yTail.readTimeout = 10
        _ = try yTail.request(#"{"op":"tail","channel":"wallet_updates","account":"acc_Y"}"#)
        var lastLine = ""
        func nextEvent(_ client: AdminClient) throws -> [String: Any] {
            let line = try #require(try client.readLine())
            lastLine = String(decoding: line, as: UTF8.self)
            return try #require(try parseObject(line)["event"] as? [String: Any])
        }
        var warmup = 0
        #expect(eventually(timeout: 10) {
            warmup += 1
            _ = try? c.nodes[1].publish(channel: "wallet_updates", account: "acc_Y", data: #"{"warmup":\#(warmup)}"#)
            tail.readTimeout = 0.5
            defer { tail.readTimeout = 10 }
            return (try? nextEvent(tail))?["node"] as? String == n1
        })
        // Drain the warm-up lines of both tails (each warm-up event is acc_Y's, so both got it).
        tail.readTimeout = 0.5; yTail.readTimeout = 0.5
        while (try? nextEvent(tail)) != nil {}
        while (try? nextEvent(yTail)) != nil {}
        tail.readTimeout = 10; yTail.readTimeout = 10

        let p1 = try c.nodes[1].publish(channel: "wallet_updates", account: "acc_X", data: #"{"k":[1,"é"]}"#)
        let e1 = try nextEvent(tail)
        #expect(e1["node"] as? String == n1 && e1["account"] as? String == "acc_X" && e1["seq"] as? Int == p1["seq"] as? Int
                && e1["delivered"] as? Int == 2 && lastLine.hasSuffix(#""data":{"k":[1,"é"]}}}"#), "\(lastLine)")
        let p0 = try c.nodes[0].publish(channel: "wallet_updates", account: "acc_Y")
        let e0 = try nextEvent(tail)
        #expect(e0["node"] as? String == n0 && e0["account"] as? String == "acc_Y" && e0["seq"] as? Int == p0["seq"] as? Int, "\(e0)")
        // The account tail skipped acc_X's event: its next line is acc_Y's, from node 0.
        let ey = try nextEvent(yTail)
        #expect(ey["account"] as? String == "acc_Y" && ey["node"] as? String == n0, "\(ey)")
        _ = try Self.events(x0, count: 1); _ = try Self.events(x1, count: 1); _ = try Self.events(y1, count: 1 + warmup)

        // disconnect by account from node 0: both nodes' acc_X connections, counted cluster-wide.
        let all = try c.nodes[0].request(#"{"op":"disconnect","account":"acc_X","code":4000,"reason":"suspended","id":5}"#)
        #expect(all["disconnected"] as? Int == 2 && all["id"] as? Int == 5, "\(all)")
        let answers = ((all["cluster"] as? [String: Any])?["nodes"] as? [[String: Any]]) ?? []
        #expect(answers.count == 1 && answers.first?["node"] as? String == n1
                && (answers.first?["reply"] as? [String: Any])?["disconnected"] as? Int == 1, "\(all)")
        for ws in [x0, x1] {
            let close = try ws.expectClose()
            #expect(close.code == 4000 && close.reason == "suspended")
        }

        // disconnect by connection id: ids are per node, so node 1's connection is named with its node.
        let ids = (try c.nodes[1].request(#"{"op":"connections","account":"acc_Y"}"#)["connections"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        #expect(ids.count == 1)
        let here = try c.nodes[0].request("{\"op\":\"disconnect\",\"conn\":\"\(ids.first ?? "")\"}")
        #expect((here["error"] as? [String: Any])?["code"] as? String == "NOT_FOUND", "\(here)")  // node 0 has no such connection
        #expect(try c.nodes[1].publish(channel: "wallet_updates", account: "acc_Y")["delivered"] as? Int == 1)
        let there = try c.nodes[0].request("{\"op\":\"disconnect\",\"conn\":\"\(ids.first ?? "")\",\"node\":\"\(n1)\",\"id\":\"d\"}")
        #expect(there["disconnected"] as? Int == 1 && there["node"] as? String == n1 && there["id"] as? String == "d", "\(there)")
        let close = try y1.expectClose()
        #expect(close.code == 1000 && close.reason == "disconnected by operator")
        let gone = try c.nodes[0].request("{\"op\":\"disconnect\",\"conn\":\"0-424242\",\"node\":\"\(n1)\"}")
        let goneError = gone["error"] as? [String: Any]
        #expect(goneError?["code"] as? String == "NOT_FOUND" && (goneError?["message"] as? String)?.contains(n1) == true, "\(gone)")
        let nowhere = try c.nodes[0].request(#"{"op":"disconnect","account":"acc_X","node":"no-such-node"}"#)
        #expect((nowhere["error"] as? [String: Any])?["code"] as? String == "NOT_FOUND", "\(nowhere)")
        #expect(try c.nodes[1].publish(channel: "wallet_updates", account: "acc_Y")["delivered"] as? Int == 0)
    }

    @Test func aSingleHubSaysItIsNotAClusterAndHealthIsPlain() throws {
        let hub = try HubProcess()
        let reply = try hub.request(#"{"op":"nodes"}"#)
        #expect(reply["ok"] as? Bool == true && reply["cluster"] as? Bool == false)
        let health = try rawHTTP(port: hub.port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(health.status == 200 && !health.body.contains("broker"))
    }

    /// A Redis without persistence restarts: the streams' numbering is gone. Subscribers are closed with 1012 and,
    /// resubscribing with their position, are told `epoch_changed` (never a silent restart of seq at 1).
    @Test func aLostNumberingClosesItsSubscribersWhoAreToldEpochChanged() throws {
        let directory = try makeRedisDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var redis: RedisServer? = try RedisServer(directory: directory)
        let c = try Self.cluster(2, redis: redis)
        let ws = try TestWebSocket.connect(port: c.nodes[1].port, headers: [("Authorization", "Bearer \(try c.token("acc_L"))")])
        try IntegrationRecoveryTests.subscribe(ws)
        var position = try IntegrationRecoveryTests.position(try IntegrationRecoveryTests.readReplay(ws).reply)
        for _ in 1...3 { _ = try c.nodes[0].publish(channel: "wallet_updates", account: "acc_L") }
        #expect(try Self.events(ws, count: 3).count == 3)
        position.seq = 3
        redis?.crash()
        redis = nil
        redis = try RedisServer(directory: directory)  // empty: no RDB, no AOF
        let close = try ws.expectClose(timeout: 15)
        #expect(close.code == 1012, "\(close)")
        #expect(c.nodes[1].log.contains("restarted its numbering"))
        // As an app would after BROKER_UNAVAILABLE: wait until the node is back on Redis (it retries with backoff).
        #expect(eventually(timeout: 15) { Self.healthy(c.nodes[0]) }, "\(c.nodes[0].log)")
        let back = try TestWebSocket.connect(port: c.nodes[0].port, headers: [("Authorization", "Bearer \(try c.token("acc_L"))")])
        try IntegrationRecoveryTests.subscribe(back, since: position)
        let reply = try IntegrationRecoveryTests.position(try IntegrationRecoveryTests.readReplay(back).reply)
        #expect(reply.recovered == false && reply.reason == "epoch_changed", "\(reply)")
        #expect(reply.epoch != position.epoch && reply.seq == 0)
        _ = redis
    }

    /// The publishes of one socket read leave in one script call (Redis charges per call), and the node counts its
    /// calls as Redis does (`hub_broker_publish_scripts_total`, `stats.cluster.publishScripts`): five lines in one
    /// write are one call, numbered in order; two single publishes are two more.
    @Test func publishesOfOneReadAreOneScriptCallAndCounted() throws {
        let c = try Self.cluster(1)
        let ws = try c.client(0, "acc_G")
        #expect(try c.nodes[0].publish(channel: "wallet_updates", account: "acc_warm")["seq"] as? Int == 1)  // loads the script
        // Redis's own record of each command (the slow log, with a threshold of 0): the publish script calls whose
        // first key is acc_G's stream (heartbeats and presence are script calls too, on other keys).
        let observer = try #require(c.redis).connect()
        _ = try observer.call(["CONFIG", "SET", "slowlog-log-slower-than", "0"])
        _ = try observer.call(["CONFIG", "SET", "slowlog-max-len", "10000"])
        _ = try observer.call(["SLOWLOG", "RESET"])
        func redisCalls() throws -> Int {
            guard case .array(let entries) = try observer.call(["SLOWLOG", "GET", "10000"]) else { return -1 }
            return entries.filter { entry in
                guard case .array(let fields) = entry, fields.count > 3, case .array(let args) = fields[3], args.count > 3 else { return false }
                return args[0].string?.uppercased() == "EVALSHA" && args[3].string?.hasSuffix(":m:a:14:wallet_updates:acc_G") == true
            }.count
        }
        func counted() throws -> (metric: Int?, status: Int?) {
            let body = try rawHTTP(port: c.nodes[0].port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").body
            let line = body.split(separator: "\n").first { $0.hasPrefix("hub_broker_publish_scripts_total ") }
            let cluster = try c.nodes[0].stats()["cluster"] as? [String: Any]
            return (line.flatMap { Int($0.split(separator: " ")[1]) }, cluster?["publishScripts"] as? Int)
        }
        let before = (redis: try redisCalls(), node: try counted())
        #expect(before.redis == 0)
        let socket = try c.nodes[0].admin()
        let lines = (1...5).map { #"{"op":"publish","channel":"wallet_updates","account":"acc_G","type":"t","data":{"n":\#($0)},"id":\#($0)}"# }
        try socket.send(Array(lines.joined(separator: "\n").utf8))
        for n in 1...5 {
            let reply = try parseObject(try #require(try socket.readLine()))
            #expect(reply["id"] as? Int == n && reply["seq"] as? Int == n && reply["delivered"] as? Int == 1, "\(reply)")
        }
        let afterBatch = try redisCalls()
        #expect(afterBatch - before.redis == 1, "five publishes of one read, one script call: \(before.redis) → \(afterBatch)")
        for n in 6...7 { #expect(try c.nodes[0].publish(channel: "wallet_updates", account: "acc_G")["seq"] as? Int == n) }
        #expect(try redisCalls() - before.redis == 3)
        let after = try counted()
        #expect(after.metric.map { $0 - (before.node.metric ?? -100) } == 3 && after.status.map { $0 - (before.node.status ?? -100) } == 3,
                "before \(before.node), after \(after)")
        #expect(try Self.events(ws, count: 7).map { $0["seq"] as? Int } == Array(1...7))
    }

    /// While a subscribe waits for Redis, the connection reads nothing more; requests the client pipelined behind it
    /// (in the same TCP write, one split across the pause) are answered afterwards, in order, and events published
    /// meanwhile arrive after the reply, without gap or duplicate.
    @Test func requestsPipelinedBehindASubscribeAreAnsweredInOrder() throws {
        let c = try Self.cluster(2)
        for n in 1...3 { _ = try c.nodes[0].publish(channel: "wallet_updates", account: "acc_Q", data: #"{"n":\#(n)}"#) }
        let ws = try TestWebSocket.connect(port: c.nodes[1].port, headers: [("Authorization", "Bearer \(try c.token("acc_Q"))")])
        var bytes: [UInt8] = []
        for text in [#"{"type":"subscribe","channels":["wallet_updates"],"id":"a"}"#, #"{"type":"ping","id":7}"#,
                     #"{"type":"subscribe","channels":["profile_updates"],"id":"b"}"#, #"{"type":"ping","id":8}"#] {
            bytes += FrameEncoder.clientFrame(opcode: .text, payload: Array(text.utf8), fin: true)
        }
        let cut = bytes.count - 5  // the last frame's end arrives later
        try ws.sendRaw(Array(bytes[..<cut]))
        // Events published while the first subscribe may still be waiting.
        let published = DispatchSemaphore(value: 0)
        let publisher = Thread {
            for n in 4...6 { _ = try? c.nodes[0].publish(channel: "wallet_updates", account: "acc_Q", data: #"{"n":\#(n)}"#) }
            published.signal()
        }
        publisher.start()
        usleep(50_000)
        try ws.sendRaw(Array(bytes[cut...]))
        #expect(published.wait(timeout: .now() + 10) == .success)
        var replies: [String] = []
        var seqs: [Int] = []
        var position = -1
        let deadline = Date().addingTimeInterval(10)
        while (replies.count < 4 || seqs.last != 6) && Date() < deadline {
            guard let text = try? ws.nextText(timeout: 2) else { break }
            let object = try parseObject(text)
            if let type = object["type"] as? String, type == "subscribed" || type == "pong" {
                replies.append("\(type):\(object["id"] ?? "")")
                if type == "subscribed", object["id"] as? String == "a" {
                    position = try IntegrationRecoveryTests.position(object).seq
                }
            } else if let seq = object["seq"] as? Int {
                seqs.append(seq)
            }
        }
        #expect(replies == ["subscribed:a", "pong:7", "subscribed:b", "pong:8"])
        // Exactly the events after the position the reply gave, once each, in order.
        #expect(position >= 3 && position <= 6)
        #expect(seqs == Array(stride(from: position + 1, through: 6, by: 1)), "position \(position), events \(seqs)")
        #expect(try ws.isQuiet(for: 0.3))
    }
}
