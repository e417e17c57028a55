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
    case disconnected(HubDisconnect)

    /// The reason, when disconnected.
    public var disconnect: HubDisconnect? {
        if case .disconnected(let d) = self { return d }
        return nil
    }
}

/// Why the connection is down, and whether the client is trying again.
public struct HubDisconnect: Sendable, Equatable, CustomStringConvertible {
    public var reason: HubDisconnectReason
    /// The WebSocket close code (4001, 1001, …; 1006: the connection ended without one), or the HTTP status of a
    /// refused upgrade (401, 429, 503), or 0 when there was neither (stopped, no token, a bad URL).
    public var code: UInt16
    /// The hub's close reason, or what failed, in words (for logs; match on `reason`).
    public var message: String
    public var willRetry: Bool
    /// When the hub said how long to wait (HTTP `Retry-After`), the next attempt waits at least that long.
    public var retryAfter: Duration?

    public init(_ reason: HubDisconnectReason, code: UInt16 = 0, message: String = "", willRetry: Bool, retryAfter: Duration? = nil) {
        self.reason = reason
        self.code = code
        self.message = message
        self.willRetry = willRetry
        self.retryAfter = retryAfter
    }

    public var description: String {
        "\(reason.rawValue)\(code == 0 ? "" : " \(code)")\(message.isEmpty ? "" : " (\(message))"), \(willRetry ? "retrying" : "not retrying")"
    }
}

/// The causes an app reacts to differently, kept apart.
public enum HubDisconnectReason: String, Sendable, Equatable, CaseIterable {
    /// `start()` was never called.
    case notStarted
    /// The app called `stop()`.
    case stopped
    /// The app called `suspend()`: subscriptions and positions are kept for `resume()`.
    case suspended
    /// The token provider threw: the session is over (log in again, then `start()`).
    case loggedOut
    /// 4001: the token expired. The client asks for a fresh one and reconnects.
    case tokenExpired
    /// 4003, or HTTP 401/403: the hub does not accept this kind of token. Not retried.
    case tokenRefused
    /// The hub went silent (no pong within two ping intervals, or none within `networkProbeTimeout` after
    /// `networkChanged()`), or the hub closed with 4002.
    case noPong
    /// 1001 or 1012: the hub restarts, or a stream's numbering restarted; reconnected with `since`.
    case serverRestart
    /// 4008: the app read too slowly and the hub's queue for it overflowed; reconnected with `since`.
    case slowConsumer
    /// 4029 or HTTP 429: too many connections for this account.
    case rateLimited
    /// HTTP 503: the hub is at its connection limit.
    case serverBusy
    /// The connection failed or dropped (1006), or did not open and authenticate within `connectTimeout`.
    case network
    /// A URL or setup this transport cannot serve: not retried.
    case configuration
    /// Any other close (1000 by an operator, 1008, 1011, …).
    case closed
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

/// An `error` reply of the hub that is not a subscribe's refusal (those end their subscriptions with `.refused`).
public struct HubError: Error, Sendable, Equatable {
    /// The hub's code (`VALIDATION_ERROR`, `UNAUTHORIZED`, `RATE_LIMITED`, …: docs/PROTOCOL.md).
    public let code: String
    public let message: String
    /// The `id` of the request it answers (`refresh` for an in-band token refresh), if any.
    public let requestID: String?
}

/// How much the client tells the app's log.
public enum HubLogLevel: Int, Sendable, Comparable {
    case debug, info, warning, error
    public static func < (a: HubLogLevel, b: HubLogLevel) -> Bool { a.rawValue < b.rawValue }
}

/// A resume position per channel, to keep across app launches (`Codable`): after iOS ended the app in the
/// background, `seed(_:)` them before `subscribe` and the hub replays what was missed instead of the app refetching.
public struct HubPositions: Codable, Sendable, Equatable {
    public struct Entry: Codable, Sendable, Equatable {
        public var channel: String
        public var epoch: String
        public var seq: UInt64
        public var broadcastSeq: UInt64

        public init(channel: String, epoch: String, seq: UInt64, broadcastSeq: UInt64) {
            self.channel = channel
            self.epoch = epoch
            self.seq = seq
            self.broadcastSeq = broadcastSeq
        }
    }

    /// A list, not a dictionary keyed by name: two channel names that differ only in Unicode form stay two.
    public var entries: [Entry]

    public init(entries: [Entry] = []) { self.entries = entries }
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
    /// From the start of a connection attempt to the hub's `authenticated`: longer, and the attempt counts as failed.
    public var connectTimeout: Duration = .seconds(10)
    /// After `networkChanged()`, how long the open connection has to answer a ping before it is replaced.
    public var networkProbeTimeout: Duration = .seconds(3)
    /// Elements a subscription holds for a consumer that has not taken them. When one is full, the client stops
    /// reading from the hub until the consumer catches up: memory stays bounded, and if the app stays behind, the
    /// hub closes with 4008 and the client resumes from its position (`since`) when it reconnects.
    public var subscriptionBufferLimit = 1_000
    /// Receives what the client does (connects, disconnects and why, token requests, refusals), at `logLevel` and
    /// above. Never a token.
    public var logger: (@Sendable (HubLogLevel, String) -> Void)?
    public var logLevel: HubLogLevel = .info
    public init() {}
}

/// A channel name as a key: equal and hashed by its UTF-8 bytes, as the hub compares names (`String` equality would
/// take "\u{212B}" for "\u{C5}").
struct ChannelKey: Hashable, Sendable, Comparable {
    let name: String
    init(_ name: String) { self.name = name }
    static func == (a: ChannelKey, b: ChannelKey) -> Bool { a.name.utf8.elementsEqual(b.name.utf8) }
    static func < (a: ChannelKey, b: ChannelKey) -> Bool { a.name.utf8.lexicographicallyPrecedes(b.name.utf8) }
    func hash(into hasher: inout Hasher) {
        for byte in name.utf8 { hasher.combine(byte) }
    }
}
