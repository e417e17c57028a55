import Foundation

/// An event as the hub sends it: `type` and `data` are what the backend published.
public struct HubEvent: Sendable, Equatable {
    public let type: String
    public let channel: String
    /// The event's number in its stream (the account's, or the channel's broadcasts when `broadcast`).
    public let seq: UInt64
    public let broadcast: Bool
    /// `data` exactly as the backend published it: the bytes of the event's `data` member, never parsed and written
    /// again (key order, number spelling, escapes and Unicode forms are the backend's).
    public let data: Data

    /// `data` decoded as a `Decodable` model (the seeds' `Wallet`, `UserProfile`, …).
    public func decode<T: Decodable>(_ type: T.Type = T.self, using decoder: JSONDecoder = JSONDecoder()) throws -> T {
        try decoder.decode(T.self, from: data)
    }
}

/// What a subscription yields: events, and the hub's word that it could not replay what was missed.
public enum HubSubscriptionElement: Sendable, Equatable {
    case event(HubEvent)
    /// Refetch this channel's state through the REST API (`reason`: `epoch_changed`, `too_old`, `too_many`); events
    /// go on from the current position.
    case recoveryFailed(channel: String, reason: String)
    /// The hub refused to subscribe this channel (`code`: `VALIDATION_ERROR` for a channel it does not serve, …).
    /// The subscription ends after this element; the other channels are not affected.
    case refused(channel: String, code: String, message: String)
}

public enum HubConnectionState: Sendable, Equatable {
    case connecting
    case connected
    /// `code`: the WebSocket close code (4001 token expired, 4003 token refused, 1001 the hub restarts, 1006 the
    /// network), or 0 when the client stopped on its own (`stop()`, or the token provider failed).
    case disconnected(code: UInt16, reason: String, willRetry: Bool)
}

/// Why the client asks the app for a token.
public enum TokenRequestReason: Sendable, Equatable {
    /// A new connection.
    case connect
    /// The hub sent `token_expiring`: the token goes in-band, the connection stays.
    case expiring
    /// The hub closed with 4001: the token expired; the client reconnects with the new one.
    case expired
}

/// Options with sensible defaults.
public struct HubClientConfiguration: Sendable {
    /// Shown in `hubctl connections`.
    public var platform = "iOS"
    public var appVersion: String?
    /// Reconnect attempt n waits a random time in [0, min(maxDelay, baseDelay × 2ⁿ)] (full jitter); n resets after a
    /// connection that lived a minute.
    public var baseDelay: Duration = .milliseconds(500)
    public var maxDelay: Duration = .seconds(30)
    /// App-level ping period; no message at all for two periods means the connection is dead.
    public var pingInterval: Duration = .seconds(25)
    public init() {}
}

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
public actor HubClient {
    public typealias TokenProvider = @Sendable (TokenRequestReason) async throws -> String

    public nonisolated let url: URL
    public nonisolated let configuration: HubClientConfiguration
    /// Connection state changes, for one consumer.
    public nonisolated let state: AsyncStream<HubConnectionState>
    private let stateContinuation: AsyncStream<HubConnectionState>.Continuation
    private let tokenProvider: TokenProvider
    private let makeTransport: @Sendable () -> any HubTransport

    private struct Position { var epoch: String; var seq: UInt64; var broadcastSeq: UInt64 }
    private var subscribers: [String: [UUID: AsyncStream<HubSubscriptionElement>.Continuation]] = [:]
    private var positions: [String: Position] = [:]
    private var pending: Set<String> = []
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
    /// Which run of the connection loop owns the client: `start()` and `stop()` each begin a new one, and a loop,
    /// token request or callback of an older one changes nothing (an app's background/foreground `stop()`/`start()`
    /// must never let a late answer to the old session close or reset the new one).
    private var generation = 0
    /// The channels of each subscribe in flight, by its `id`: a refusal names the request, not the channels.
    private var subscribeRequests: [String: [String]] = [:]

    /// - Parameters:
    ///   - tokenProvider: returns a current access token (the app's REST refresh, the seeds' `TokenRefreshManager`).
    ///     Throwing stops the client (state `disconnected(willRetry: false)`): the refresh token expired, log out.
    ///   - transport: a new transport per connection; by default `POSIXTransport` on Linux, `URLSessionTransport`
    ///     elsewhere.
    public init(url: URL, configuration: HubClientConfiguration = HubClientConfiguration(),
                transport: @escaping @Sendable () -> any HubTransport = HubClient.defaultTransport,
                tokenProvider: @escaping TokenProvider) {
        self.url = url
        self.configuration = configuration
        self.tokenProvider = tokenProvider
        self.makeTransport = transport
        (state, stateContinuation) = AsyncStream.makeStream(of: HubConnectionState.self, bufferingPolicy: .bufferingNewest(64))
    }

    @Sendable public static func defaultTransport() -> any HubTransport {
        #if canImport(Glibc)
        POSIXTransport()
        #else
        URLSessionTransport()
        #endif
    }

    /// Connects, and keeps connecting until `stop()`.
    public func start() {
        guard stopped else { return }
        stopped = false
        attempt = 0
        generation += 1
        let run = generation
        running = Task { await self.run(run) }
    }

    /// Closes (1000) and stops reconnecting; returns once the connection is closed (the close handshake, or at most
    /// about 2 s for a hub that does not answer, then the socket is cut). Subscriptions stay registered for a later
    /// `start()`. Whatever the old run was waiting for (a token, a connect) changes nothing when it comes back.
    public func stop() async {
        stopped = true
        generation += 1
        running?.cancel()
        running = nil
        authenticated = false
        pending.removeAll()
        subscribeRequests.removeAll()
        if let transport {
            self.transport = nil
            await transport.close(code: 1000, reason: "client stopped")
        }
        setState(.disconnected(code: 0, reason: "stopped", willRetry: false))
    }

    /// Events of `channels` for this connection's account, each once, in `seq` order per stream, across reconnects.
    /// Ending the iteration (or cancelling its task) unsubscribes.
    public func subscribe(_ channels: [String]) -> AsyncStream<HubSubscriptionElement> {
        let id = UUID()
        let (stream, continuation) = AsyncStream.makeStream(of: HubSubscriptionElement.self, bufferingPolicy: .unbounded)
        var added: [String] = []
        for channel in Set(channels) {
            if subscribers[channel] == nil { added.append(channel) }
            subscribers[channel, default: [:]][id] = continuation
        }
        continuation.onTermination = { [weak self] _ in
            Task { await self?.unsubscribe(id, channels) }
        }
        if authenticated && !added.isEmpty { sendSubscribe(added.sorted()) }
        return stream
    }

    /// The position kept for `channel`: (epoch, seq, broadcastSeq), nil before its first `subscribed`.
    public func position(of channel: String) -> (epoch: String, seq: UInt64, broadcastSeq: UInt64)? {
        positions[channel].map { ($0.epoch, $0.seq, $0.broadcastSeq) }
    }

    private func unsubscribe(_ id: UUID, _ channels: [String]) {
        var gone: [String] = []
        for channel in Set(channels) {
            subscribers[channel]?[id] = nil
            if subscribers[channel]?.isEmpty == true {
                subscribers[channel] = nil
                positions[channel] = nil
                gone.append(channel)
            }
        }
        if authenticated && !gone.isEmpty { send(["type": "unsubscribe", "channels": gone.sorted()]) }
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
            var code: UInt16 = 1006
            var reason = ""
            var worked = false
            do {
                try await transport.connect(url: url, protocols: ["hub.v1"])
                guard run == generation else { return await transport.close(code: 1000, reason: "client stopped") }
                let token: String
                do {
                    token = try await tokenProvider(lastCloseCode == 4001 ? .expired : .connect)
                } catch {
                    await transport.close(code: 1000, reason: "no token")
                    guard run == generation else { return }
                    return giveUp("no token: \(error)")
                }
                guard run == generation else { return await transport.close(code: 1000, reason: "client stopped") }
                var auth: [String: Any] = ["type": "auth", "token": token, "platform": configuration.platform, "id": "auth"]
                if let appVersion = configuration.appVersion { auth["appVersion"] = appVersion }
                try await transport.send(text: Self.json(auth))
                lastMessageAt = .now
                let pinger = Task { await self.keepAlive(transport) }
                receiving: while true {
                    let message = await transport.receive()
                    guard run == generation else {
                        pinger.cancel()
                        return await transport.close(code: 1000, reason: "client stopped")
                    }
                    switch message {
                    case .text(let text):
                        handle(text)
                        if authenticated { worked = true }
                    case .closed(let c, let r):
                        code = c
                        reason = r
                        break receiving
                    }
                }
                pinger.cancel()
            } catch let error as HubTransportError where error.isConfigurationError {
                guard run == generation else { return }
                // A URL this transport cannot serve (wss:// without TLS, no host): no retry can help.
                if self.transport as AnyObject? === transport as AnyObject { self.transport = nil }
                return giveUp("configuration: \(error)")
            } catch {
                reason = "\(error)"
            }
            guard run == generation else { return }
            if self.transport as AnyObject? === transport as AnyObject { self.transport = nil }
            authenticated = false
            pending.removeAll()
            subscribeRequests.removeAll()
            lastCloseCode = code
            guard !stopped else { return }
            if code == 4003 {
                // The hub refuses this kind of token: another connection with it would fail the same way.
                stopped = true
                return setState(.disconnected(code: code, reason: reason, willRetry: false))
            }
            if let connectedAt, ContinuousClock.now - connectedAt > .seconds(60) { attempt = 0 }
            connectedAt = nil
            // A token that expired on a connection that worked: refresh and reconnect at once, once. A 4001 right at
            // connect (a cached token, a clock behind the hub's) waits like any failure: no tight loop.
            let delay: Duration = code == 4001 && worked ? .zero : backoff()
            attempt += 1
            setState(.disconnected(code: code, reason: reason, willRetry: true))
            try? await Task.sleep(for: delay)
        }
    }

    private func backoff() -> Duration {
        let cap = min(configuration.maxDelay, configuration.baseDelay * (1 << min(attempt, 20)))
        let seconds = Double(cap.components.seconds) + Double(cap.components.attoseconds) / 1e18
        return .milliseconds(Int((Double.random(in: 0...1) * seconds * 1000).rounded()))
    }

    private func giveUp(_ reason: String) {
        stopped = true
        transport = nil
        setState(.disconnected(code: 0, reason: reason, willRetry: false))
    }

    /// App-level pings; a connection that hears nothing for two intervals is cut (the loop then reconnects).
    private func keepAlive(_ transport: any HubTransport) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: configuration.pingInterval)
            guard !Task.isCancelled, self.transport as AnyObject? === transport as AnyObject else { return }
            if ContinuousClock.now - lastMessageAt > configuration.pingInterval * 2 {
                await transport.close(code: 4002, reason: "no pong")
                if let posix = transport as? any POSIXTransportCancellable { posix.cancelNow() }
                return
            }
            send(["type": "ping"])
        }
    }

    private func setState(_ state: HubConnectionState) {
        stateContinuation.yield(state)
    }

    // MARK: Messages

    private func handle(_ text: String) {
        lastMessageAt = .now
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8), options: []),
              let message = object as? [String: Any], let type = message["type"] as? String else { return }
        switch type {
        case "authenticated":
            guard message["id"] as? String == "auth" else { return }
            authenticated = true
            connectedAt = .now
            setState(.connected)
            let channels = subscribers.keys.sorted()
            if !channels.isEmpty { sendSubscribe(channels) }
        case "subscribed":
            if let id = message["id"] as? String { subscribeRequests[id] = nil }
            for (channel, value) in message["positions"] as? [String: Any] ?? [:] {
                guard let p = value as? [String: Any], subscribers[channel] != nil else { continue }
                pending.remove(channel)
                positions[channel] = Position(epoch: p["epoch"] as? String ?? "", seq: Self.uint(p["seq"]),
                                              broadcastSeq: Self.uint(p["broadcastSeq"]))
                if p["recovered"] as? Bool == false {
                    yield(.recoveryFailed(channel: channel, reason: p["reason"] as? String ?? ""), to: channel)
                }
            }
        case "token_expiring":
            Task { await self.refresh() }
        case "error":
            guard let id = message["id"] as? String, let channels = subscribeRequests.removeValue(forKey: id) else { return }
            subscribeRefused(channels, error: message["error"] as? [String: Any] ?? [:])
        case "unsubscribed", "pong":
            return
        default:
            guard let channel = message["channel"] as? String, let seq = (message["seq"] as? NSNumber)?.uint64Value else { return }
            let broadcast = message["broadcast"] as? Bool ?? false
            guard subscribers[channel] != nil else { return }
            if var p = positions[channel] {
                let last = broadcast ? p.broadcastSeq : p.seq
                if seq <= last { return }  // a duplicate
                if seq != last + 1 {
                    // A gap, or a restarted stream: resubscribe; the hub replays what is missing or says refetch.
                    if !pending.contains(channel) { sendSubscribe([channel]) }
                    return
                }
                if broadcast { p.broadcastSeq = seq } else { p.seq = seq }
                positions[channel] = p
            }
            let bytes = Array(text.utf8)
            let data = JSONMember.range(of: "data", in: bytes).map { Data(bytes[$0]) } ?? Data("null".utf8)
            let event = HubEvent(type: type, channel: channel, seq: seq, broadcast: broadcast, data: data)
            yield(.event(event), to: channel)
        }
    }

    private func yield(_ element: HubSubscriptionElement, to channel: String) {
        for continuation in subscribers[channel]?.values ?? [:].values { continuation.yield(element) }
    }

    private func refresh() async {
        let run = generation
        let token: String
        do {
            token = try await tokenProvider(.expiring)
        } catch {
            guard run == generation else { return }
            if let transport { await transport.close(code: 1000, reason: "no token") }
            return giveUp("no token: \(error)")
        }
        guard run == generation else { return }
        send(["type": "auth", "token": token, "id": "refresh"])
    }

    private func sendSubscribe(_ channels: [String]) {
        var since: [String: Any] = [:]
        for channel in channels {
            pending.insert(channel)
            if let p = positions[channel] { since[channel] = ["epoch": p.epoch, "seq": p.seq, "broadcastSeq": p.broadcastSeq] }
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
        for channel in channels { pending.remove(channel) }
        let code = error["code"] as? String ?? "ERROR"
        let message = error["message"] as? String ?? ""
        let details = error["details"] as? [String: Any]
        if code == "RATE_LIMITED" {
            let seconds = (details?["retryAfter"] as? NSNumber)?.doubleValue ?? 1
            let run = generation
            Task {
                try? await Task.sleep(for: .milliseconds(Int(max(0.1, seconds) * 1000)))
                self.resubscribe(channels, run: run)
            }
            return
        }
        // By bytes, as the hub names them (a `Set<String>` would take "\u{212A}x" for "Kx").
        let refused = Set((details?["unknownChannels"] as? [String] ?? channels).map { Array($0.utf8) })
        for channel in channels where refused.contains(Array(channel.utf8)) {
            let continuations = subscribers[channel]?.values.map { $0 } ?? []
            subscribers[channel] = nil
            positions[channel] = nil
            for continuation in continuations {
                continuation.yield(.refused(channel: channel, code: code, message: message))
                continuation.finish()
            }
        }
        let rest = channels.filter { !refused.contains(Array($0.utf8)) && subscribers[$0] != nil }
        if !rest.isEmpty && authenticated { sendSubscribe(rest) }
    }

    private func resubscribe(_ channels: [String], run: Int) {
        guard run == generation, authenticated else { return }
        let rest = channels.filter { subscribers[$0] != nil && !pending.contains($0) }
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
