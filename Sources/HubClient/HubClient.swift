import Foundation
import Synchronization

/// The hub's Swift client: one connection kept open, authenticated and refreshed, resubscribed and resumed without
/// gaps after every reconnect. docs/CLIENT-SWIFT.md is the guide.
///
/// ```swift
/// let hub = HubClient(url: URL(string: "wss://api.interspace.com/ws")!) { _ in try await auth.validAccessToken() }
/// await hub.start()
/// for await element in await hub.subscribe(["wallet_updates"]) {
///     if case .event(let e) = element, e.type == "wallet_balance_changed" { balance = try e.decode(Wallet.self).balance }
/// }
/// ```
///
/// The app's handle on a `HubSession` (the actor that does the work): when the app lets go of it without `stop()`,
/// the session is stopped and its connection closed (the session's own tasks keep the session alive, not this).
public final class HubClient: Sendable {
    public typealias TokenProvider = @Sendable (TokenRequestReason) async throws -> String

    public let url: URL
    public let configuration: HubClientConfiguration
    let session: HubSession

    /// - Parameters:
    ///   - tokenProvider: returns a current access token (the app's REST refresh, the seeds' `TokenRefreshManager`).
    ///     It is `@Sendable` and runs outside the client: an app's token manager must be an actor or `@MainActor`
    ///     (or otherwise `Sendable`). Throwing ends the session: state `disconnected(.loggedOut)`, every stream ends.
    ///   - transport: a new transport per connection; by default `POSIXTransport` on Linux, `URLSessionTransport`
    ///     elsewhere.
    public init(url: URL, configuration: HubClientConfiguration = HubClientConfiguration(),
                transport: @escaping @Sendable () -> any HubTransport = HubClient.defaultTransport,
                tokenProvider: @escaping TokenProvider) {
        self.url = url
        self.configuration = configuration
        session = HubSession(url: url, configuration: configuration, transport: transport, tokenProvider: tokenProvider)
    }

    deinit {
        let session = session
        Task { await session.stop() }
    }

    @Sendable public static func defaultTransport() -> any HubTransport {
        #if canImport(Glibc)
        POSIXTransport()
        #else
        URLSessionTransport()
        #endif
    }

    /// Connects, and keeps connecting until `stop()`, `suspend()` or a cause that retrying cannot fix.
    public func start() async { await session.start() }
    /// Closes (1000), stops reconnecting and ends the session: every subscription, state and error stream finishes.
    /// Returns once the connection is closed (the close handshake, or at most about 2 s for a hub that does not
    /// answer, then the socket is cut). A later `start()` begins a new session (subscribe again).
    public func stop() async { await session.stop() }
    /// The app goes to the background: closes the connection (1000) but keeps the subscriptions and their positions,
    /// so `resume()` resubscribes with `since` and the hub replays what was missed. Returns once it is closed.
    public func suspend() async { await session.suspend() }
    /// Back in the foreground after `suspend()` (the same as `start()`).
    public func resume() async { await session.start() }
    /// The device's network changed: an open connection must answer a ping within `networkProbeTimeout` or is
    /// replaced, and a client waiting to reconnect tries now.
    public func networkChanged() async { await session.networkChanged() }
    /// The state now; `stateUpdates()` follows it.
    public var currentState: HubConnectionState { get async { await session.currentState } }
    /// The connection's state: `currentState` first, then every change, for this observer alone. Finishes on
    /// `stop()` and logout.
    public func stateUpdates() async -> AsyncStream<HubConnectionState> { await session.stateUpdates() }
    /// The hub's `error` replies that are not a subscribe's refusal, for this observer alone.
    public func errors() async -> AsyncStream<HubError> { await session.errors() }
    /// Events of `channels` for this connection's account, each once, in `seq` order per stream, across reconnects.
    public func subscribe(_ channels: [String]) async -> HubSubscription { await session.subscribe(channels) }
    /// The position kept for `channel`: (epoch, seq, broadcastSeq), nil before its first `subscribed` (or seed).
    public func position(of channel: String) async -> (epoch: String, seq: UInt64, broadcastSeq: UInt64)? {
        await session.position(of: channel)
    }
    /// Every position kept, to store (`Codable`) when the app goes to the background.
    public func exportPositions() async -> HubPositions { await session.exportPositions() }
    /// Positions stored by an earlier launch, used by the next subscribe of these channels (`since`).
    public func seed(_ stored: HubPositions) async { await session.seed(stored) }
}

/// The connection, its runs, subscriptions and positions: everything `HubClient` does.
actor HubSession {
    typealias TokenProvider = HubClient.TokenProvider
    nonisolated let url: URL
    nonisolated let configuration: HubClientConfiguration
    private(set) var currentState = HubConnectionState.disconnected(HubDisconnect(.notStarted, willRetry: false))
    private let tokenProvider: TokenProvider
    private let makeTransport: @Sendable () -> any HubTransport

    private struct Position { var epoch: String; var seq: UInt64; var broadcastSeq: UInt64 }
    private var subscribers: [ChannelKey: [UUID: HubSubscriptionBuffer]] = [:]
    private var positions: [ChannelKey: Position] = [:]
    private var pending: Set<ChannelKey> = []
    private var stateObservers: [UUID: AsyncStream<HubConnectionState>.Continuation] = [:]
    private var errorObservers: [UUID: AsyncStream<HubError>.Continuation] = [:]
    private var transport: (any HubTransport)?
    private var authenticated = false
    private var running: Task<Void, Never>?
    private var stopped = true
    private var attempt = 0
    private var lastCloseCode: UInt16 = 0
    private var connectedAt: ContinuousClock.Instant?
    private var lastMessageAt = ContinuousClock.now
    private var nextID = 1
    /// The last send: each send waits for the one before, so messages leave in the order they were made.
    private var sendChain: Task<Void, Never>?
    /// Which run of the connection loop owns the client: `start()`, `stop()` and `suspend()` each begin a new one,
    /// and a loop, token request or callback of an older one changes nothing (an app's background/foreground
    /// `suspend()`/`resume()` must never let a late answer to the old session close or reset the new one).
    private var generation = 0
    /// The channels of each subscribe in flight, by its `id`: a refusal names the request, not the channels.
    private var subscribeRequests: [String: [String]] = [:]
    /// The client cut the current connection itself because the hub went silent (ping, or `networkChanged()`).
    private var cutForSilence = false
    /// The current attempt did not authenticate within `connectTimeout`.
    private var timedOut = false
    /// `networkChanged()` while waiting to reconnect: stop waiting.
    private var wakeRequested = false
    private var probe: Task<Void, Never>?

    init(url: URL, configuration: HubClientConfiguration, transport: @escaping @Sendable () -> any HubTransport,
         tokenProvider: @escaping TokenProvider) {
        self.url = url
        self.configuration = configuration
        self.tokenProvider = tokenProvider
        self.makeTransport = transport
    }

    // MARK: Lifecycle

    /// Connects, and keeps connecting until `stop()`, `suspend()` or a cause that retrying cannot fix.
    func start() {
        guard stopped else { return }
        stopped = false
        attempt = 0
        generation += 1
        let run = generation
        log(.info, "starting")
        running = Task { await self.run(run) }
    }

    /// Closes (1000), stops reconnecting and ends the session: every subscription, state and error stream finishes.
    /// Returns once the connection is closed (the close handshake, or at most about 2 s for a hub that does not
    /// answer, then the socket is cut). Whatever the old run was waiting for (a token, a connect) changes nothing
    /// when it comes back. A later `start()` begins a new session (subscribe again).
    func stop() async {
        await disconnect(HubDisconnect(.stopped, message: "stopped", willRetry: false))
        endSession()
    }

    /// The app goes to the background: closes the connection (1000) but keeps the subscriptions and their positions,
    /// so `resume()` resubscribes with `since` and the hub replays what was missed. Returns once the connection is
    /// closed, like `stop()`.
    func suspend() async {
        await disconnect(HubDisconnect(.suspended, message: "suspended", willRetry: false))
    }

    /// Back in the foreground after `suspend()` (the same as `start()`).
    func resume() { start() }

    /// The device's network changed (Wi-Fi to cellular, a VPN): a connection that may be dead is checked at once
    /// (a ping; no answer within `networkProbeTimeout` and it is replaced), and a client waiting to reconnect tries
    /// now. On Apple platforms `HubClient.monitorNetwork()` calls this from an `NWPathMonitor`.
    func networkChanged() {
        guard !stopped else { return }
        if authenticated, let transport {
            log(.info, "network changed: checking the connection")
            let asked = ContinuousClock.now
            send(["type": "ping"])
            probe?.cancel()
            let timeout = configuration.networkProbeTimeout
            probe = Task {
                try? await Task.sleep(for: timeout)
                guard !Task.isCancelled else { return }
                await self.probeExpired(since: asked, transport)
            }
        } else {
            log(.info, "network changed: reconnecting now")
            attempt = 0
            wakeRequested = true
        }
    }

    private func probeExpired(since: ContinuousClock.Instant, _ probed: any HubTransport) async {
        guard self.transport as AnyObject? === probed as AnyObject, lastMessageAt < since else { return }
        log(.warning, "no answer after the network changed: reconnecting")
        await cutSilent(probed)
    }

    private func disconnect(_ reason: HubDisconnect) async {
        stopped = true
        generation += 1
        running?.cancel()
        running = nil
        probe?.cancel()
        authenticated = false
        pending.removeAll()
        subscribeRequests.removeAll()
        if let transport {
            self.transport = nil
            await transport.close(code: 1000, reason: reason.reason == .suspended ? "client suspended" : "client stopped")
        }
        setState(.disconnected(reason))
    }

    /// The session is over: every stream the app holds finishes.
    private func endSession() {
        let buffers = subscribers.values.flatMap { $0.values }
        subscribers.removeAll()
        positions.removeAll()
        for buffer in buffers { buffer.finish() }
        for observer in stateObservers.values { observer.finish() }
        stateObservers.removeAll()
        for observer in errorObservers.values { observer.finish() }
        errorObservers.removeAll()
    }

    // MARK: Observing

    /// The connection's state: `currentState` first, then every change, for this observer alone (each call makes a
    /// new stream). Slow observers see the newest 32 changes. Finishes on `stop()` and logout.
    func stateUpdates() -> AsyncStream<HubConnectionState> {
        let (stream, continuation) = AsyncStream.makeStream(of: HubConnectionState.self, bufferingPolicy: .bufferingNewest(32))
        let id = UUID()
        continuation.yield(currentState)
        stateObservers[id] = continuation
        continuation.onTermination = { [weak self] _ in Task { await self?.removeStateObserver(id) } }
        return stream
    }

    /// The hub's `error` replies that are not a subscribe's refusal (an in-band token refresh refused, …), for this
    /// observer alone. Finishes on `stop()` and logout.
    func errors() -> AsyncStream<HubError> {
        let (stream, continuation) = AsyncStream.makeStream(of: HubError.self, bufferingPolicy: .bufferingNewest(32))
        let id = UUID()
        errorObservers[id] = continuation
        continuation.onTermination = { [weak self] _ in Task { await self?.removeErrorObserver(id) } }
        return stream
    }

    private func removeStateObserver(_ id: UUID) { stateObservers[id] = nil }
    private func removeErrorObserver(_ id: UUID) { errorObservers[id] = nil }

    // MARK: Subscriptions

    /// Events of `channels` for this connection's account, each once, in `seq` order per stream, across reconnects.
    /// Ending the iteration (or cancelling its task) unsubscribes. At most `configuration.subscriptionBufferLimit`
    /// elements wait for the consumer; beyond that the client stops reading from the hub until it catches up.
    func subscribe(_ channels: [String]) -> HubSubscription {
        let id = UUID()
        let keys = Array(Set(channels.map(ChannelKey.init))).sorted()
        let buffer = HubSubscriptionBuffer(limit: configuration.subscriptionBufferLimit) { [weak self] in
            Task { await self?.unsubscribe(id, keys) }
        }
        var added: [String] = []
        for key in keys {
            if subscribers[key] == nil { added.append(key.name) }
            subscribers[key, default: [:]][id] = buffer
        }
        if authenticated && !added.isEmpty { sendSubscribe(added) }
        return HubSubscription(buffer: buffer)
    }

    /// The position kept for `channel`: (epoch, seq, broadcastSeq), nil before its first `subscribed` (or seed).
    func position(of channel: String) -> (epoch: String, seq: UInt64, broadcastSeq: UInt64)? {
        positions[ChannelKey(channel)].map { ($0.epoch, $0.seq, $0.broadcastSeq) }
    }

    /// Every position kept, to store (`Codable`) when the app goes to the background.
    func exportPositions() -> HubPositions {
        HubPositions(entries: positions.keys.sorted().compactMap { key in
            positions[key].map { HubPositions.Entry(channel: key.name, epoch: $0.epoch, seq: $0.seq, broadcastSeq: $0.broadcastSeq) }
        })
    }

    /// Positions stored by an earlier launch: the next subscribe of these channels asks the hub to replay from them
    /// (`since`). Call before `subscribe`; a channel the hub can no longer replay yields `.recoveryFailed`.
    func seed(_ stored: HubPositions) {
        for entry in stored.entries {
            positions[ChannelKey(entry.channel)] = Position(epoch: entry.epoch, seq: entry.seq, broadcastSeq: entry.broadcastSeq)
        }
    }

    private func unsubscribe(_ id: UUID, _ keys: [ChannelKey]) {
        var gone: [String] = []
        for key in keys {
            guard subscribers[key]?[id] != nil else { continue }
            subscribers[key]?[id] = nil
            if subscribers[key]?.isEmpty == true {
                subscribers[key] = nil
                positions[key] = nil
                gone.append(key.name)
            }
        }
        if authenticated && !gone.isEmpty { send(["type": "unsubscribe", "channels": gone]) }
    }

    // MARK: The connection loop

    /// The connection loop of run `run` (`generation`). After every suspension it checks it still owns the client;
    /// a stale loop closes what it opened and returns without touching any state.
    private func run(_ run: Int) async {
        while !stopped && !Task.isCancelled && run == generation {
            setState(.connecting)
            let transport = makeTransport()
            self.transport = transport
            authenticated = false
            cutForSilence = false
            timedOut = false
            var code: UInt16 = 1006
            var reason = ""
            var httpStatus: Int?
            var worked = false
            let timeout = configuration.connectTimeout
            let watchdog = Task {
                try? await Task.sleep(for: timeout)
                guard !Task.isCancelled else { return }
                await self.connectTimedOut(run, transport)
            }
            do {
                log(.debug, "connecting to \(url.host ?? "")")
                try await Self.connect(transport, url: url, within: timeout)
                guard run == generation else {
                    watchdog.cancel()
                    return await transport.close(code: 1000, reason: "client stopped")
                }
                let token: String
                do {
                    log(.debug, "asking for a token")
                    token = try await tokenProvider(lastCloseCode == 4001 ? .expired : .connect)
                } catch {
                    watchdog.cancel()
                    await transport.close(code: 1000, reason: "no token")
                    guard run == generation else { return }
                    return loggedOut(error)
                }
                guard run == generation else {
                    watchdog.cancel()
                    return await transport.close(code: 1000, reason: "client stopped")
                }
                var auth: [String: Any] = ["type": "auth", "token": token, "platform": configuration.platform, "id": "auth"]
                if let appVersion = configuration.appVersion { auth["appVersion"] = appVersion }
                try await transport.send(text: Self.json(auth))
                lastMessageAt = .now
                let pinger = Task { await self.keepAlive(transport) }
                receiving: while true {
                    let message = await transport.receive()
                    guard run == generation else {
                        pinger.cancel()
                        watchdog.cancel()
                        return await transport.close(code: 1000, reason: "client stopped")
                    }
                    switch message {
                    case .text(let text):
                        for (buffer, element) in handle(text) { await buffer.send(element) }
                        if authenticated && !worked {
                            worked = true
                            watchdog.cancel()
                        }
                    case .closed(let c, let r):
                        code = c
                        reason = r
                        break receiving
                    }
                }
                pinger.cancel()
            } catch let error as HubTransportError where error.isConfigurationError {
                watchdog.cancel()
                guard run == generation else { return }
                // A URL this transport cannot serve (no host, a scheme it does not speak): no retry can help.
                if self.transport as AnyObject? === transport as AnyObject { self.transport = nil }
                stopped = true
                log(.error, "configuration: \(error)")
                return setState(.disconnected(HubDisconnect(.configuration, message: error.description, willRetry: false)))
            } catch let error as HubTransportError {
                reason = error.description
                httpStatus = error.httpStatus
            } catch {
                reason = "\(error)"
            }
            watchdog.cancel()
            guard run == generation else { return }
            if self.transport as AnyObject? === transport as AnyObject { self.transport = nil }
            authenticated = false
            pending.removeAll()
            subscribeRequests.removeAll()
            lastCloseCode = code
            guard !stopped else { return }
            var down = classify(code: code, message: reason, httpStatus: httpStatus)
            if down.reason == .tokenRefused {
                // The hub refuses this kind of token: another connection with it would fail the same way.
                stopped = true
                down.willRetry = false
                log(.error, "disconnected: \(down)")
                return setState(.disconnected(down))
            }
            if let connectedAt, ContinuousClock.now - connectedAt > .seconds(60) { attempt = 0 }
            connectedAt = nil
            // A token that expired on a connection that worked: refresh and reconnect at once, once. A 4001 right at
            // connect (a cached token, a clock behind the hub's) waits like any failure: no tight loop.
            var delay: Duration = code == 4001 && worked ? .zero : backoff()
            if let retryAfter = down.retryAfter { delay = max(delay, retryAfter) }
            attempt += 1
            down.willRetry = true
            log(.warning, "disconnected: \(down); next attempt in \(delay)")
            setState(.disconnected(down))
            await wait(delay, run: run)
        }
    }

    /// `transport.connect`, given up after `timeout`: a transport blocked in a connect or handshake that never
    /// answers is closed (which cuts the connect) while the client goes on.
    private static func connect(_ transport: any HubTransport, url: URL, within timeout: Duration) async throws {
        final class Outcome: Sendable {
            let waiting = Mutex<CheckedContinuation<Void, any Error>?>(nil)
            /// Whether this result was the first (the one the caller gets).
            @discardableResult
            func resume(_ result: Result<Void, any Error>) -> Bool {
                guard let waiting = waiting.withLock({ $0.take() }) else { return false }
                waiting.resume(with: result)
                return true
            }
        }
        let outcome = Outcome()
        let attempt = Task { try await transport.connect(url: url, protocols: ["hub.v1"]) }
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            outcome.waiting.withLock { $0 = done }
            let deadline = Task {
                try? await Task.sleep(for: timeout)
                guard !Task.isCancelled else { return }
                // Only when the deadline came first: the abandoned connect is cut (a POSIXTransport's blocked thread
                // returns and closes its socket).
                if outcome.resume(.failure(HubTransportError("not connected within \(timeout)"))) {
                    await transport.close(code: 1000, reason: "connect timeout")
                }
            }
            Task {
                outcome.resume(await attempt.result)
                deadline.cancel()
            }
        }
    }

    /// What a connection's end means for the app.
    private func classify(code: UInt16, message: String, httpStatus: Int?) -> HubDisconnect {
        if timedOut {
            return HubDisconnect(.network, message: "not connected within \(configuration.connectTimeout)", willRetry: true)
        }
        if cutForSilence { return HubDisconnect(.noPong, code: 4002, message: "no pong", willRetry: true) }
        if let status = httpStatus {
            let reason: HubDisconnectReason = switch status {
            case 401, 403: .tokenRefused
            case 429: .rateLimited
            case 503: .serverBusy
            default: .closed
            }
            return HubDisconnect(reason, code: UInt16(clamping: status), message: message, willRetry: true)
        }
        let reason: HubDisconnectReason = switch code {
        case 4001: .tokenExpired
        case 4003: .tokenRefused
        case 4002: .noPong
        case 1001, 1012: .serverRestart
        case 4008: .slowConsumer
        case 4029: .rateLimited
        case 1006: .network
        default: .closed
        }
        return HubDisconnect(reason, code: code, message: message, willRetry: true)
    }

    /// Waits `delay` before the next attempt, or less if `networkChanged()` says the network is back.
    private func wait(_ delay: Duration, run: Int) async {
        wakeRequested = false
        let until = ContinuousClock.now + delay
        while run == generation, !wakeRequested, !Task.isCancelled {
            let left = until - ContinuousClock.now
            if left <= .zero { break }
            try? await Task.sleep(for: min(left, .milliseconds(50)))
        }
    }

    private func connectTimedOut(_ run: Int, _ attempt: any HubTransport) async {
        guard run == generation, !authenticated, self.transport as AnyObject? === attempt as AnyObject else { return }
        timedOut = true
        log(.warning, "not connected within \(configuration.connectTimeout): trying again")
        await attempt.close(code: 1000, reason: "connect timeout")
        if let posix = attempt as? any POSIXTransportCancellable { posix.cancelNow() }
    }

    private func backoff() -> Duration {
        let cap = min(configuration.maxDelay, configuration.baseDelay * (1 << min(attempt, 20)))
        let seconds = Double(cap.components.seconds) + Double(cap.components.attoseconds) / 1e18
        return .milliseconds(Int((Double.random(in: 0...1) * seconds * 1000).rounded()))
    }

    /// The token provider threw: the session is over.
    private func loggedOut(_ error: any Error) {
        stopped = true
        transport = nil
        log(.warning, "logged out: the token provider failed (\(error))")
        setState(.disconnected(HubDisconnect(.loggedOut, message: "\(error)", willRetry: false)))
        endSession()
    }

    /// App-level pings; a connection that hears nothing for two intervals is cut (the loop then reconnects).
    private func keepAlive(_ transport: any HubTransport) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: configuration.pingInterval)
            guard !Task.isCancelled, self.transport as AnyObject? === transport as AnyObject else { return }
            if ContinuousClock.now - lastMessageAt > configuration.pingInterval * 2 {
                log(.warning, "no message for two ping intervals: reconnecting")
                return await cutSilent(transport)
            }
            send(["type": "ping"])
        }
    }

    /// A connection that stopped answering: cut at once (a dead connection does not answer a close frame either).
    private func cutSilent(_ silent: any HubTransport) async {
        cutForSilence = true
        if let posix = silent as? any POSIXTransportCancellable { posix.cancelNow() }
        await silent.close(code: 4002, reason: "no pong")
    }

    private func setState(_ state: HubConnectionState) {
        currentState = state
        for observer in stateObservers.values { observer.yield(state) }
    }

    private func log(_ level: HubLogLevel, _ message: @autoclosure () -> String) {
        guard let logger = configuration.logger, level >= configuration.logLevel else { return }
        logger(level, message())
    }

    // MARK: Messages

    /// Handles one message of the hub; returns the events to hand to subscriptions (the caller waits for room).
    private func handle(_ text: String) -> [(HubSubscriptionBuffer, HubSubscriptionElement)] {
        lastMessageAt = .now
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8), options: []),
              let message = object as? [String: Any], let type = message["type"] as? String else { return [] }
        switch type {
        case "authenticated":
            guard message["id"] as? String == "auth" else { return [] }
            authenticated = true
            connectedAt = .now
            log(.info, "connected")
            setState(.connected)
            let channels = subscribers.keys.sorted().map(\.name)
            if !channels.isEmpty { sendSubscribe(channels) }
        case "subscribed":
            if let id = message["id"] as? String { subscribeRequests[id] = nil }
            for (channel, value) in message["positions"] as? [String: Any] ?? [:] {
                let key = ChannelKey(channel)
                guard let p = value as? [String: Any], subscribers[key] != nil else { continue }
                pending.remove(key)
                positions[key] = Position(epoch: p["epoch"] as? String ?? "", seq: Self.uint(p["seq"]),
                                          broadcastSeq: Self.uint(p["broadcastSeq"]))
                if p["recovered"] as? Bool == false {
                    let reason = p["reason"] as? String ?? ""
                    log(.info, "\(channel): the hub could not replay what was missed (\(reason))")
                    for buffer in subscribers[key]?.values ?? [:].values {
                        buffer.sendNow(.recoveryFailed(channel: channel, reason: reason))
                    }
                }
            }
        case "token_expiring":
            Task { await self.refresh() }
        case "error":
            let error = message["error"] as? [String: Any] ?? [:]
            let id = message["id"] as? String
            if let id, let channels = subscribeRequests.removeValue(forKey: id) {
                subscribeRefused(channels, error: error)
            } else {
                let hubError = HubError(code: error["code"] as? String ?? "ERROR", message: error["message"] as? String ?? "", requestID: id)
                log(.warning, "the hub answered \(hubError.code): \(hubError.message)")
                for observer in errorObservers.values { observer.yield(hubError) }
            }
        case "unsubscribed", "pong":
            return []
        default:
            guard let channel = message["channel"] as? String, let seq = (message["seq"] as? NSNumber)?.uint64Value else { return [] }
            let key = ChannelKey(channel)
            let broadcast = message["broadcast"] as? Bool ?? false
            guard let buffers = subscribers[key], !buffers.isEmpty else { return [] }
            if var p = positions[key] {
                let last = broadcast ? p.broadcastSeq : p.seq
                if seq <= last { return [] }  // a duplicate
                if seq != last + 1 {
                    // A gap, or a restarted stream: resubscribe; the hub replays what is missing or says refetch.
                    if !pending.contains(key) {
                        log(.info, "\(channel): a gap after \(last): resubscribing")
                        sendSubscribe([channel])
                    }
                    return []
                }
                if broadcast { p.broadcastSeq = seq } else { p.seq = seq }
                positions[key] = p
            }
            let bytes = Array(text.utf8)
            let data = JSONMember.range(of: "data", in: bytes).map { Data(bytes[$0]) } ?? Data("null".utf8)
            let event = HubSubscriptionElement.event(HubEvent(type: type, channel: channel, seq: seq, broadcast: broadcast, data: data))
            return buffers.values.map { ($0, event) }
        }
        return []
    }

    private func refresh() async {
        let run = generation
        let token: String
        do {
            log(.debug, "asking for a token (expiring)")
            token = try await tokenProvider(.expiring)
        } catch {
            guard run == generation else { return }
            let open = transport
            loggedOut(error)
            if let open { await open.close(code: 1000, reason: "no token") }
            return
        }
        guard run == generation else { return }
        send(["type": "auth", "token": token, "id": "refresh"])
    }

    private func sendSubscribe(_ channels: [String]) {
        var since: [String: Any] = [:]
        for channel in channels {
            let key = ChannelKey(channel)
            pending.insert(key)
            if let p = positions[key] { since[channel] = ["epoch": p.epoch, "seq": p.seq, "broadcastSeq": p.broadcastSeq] }
        }
        let id = "s\(nextID)"
        var message: [String: Any] = ["type": "subscribe", "channels": channels, "id": id]
        nextID += 1
        subscribeRequests[id] = channels
        if !since.isEmpty { message["since"] = since }
        send(message)
    }

    /// The hub refused a subscribe: channels it does not serve end their subscriptions with `.refused`, and the
    /// others are asked again on their own, so one bad name never takes the valid channels down with it. A rate
    /// limit is waited out; any other refusal ends the request's channels.
    private func subscribeRefused(_ channels: [String], error: [String: Any]) {
        for channel in channels { pending.remove(ChannelKey(channel)) }
        let code = error["code"] as? String ?? "ERROR"
        let message = error["message"] as? String ?? ""
        let details = error["details"] as? [String: Any]
        if code == "RATE_LIMITED" {
            let seconds = (details?["retryAfter"] as? NSNumber)?.doubleValue ?? 1
            let run = generation
            log(.info, "subscribe rate limited: again in \(seconds) s")
            Task {
                try? await Task.sleep(for: .milliseconds(Int(max(0.1, seconds) * 1000)))
                self.resubscribe(channels, run: run)
            }
            return
        }
        let refused = Set((details?["unknownChannels"] as? [String] ?? channels).map(ChannelKey.init))
        for channel in channels where refused.contains(ChannelKey(channel)) {
            let key = ChannelKey(channel)
            let buffers = subscribers[key]?.values.map { $0 } ?? []
            subscribers[key] = nil
            positions[key] = nil
            log(.warning, "\(channel): refused by the hub (\(code): \(message))")
            for buffer in buffers {
                buffer.sendNow(.refused(channel: channel, code: code, message: message))
                buffer.finish()
            }
        }
        let rest = channels.filter { !refused.contains(ChannelKey($0)) && subscribers[ChannelKey($0)] != nil }
        if !rest.isEmpty && authenticated { sendSubscribe(rest) }
    }

    private func resubscribe(_ channels: [String], run: Int) {
        guard run == generation, authenticated else { return }
        let rest = channels.filter { subscribers[ChannelKey($0)] != nil && !pending.contains(ChannelKey($0)) }
        if !rest.isEmpty { sendSubscribe(rest) }
    }

    private func send(_ message: [String: Any]) {
        guard let transport else { return }
        let text = Self.json(message)
        let previous = sendChain
        sendChain = Task {
            await previous?.value
            try? await transport.send(text: text)
        }
    }

    private static func json(_ object: [String: Any]) -> String {
        (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    private static func uint(_ value: Any?) -> UInt64 { (value as? NSNumber)?.uint64Value ?? 0 }
}

/// A transport that can be cut at once (no close handshake): a dead connection does not answer a close frame.
protocol POSIXTransportCancellable { func cancelNow() }

#if canImport(Glibc)
extension POSIXTransport: POSIXTransportCancellable {
    func cancelNow() { abort() }
}
#endif

#if canImport(Network)
import Network

extension HubClient {
    /// Calls `networkChanged()` whenever the device's network path changes (an `NWPathMonitor` on its own queue);
    /// cancel the returned monitor to stop.
    public func monitorNetwork() -> NWPathMonitor {
        let monitor = NWPathMonitor()
        // The first update is the current path: a check then costs one ping.
        monitor.pathUpdateHandler = { [weak self] path in
            guard path.status == .satisfied else { return }
            Task { await self?.networkChanged() }
        }
        monitor.start(queue: DispatchQueue(label: "HubClient.network"))
        return monitor
    }
}
#endif
