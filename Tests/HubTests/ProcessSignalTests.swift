import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The signals an operator sends by habit (docs/OPERATIONS.md, "Signals"), against the real binary: none of them
/// stops the hub except SIGTERM and SIGINT.
@Suite struct ProcessSignalTests {
    /// A publish to the witness's account reaches it.
    static func expectServing(_ hub: HubProcess, _ witness: TestWebSocket, seq: Int) throws {
        let reply = try hub.publish(channel: "wallet_updates", account: "acc_w", type: "after_signal")
        #expect(reply["delivered"] as? Int == 1, "\(reply)\n\(hub.log)")
        let text = try witness.nextText()
        #expect(text.contains(#""type":"after_signal""#) && text.contains(#""seq":\#(seq)"#), "\(text)")
    }

    /// Before: SIGHUP, SIGUSR1 and SIGUSR2 had their default action (terminate: no 1001, socket file left).
    @Test(arguments: [SIGHUP, SIGUSR1, SIGUSR2])
    func harmlessSignalsLeaveTheHubServing(signal: Int32) throws {
        let hub = try HubProcess()
        let witness = try hub.client("acc_w", channels: ["wallet_updates"])
        let name = HubServer.name(of: signal)
        hub.send(signal: signal)
        #expect(eventually { hub.logLines(containing: "received \(name)").count == 1 }, "\(hub.log)")
        try Self.expectServing(hub, witness, seq: 1)
        // A second one is no different.
        hub.send(signal: signal)
        #expect(eventually { hub.logLines(containing: "received \(name)").count == 2 }, "\(hub.log)")
        try Self.expectServing(hub, witness, seq: 2)
        if signal == SIGHUP {
            #expect(hub.log.contains("received SIGHUP: nothing to reload"), "\(hub.log)")
        } else {
            #expect(hub.log.contains("received \(name): ignored; still serving"), "\(hub.log)")
        }
        // SIGTERM still means a graceful shutdown.
        hub.send(signal: SIGTERM)
        #expect(try witness.expectClose().code == 1001)
        try witness.sendClose(code: 1001)
        #expect(hub.waitForExit(timeout: 8) == 0)
        #expect(access(hub.socketPath, F_OK) != 0)
    }

    /// Before: the Swift runtime's backtracer printed "Program crashed" and a register dump, and nothing useful.
    @Test func sigquitWritesAStateDumpAndTheHubKeepsServing() throws {
        let hub = try HubProcess(threads: 2)
        let witness = try hub.client("acc_w", channels: ["wallet_updates"])
        let other = try hub.client("acc_o", channels: ["wallet_updates", "profile_updates"])
        try Self.expectServing(hub, witness, seq: 1)
        hub.send(signal: SIGQUIT)
        #expect(eventually { hub.log.contains("state dump ends") }, "\(hub.log)")
        let log = hub.log
        #expect(!log.contains("crashed") && !log.contains("Backtrac"), "\(log)")
        #expect(hub.logLines(containing: "state dump (SIGQUIT): hub ").count == 1, "\(log)")
        // One line per loop; together they account for both clients and their three subscriptions.
        let loops = hub.logLines(containing: "hub: state: loop=")
        #expect(loops.count == 2, "\(log)")
        func total(_ key: String) -> Int {
            loops.reduce(0) { sum, line in
                let field = line.split(separator: " ").first { $0.hasPrefix(key + "=") }
                return sum + (field.flatMap { Int($0.dropFirst(key.count + 1)) } ?? 0)
            }
        }
        #expect(total("open") == 2 && total("subscriptions") == 3, "\(loops)")
        #expect(loops.allSatisfy { $0.contains("queuedBytes=") && $0.contains("largestQueue=") && $0.contains("messagesOut=") })
        #expect(loops.contains { $0.contains("published=1") }, "loop 0 keeps the ledger: \(loops)")
        // The stats line is the `{"op":"stats"}` reply, what `hubctl status` shows.
        let statsLine = try #require(hub.logLines(containing: "hub: state: stats ").first)
        let json = String(statsLine[statsLine.range(of: "state: stats ")!.upperBound...])
        let stats = try #require(try parseObject(json)["stats"] as? [String: Any])
        #expect((stats["connections"] as? [String: Any])?["open"] as? Int == 2, "\(json)")
        #expect(stats["subscriptions"] as? Int == 3, "\(json)")

        try Self.expectServing(hub, witness, seq: 2)
        // Again: the dump is repeatable, and SIGTERM still shuts down gracefully.
        hub.send(signal: SIGQUIT)
        #expect(eventually { hub.logLines(containing: "state dump ends").count == 2 }, "\(hub.log)")
        try Self.expectServing(hub, witness, seq: 3)
        hub.send(signal: SIGTERM)
        for ws in [witness, other] {
            #expect(try ws.expectClose().code == 1001)
            try ws.sendClose(code: 1001)
        }
        #expect(hub.waitForExit(timeout: 8) == 0)
        #expect(access(hub.socketPath, F_OK) != 0)
    }
}
