import Foundation
import Glibc
@testable import HubClient
import Synchronization
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubRouting

/// `HubClient`'s defects from the app-shaped tests, each against the real hub: an app's background/foreground
/// `stop()`/`start()` racing a late token answer, a channel the hub does not serve among valid ones, a token the hub
/// keeps calling expired, `data` as published, `stop()` against a hub that does not answer, and a `wss://` URL on a
/// transport without TLS.
@Suite(.serialized) struct HubClientLifecycleTests {
    typealias Recorder = HubClientTests.Recorder

    static func openConnections(_ hub: HubProcess) -> Int? {
        (try? hub.stats()["connections"] as? [String: Any])?["open"] as? Int
    }

    /// Defects 1 and 2: the first session's token request answers late (fails, or succeeds) after the app went to the
    /// background and came back (`suspend()`/`resume()`; the same generation guard serves `stop()`/`start()`). The stale answer changes nothing: one connection at the hub, the client connected, its
    /// events delivered; and `stop()` then closes it.
    @Test(arguments: [false, true])
    func aLateTokenOfAStoppedSessionChangesNothing(lateAnswerSucceeds: Bool) async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let calls = Atomic<Int>(0)
        let secondSession = Atomic<Bool>(false)
        let r = Recorder()
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: HubClientTests.fast) { reason in
            r.asked(reason)
            calls.add(1, ordering: .relaxed)
            if !secondSession.load(ordering: .relaxed) {
                // The first session's request: it answers late, after the app stopped and started again.
                try await Task.sleep(for: .milliseconds(600))
                if !lateAnswerSucceeds { throw CancellationError() }
            }
            return mint("acc_life", 900)
        }
        await r.follow(client, ["wallet_updates"])
        await client.start()
        try #require(await HubClientTests.until(20) { calls.load(ordering: .relaxed) == 1 }, "the first token request never came")
        await client.suspend()  // the app goes to the background while the first token is on its way
        secondSession.store(true, ordering: .relaxed)
        await client.resume()  // and comes back
        #expect(await HubClientTests.subscribed(client))
        try await Task.sleep(for: .milliseconds(900))  // the stale answer has come back by now
        #expect(Self.openConnections(hub) == 1, "connections at the hub: \(Self.openConnections(hub) ?? -1)")
        #expect(r.states.last == .connected, "\(r.states)")
        let reply = try hub.publish(channel: "wallet_updates", account: "acc_life")
        #expect(reply["delivered"] as? Int == 1)
        #expect(await HubClientTests.until(5) { r.events.count == 1 }, "the app did not get the event")
        await client.stop()
        #expect(await HubClientTests.until(5) { Self.openConnections(hub) == 0 }, "stop() left a connection")
    }

    /// Defect 3: a channel the hub does not serve (renamed, in an old app version) rode in the same all-or-nothing
    /// resubscribe as the valid ones, and the refusal was dropped: nothing reached the app after a reconnect. It is
    /// refused alone (`.refused`, its subscription ends) and the valid channels go on, across a reconnect.
    @Test func anUnknownChannelIsRefusedAloneAndTheOthersGoOn() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let r = Recorder()
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: HubClientTests.fast) { _ in
            mint("acc_u", 900)
        }
        await r.follow(client, ["wallet_updates"])
        let renamed = await client.subscribe(["renamed_updates"])
        let refusal = Task { () -> [HubSubscriptionElement] in
            var all: [HubSubscriptionElement] = []
            for await element in renamed { all.append(element) }
            return all
        }
        await client.start()
        #expect(await HubClientTests.subscribed(client))
        let refused = await refusal.value  // the stream ends after its refusal
        #expect(refused.count == 1, "\(refused)")
        if case .refused(let channel, let code, _)? = refused.first {
            #expect(channel == "renamed_updates" && code == "VALIDATION_ERROR")
        } else {
            Issue.record("no refusal: \(refused)")
        }
        _ = try hub.publish(channel: "wallet_updates", account: "acc_u", data: #"{"n":1}"#)
        #expect(await HubClientTests.until(5) { r.events.count == 1 })
        // The hub drops the connection: the client reconnects and resubscribes the valid channel, and only it.
        _ = try hub.request(#"{"op":"disconnect","account":"acc_u"}"#)
        #expect(await HubClientTests.until(10) { r.states.filter { $0 == .connected }.count == 2 })
        #expect(await HubClientTests.until(5) { await client.position(of: "wallet_updates") != nil })
        try await Task.sleep(for: .milliseconds(200))
        _ = try hub.publish(channel: "wallet_updates", account: "acc_u", data: #"{"n":2}"#)
        #expect(await HubClientTests.until(5) { r.events.count == 2 }, "after the reconnect: \(r.events.count) events")
        await client.stop()
    }

    /// Defect 4: a provider that keeps returning a token the hub calls expired (a cache, a clock behind the hub's)
    /// was retried with no delay, ~1 000 connections a second. A 4001 at connect now waits like any failure.
    @Test func aTokenTheHubAlwaysCallsExpiredIsRetriedWithBackoff() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let r = Recorder()
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, configuration: HubClientTests.fast) { reason in
            r.asked(reason)
            return mint("acc_x", -600)
        }
        await client.start()
        try await Task.sleep(for: .seconds(2))
        await client.stop()
        let asked = r.reasons.count
        // Backoff of 20 ms doubling to 200 ms (full jitter) allows ~25 attempts in 2 s; zero delay allowed thousands.
        #expect(asked >= 2 && asked <= 80, "\(asked) token requests in 2 s")
    }

    /// Defect 5: `data` was parsed and written back (keys reordered, `/` escaped, 10.50 → 10.5, keys equal under
    /// normalisation merged). It is the published bytes.
    @Test func eventDataIsThePublishedBytes() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let r = Recorder()
        let client = await HubClientTests.client(hub.port, { _ in mint("acc_d", 900) }, recorder: r)
        #expect(await HubClientTests.subscribed(client))
        let data = #"{"z":1,"a":10.50,"s":"a/b","caf\u00e9":1,"cafe\u0301":2,"n":[1e2,-0.0,{"x":"}"}]}"#
        _ = try hub.publish(channel: "wallet_updates", account: "acc_d", data: data)
        #expect(await HubClientTests.until(5) { r.events.count == 1 })
        #expect(r.events.first.map { String(decoding: $0.data, as: UTF8.self) } == data)
        await client.stop()
    }

    /// Defect 6: `stop()` against a hub that does not answer (here: stopped with SIGSTOP) left the reader thread
    /// blocked and the socket open. It returns after the close timeout (2 s), the socket cut.
    @Test func stopReturnsAgainstAHubThatDoesNotAnswer() async throws {
        let hub = try HubProcess()
        let mint = try HubClientTests.minter(hub)
        let r = Recorder()
        let client = await HubClientTests.client(hub.port, { _ in mint("acc_s", 900) }, recorder: r)
        #expect(await HubClientTests.subscribed(client))
        let pid = hub.process.processIdentifier
        #expect(kill(pid, SIGSTOP) == 0)
        let started = ContinuousClock.now
        await client.stop()
        let took = ContinuousClock.now - started
        #expect(kill(pid, SIGCONT) == 0)
        #expect(took < .seconds(5), "stop() took \(took)")
        #expect(await HubClientTests.until(2) { await client.currentState.disconnect?.reason == .stopped }, "\(r.states)")
        #expect(await HubClientTests.until(5) { Self.openConnections(hub) == 0 }, "the socket was not closed")

        // The transport itself: when close() returns, its reader has ended and its descriptor is closed, though
        // the hub has still not answered.
        let transport = POSIXTransport(closeTimeout: .milliseconds(500))
        try await transport.connect(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!, protocols: [])
        #expect(kill(pid, SIGSTOP) == 0)
        await transport.close(code: 1000, reason: "bye")
        let finished = transport.isFinished
        #expect(kill(pid, SIGCONT) == 0)
        #expect(finished, "the reader and the socket outlived close()")
    }

    /// Defect 7: a URL the transport cannot serve (it was `wss://` on Linux before POSIXTransport spoke TLS; here a
    /// scheme it never speaks) was retried forever as `1006, willRetry: true`. A configuration error stops at once,
    /// before any token is asked.
    @Test func aURLTheTransportCannotServeStopsAtOnce() async throws {
        let r = Recorder()
        let client = HubClient(url: URL(string: "http://127.0.0.1:1/ws")!, configuration: HubClientTests.fast) { reason in
            r.asked(reason)
            return "token"
        }
        await r.follow(client, ["wallet_updates"])
        await client.start()
        #expect(await HubClientTests.until(5) {
            r.states.contains { $0.disconnect?.reason == .configuration && $0.disconnect?.willRetry == false }
        }, "\(r.states)")
        try await Task.sleep(for: .milliseconds(200))
        #expect(r.reasons.isEmpty && r.states.filter { $0 == .connecting }.count == 1, "\(r.reasons) \(r.states)")
        await client.stop()
    }
}
