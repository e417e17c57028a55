import Foundation
import Glibc
@testable import HubClient
import Synchronization
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// What an app builds on besides delivery, against the real hub: `stop()` and a logout end every stream;
/// `suspend()`/`resume()` keep subscriptions and replay what was missed; positions exported, stored as JSON and
/// seeded into a new client resume where the old one stopped; `networkChanged()` replaces a connection that went
/// silent; a connect that hangs is given up after `connectTimeout`; the hub's other errors reach `errors()`; a
/// subscription holds at most its buffer limit while its consumer does not read.
@Suite(.serialized) struct HubClientAppLifecycleTests {
    typealias Recorder = HubClientTests.Recorder

    /// States gathered by a background task.
    final class Seen: Sendable {
        private let states = Mutex<[HubConnectionState]>([])
        func append(_ s: HubConnectionState) { states.withLock { $0.append(s) } }
        var all: [HubConnectionState] { states.withLock { $0 } }
    }

    static func configuration(_ change: (inout HubClientConfiguration) -> Void = { _ in }) -> HubClientConfiguration {
        var c = HubClientTests.fast
        change(&c)
        return c
    }

    @Test func stopEndsEverySubscriptionAndObserver() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: Self.configuration()) { _ in
            mint("acc_stop", 900)
        }
        let subscription = await client.subscribe(["wallet_updates"])
        let states = await client.stateUpdates()
        let errors = await client.errors()
        final class Ended: Sendable { let count = Atomic<Int>(0) }
        let ended = Ended()
        let seen = Seen()
        Task { for await _ in subscription {}; ended.count.add(1, ordering: .relaxed) }
        Task { for await s in states { seen.append(s) }; ended.count.add(1, ordering: .relaxed) }
        Task { for await _ in errors {}; ended.count.add(1, ordering: .relaxed) }
        await client.start()
        #expect(await HubClientTests.subscribed(client))
        #expect(ended.count.load(ordering: .relaxed) == 0)
        await client.stop()
        #expect(await HubClientTests.until(5) { ended.count.load(ordering: .relaxed) == 3 }, "\(ended.count.load(ordering: .relaxed)) of 3 streams ended")
        #expect(await client.currentState == .disconnected(HubDisconnect(.stopped, message: "stopped", willRetry: false)))
        let all = seen.all
        #expect(all.first?.disconnect?.reason == .notStarted && all.contains(.connected) && all.last?.disconnect?.reason == .stopped, "\(all)")
        #expect(await HubClientTests.until(5) { HubClientLifecycleTests.openConnections(hub) == 0 })
    }

    /// An app that lets go of its client without `stop()` (a view model freed) leaves no connection behind.
    @Test func aClientDroppedWithoutStopClosesItsConnection() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        var client: HubClient? = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: Self.configuration()) { _ in
            mint("acc_drop", 900)
        }
        let subscription = await client?.subscribe(["wallet_updates"])
        let ended = Atomic<Bool>(false)
        if let subscription { Task { for await _ in subscription {}; ended.store(true, ordering: .relaxed) } }
        await client?.start()
        #expect(await HubClientTests.until(10) { HubClientLifecycleTests.openConnections(hub) == 1 })
        client = nil
        #expect(await HubClientTests.until(10) { HubClientLifecycleTests.openConnections(hub) == 0 }, "the dropped client kept its connection")
        #expect(await HubClientTests.until(5) { ended.load(ordering: .relaxed) }, "its subscription did not end")
    }

    /// The token provider throws (the refresh token expired): `loggedOut`, not retried, and every stream ends.
    @Test func aFailingTokenProviderLogsOutAndEndsTheStreams() async throws {
        let hub = try HubProcess(["--token-warning", "50"])
        let mint = try HubClientTests.minter(hub)
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: Self.configuration()) { reason in
            if reason == .expiring { throw CancellationError() }
            return mint("acc_out", 52)
        }
        let subscription = await client.subscribe(["wallet_updates"])
        let ended = Atomic<Bool>(false)
        Task { for await _ in subscription {}; ended.store(true, ordering: .relaxed) }
        await client.start()
        #expect(await HubClientTests.subscribed(client))
        let loggedOut = await HubClientTests.until(10) { await client.currentState.disconnect?.reason == .loggedOut }
        let state = await client.currentState
        #expect(loggedOut && state.disconnect?.willRetry == false, "\(state)")
        #expect(await HubClientTests.until(5) { ended.load(ordering: .relaxed) }, "the subscription did not end")
        #expect(await HubClientTests.until(5) { HubClientLifecycleTests.openConnections(hub) == 0 })
    }

    /// Background and back: no connection while suspended, and what was published meanwhile arrives once, in order.
    @Test func suspendAndResumeReplayWhatWasMissed() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let r = Recorder()
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: Self.configuration()) { _ in
            mint("acc_bg", 900)
        }
        await r.follow(client, ["wallet_updates"])
        await client.start()
        #expect(await HubClientTests.subscribed(client))
        for i in 1...2 { _ = try hub.publish(channel: "wallet_updates", account: "acc_bg", data: #"{"i":\#(i)}"#) }
        #expect(await HubClientTests.until(5) { r.events.count == 2 })
        await client.suspend()
        #expect(await client.currentState.disconnect?.reason == .suspended)
        #expect(await HubClientTests.until(5) { HubClientLifecycleTests.openConnections(hub) == 0 })
        for i in 3...5 {
            let reply = try hub.publish(channel: "wallet_updates", account: "acc_bg", data: #"{"i":\#(i)}"#)
            #expect(reply["delivered"] as? Int == 0, "nobody is connected while suspended")
        }
        await client.resume()
        #expect(await HubClientTests.until(10) { r.events.count >= 5 }, "\(r.events.map(\.seq))")
        try await Task.sleep(for: .milliseconds(200))
        #expect(r.events.map(\.seq) == [1, 2, 3, 4, 5] && r.failures.isEmpty, "\(r.events.map(\.seq)) \(r.failures)")
        #expect(HubClientLifecycleTests.openConnections(hub) == 1)
        await client.stop()
    }

    /// A cold start: the positions of the last run, stored as JSON, seed a new client, which gets only what it missed.
    @Test func exportedPositionsResumeANewClient() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let first = Recorder()
        let a = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: Self.configuration()) { _ in mint("acc_cold", 900) }
        await first.follow(a, ["wallet_updates"])
        await a.start()
        #expect(await HubClientTests.subscribed(a))
        for i in 1...3 { _ = try hub.publish(channel: "wallet_updates", account: "acc_cold", data: #"{"i":\#(i)}"#) }
        #expect(await HubClientTests.until(5) { first.events.count == 3 })
        let stored = try JSONEncoder().encode(await a.exportPositions())
        await a.stop()
        for i in 4...5 { _ = try hub.publish(channel: "wallet_updates", account: "acc_cold", data: #"{"i":\#(i)}"#) }

        let second = Recorder()
        let b = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: Self.configuration()) { _ in mint("acc_cold", 900) }
        let positions = try JSONDecoder().decode(HubPositions.self, from: stored)
        #expect(positions.entries.map(\.channel) == ["wallet_updates"] && positions.entries.first?.seq == 3, "\(positions)")
        await b.seed(positions)
        await second.follow(b, ["wallet_updates"])
        await b.start()
        #expect(await HubClientTests.until(10) { second.events.count >= 2 }, "\(second.events.map(\.seq))")
        try await Task.sleep(for: .milliseconds(200))
        #expect(second.events.map(\.seq) == [4, 5] && second.failures.isEmpty, "\(second.events.map(\.seq)) \(second.failures)")
        await b.stop()
    }

    /// The network changed and the connection is dead (the hub stopped answering, SIGSTOP): the client finds out
    /// within `networkProbeTimeout` (not two ping intervals) and reports `noPong`.
    @Test func networkChangedReplacesASilentConnection() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!,
                               configuration: Self.configuration { $0.networkProbeTimeout = .milliseconds(400); $0.connectTimeout = .seconds(2) }) { _ in
            mint("acc_net", 900)
        }
        _ = await client.subscribe(["wallet_updates"])
        await client.start()
        #expect(await HubClientTests.subscribed(client))
        await client.networkChanged()
        try await Task.sleep(for: .milliseconds(700))
        let probed = await client.currentState
        #expect(probed == .connected, "a live connection answers the probe: \(probed)")
        let pid = hub.process.processIdentifier
        #expect(kill(pid, SIGSTOP) == 0)
        let started = ContinuousClock.now
        await client.networkChanged()
        let noticed = await HubClientTests.until(3) {
            let state = await client.currentState
            return state.disconnect?.reason == .noPong || state == .connecting
        }
        let took = ContinuousClock.now - started
        #expect(kill(pid, SIGCONT) == 0)
        let after = await client.currentState
        #expect(noticed && took < .seconds(2), "\(took): \(after)")
        let back = await HubClientTests.until(10) { await client.currentState == .connected }
        let final = await client.currentState
        #expect(back, "reconnected: \(final)")
        await client.stop()
    }

    /// A server that accepts TCP and never answers the upgrade: the attempt is given up after `connectTimeout` and
    /// retried with backoff (`network`), not left hanging for the transport's own 10 s.
    @Test func aConnectThatHangsTimesOut() async throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #expect(fd >= 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        #expect(listen(fd, 16) == 0)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        let port = Int(UInt16(bigEndian: address.sin_port))
        let asked = Atomic<Int>(0)
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(port)/ws")!,
                               configuration: Self.configuration { $0.connectTimeout = .milliseconds(300) }) { _ in
            asked.add(1, ordering: .relaxed)
            return "token"
        }
        let states = await client.stateUpdates()
        let seen = Seen()
        Task { for await s in states { seen.append(s) } }
        await client.start()
        #expect(await HubClientTests.until(3) { seen.all.filter { $0.disconnect?.reason == .network }.count >= 2 }, "\(seen.all)")
        let timeouts = seen.all.compactMap(\.disconnect).filter { $0.reason == .network && $0.willRetry }
        #expect(timeouts.first?.message.contains("not connected within") == true, "\(timeouts)")
        #expect(asked.load(ordering: .relaxed) == 0, "no token is asked before the WebSocket opens")
        await client.stop()
    }

    /// The hub's `error` replies other than a subscribe's refusal reach `errors()`: an in-band refresh with another
    /// account's token is `FORBIDDEN` (the connection stays).
    @Test func theHubsOtherErrorsReachTheApp() async throws {
        let hub = try HubProcess(["--token-warning", "50"])
        let mint = try HubClientTests.minter(hub)
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: Self.configuration()) { reason in
            mint(reason == .expiring ? "acc_other" : "acc_err", 52)
        }
        let errors = await client.errors()
        let first = Task { () -> HubError? in
            for await error in errors { return error }
            return nil
        }
        _ = await client.subscribe(["wallet_updates"])
        await client.start()
        #expect(await HubClientTests.subscribed(client))
        let error = await first.value
        #expect(error?.code == "FORBIDDEN" && error?.requestID == "refresh", "\(String(describing: error))")
        #expect(await client.currentState == .connected)
        await client.stop()
    }

    /// A consumer that does not read: its subscription holds at most its limit, and the client stops taking events
    /// for it (the rest wait, in order, for the consumer).
    @Test func aSubscriptionHoldsAtMostItsLimit() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!,
                               configuration: Self.configuration { $0.subscriptionBufferLimit = 10 }) { _ in mint("acc_slow", 900) }
        let subscription = await client.subscribe(["wallet_updates"])
        await client.start()
        #expect(await HubClientTests.subscribed(client))
        let admin = try hub.admin()
        let lines = (1...50).map { #"{"op":"publish","channel":"wallet_updates","account":"acc_slow","type":"t","data":{"i":\#($0)}}"# }
        #expect(try admin.requests(lines).count == 50)
        #expect(await HubClientTests.until(5) { subscription.buffer.queued == 10 })
        try await Task.sleep(for: .milliseconds(300))
        #expect(subscription.buffer.queued == 10, "the buffer grew past its limit: \(subscription.buffer.queued)")
        var seqs: [UInt64] = []
        for await element in subscription {
            if case .event(let e) = element { seqs.append(e.seq) }
            if seqs.count == 50 { break }
        }
        #expect(seqs == Array(1...50))
        await client.stop()
    }
}

/// The whole path of an app that falls behind: its subscription fills, the client stops taking messages, the
/// transport stops reading, the hub's queue for the connection grows past `--max-queued-bytes` and the hub closes
/// with 4008 (before the bounds, the client read everything into memory and the guard never fired). At the same
/// publish rate a consumer that reads is never closed. Once it reads again, the client has reconnected and
/// resumed: events come in order, without duplicates, and any gap is announced by `.recoveryFailed` (a replay larger
/// than half the hub's queue limit is `too_many`).
@Suite(.serialized) struct HubClientBackpressureTests {
    final class Consumer: Sendable {
        let seqs = Mutex<[UInt64]>([])
        let failuresAt = Mutex<[Int]>([])
        let paused = Atomic<Bool>(false)
    }

    /// Publishes `count` events of ~4 KiB at `perSecond`, from a thread of its own; returns the last seq.
    static func publish(_ hub: HubProcess, count: Int, perSecond: Double) async -> UInt64? {
        let socketPath = hub.socketPath
        let padding = String(repeating: "x", count: 4096)
        return await withCheckedContinuation { (done: CheckedContinuation<UInt64?, Never>) in
            Thread.detachNewThread {
                guard let admin = try? AdminClient(socketPath: socketPath) else { return done.resume(returning: nil) }
                let started = Date()
                var last: UInt64?
                for i in 0..<count {
                    let line = #"{"op":"publish","channel":"wallet_updates","account":"acc_behind","type":"t","data":{"p":"\#(padding)"}}"#
                    guard let bytes = try? admin.request(line), let reply = try? parseObject(bytes), let seq = reply["seq"] as? Int else {
                        return done.resume(returning: nil)
                    }
                    last = UInt64(seq)
                    let wait = started.addingTimeInterval(Double(i + 1) / perSecond).timeIntervalSinceNow
                    if wait > 0 { usleep(UInt32(wait * 1_000_000)) }
                }
                done.resume(returning: last)
            }
        }
    }

    @Test func anAppThatFallsBehindIsClosedByTheHubAndResumes() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        var configuration = HubClientTests.fast
        configuration.subscriptionBufferLimit = 10
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: configuration,
                               transport: { POSIXTransport(maxQueuedMessages: 16) }) { _ in mint("acc_behind", 900) }
        let states = await client.stateUpdates()
        let seen = HubClientAppLifecycleTests.Seen()
        Task { for await s in states { seen.append(s) } }
        let subscription = await client.subscribe(["wallet_updates"])
        let consumer = Consumer()
        let reading = Task {
            var iterator = subscription.makeAsyncIterator()
            while !Task.isCancelled {
                if consumer.paused.load(ordering: .relaxed) {
                    try? await Task.sleep(for: .milliseconds(10))
                    continue
                }
                guard let element = await iterator.next() else { return }
                switch element {
                case .event(let e): consumer.seqs.withLock { $0.append(e.seq) }
                case .recoveryFailed: consumer.failuresAt.withLock { f in f.append(consumer.seqs.withLock { $0.count }) }
                case .refused: break
                }
            }
        }
        defer { reading.cancel() }
        await client.start()
        #expect(await HubClientTests.subscribed(client))

        // A consumer that reads keeps up with 250 events (1 MiB) a second: never closed.
        let first = await Self.publish(hub, count: 500, perSecond: 250)
        #expect(first == 500)
        #expect(await HubClientTests.until(10) { consumer.seqs.withLock { $0.count } == 500 })
        #expect(!seen.all.contains { $0.disconnect?.reason == .slowConsumer }, "closed while reading: \(seen.all)")

        // The same rate while it does not read: the client stops reading, so the hub's queue for it grows and the
        // hub closes it (4008, counted). The client learns of it when its consumer reads again.
        consumer.paused.store(true, ordering: .relaxed)
        let publishing = Task { await Self.publish(hub, count: 8000, perSecond: 2000) }
        func slowConsumerCloses() -> Int {
            ((try? hub.stats())?["drops"] as? [String: Any])?["slowConsumerCloses"] as? Int ?? 0
        }
        let closed = await HubClientTests.until(15) { slowConsumerCloses() >= 1 }
        #expect(closed, "the hub never closed the app that stopped reading")
        let last = await publishing.value ?? 0
        consumer.paused.store(false, ordering: .relaxed)
        // It reconnects and resumes; the hub cannot replay 8 000 events (history 100 by default): a recoveryFailed,
        // then what comes next, in order.
        #expect(await HubClientTests.until(10) { !consumer.failuresAt.withLock { $0 }.isEmpty }, "no recoveryFailed after the gap")
        #expect(await HubClientTests.until(10) { HubClientLifecycleTests.openConnections(hub) == 1 })
        let next = try hub.publish(channel: "wallet_updates", account: "acc_behind")
        #expect(next["seq"] as? Int == Int(last) + 1)
        #expect(await HubClientTests.until(10) { consumer.seqs.withLock { $0.last } == last + 1 },
                "the consumer ends at \(consumer.seqs.withLock { $0.last } ?? 0), the hub at \(last + 1)")
        let seqs = consumer.seqs.withLock { $0 }
        let gaps = Set(consumer.failuresAt.withLock { $0 })
        let unannounced = seqs.indices.dropFirst().first { seqs[$0] != seqs[$0 - 1] + 1 && !gaps.contains($0) }
        #expect(unannounced == nil, "seq \(unannounced.map { seqs[$0] } ?? 0) after \(unannounced.map { seqs[$0 - 1] } ?? 0) with no recoveryFailed")
        #expect(!gaps.isEmpty, "a gap this large cannot be replayed (too_many): it must be announced")
        await client.stop()
    }
}
