import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// A node cut off from Redis by a real network partition: node B runs in its own network namespace, reaching Redis
/// over one veth pair (the link the test takes down) and its clients over another. Needs root and iproute2
/// (`scripts/test` runs as root in CI; `.ci/run` installs iproute2).
@Suite(.serialized, .enabled(if: RedisPeer.enabled && PartitionNet.available, "needs redis-server, root, iproute2 and network namespaces with veth pairs"))
struct ClusterPartitionTests {
    @Test func aPartitionedNodeReportsDegradedFailsPublishesClearlyAndCatchesUpWhenHealed() throws {
        let net = try PartitionNet()
        let redis = try RedisServer(arguments: ["--port", String(net.redisPort), "--bind", net.redisAddress, "--protected-mode", "no"])
        let a = try HubProcess(["--broker", "unix://" + redis.socketPath], environment: ["HUB_JWT_SECRET": ClusterTests.secret])
        let b = try HubProcess(["--broker", "redis://\(net.redisAddress):\(net.redisPort)", "--listen", "\(net.clientAddress):0"],
                               environment: ["HUB_JWT_SECRET": ClusterTests.secret], launcher: [PartitionNet.ip, "netns", "exec", net.namespace])
        for node in [a, b] {
            #expect(eventually(timeout: 10) { node.log.contains("cluster: subscribed to") }, "\(node.log)")
        }
        let token = try ClusterTests.Cluster(redis: redis, nodes: []).token("acc_P")
        let onA = try TestWebSocket.connect(port: a.port, headers: [("Authorization", "Bearer \(token)")])
        let onB = try TestWebSocket.connect(port: b.port, host: net.clientAddress, headers: [("Authorization", "Bearer \(token)")])
        for ws in [onA, onB] {
            try IntegrationRecoveryTests.subscribe(ws)
            _ = try IntegrationRecoveryTests.readReplay(ws)
        }
        #expect(try a.publish(channel: "wallet_updates", account: "acc_P")["delivered"] as? Int == 2)
        for ws in [onA, onB] { #expect(try ClusterTests.events(ws, count: 1).first?["seq"] as? Int == 1) }
        let health = { (try? rawHTTP(port: b.port, host: net.clientAddress, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))?.status }
        #expect(health() == 200)

        try net.partition(true)
        // A silent partition: B notices within the stall timeout (3 s) plus a heartbeat.
        #expect(eventually(timeout: 8) { health() == 503 }, "B's health: \(String(describing: health()))\n\(b.log)")
        // Found by the stall check (a quiet connection owing replies), not by a socket error.
        #expect(b.log.contains("no reply from"), "\(b.log)")
        let refused = try b.request(#"{"op":"publish","channel":"wallet_updates","account":"acc_P","type":"t","data":{},"id":1}"#)
        // BROKER_UNAVAILABLE once B's command connection is down; PUBLISH_OUTCOME_UNKNOWN if the publish was written
        // to it before the stall check closed it (it may have reached Redis: PROTOCOL.md 2). Either is a clear
        // failure; a reply that claims success is not. (The aborted connection's unsent bytes never run.)
        let code = (refused["error"] as? [String: Any])?["code"] as? String
        #expect(code == "BROKER_UNAVAILABLE" || code == "PUBLISH_OUTCOME_UNKNOWN", "\(refused)")
        // The rest of the cluster goes on: A publishes, and its client gets the events.
        for _ in 2...4 { #expect(try a.publish(channel: "wallet_updates", account: "acc_P")["ok"] as? Bool == true) }
        #expect(try ClusterTests.events(onA, count: 3).compactMap { $0["seq"] as? Int } == [2, 3, 4])
        #expect(try onB.isQuiet(for: 0.3), "B's client got events through a partition")

        try net.partition(false)
        // Healed: B reconnects, resubscribes, and fills its client's gap from the stream's history, in order.
        #expect(eventually(timeout: 15) { health() == 200 }, "\(b.log)")
        #expect(try ClusterTests.events(onB, count: 3, timeout: 10).compactMap { $0["seq"] as? Int } == [2, 3, 4])
        #expect(try b.publish(channel: "wallet_updates", account: "acc_P")["seq"] as? Int == 5)
        for ws in [onA, onB] { #expect(try ClusterTests.events(ws, count: 1).first?["seq"] as? Int == 5) }
    }
}

/// Node B's network namespace with two veth pairs: one to Redis (partitioned with netem), one for clients.
final class PartitionNet {
    static let ip: String = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first { access($0, X_OK) == 0 } ?? "/usr/sbin/ip"
    /// Root, iproute2, and a kernel and container that allow network namespaces and veth pairs (probed once).
    static let available: Bool = {
        guard getuid() == 0, access(ip, X_OK) == 0 else { return false }
        let probe = "hubprobe-\(getpid())"
        guard (try? run(ip, "netns", "add", probe)) != nil else { return false }
        defer { _ = try? run(ip, "netns", "del", probe) }
        let link = "hpp\(getpid() % 100_000)"
        guard (try? run(ip, "link", "add", link, "type", "veth", "peer", "name", link + "n")) != nil else { return false }
        _ = try? run(ip, "link", "del", link)
        return true
    }()

    let namespace: String
    let subnet: Int
    var redisAddress: String { "10.231.\(subnet).1" }
    var clientAddress: String { "10.232.\(subnet).2" }
    let redisPort: Int
    private let redisLink: String
    private let clientLink: String

    init() throws {
        let tag = String(UInt32.random(in: 0...0xFFFFFF), radix: 16)
        namespace = "hubpart-\(tag)"
        subnet = Int.random(in: 1...250)
        redisLink = "hpr\(tag)"
        clientLink = "hpc\(tag)"
        redisPort = Int(try freeLoopbackPort())
        try Self.run(Self.ip, "netns", "add", namespace)
        do {
            for (link, net) in [(redisLink, 231), (clientLink, 232)] {
                try Self.run(Self.ip, "link", "add", link, "type", "veth", "peer", "name", link + "n")
                try Self.run(Self.ip, "link", "set", link + "n", "netns", namespace)
                try Self.run(Self.ip, "addr", "add", "10.\(net).\(subnet).1/24", "dev", link)
                try Self.run(Self.ip, "link", "set", link, "up")
                try Self.run(Self.ip, "netns", "exec", namespace, Self.ip, "addr", "add", "10.\(net).\(subnet).2/24", "dev", link + "n")
                try Self.run(Self.ip, "netns", "exec", namespace, Self.ip, "link", "set", link + "n", "up")
            }
            try Self.run(Self.ip, "netns", "exec", namespace, Self.ip, "link", "set", "lo", "up")
        } catch {
            cleanup()
            throw error
        }
    }

    deinit { cleanup() }

    private func cleanup() {
        _ = try? Self.run(Self.ip, "link", "del", redisLink)
        _ = try? Self.run(Self.ip, "link", "del", clientLink)
        _ = try? Self.run(Self.ip, "netns", "del", namespace)
    }

    /// Takes the Redis link down on both ends, or up again. Neither end's TCP connection hears a thing (no RST, no
    /// FIN): to the hub and to Redis it is a silent partition. (This kernel has no `sch_netem`, so no netem loss.)
    func partition(_ on: Bool) throws {
        let state = on ? "down" : "up"
        try Self.run(Self.ip, "link", "set", redisLink, state)
        try Self.run(Self.ip, "netns", "exec", namespace, Self.ip, "link", "set", redisLink + "n", state)
    }

    @discardableResult
    static func run(_ arguments: String...) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: arguments[0])
        process.arguments = Array(arguments.dropFirst())
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw HubTestError("\(arguments.joined(separator: " ")) exited \(process.terminationStatus): \(output)")
        }
        return output
    }
}
