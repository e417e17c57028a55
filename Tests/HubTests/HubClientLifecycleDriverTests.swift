import Foundation
import Glibc
@testable import HubClient
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubRouting
@testable import HubSupport

/// A seeded random driver of `HubClient`'s lifecycle against the real hub behind a proxy that cuts and stalls
/// connections: start, stop, suspend, resume, networkChanged, unsubscribe and subscribe again, flurries of these,
/// cuts, stalls of 0.2-4 s (a black hole past the probe and ping timeouts), `hubctl disconnect`, graceful hub
/// restarts, and a token provider that succeeds, hangs, answers late or fails (a logout, after which the app logs in
/// again), while a publisher keeps publishing.
/// Checked throughout and at the end: the hub never holds two connections of the client for long; within each
/// subscription every event comes once, in seq order, with no gap unless the client was told `.recoveryFailed`;
/// the client's state agrees with the hub's view; after `stop()` the hub holds nothing of the client, the client no
/// socket and no stream.
///
/// Replay a run with `HUB_LIFECYCLE_SEED=N`; `HUB_LIFECYCLE_STEPS` (default 40) makes it longer.
@Suite(.serialized) struct HubClientLifecycleDriverTests {
    /// What the token provider does next, drawn by the driver.
    final class TokenBehaviour: Sendable {
        enum Mode: Sendable { case ok, hang, late, fail }
        let mode = Mutex(Mode.ok)
        let asked = Atomic<Int>(0)
    }

    /// One subscription's elements, in arrival order.
    final class Session: Sendable {
        let seqs = Mutex<[UInt64]>([])
        let recoveries = Mutex<[Int]>([])  // the index in `seqs` at which a recoveryFailed came
        let ended = Atomic<Bool>(false)
        let consumer = Mutex<Task<Void, Never>?>(nil)

        func follow(_ subscription: HubSubscription) {
            consumer.withLock { $0 = Task {
                for await element in subscription {
                    switch element {
                    case .event(let e): seqs.withLock { $0.append(e.seq) }
                    case .recoveryFailed: recoveries.withLock { r in r.append(self.seqs.withLock { $0.count }) }
                    case .refused: break
                    }
                }
                ended.store(true, ordering: .relaxed)
            } }
        }

        /// The consumer goes away: its iteration ends, and the client unsubscribes.
        func cancel() { consumer.withLock { $0 }?.cancel() }

        /// Once, in order, contiguous except right after a recovery failure.
        func violation() -> String? {
            let all = seqs.withLock { $0 }
            let breaks = Set(recoveries.withLock { $0 })
            for i in all.indices.dropFirst() where all[i] != all[i - 1] + 1 && !breaks.contains(i) {
                return "seq \(all[i]) after \(all[i - 1]) at \(i) (recoveries at \(breaks.sorted()))"
            }
            return nil
        }
    }

    static func connections(_ hub: HubProcess, account: String) -> Int? {
        (try? hub.request(#"{"op":"connections","account":"\#(account)"}"#))?["total"] as? Int
    }

    @Test func randomLifecycleKeepsOneConnectionAndEveryEvent() async throws {
        let environment = ProcessInfo.processInfo.environment
        let seed = environment["HUB_LIFECYCLE_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64(UInt32.max))
        let steps = environment["HUB_LIFECYCLE_STEPS"].flatMap(Int.init) ?? 40
        var rng = SplitMix64(seed: seed)
        let replay = "replay with HUB_LIFECYCLE_SEED=\(seed)"
        print("lifecycle driver: seed \(seed), \(steps) steps")

        let account = "acc_driver"
        var hub = try HubProcess(["--history-size", "10000", "--recovery-max", "10000"])
        let port = hub.port
        let stateDirectory = hub.stateDirectory
        let mint = try HubClientTests.minter(hub)
        let proxy = try CuttingProxy(target: port)
        defer { proxy.stop() }
        let tokens = TokenBehaviour()
        var configuration = HubClientTests.fast
        configuration.connectTimeout = .seconds(3)
        configuration.networkProbeTimeout = .milliseconds(500)
        // The client's own account of what happened, to say what went wrong when a check fails.
        final class ClientLog: Sendable { let lines = Mutex<[String]>([]) }
        let clientLog = ClientLog()
        configuration.logLevel = .debug
        configuration.logger = { _, message in clientLog.lines.withLock { $0.append(message) } }
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(proxy.port)/ws")!, configuration: configuration) { _ in
            tokens.asked.add(1, ordering: .relaxed)
            switch tokens.mode.withLock({ $0 }) {
            case .ok: break
            case .hang: try await Task.sleep(for: .milliseconds(1500))  // past nothing: the connect timeout is 3 s
            case .late: try await Task.sleep(for: .milliseconds(Int.random(in: 50...800)))
            case .fail: throw CancellationError()  // the refresh token expired: the session ends (loggedOut)
            }
            return mint(account, 900)
        }

        // The publisher: one event every 5 ms on a thread of its own, through whichever hub is up.
        let publishing = Atomic<Bool>(true)
        let hubSocket = Mutex(hub.socketPath)
        let publisher = Thread {
            var admin: AdminClient?
            while publishing.load(ordering: .relaxed) {
                if admin == nil { admin = try? AdminClient(socketPath: hubSocket.withLock { $0 }) }
                if let a = admin, (try? a.request(#"{"op":"publish","channel":"wallet_updates","account":"acc_driver","type":"tick","data":{}}"#)) == nil {
                    admin = nil
                }
                usleep(5_000)
            }
        }
        publisher.start()
        defer { publishing.store(false, ordering: .relaxed) }

        var sessions: [Session] = []
        func subscribeNew() async {
            let session = Session()
            session.follow(await client.subscribe(["wallet_updates"]))
            sessions.append(session)
        }
        await subscribeNew()
        await client.start()
        var running = true
        var restarts = 0
        var retired: [HubProcess] = []
        var log: [String] = []

        for step in 0..<steps {
            let roll = Int.random(in: 0..<100, using: &rng)
            let action: String
            switch roll {
            case 0..<12:
                action = running ? "suspend" : "resume"
                if running { await client.suspend() } else { await client.resume() }
                running.toggle()
            case 12..<18:
                action = "stop+start"
                await client.stop()
                await subscribeNew()
                await client.start()
                running = true
            case 18..<30:
                action = "networkChanged"
                await client.networkChanged()
            case 30..<45:
                action = "cut"
                proxy.cutNow()
            case 45..<52:
                action = "hubctl disconnect"
                _ = try? hub.request(#"{"op":"disconnect","account":"\#(account)"}"#)
            case 52..<55 where restarts < 2:
                action = "hub restart"
                restarts += 1
                hub.send(signal: SIGTERM)
                _ = hub.waitForExit(timeout: 10)
                retired.append(hub)  // the first one owns the state directory: it goes when the test ends
                hub = try HubProcess(["--history-size", "10000", "--recovery-max", "10000", "--state-dir", stateDirectory,
                                      "--listen", "127.0.0.1:\(port)"])
                hubSocket.withLock { $0 = hub.socketPath }
            case 55..<70:
                let mode: TokenBehaviour.Mode = [.ok, .ok, .hang, .late, .fail].randomElement(using: &rng) ?? .ok
                action = "tokens \(mode)"
                tokens.mode.withLock { $0 = mode }
            case 78..<88:
                // A flurry: lifecycle calls back to back, as a scene phase that flaps or racing tasks make them.
                var calls: [String] = []
                for _ in 0..<Int.random(in: 2...6, using: &rng) {
                    switch Int.random(in: 0..<4, using: &rng) {
                    case 0: await client.suspend(); running = false; calls.append("suspend")
                    case 1: await client.resume(); running = true; calls.append("resume")
                    case 2: await client.networkChanged(); calls.append("networkChanged")
                    default: proxy.cutNow(); calls.append("cut")
                    }
                    try await Task.sleep(for: .milliseconds(Int.random(in: 0...30, using: &rng)))
                }
                action = "flurry \(calls)"
            case 88..<94:
                let seconds = Double(Int.random(in: 2...40, using: &rng)) / 10
                action = "stall \(seconds) s"
                proxy.stall(for: seconds)
            case 70..<78:
                action = "unsubscribe+subscribe"
                // The consumer goes away (its iteration ends, the client unsubscribes); a new one starts afresh.
                sessions.last?.cancel()
                await subscribeNew()
            default:
                action = "wait"
            }
            log.append("\(step): \(action)")
            try await Task.sleep(for: .milliseconds(Int.random(in: 20...250, using: &rng)))
            // A provider that failed logged the user out: the session ended, every stream with it. The app logs in
            // again: a working provider, a new subscription, start.
            if await client.currentState.disconnect?.reason == .loggedOut {
                tokens.mode.withLock { $0 = .ok }
                await subscribeNew()
                await client.start()
                running = true
                log.append("\(step): logged out; logged in again")
            }
            // Never two connections for long: a second one may overlap the first only while the hub notices a cut.
            if let n = Self.connections(hub, account: account), n > 1 {
                try await Task.sleep(for: .milliseconds(600))
                let again = Self.connections(hub, account: account) ?? 0
                #expect(again <= 1, "\(again) connections of the client after \(log.suffix(4)); \(replay)")
            }
            for (i, session) in sessions.enumerated() {
                if let problem = session.violation() { Issue.record("session \(i): \(problem) after \(log.suffix(6)); \(replay)") }
            }
        }

        // Settle: a working network and provider, the client running; it must end up connected, with one connection
        // at the hub, and the latest subscription must receive what is published from now on, in order.
        tokens.mode.withLock { $0 = .ok }
        if !running { await client.resume() }
        let connected = await HubClientTests.until(15) { await client.currentState == .connected }
        let state = await client.currentState
        #expect(connected, "not connected after the run: \(state) after \(log.suffix(8)); client: \(clientLog.lines.withLock { $0.suffix(10) }); \(replay)")
        #expect(await HubClientTests.until(10) { Self.connections(hub, account: account) == 1 },
                "the hub's view: \(Self.connections(hub, account: account) ?? -1) connections; \(replay)")
        publishing.store(false, ordering: .relaxed)
        try await Task.sleep(for: .milliseconds(100))
        let marker = try hub.publish(channel: "wallet_updates", account: account, type: "marker")
        let last = marker["seq"] as? UInt64 ?? UInt64(marker["seq"] as? Int ?? 0)
        let latest = sessions[sessions.count - 1]
        #expect(await HubClientTests.until(10) { latest.seqs.withLock { $0.last } == last },
                "the last subscription ends at \(latest.seqs.withLock { $0.last } ?? 0), the hub at \(last); \(replay)")
        for (i, session) in sessions.enumerated() {
            if let problem = session.violation() { Issue.record("session \(i): \(problem); \(replay)") }
        }
        await client.stop()
        #expect(await HubClientTests.until(5) { Self.connections(hub, account: account) == 0 }, "stop() left a connection; \(replay)")
        #expect(await HubClientTests.until(5) { HubClientTLSTests.socketsTo(port: proxy.port) == 0 },
                "a socket of the client outlived stop(): \(HubClientTLSTests.socketsTo(port: proxy.port)); \(replay)")
        #expect(await HubClientTests.until(5) { sessions.allSatisfy { $0.ended.load(ordering: .relaxed) } }, "a stream outlived stop(); \(replay)")
        #expect(tokens.asked.load(ordering: .relaxed) > 0)
        _ = retired
    }
}
