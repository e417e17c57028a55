import Glibc
import HubEngine
import HubRouting

/// Why a Redis command or connection failed.
public struct RedisError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable, Equatable {
        /// The endpoint URL does not parse.
        case badURL
        /// Not connected (connecting, or waiting to reconnect): the command was not sent.
        case unavailable
        /// The connection was lost after the command was sent: it may or may not have run.
        case connectionLost
        /// Redis answered with an error reply (the message is Redis's).
        case server
        /// The connection handshake (HELLO, AUTH, SELECT) was refused.
        case handshake
        /// Redis sent bytes that are not RESP, or a reply nobody asked for.
        case protocolError
        /// More unsent bytes than the connection may queue: Redis reads too slowly.
        case overloaded
        /// `close()` was called.
        case closed
        /// A script failed part way (one event of a publish batch): what it did before the error stays done.
        case scriptFailed
    }

    public let kind: Kind
    public let message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { "\(kind.rawValue): \(message)" }
}

/// Reconnect delays: exponential from `initial`, doubled per failed attempt up to `maximum`, each one drawn
/// uniformly from its upper half (jitter, so that many hubs that lost Redis together do not return together).
public struct RedisBackoff: Sendable, Equatable {
    public var initial: Duration
    public var maximum: Duration

    public init(initial: Duration = .milliseconds(100), maximum: Duration = .seconds(5)) {
        self.initial = initial
        self.maximum = max(initial, maximum)
    }

    /// The delay before attempt `attempt` (1 = the first retry), before jitter.
    public func ceiling(attempt: Int) -> Duration {
        var d = initial
        var n = 1
        while n < attempt, d < maximum {
            d = min(maximum, d * 2)
            n += 1
        }
        return d
    }

    public func delay<G: RandomNumberGenerator>(attempt: Int, using generator: inout G) -> Duration {
        let ceiling = ceiling(attempt: attempt)
        let nanos = max(1, ceiling.engineNanos)
        let drawn = UInt64.random(in: (nanos / 2)...nanos, using: &generator)
        return .nanoseconds(Int64(clamping: drawn))
    }
}

/// What the cluster broker needs of its Redis side: one connection (`RedisConnection`, a single Redis) or a set of
/// them routed by slot (`RedisClusterClient`, a Redis Cluster). Everything runs on the loop thread.
public protocol RedisLink: AnyObject {
    var state: RedisConnection.State { get }
    /// Commands may be sent: the connection is ready; for a cluster, the slot map is known and a master is connected
    /// (each command then fails or not by its own slot's master).
    var canSend: Bool { get }
    /// Why the link last went down or failed to come up (nil once ready again).
    var lastError: RedisError? { get }
    /// After each time the link becomes ready (connected, handshake done; for a cluster: every master's connection).
    var onReady: () -> Void { get set }
    /// Each push message (pub/sub messages and subscription confirmations).
    var onPush: (RESPValue) -> Void { get set }
    /// Each time the link goes down or an attempt fails.
    var onDown: (RedisError) -> Void { get set }
    func start()
    func close()
    /// Sends one command; `reply` runs on the loop thread with its reply (an error reply is `.server`).
    func send(_ arguments: [String], reply: @escaping RedisConnection.Reply)
    /// A SUBSCRIBE-family command with explicit channels; `done` once all are confirmed, or with the first error.
    func subscribe(_ arguments: [String], done: @escaping (RedisError?) -> Void)
    /// Closes a connection that owes replies and has heard nothing for `timeout` (it reconnects); whether it did.
    @discardableResult func closeIfStalled(after timeout: Duration) -> Bool
}

extension RedisLink {
    public func subscribe(_ arguments: [String]) { subscribe(arguments, done: { _ in }) }
}

/// One connection to Redis on an event loop, kept up for as long as it is wanted: non-blocking connect, a
/// handshake (`HELLO 3` with `AUTH` when the endpoint has a password, `SELECT` for a database other than 0),
/// pipelined commands whose replies are matched in order, RESP3 push messages (pub/sub) handed to `onPush`, and
/// reconnection with backoff whenever the connection fails or is lost.
///
/// Everything runs on `loop`'s thread (create, call and receive there). A command is written only while the
/// connection is ready; otherwise its reply is `unavailable` at once (callers such as a publish path fail fast and
/// let their own client retry). Commands in flight when the connection drops get `connectionLost`: they may have
/// run. Subscriptions are the caller's to restore: `onReady` runs after every (re)connection, before any queued
/// work, which is where to `SUBSCRIBE` again.
///
/// SUBSCRIBE-family commands go through `subscribe`: under RESP3 their confirmations arrive as push messages (one
/// per channel), not as a reply, while a refusal is an ordinary error reply.
public final class RedisConnection: ConnectionHandler, RedisLink {
    public enum State: Sendable, Equatable {
        /// Connecting, or connected and in the handshake.
        case connecting
        case ready
        /// Down; the next attempt is scheduled.
        case waiting
        case closed
    }

    public typealias Reply = (Result<RESPValue, RedisError>) -> Void

    public let endpoint: RedisEndpoint
    public let backoff: RedisBackoff
    public private(set) var state: State = .waiting
    /// Why the connection last went down or failed to come up (nil once ready again).
    public private(set) var lastError: RedisError? = nil
    public var canSend: Bool { state == .ready }
    /// The `mode` the server's HELLO reply gave (`standalone`, `cluster`, `sentinel`), once connected.
    public private(set) var serverMode: String? = nil
    /// Which Redis process answers, and whether it keeps what it acknowledged across a crash: `RUNID/always` when
    /// the append-only file is on with `appendfsync always`, `RUNID/lossy` otherwise (RDB, `everysec`, none, or
    /// settings it would not tell). Read at each connect (INFO, CONFIG GET). A restarted Redis has a new run id.
    public var serverIdentity: String { bindsNumberingToProcess ? identity : "cluster/always" }
    private var identity = "unknown/lossy"
    /// Whether numbering is bound to this Redis process (`serverIdentity`). Not for a Redis Cluster's masters: a slot
    /// that migrates, or a replica promoted in a failover, carries its streams to another process legitimately, and
    /// the run id cannot tell that from a rewind (docs/OPERATIONS.md, "Cluster").
    public var bindsNumberingToProcess = true
    /// An argument that `send` replaces with `serverIdentity` of the connection that sends it (after a Redis
    /// Cluster's routing, so it names the master that runs the command).
    public static let serverIdentityArgument = "\u{1}hub:redis-identity\u{1}"

    /// After each successful handshake.
    public var onReady: () -> Void = {}
    /// Each push message (pub/sub messages and subscription confirmations).
    public var onPush: (RESPValue) -> Void = { _ in }
    /// Each time the connection goes down or an attempt fails (before the retry is scheduled).
    public var onDown: (RedisError) -> Void = { _ in }

    private let loop: EventLoop
    private let connectTimeout: Duration
    private let maxQueuedBytes: Int
    private var connection: Connection? = nil
    private var decoder = RESPDecoder()
    /// Replies owed, in the order their commands were written (the handshake's first).
    private var pending = Ring<Owed>()
    /// When the connection last received anything, or (if nothing was owed) last wrote a command.
    private var lastProgress: UInt64 = 0

    /// What Redis owes for a command written: a reply, or (SUBSCRIBE family) one confirmation push per channel.
    private enum Owed {
        case reply(Reply)
        /// How many confirmations are still due, of which kind (`ssubscribe` for SSUBSCRIBE…), and who waits.
        case confirmations(Int, String, (RedisError?) -> Void)

        func fail(_ error: RedisError) {
            switch self {
            case .reply(let reply): reply(.failure(error))
            case .confirmations(_, _, let done): done(error)
            }
        }
    }
    private var attempt = 0
    /// Why the current attempt or connection is being closed by us (timeout, refused handshake, bad bytes).
    private var closingBecause: RedisError? = nil
    private var retryTimer = TimerHandle.none
    private var connectTimer = TimerHandle.none
    private var scratch: [UInt8] = []
    /// The endpoint's address, parsed once.
    private let resolved: Result<SocketAddress, RedisError>
    private var random = SystemRandomNumberGenerator()

    public init(endpoint: RedisEndpoint, loop: EventLoop, backoff: RedisBackoff = RedisBackoff(),
                connectTimeout: Duration = .seconds(2), maxQueuedBytes: Int = 64 << 20) {
        self.endpoint = endpoint
        self.loop = loop
        self.backoff = backoff
        self.connectTimeout = connectTimeout
        self.maxQueuedBytes = maxQueuedBytes
        resolved = Result { () throws(RedisError) in try endpoint.socketAddress() }
    }

    /// Starts connecting (on the loop thread).
    public func start() {
        loop.assertInLoop()
        guard state == .waiting, connection == nil else { return }
        attemptConnect()
    }

    /// Closes for good: pending commands get `closed`, no reconnect.
    public func close() {
        loop.assertInLoop()
        guard state != .closed else { return }
        state = .closed
        _ = loop.cancel(retryTimer)
        _ = loop.cancel(connectTimer)
        let c = connection
        connection = nil
        c?.close(.abort)
        failPending(RedisError(.closed, "the Redis connection was closed"))
    }

    /// Sends one command; `reply` runs on the loop thread with its reply (an error reply is `.server`).
    public func send(_ arguments: [String], reply: @escaping Reply) {
        scratch.removeAll(keepingCapacity: true)
        if arguments.contains(Self.serverIdentityArgument) {
            RESPEncoder.appendCommand(arguments.map { $0 == Self.serverIdentityArgument ? serverIdentity : $0 }, to: &scratch)
        } else {
            RESPEncoder.appendCommand(arguments, to: &scratch)
        }
        sendEncoded(scratch, reply: reply)
    }

    /// Sends one already-encoded command (`RESPEncoder`); `reply` as for `send`.
    public func sendEncoded(_ command: [UInt8], reply: @escaping Reply) {
        loop.assertInLoop()
        guard state == .ready, let connection else {
            reply(.failure(lastError.map { RedisError(.unavailable, "Redis is not connected (\($0.message))") }
                ?? RedisError(.unavailable, "Redis is not connected")))
            return
        }
        switch command.withUnsafeBytes({ connection.write(copying: $0) }) {
        case .accepted:
            if pending.isEmpty { lastProgress = monotonicNanos() }
            pending.append(.reply(reply))
        case .overCap:
            reply(.failure(RedisError(.overloaded, "over \(maxQueuedBytes) bytes queued for Redis")))
        case .closed:
            reply(.failure(RedisError(.unavailable, "the Redis connection is closing")))
        }
    }

    /// Sends a SUBSCRIBE-family command with its channels (`["SUBSCRIBE", "a", "b"]`, also SSUBSCRIBE, PSUBSCRIBE and
    /// their UNSUBSCRIBE forms, always with explicit channels). `done` runs once: with nil when every channel is
    /// confirmed, or with the error (Redis refused it, the connection is down or was lost). Messages go to `onPush`.
    public func subscribe(_ arguments: [String], done: @escaping (RedisError?) -> Void) {
        loop.assertInLoop()
        let channels = arguments.count - 1
        guard channels > 0 else {
            done(RedisError(.protocolError, "\(arguments.first ?? "SUBSCRIBE") needs explicit channels here"))
            return
        }
        guard state == .ready, let connection else {
            done(RedisError(.unavailable, "Redis is not connected"))
            return
        }
        scratch.removeAll(keepingCapacity: true)
        RESPEncoder.appendCommand(arguments, to: &scratch)
        switch scratch.withUnsafeBytes({ connection.write(copying: $0) }) {
        case .accepted:
            if pending.isEmpty { lastProgress = monotonicNanos() }
            pending.append(.confirmations(channels, (arguments.first ?? "").lowercased(), done))
        case .overCap: done(RedisError(.overloaded, "over \(maxQueuedBytes) bytes queued for Redis"))
        case .closed: done(RedisError(.unavailable, "the Redis connection is closing"))
        }
    }

    /// Replies owed by Redis (commands written, not yet answered).
    public var inFlight: Int { pending.count }

    /// A connection that owes replies and has received nothing for `timeout` is taken for dead (a partition or a
    /// hung server shows no error on a quiet TCP connection): it is closed, what it owed fails with
    /// `connectionLost`, and it reconnects with backoff. Call it periodically; returns whether it closed.
    @discardableResult
    public func closeIfStalled(after timeout: Duration) -> Bool {
        loop.assertInLoop()
        guard state == .ready, !pending.isEmpty, let c = connection else { return false }
        guard monotonicNanos() &- lastProgress > timeout.engineNanos else { return false }
        closingBecause = RedisError(.unavailable, "no reply from \(endpoint) within \(timeout) (\(pending.count) commands waiting)")
        c.close(.abort)
        return true
    }

    // MARK: Connecting

    private func attemptConnect() {
        state = .connecting
        decoder = RESPDecoder()
        closingBecause = nil
        let fd: Int32
        do {
            fd = try openSocket()
        } catch {
            down(error)
            return
        }
        let c: Connection
        do {
            c = try Connection(adopting: fd, on: loop, peer: endpoint.description, handler: self, maxQueuedBytes: maxQueuedBytes)
        } catch {
            down(RedisError(.unavailable, "cannot watch the Redis socket: \(error)"))
            return
        }
        connection = c
        connectTimer = loop.schedule(after: connectTimeout) { [weak self] in
            guard let self, self.state == .connecting, let c = self.connection else { return }
            self.closingBecause = RedisError(.unavailable, "no handshake with \(self.endpoint) within \(self.connectTimeout)")
            c.close(.abort)
        }
        handshake(on: c)
    }

    /// A non-blocking socket with its connect started (in progress or done).
    private func openSocket() throws(RedisError) -> Int32 {
        let address = try resolved.get()
        do {
            return try address.startConnect()
        } catch {
            throw RedisError(.unavailable, "cannot connect to \(endpoint): \(error)")
        }
    }

    /// HELLO 3 (with AUTH), then SELECT, then what identifies the server (`serverIdentity`): written at once (they
    /// go out when the connect completes); the connection is ready when the last of them is answered. INFO and
    /// CONFIG refused (an ACL, a managed Redis) leave the identity unknown and lossy, and are no error.
    private func handshake(on c: Connection) {
        var command: [UInt8] = []
        var hello = ["HELLO", "3"]
        if let password = endpoint.password { hello += ["AUTH", endpoint.username ?? "default", password] }
        RESPEncoder.appendCommand(hello, to: &command)
        let selecting = endpoint.database != 0
        if selecting { RESPEncoder.appendCommand(["SELECT", String(endpoint.database)], to: &command) }
        RESPEncoder.appendCommand(["INFO", "server"], to: &command)
        RESPEncoder.appendCommand(["INFO", "persistence"], to: &command)
        RESPEncoder.appendCommand(["CONFIG", "GET", "appendfsync"], to: &command)
        _ = command.withUnsafeBytes { c.write(copying: $0) }
        var refused = false
        pending.append(.reply { [weak self] result in
            guard let self else { return }
            switch result {
            case .success(let reply): self.serverMode = Self.field("mode", of: reply)
            case .failure(let error):
                refused = true
                self.handshakeFailed("HELLO 3", error)
            }
        })
        if selecting {
            pending.append(.reply { [weak self] result in
                guard let self, !refused, case .failure(let error) = result else { return }
                refused = true
                self.handshakeFailed("SELECT \(self.endpoint.database)", error)
            })
        }
        var runID = "unknown"
        var appendOnly = false
        pending.append(.reply { result in
            if case .success(let info) = result, let id = Self.infoField("run_id", in: info), !id.isEmpty { runID = id }
        })
        pending.append(.reply { result in
            if case .success(let info) = result { appendOnly = Self.infoField("aof_enabled", in: info) == "1" }
        })
        pending.append(.reply { [weak self] result in
            guard let self else { return }
            var always = false
            if case .success(let reply) = result, let items = reply.elements ?? { if case .map(let m) = reply { return m } else { return nil } }(),
               items.count == 2 {
                always = items[1].string == "always"
            }
            guard !refused else { return }
            self.identity = runID + (appendOnly && always ? "/always" : "/lossy")
            self.becameReady()
        })
    }

    /// A `name:value` line of an INFO reply.
    static func infoField(_ name: String, in reply: RESPValue) -> String? {
        guard let text = reply.string else { return nil }
        // `isNewline`: INFO's lines end in CRLF, which is one Character ("\r\n"), equal to neither "\r" nor "\n".
        for line in text.split(whereSeparator: \.isNewline) where line.hasPrefix(name + ":") {
            return String(line.dropFirst(name.count + 1))
        }
        return nil
    }

    /// A field of a RESP3 map reply (HELLO's), as text.
    static func field(_ name: String, of reply: RESPValue) -> String? {
        guard case .map(let items) = reply else { return nil }
        var i = 0
        while i + 1 < items.count {
            if items[i].string == name { return items[i + 1].string }
            i += 2
        }
        return nil
    }

    /// An error reply (or a lost connection) during the handshake.
    private func handshakeFailed(_ step: String, _ error: RedisError) {
        guard state == .connecting, let c = connection else { return }
        // The connection goes down and is retried with backoff: a wrong password is logged at every attempt.
        closingBecause = RedisError(.handshake, "\(step) refused by \(endpoint): \(error.message)")
        c.close(.abort)
    }

    private func becameReady() {
        guard state == .connecting else { return }
        _ = loop.cancel(connectTimer)
        state = .ready
        attempt = 0
        lastError = nil
        onReady()
    }

    /// The attempt failed or the connection was lost: fail what is owed, schedule the next attempt.
    private func down(_ error: RedisError) {
        guard state != .closed else { return }
        _ = loop.cancel(connectTimer)
        connection = nil
        state = .waiting
        lastError = error
        failPending(RedisError(.connectionLost, error.message))
        onDown(error)
        guard state == .waiting else { return }  // onDown may have closed it
        attempt += 1
        let delay = backoff.delay(attempt: attempt, using: &random)
        retryTimer = loop.schedule(after: delay) { [weak self] in
            guard let self, self.state == .waiting else { return }
            self.attemptConnect()
        }
    }

    private func failPending(_ error: RedisError) {
        while let owed = pending.removeFirst() { owed.fail(error) }
    }

    // MARK: ConnectionHandler

    public func connectionReadable(_ connection: Connection, _ bytes: UnsafeMutableRawBufferPointer) -> Int {
        let buffer = UnsafeRawBufferPointer(bytes)
        /// Redis broke the protocol: drop the connection (it is retried) and the rest of what it sent.
        func fail(_ why: String) -> Int {
            closingBecause = RedisError(.protocolError, "\(why) from \(endpoint)")
            connection.close(.abort)
            return buffer.count
        }
        var start = 0
        while connection.isOpen {
            let next: RESPDecoder.Next
            do {
                next = try decoder.next(in: buffer, from: start)
            } catch {
                return fail("\(error)")
            }
            switch next {
            case .incomplete(let keep):
                return keep
            case .value(let value, let after):
                start = after
                lastProgress = monotonicNanos()
                if case .push(let items) = value {
                    // Only a confirmation of the kind asked counts: Redis also pushes `sunsubscribe` on its own when a
                    // shard channel's slot moves away (Redis Cluster), which must not complete a pending SSUBSCRIBE.
                    if case .confirmations(let left, let kind, let done)? = pending.first, Self.isConfirmation(items),
                       items.first?.string == kind {
                        if left > 1 {
                            pending.replaceFirst(.confirmations(left - 1, kind, done))
                        } else {
                            _ = pending.removeFirst()
                            done(nil)
                        }
                    }
                    onPush(value)
                } else if let owed = pending.removeFirst() {
                    switch owed {
                    case .reply(let reply):
                        if let message = value.errorMessage {
                            reply(.failure(RedisError(.server, message)))
                        } else {
                            reply(.success(value))
                        }
                    case .confirmations(_, _, let done):
                        guard let message = value.errorMessage else { return fail("a reply where subscription confirmations were due") }
                        done(RedisError(.server, message))
                    }
                } else {
                    return fail("a reply nobody asked for")
                }
            }
        }
        return buffer.count
    }

    /// A push that confirms a (un)subscription: `subscribe`, `ssubscribe`, `psubscribe` or an unsubscribe form.
    private static func isConfirmation(_ items: [RESPValue]) -> Bool {
        guard let kind = items.first?.string else { return false }
        switch kind {
        case "subscribe", "ssubscribe", "psubscribe", "unsubscribe", "sunsubscribe", "punsubscribe": return true
        default: return false
        }
    }

    public func connectionClosed(_ connection: Connection, reason: CloseReason) {
        guard self.connection === connection else { return }
        let error: RedisError
        if let closingBecause {
            error = closingBecause
        } else if state == .connecting {
            error = RedisError(.unavailable, "cannot connect to \(endpoint): \(Self.describe(reason))")
        } else {
            error = RedisError(.connectionLost, "lost the connection to \(endpoint): \(Self.describe(reason))")
        }
        down(error)
    }

    private static func describe(_ reason: CloseReason) -> String {
        if case .error(let code) = reason { return String(cString: strerror(code)) }
        return reason.description
    }
}
