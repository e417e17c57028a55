import Foundation
import Glibc
import HubClient
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// `HubClient` (the Swift client library, `Sources/HubClient/`) with its POSIX transport against the real hub binary:
/// delivery and isolation, refresh before expiry, the 4001 path, a graceful restart resumed without a gap, a
/// `kill -9` restart reported as `recoveryFailed`, and a flapping network under 1 000 events/s where every seq
/// arrives exactly once, in order.
@Suite(.serialized) struct HubClientTests {
    /// What a subscription and the state stream yielded, gathered by background tasks.
    final class Recorder: Sendable {
        private struct Seen { var events: [HubEvent] = []; var failures: [String] = []; var states: [HubConnectionState] = []; var reasons: [TokenRequestReason] = [] }
        private let seen = Mutex(Seen())
        var events: [HubEvent] { seen.withLock { $0.events } }
        var failures: [String] { seen.withLock { $0.failures } }
        var states: [HubConnectionState] { seen.withLock { $0.states } }
        var reasons: [TokenRequestReason] { seen.withLock { $0.reasons } }
        func asked(_ reason: TokenRequestReason) { seen.withLock { $0.reasons.append(reason) } }

        func follow(_ client: HubClient, _ channels: [String]) async {
            let subscription = await client.subscribe(channels)
            Task {
                for await element in subscription {
                    switch element {
                    case .event(let e): seen.withLock { $0.events.append(e) }
                    case .recoveryFailed(let channel, let reason): seen.withLock { $0.failures.append("\(channel):\(reason)") }
                    case .refused(let channel, let code, _): seen.withLock { $0.failures.append("\(channel):refused:\(code)") }
                    }
                }
            }
            let states = await client.stateUpdates()
            Task {
                for await state in states where state.disconnect?.reason != .notStarted { seen.withLock { $0.states.append(state) } }
            }
        }
    }

    /// Mints HS256 tokens with the hub's secret (Sendable, unlike the HubProcess).
    static func minter(_ hub: HubProcess) throws -> @Sendable (String, Int64) -> String {
        let signer = try JWTSigner(key: .hmacSecret(try hub.secret()))
        return { account, ttl in
            let now = Int64(time(nil))
            return (try? signer.sign(JWTClaims(sub: account, exp: now + ttl, iat: now))) ?? ""
        }
    }

    static var fast: HubClientConfiguration {
        var c = HubClientConfiguration()
        c.baseDelay = .milliseconds(20)
        c.maxDelay = .milliseconds(200)
        c.platform = "test"
        // The whole suite can starve the test process for ~10 s at a time (see `until`): an attempt must not be given
        // up for that. Tests of the timeout set their own.
        c.connectTimeout = .seconds(120)
        return c
    }

    /// Polls `condition` every 10 ms for at most `timeout` seconds of time this test was able to run. A poll that
    /// came back far later than its 10 ms sleep means the whole test process was stalled (tests of other suites
    /// blocking the cooperative pool, which has one thread per core: seen for ~10 s at a time when ~60 tests run
    /// in parallel), and counts as half a second, not as the stall's length: the hub and the client get the time
    /// the test promised them. The wall-clock wait is still bounded, at 4 × `timeout`.
    static func until(_ timeout: Double, _ condition: () async -> Bool) async -> Bool {
        let wallDeadline = Date().addingTimeInterval(4 * timeout)
        var budget = timeout
        var last = Date()
        while budget > 0, Date() < wallDeadline {
            if await condition() { return true }
            try? await Task.sleep(for: .milliseconds(10))
            let now = Date()
            budget -= min(now.timeIntervalSince(last), 0.5)
            last = now
        }
        return await condition()
    }

    static func client(_ port: Int, _ token: @escaping @Sendable (TokenRequestReason) -> String, recorder: Recorder,
                       channels: [String] = ["wallet_updates"]) async -> HubClient {
        let client = HubClient(url: URL(string: "ws://127.0.0.1:\(port)/ws")!, configuration: fast) { reason in
            recorder.asked(reason)
            return token(reason)
        }
        await recorder.follow(client, channels)
        await client.start()
        return client
    }

    static func subscribed(_ client: HubClient) async -> Bool {
        await until(10) { await client.position(of: "wallet_updates") != nil }
    }

    @Test func exactDeliveryPerAccountInOrder() async throws {
        let hub = try HubProcess()
        let mint = try Self.minter(hub)
        let (ra, rb) = (Recorder(), Recorder())
        let a = await Self.client(hub.port, { _ in mint("acc_a", 900) }, recorder: ra)
        let b = await Self.client(hub.port, { _ in mint("acc_b", 900) }, recorder: rb)
        let aSubscribed = await Self.subscribed(a)
        let bSubscribed = await Self.subscribed(b)
        let bothSubscribed = aSubscribed && bSubscribed
        #expect(bothSubscribed)
        let admin = try hub.admin()
        let lines = (0..<200).map { i in
            #"{"op":"publish","channel":"wallet_updates","account":"\#(i % 2 == 0 ? "acc_a" : "acc_b")","type":"wallet_balance_changed","data":{"i":\#(i)}}"#
        }
        #expect(try admin.requests(lines).count == 200)
        #expect(await Self.until(10) { ra.events.count >= 100 && rb.events.count >= 100 })
        try await Task.sleep(for: .milliseconds(200))
        struct Payload: Decodable { let i: Int }
        #expect(ra.events.map(\.seq) == Array(1...100) && rb.events.map(\.seq) == Array(1...100))
        #expect(try ra.events.map { try $0.decode(Payload.self).i } == Array(stride(from: 0, to: 200, by: 2)))
        #expect(try rb.events.map { try $0.decode(Payload.self).i } == Array(stride(from: 1, to: 200, by: 2)))
        #expect(ra.events.allSatisfy { $0.type == "wallet_balance_changed" && $0.channel == "wallet_updates" && !$0.broadcast })
        await a.stop()
        await b.stop()
    }

    /// `token_expiring` → the provider is asked (`.expiring`) and the token goes in-band: no reconnect.
    @Test func refreshesInBandBeforeExpiry() async throws {
        let hub = try HubProcess(["--token-warning", "50"])
        let mint = try Self.minter(hub)
        let r = Recorder()
        let client = await Self.client(hub.port, { reason in mint("acc_r", reason == .connect ? 52 : 900) }, recorder: r)
        #expect(await Self.subscribed(client))
        #expect(await Self.until(10) { r.reasons.contains(.expiring) }, "\(r.reasons)")
        _ = try hub.publish(channel: "wallet_updates", account: "acc_r", type: "after_refresh")
        #expect(await Self.until(5) { r.events.count == 1 })
        #expect(r.states == [.connecting, .connected], "\(r.states)")
        await client.stop()
    }

    /// An expired token at connect: close 4001, the provider is asked with `.expired`, and the client connects.
    @Test func closeFourThousandOneGetsAFreshToken() async throws {
        let hub = try HubProcess()
        let mint = try Self.minter(hub)
        let r = Recorder()
        let client = await Self.client(hub.port, { reason in mint("acc_e", reason == .connect ? -120 : 900) }, recorder: r)
        #expect(await Self.subscribed(client))
        #expect(r.reasons.prefix(2) == [.connect, .expired], "\(r.reasons)")
        #expect(r.states.contains(.disconnected(HubDisconnect(.tokenExpired, code: 4001, message: "ErrAccessTokenExpired", willRetry: true))),
                "\(r.states)")
        #expect(r.states.last == .connected, "\(r.states)")
        await client.stop()
    }

    /// A token the hub refuses (4003) stops the client: retrying with such a token cannot work.
    @Test func aRefusedTokenStops() async throws {
        let hub = try HubProcess()
        let r = Recorder()
        let client = await Self.client(hub.port, { _ in "not.a.token" }, recorder: r)
        #expect(await Self.until(5) { r.states.contains { $0.disconnect?.reason == .tokenRefused && $0.disconnect?.code == 4003 && $0.disconnect?.willRetry == false } },
                "\(r.states)")
        try await Task.sleep(for: .milliseconds(300))
        #expect(r.reasons == [.connect], "no retry: \(r.reasons)")
        await client.stop()
    }

    /// A graceful restart resumes without a gap; after `kill -9` the client is told to refetch.
    @Test func gracefulRestartResumesAndKillNineReportsRecoveryFailed() async throws {
        let first = try HubProcess()
        let port = first.port
        let mint = try Self.minter(first)
        let r = Recorder()
        let client = await Self.client(port, { _ in mint("acc_g", 900) }, recorder: r)
        #expect(await Self.subscribed(client))
        for i in 1...3 { _ = try first.publish(channel: "wallet_updates", account: "acc_g", data: #"{"i":\#(i)}"#) }
        #expect(await Self.until(5) { r.events.count == 3 })
        first.send(signal: SIGTERM)
        #expect(first.waitForExit(timeout: 10) == 0)
        let second = try HubProcess(["--state-dir", first.stateDirectory, "--listen", "127.0.0.1:\(port)"])
        for i in 4...6 { _ = try second.publish(channel: "wallet_updates", account: "acc_g", data: #"{"i":\#(i)}"#) }
        #expect(await Self.until(10) { r.events.count >= 6 }, "\(r.events.map(\.seq)) \(r.states)")
        try await Task.sleep(for: .milliseconds(200))
        #expect(r.events.map(\.seq) == Array(1...6), "\(r.events.map(\.seq))")
        #expect(r.failures.isEmpty, "\(r.failures)")
        #expect(r.states.contains { $0.disconnect?.reason == .serverRestart && $0.disconnect?.code == 1001 && $0.disconnect?.willRetry == true },
                "\(r.states)")

        // kill -9: the numbering is gone; the resume says epoch_changed and the app refetches.
        #expect(await Self.until(10) { await client.position(of: "wallet_updates")?.seq == 6 })
        kill(second.process.processIdentifier, SIGKILL)
        _ = second.waitForExit(timeout: 10)
        let third = try HubProcess(["--state-dir", first.stateDirectory, "--listen", "127.0.0.1:\(port)"])
        #expect(await Self.until(10) { r.failures == ["wallet_updates:epoch_changed"] }, "\(r.failures) \(r.states.suffix(3))")
        _ = try third.publish(channel: "wallet_updates", account: "acc_g", data: #"{"after":"crash"}"#)
        #expect(await Self.until(5) { r.events.count == 7 }, "\(r.events.map(\.seq))")
        #expect(r.events.last?.seq == 1, "numbering restarted after the crash")
        await client.stop()
    }

    /// A network that cuts every connection every 150-300 ms while 3 000 events are published at 1 000/s: the
    /// app gets every seq exactly once, in order (resume with `since` after each cut, duplicates dropped).
    @Test func flappingNetworkUnderLoadLosesAndDuplicatesNothing() async throws {
        let hub = try HubProcess(["--history-size", "10000", "--recovery-max", "10000"])
        let mint = try Self.minter(hub)
        let proxy = try CuttingProxy(target: hub.port)
        defer { proxy.stop() }
        let r = Recorder()
        let client = await Self.client(proxy.port, { _ in mint("acc_f", 900) }, recorder: r)
        #expect(await Self.subscribed(client))
        proxy.startCutting(every: 0.15...0.3)
        let total = 3000
        // The publisher paces itself with blocking calls: on a thread of its own, not the cooperative pool.
        let socketPath = hub.socketPath
        let publishError: String? = await withCheckedContinuation { done in
            Thread.detachNewThread {
                do {
                    let publisher = try AdminClient(socketPath: socketPath)
                    let started = Date()
                    for i in 1...total {
                        _ = try publisher.request(#"{"op":"publish","channel":"wallet_updates","account":"acc_f","type":"tick","data":{"i":\#(i)}}"#)
                        let wait = started.addingTimeInterval(Double(i) / 1000).timeIntervalSinceNow
                        if wait > 0 { usleep(UInt32(wait * 1_000_000)) }
                    }
                    done.resume(returning: nil)
                } catch {
                    done.resume(returning: "\(error)")
                }
            }
        }
        #expect(publishError == nil, "\(publishError ?? "")")
        proxy.stopCutting()
        #expect(await Self.until(20) { r.events.count >= total }, "got \(r.events.count) of \(total)")
        try await Task.sleep(for: .milliseconds(200))
        let seqs = r.events.map(\.seq)
        #expect(seqs == Array(1...UInt64(total)), "\(seqs.count) events; first wrong at \(zip(seqs, 1...).first { $0.0 != UInt64($0.1) }.map { "\($0)" } ?? "-")")
        #expect(r.failures.isEmpty, "\(r.failures)")
        #expect(proxy.cuts >= 5, "the network was cut \(proxy.cuts) times")
        await client.stop()
    }
}

/// A TCP proxy on loopback that forwards to `target` and, while cutting, shuts down every open connection at random
/// intervals: a network that keeps dropping (as a phone in a train does). A connection's two descriptors are closed
/// only once both of its pumps have ended, so a cut never touches a descriptor that was reused.
final class CuttingProxy: @unchecked Sendable {
    private final class Pair: @unchecked Sendable {  // its counter is guarded by the proxy's lock
        let a: Int32, b: Int32
        var pumps = 2
        init(_ a: Int32, _ b: Int32) { self.a = a; self.b = b }
        func shut() { shutdown(a, Int32(SHUT_RDWR)); shutdown(b, Int32(SHUT_RDWR)) }
    }
    let port: Int
    private let listener: Int32
    private let lock = NSLock()
    private var pairs: [ObjectIdentifier: Pair] = [:]
    private var cutting = false
    private var running = true
    private var cutCount = 0
    private var stalledUntil = Date.distantPast
    var cuts: Int { lock.lock(); defer { lock.unlock() }; return cutCount }

    init(target: Int) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0, listen(fd, 64) == 0 else {
            Glibc.close(fd)
            throw HubTestError("proxy: bind/listen failed")
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        listener = fd
        port = Int(UInt16(bigEndian: addr.sin_port))
        Thread.detachNewThread { [self] in acceptLoop(target: target) }
    }

    func startCutting(every interval: ClosedRange<Double>) {
        lock.lock(); cutting = true; lock.unlock()
        Thread.detachNewThread { [self] in
            while true {
                usleep(UInt32(Double.random(in: interval) * 1_000_000))
                lock.lock()
                guard cutting && running else { lock.unlock(); return }
                if !pairs.isEmpty { cutCount += 1 }
                for pair in pairs.values { pair.shut() }  // under the lock: their descriptors are still open
                lock.unlock()
            }
        }
    }

    func stopCutting() { lock.lock(); cutting = false; lock.unlock() }

    /// Holds every byte in both directions for `seconds` (a stalled network: reads go on until the buffers fill,
    /// nothing is forwarded; long enough, a black hole), then forwards again.
    func stall(for seconds: Double) {
        lock.lock(); stalledUntil = max(stalledUntil, Date().addingTimeInterval(seconds)); lock.unlock()
    }

    private var isStalled: Bool { lock.lock(); defer { lock.unlock() }; return Date() < stalledUntil }

    /// Cuts every open connection once.
    func cutNow() {
        lock.lock()
        if !pairs.isEmpty { cutCount += 1 }
        for pair in pairs.values { pair.shut() }
        lock.unlock()
    }

    func stop() {
        lock.lock()
        running = false
        for pair in pairs.values { pair.shut() }
        lock.unlock()
        shutdown(listener, Int32(SHUT_RDWR))
    }

    private func acceptLoop(target: Int) {
        while true {
            let client = accept(listener, nil, nil)
            lock.lock()
            let live = running
            lock.unlock()
            guard client >= 0, live else {
                if client >= 0 { Glibc.close(client) }
                Glibc.close(listener)
                return
            }
            guard let upstream = try? TestWebSocket.tcpConnect(port: target) else { Glibc.close(client); continue }
            let pair = Pair(client, upstream)
            lock.lock(); pairs[ObjectIdentifier(pair)] = pair; lock.unlock()
            Thread.detachNewThread { [self] in pump(pair, from: client, to: upstream) }
            Thread.detachNewThread { [self] in pump(pair, from: upstream, to: client) }
        }
    }

    /// Copies until either side ends, then ends the other direction too; the last pump closes both descriptors.
    private func pump(_ pair: Pair, from source: Int32, to sink: Int32) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        copying: while true {
            let n = buffer.withUnsafeMutableBytes { read(source, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            while isStalled { usleep(10_000) }
            var offset = 0
            while offset < n {
                let w = buffer.withUnsafeBytes { send(sink, $0.baseAddress! + offset, n - offset, Int32(MSG_NOSIGNAL)) }
                if w <= 0 { break copying }
                offset += w
            }
        }
        lock.lock()
        pair.shut()
        pair.pumps -= 1
        let last = pair.pumps == 0
        if last { pairs[ObjectIdentifier(pair)] = nil }
        lock.unlock()
        if last { Glibc.close(pair.a); Glibc.close(pair.b) }
    }
}
