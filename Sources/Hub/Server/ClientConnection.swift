import Glibc
import HubAuth
import HubEngine
import HubJSON
import HubRouting
import HubSupport
import WSProtocol

/// One TCP client, from its first byte to its close: the HTTP request head, then either a plain HTTP answer
/// (`/healthz`, `/metrics`, errors) or a WebSocket session on `/ws` (the hub protocol) or `/echo`.
///
/// Loop-bound: every method runs on the owning loop's thread.
final class ClientConnection: ConnectionHandler {
    enum Phase {
        case http
        case webSocket
        /// We sent a close frame and wait for the peer's (bounded by `phaseDeadline`).
        case closing
        /// A plain HTTP answer is being flushed, or the TCP connection is going away.
        case done
    }

    enum Mode { case hub, echo }

    /// Which gauge this connection is counted in.
    enum Gauge { case handshaking, upgraded, none }

    // Fields that a delivery or a handshake touches skip Swift's run-time exclusivity check:
    // `@exclusivity(unchecked)` (docs/ENGINE.md says when that is safe). They hold plain values, where an
    // overlapping access could see a stale value but never free memory in use, or a reference that is only read or
    // replaced in single statements (`connection`, `answering`).
    // The floors and held events of a subscribe being answered (`Answering`) skip it too: `SubscribeFloors` changes
    // them only by appends, a `removeAll(where:)` with a pure predicate and assignments. The parser, the reader and the channel
    // list keep the check: their accesses call into the codec and the registry.
    let context: LoopContext
    @exclusivity(unchecked) var connection: Connection!
    let serial: Int
    let connectedAt = wallClockSeconds()
    /// Only until the request head is complete, then dropped with its buffers. Boxed, so an upgraded connection
    /// carries a nil pointer rather than the parser's inline size (idle connections are most of the hub's memory).
    private final class ParserBox { var parser = HTTPRequestParser() }
    private var httpParser: ParserBox? {
        get { if case .parser(let box) = input { return box } else { return nil } }
        set {
            if let newValue { input = .parser(newValue) } else if case .parser = input { input = .none }
        }
    }
    /// The WebSocket reader, made when frames arrive and dropped again when it is at rest between messages: an idle
    /// connection holds none (the reader is ~225 bytes, its box ~240 with malloc's header; memory per idle
    /// connection). Kept while a frame, message or control frame is partial, after a close or a violation (it is
    /// poisoned: no later byte is parsed), and for /echo, whose permessage-deflate window lives in it.
    private var readerBox: ReaderBox? {
        get { if case .reader(let box) = input { return box } else { return nil } }
        set {
            if let newValue { input = .reader(newValue) } else if case .reader = input { input = .none }
        }
    }
    /// The parser and the reader share one 8-byte field: the parser is dropped when the request head is
    /// complete, before the upgrade, and a reader is made only after it.
    private enum Input { case parser(ParserBox), reader(ReaderBox), none }
    private var input = Input.parser(ParserBox())
    private final class ReaderBox {
        var reader: MessageReader
        init(_ reader: MessageReader) { self.reader = reader }
    }
    /// `/echo` only.
    private var echoSession: EchoSession?

    // Identity (after the handshake)
    var account = AccountID("")
    @exclusivity(unchecked) var tokenExpiresAt: Int64 = 0
    var platform: String?
    var appVersion: String?

    // Subscriptions: indices into the configured channel list, with this connection's position in each channel's
    // broadcast list. Only the registry changes it (`ChannelMember`).
    private(set) var channels = ChannelList()  // usually one: no allocation
    /// The floors and held events of subscribes being answered (`SubscribeFloors`). They live in a side object that
    /// exists only while there are any, so an idle connection carries one nil pointer for them.
    private final class Answering {
        @exclusivity(unchecked) var rule = SubscribeFloors()
    }
    @exclusivity(unchecked) private var answering: Answering?
    private var floors: SubscribeFloors {
        get { answering?.rule ?? SubscribeFloors() }
        _modify {
            let side = answering ?? Answering()
            answering = side
            yield &side.rule
            if side.rule.isEmpty { answering = nil }
        }
    }

    // Counters for admin views.
    @exclusivity(unchecked) var messagesIn = 0
    @exclusivity(unchecked) var messagesOut = 0

    // Timers: one wheel entry per connection, re-armed for the earliest deadline.
    @exclusivity(unchecked) private var timer = TimerHandle.none
    /// The handshake's deadline (`.http`, and `.webSocket` while awaiting `auth`), then the close's (`.closing`):
    /// one field, since a phase uses at most one of them.
    @exclusivity(unchecked) private var phaseDeadline: UInt64 = 0
    @exclusivity(unchecked) private var nextPingAt: UInt64 = 0
    @exclusivity(unchecked) private var pongDeadline: UInt64 = 0
    @exclusivity(unchecked) private var limiter: RateLimiter

    // The small fields together, after the others: stored properties are laid out in declaration order, so spread
    // among 8-byte fields each would take 8 (an idle connection's memory).
    @exclusivity(unchecked) var phase = Phase.http
    @exclusivity(unchecked) var mode = Mode.hub
    @exclusivity(unchecked) private var closeHandshake = CloseHandshake(role: .server)
    @exclusivity(unchecked) private var gauge = Gauge.none
    /// The peer's close frame has arrived.
    @exclusivity(unchecked) private var peerClosed = false
    @exclusivity(unchecked) private var warnedExpiry = false
    /// Counted against `--max-connections-per-account` (released when the connection closes).
    @exclusivity(unchecked) private var countedForAccount = false
    /// Upgraded without a token (a browser's way): the first message must be `auth`, within the handshake timeout.
    /// Until then the connection has no account, accepts nothing else and counts as handshaking.
    @exclusivity(unchecked) private(set) var awaitingAuth = false
    /// A subscribe waits for the broker's answer: reading from the client is paused.
    @exclusivity(unchecked) private var attaching = false
    /// A TLS client over the connection limit: whatever it asks, the answer is 503 (inside TLS, where it can read
    /// it). Not counted in the hub's connections (`ClientAcceptor.accepted`).
    var answersBusy = false

    init(context: LoopContext, serial: Int) {
        self.context = context
        self.serial = serial
        limiter = RateLimiter(context.rateLimit, now: context.loop.nowNanos)
    }

    /// The loop iteration's time (read once after `epoll_wait`): what deadlines and the rate limiter count from.
    /// Up to one iteration old, against deadlines of seconds; a set-up used to read the clock ~17 times.
    private var now: UInt64 { context.loop.nowNanos }

    var id: String { "\(context.loop.index)-\(serial)" }
    var hub: HubCore { context.hub }

    /// Called right after the engine adopted the socket.
    func start() {
        count(as: .handshaking)
        phaseDeadline = now + UInt64(hub.configuration.handshakeTimeoutSeconds) * 1_000_000_000
        armTimer()
    }

    // MARK: ConnectionHandler

    func connectionReadable(_ connection: Connection, _ bytes: UnsafeMutableRawBufferPointer) -> Int {
        switch phase {
        case .http:
            return readHTTP(bytes)
        case .webSocket, .closing:
            return readFrames(bytes)
        case .done:
            return bytes.count
        }
    }

    func connectionClosed(_ connection: Connection, reason: CloseReason) {
        if hub.logger.enabled(.debug) { logDebug("connection closed", connection: connection, code: nil) }
        count(as: .none)
        unsubscribeAll()
        if countedForAccount {
            countedForAccount = false
            hub.releaseAccount(account)
        }
        context.clients[serial] = nil
        context.loop.cancel(timer)
        timer = .none
        if answersBusy { context.counters.busyTLSAnswers -= 1 } else { hub.clientClosed() }
        phase = .done
        self.connection = nil
    }

    // MARK: HTTP phase

    private func readHTTP(_ bytes: UnsafeMutableRawBufferPointer) -> Int {
        guard let box = httpParser else { return bytes.count }
        // 22 = a TLS handshake record: a wss:// client at a plain port. Its ClientHello has no line end for the
        // parser to wait for, so it is answered now, in the clear (its TLS stack reports the answer at once, OpenSSL
        // as "wrong version number"), rather than at the handshake timeout.
        if bytes.first == 22, box.parser.isAtStart, connection?.isTLS == false {
            httpParser = nil
            context.counters.tlsHelloOnPlainPort += 1
            respondHTTP(FrontDoor.tlsToPlainResponse)
            return bytes.count
        }
        let result: HTTPParseResult<HTTPRequestHead>
        do {
            result = try box.parser.parse(UnsafeRawBufferPointer(bytes))
        } catch {
            httpParser = nil
            respondHTTP(error.response())
            return bytes.count
        }
        switch result {
        case .needMoreData:
            return bytes.count
        case .complete(let head, let consumed):
            httpParser = nil
            context.counters.httpRequests += 1
            route(head)
            if phase == .webSocket && consumed < bytes.count {
                // Frames the client sent right behind its request.
                return consumed + readFrames(UnsafeMutableRawBufferPointer(rebasing: bytes[consumed...]))
            }
            return bytes.count
        }
    }

    /// Carries out the front door's decision (`FrontDoor`).
    private func route(_ head: HTTPRequestHead) {
        let door = FrontDoor(hub: hub, allowedOrigins: context.allowedOrigins)
        switch door.decide(head, answersBusy: answersBusy) {
        case .respond(let response, let headOnly):
            respondHTTP(response, headOnly: headOnly)
        case .refused(let failure):
            refuse(failure)
        case .health(let headOnly):
            count(as: .none)  // its request is complete: not a handshake any more, so it does not count itself
            let loop = context.loop
            let me = LoopBound(Weak(self), loop: loop)
            hub.gatherHealthJSON { status, text in
                loop.execute { me.value.object?.respondHTTP(HTTPResponse.json(status: status, body: text), headOnly: headOnly) }
            }
        case .metrics(let headOnly):
            count(as: .none)  // as above: hub_connections_handshaking does not include the scrape itself
            let loop = context.loop
            let me = LoopBound(Weak(self), loop: loop)
            hub.gatherMetricsText { text in
                loop.execute { me.value.object?.respondHTTP(HTTPResponse.make(
                    status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")], body: Array(text.utf8)),
                    headOnly: headOnly) }
            }
        case .session(let request, let subprotocol, let identity):
            switch identity {
            case .awaitingAuth:
                awaitingAuth = true
            case .verified(let token, let platform, let appVersion):
                account = AccountID(token.subject)
                tokenExpiresAt = token.expiresAt
                guard hub.admitAccount(account) else {
                    context.counters.rejectedConnections += 1
                    return respondHTTP(HTTPError(status: 429, code: "RATE_LIMITED", message: accountLimitMessage,
                                                 headers: [("Retry-After", "10")]).response())
                }
                countedForAccount = true
                self.platform = platform
                self.appVersion = appVersion
            }
            upgrade(request, subprotocol: subprotocol, extensions: nil, mode: .hub)
        case .echo(let request):
            let session = EchoSession(offers: request.extensions)
            echoSession = session
            readerBox = ReaderBox(session.makeReader(maxMessageBytes: hub.configuration.maxEchoMessageBytes))
            upgrade(request, subprotocol: nil, extensions: session.extensionsHeader, mode: .echo)
        }
    }

    /// Sends a complete HTTP response and closes after it is flushed. `headOnly` (a HEAD request) sends the head
    /// alone: same status and headers, Content-Length included, but no body (RFC 9110 section 9.3.2).
    func respondHTTP(_ response: [UInt8], headOnly: Bool = false, closeMode: Connection.CloseMode = .graceful(linger: .seconds(2))) {
        guard let connection, phase == .http else { return }
        count(as: .none)
        phase = .done
        let bytes = headOnly ? FrontDoor.head(of: response) : response[...]
        bytes.withUnsafeBytes { _ = connection.write(copying: $0) }
        connection.close(closeMode)
    }

    /// Answers 101 and starts the WebSocket session.
    private func upgrade(_ request: UpgradeRequest, subprotocol: String?, extensions: String?, mode: Mode) {
        self.mode = mode
        // Written straight into the outbound chunk (no array copied into it).
        _ = WebSocketHandshake.response101(key: request.keyBytes, subprotocol: subprotocol, extensions: extensions) { count, fill in
            connection.write(SharedBytes(count: count, initializingWith: fill))
        }
        if !awaitingAuth { count(as: .upgraded) }
        phase = .webSocket
        let configuration = hub.configuration
        if mode == .echo { connection.maxQueuedBytes = max(connection.maxQueuedBytes, 4 * configuration.maxEchoMessageBytes) }
        nextPingAt = now + UInt64(configuration.pingIntervalSeconds) * 1_000_000_000
        armTimer()
    }

    private func refuse(_ failure: AuthFailure) {
        logRefusedToken(failure)
        context.counters.authFailures[failure.reason.rawValue, default: 0] += 1
        respondHTTP(HTTPResponse.json(status: 401, body: failure.httpBody(),
                                      headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")]))
    }

    private func count(as new: Gauge) {
        switch gauge {
        case .handshaking: context.counters.handshaking -= 1
        case .upgraded: context.counters.upgraded -= 1
        case .none: break
        }
        switch new {
        case .handshaking: context.counters.handshaking += 1
        case .upgraded: context.counters.upgraded += 1
        case .none: break
        }
        gauge = new
    }

    // MARK: WebSocket phase

    /// Returns the bytes consumed: all of them, unless a subscribe now waits for the broker (the rest is read when
    /// it is answered).
    private func readFrames(_ bytes: UnsafeMutableRawBufferPointer) -> Int {
        let box: ReaderBox
        if let existing = readerBox {
            box = existing
        } else {
            // /ws (/echo made its reader at the upgrade and keeps it).
            let limit = hub.configuration.maxMessageBytes
            box = ReaderBox(MessageReader(configuration: MessageReaderConfiguration(role: .server, maxFrameSize: limit, maxMessageSize: limit)))
            readerBox = box
        }
        do {
            let consumed = try box.reader.read(bytes) { [self] message in
                handle(message)
                if attaching && phase == .webSocket { return .stop }
                // Nothing after the peer's close frame is read (RFC 6455 5.5.1): stop there.
                return !peerClosed && (phase == .webSocket || phase == .closing) ? .continue : .stop
            }
            if mode == .hub && box.reader.isAtRest && readerBox === box { readerBox = nil }
            return attaching && phase == .webSocket ? consumed : bytes.count
        } catch {
            context.counters.protocolErrors += 1
            fail(error.closeCode, reason: error.description)
            return bytes.count
        }
    }

    private func handle(_ message: InboundMessage) {
        pongDeadline = 0  // any frame proves the peer is alive
        switch message {
        case .text(let payload):
            guard phase == .webSocket else { return }
            messagesIn += 1
            context.counters.messagesIn += 1
            if mode == .echo { return echo(.text, payload) }
            handleText(payload)
        case .binary(let payload):
            guard phase == .webSocket else { return }
            messagesIn += 1
            context.counters.messagesIn += 1
            if mode == .echo { return echo(.binary, payload) }
            fail(.unsupportedData, reason: "binary messages are not supported; send JSON text")
        case .ping(let payload):
            guard phase == .webSocket else { return }
            // Every ping gets its pong (RFC 6455 5.5.2). One that does not fit the queue means the peer is not reading
            // what it is sent: closed as a slow consumer (4008), like any other frame that does not fit, never left
            // unanswered on an open connection (found by the Client fuzz target: seed_regress_ping_at_queue_cap).
            if connection.write(SharedBytes.frame(opcode: .pong, payload)) == .overCap { slowConsumer() }
        case .pong:
            break
        case .close(let code, _):
            peerClosed = true
            switch closeHandshake.peerSentClose(code: code) {
            case .sendClose(let reply, _):
                sendCloseFrame(reply, reason: "")
                finishTCP()
            case .closeTCP, .awaitTCPClose:
                finishTCP()
            case .none:
                break
            }
        }
    }

    private func echo(_ opcode: Opcode, _ payload: UnsafeRawBufferPointer) {
        guard let echoSession else { return }
        if connection.write(echoSession.frame(opcode, payload)) == .overCap { return slowConsumer() }
        messagesOut += 1
        context.counters.messagesOut += 1
    }

    private func handleText(_ payload: UnsafeRawBufferPointer) {
        switch limiter.consume(now: now, context.rateLimit) {
        case .allowed:
            break
        case .limited(let retryAfter):
            context.counters.rateLimited += 1
            let id = try? ClientMessage.parse(payload).id
            return reply { w in
                ClientReplies.error(code: "RATE_LIMITED", message: "more than \(context.rateLimitPerMinute) messages per minute",
                                    details: .retryAfter(retryAfter), id: id ?? nil, into: &w)
            }
        case .abusive:
            context.counters.rateLimited += 1
            return fail(.policyViolation, reason: "rate limit exceeded repeatedly")
        }
        let message: ClientMessage
        do {
            message = try ClientMessage.parse(payload)
        } catch {
            reply { w in ClientReplies.error(error, into: &w) }
            if awaitingAuth { close(code: Self.unauthorizedClose, reason: AuthFailure.unauthorizedCode) }
            return
        }
        if awaitingAuth {
            guard case .auth(let token, let platform, let appVersion, let id) = message else {
                reply { w in
                    ClientReplies.error(code: AuthFailure.unauthorizedCode, message: #"authenticate first: {"type":"auth","token":"…"}"#,
                                        details: nil, id: message.id, into: &w)
                }
                return close(code: Self.unauthorizedClose, reason: AuthFailure.unauthorizedCode)
            }
            return authenticateFirst(token, platform: platform, appVersion: appVersion, id: id)
        }
        switch message {
        case .subscribe(let names, let since, let id):
            subscribe(names, since: since, id: id)
        case .unsubscribe(let names, let id):
            unsubscribe(names, id: id)
        case .auth(let token, _, _, let id):
            refreshToken(token, id: id)
        case .ping(let id):
            reply { w in ClientReplies.pong(id: id, into: &w) }
        }
    }

    private func resolve(_ names: [String], id: RawJSON?) -> [Int]? {
        var indices: [Int] = []
        var unknown: [String] = []
        for name in names {
            if let index = hub.channelIndex[name] { indices.append(index) } else { unknown.append(name) }
        }
        guard unknown.isEmpty else {
            let message = unknown.count == 1 ? "unknown channel \"\(unknown[0])\"" : "unknown channels"
            reply { w in
                ClientReplies.error(code: "VALIDATION_ERROR", message: message, details: .unknownChannels(unknown), id: id, into: &w)
            }
            return nil
        }
        return indices
    }

    /// Subscribes, reads every stream's position (and the history after `since`), writes the replays, then the
    /// `subscribed` reply. No gap and no duplicate between replay and live events:
    /// - Local broker: the read happens under its numbering lock, so an event is either numbered before it (in the
    ///   replay, or not wanted, and possibly still in this loop's inbox: the floor skips it) or after it (delivered
    ///   live, after the reply, since inbox jobs run after this handler returns).
    /// - A broker that answers later (Redis): the connection is in the registry before the read is sent, so every
    ///   event numbered after the read reaches it; until the answer comes, the events of the new streams are held
    ///   (not written) and reading from the client pauses, so its later requests wait their turn. With the answer,
    ///   held events at or below the read's positions are dropped and the rest go out after the reply.
    private func subscribe(_ names: [String], since: [SincePosition], id: RawJSON?) {
        guard let indices = resolve(names, id: id) else { return }
        // The first subscribe adds all it names: the same array, not a filtered copy.
        let added = channels.isEmpty ? indices : indices.filter { !channels.contains($0) }
        let configuration = hub.configuration
        let limit = configuration.maxSubscriptions
        guard channels.count + added.count <= limit else {
            return reply { w in
                ClientReplies.error(code: "VALIDATION_ERROR", message: "at most \(limit) subscriptions per connection",
                                    details: nil, id: id, into: &w)
            }
        }
        let hubEpoch = hub.broker.epoch
        // Sized up front: each append past a capacity is an allocation and a copy.
        var reads: [StreamRead] = []
        reads.reserveCapacity(2 * indices.count)
        var request = PendingSubscribe(names: names, indices: indices, added: added, id: id)
        if !since.isEmpty {  // a subscribe that resumes nothing (most) makes neither array
            request.resumes.reserveCapacity(indices.count)
            request.knownEpoch.reserveCapacity(indices.count)
        }
        for (n, index) in indices.enumerated() {
            let follow = added.contains(index)
            let position = since.isEmpty ? nil : since.last { ExactString($0.channel) == ExactString(names[n]) }
            let epochs = position.flatMap { Resume.streamEpochs(of: $0.epoch, hubEpoch: hubEpoch) }
            if !since.isEmpty {
                request.resumes.append(position)
                request.knownEpoch.append(epochs != nil)
            }
            let max = context.recoveryMax
            reads.append(StreamRead(stream: StreamKey(channel: index, account: account), follow: follow,
                                    resume: epochs.map { ResumePoint(epoch: $0.account, seq: position?.seq ?? 0) }, limit: max,
                                    loop: context.loop.index))
            reads.append(StreamRead(stream: StreamKey(channel: index, account: nil), follow: follow,
                                    resume: epochs.map { ResumePoint(epoch: $0.broadcast, seq: position?.broadcastSeq ?? 0) }, limit: max,
                                    loop: context.loop.index))
        }
        for index in added {
            context.registry.subscribe(self, account: account, channel: index)  // adds it to `channels`
        }
        // Tokens come from the loop, so they only grow over a connection's life (a deferred dropFloors(upTo:) of
        // an earlier subscribe can never retire a later one's floors), without a counter in every connection.
        context.nextFloorToken += 1
        request.token = context.nextFloorToken
        if let positions = hub.broker.attachNow(reads) { return finishSubscribe(request, positions) }
        let loop = context.loop
        let me = LoopBound(ClientRef(self), loop: loop)
        let pending = LoopBound(request, loop: loop)
        hub.broker.attach(reads) { result in
            loop.execute { me.value.client?.attached(pending.value, result) }
        }
        // The answer comes later: hold the new streams' live events, and read nothing more from the client meanwhile.
        floors.hold(channels: indices, token: request.token)
        attaching = true
        connection?.pauseReading()
    }

    /// What a subscribe waiting for the broker's answer needs to finish.
    private struct PendingSubscribe {
        let names: [String]
        let indices: [Int]
        let added: [Int]
        let id: RawJSON?
        /// Per channel, its `since` position and whether its epoch is known; both empty when `since` is.
        var resumes: [SincePosition?] = []
        var knownEpoch: [Bool] = []
        func resume(_ n: Int) -> SincePosition? { resumes.isEmpty ? nil : resumes[n] }
        var token = 0
    }

    /// The broker's later answer to a subscribe (on this loop).
    private func attached(_ request: PendingSubscribe, _ result: Result<[StreamPosition], BrokerFailure>) {
        // A connection that closed meanwhile has already left its streams (`unsubscribeAll`).
        guard attaching, phase == .webSocket else { return }
        attaching = false
        let held = floors.answered(token: request.token)
        switch result {
        case .success(let positions):
            finishSubscribe(request, positions, dropFloorsAfterInbox: false)
            // What arrived meanwhile, in arrival order (seq order per stream), minus what the read already covered.
            for event in held where !floors.covers(event) {
                guard deliver(frame: event.frame) else { break }
            }
        case .failure(let failure):
            // Nothing of this subscribe takes effect.
            var left: [StreamKey] = []
            for index in request.added {
                context.registry.unsubscribe(self, account: account, channel: index)  // removes it from `channels`
                left.append(StreamKey(channel: index, account: account))
                left.append(StreamKey(channel: index, account: nil))
            }
            hub.broker.detach(left, loop: context.loop.index)
            reply { w in ClientReplies.error(code: failure.code, message: failure.message, details: nil, id: request.id, into: &w) }
        }
        connection?.resumeReading()
    }

    /// Writes the replays and the `subscribed` reply for positions just read, and sets the floors.
    /// `dropFloorsAfterInbox`: the local broker's read is ordered with this loop's inbox, so the floors can go once
    /// the inbox has run. A later answer is not: an event at or below the position may still be on its way (Redis
    /// flushes a pub/sub message and a read reply on different connections in no guaranteed order), so those floors
    /// go only when an event above them passes (`SubscribeFloors.decide`).
    private func finishSubscribe(_ request: PendingSubscribe, _ read: [StreamPosition], dropFloorsAfterInbox: Bool = true) {
        guard read.count == 2 * request.indices.count else { return fail(.internalError, reason: "broker answered a different read") }
        let hubEpoch = hub.broker.epoch
        var positions: [ClientReplies.ChannelPosition] = []
        positions.reserveCapacity(request.indices.count)
        var newFloors: [SubscribeFloors.Floor] = []
        newFloors.reserveCapacity(2 * request.indices.count)  // one allocation, not one per doubling
        // A replay may fill at most half the outbound cap, so the live events behind it still fit.
        var budget = max(0, hub.configuration.maxQueuedBytes / 2 - (connection?.queuedBytes ?? 0))
        for (n, index) in request.indices.enumerated() {
            let (a, b) = (read[2 * n], read[2 * n + 1])
            var position = ClientReplies.ChannelPosition(
                channel: request.names[n], epoch: ClientReplies.ChannelEpoch(hub: hubEpoch, account: a.epoch, broadcast: b.epoch),
                seq: a.seq, broadcastSeq: b.seq)
            if request.resume(n) != nil {
                var outcome = request.knownEpoch[n] ? Resume.combine(a.replay, b.replay) : .failure(.epochChanged)
                if case .success(let events) = outcome {
                    let bytes = events.reduce(0) { $0 + $1.frame.count }
                    if bytes > budget { outcome = .failure(.tooMany) } else { budget -= bytes }
                }
                switch outcome {
                case .success(let events):
                    guard replay(events) else { return }
                    position.recovered = true
                    context.counters.recoveries[0] += 1
                case .failure(let failure):
                    position.recovered = false
                    position.reason = failure.rawValue
                    context.counters.recoveries[RecoveryOutcome.index(of: failure)] += 1
                }
            }
            newFloors.append(SubscribeFloors.Floor(channel: index, broadcast: false, seq: a.seq, token: request.token))
            newFloors.append(SubscribeFloors.Floor(channel: index, broadcast: true, seq: b.seq, token: request.token))
            positions.append(position)
        }
        // A subscribe to no channel has nothing to hold back (and makes no side object for nothing).
        if !newFloors.isEmpty { floors.add(newFloors) }
        reply { w in ClientReplies.subscribed(channels: request.names, positions: positions, id: request.id, into: &w) }
        // Runs after every delivery job that was in this loop's inbox when the positions were read (the inbox is
        // FIFO): from then on, every event for these streams is above its floor.
        guard dropFloorsAfterInbox else { return }
        let me = LoopBound(ClientRef(self), loop: context.loop)
        let token = request.token
        context.loop.execute { me.value.client?.dropFloors(upTo: token) }
    }

    /// Writes replayed frames (the history's own shared bytes). False when the connection could not take them.
    private func replay(_ events: [RetainedEvent]) -> Bool {
        guard let connection, phase == .webSocket else { return false }
        for event in events {
            if connection.write(event.frame) == .overCap {
                slowConsumer()
                return false
            }
            messagesOut += 1
            context.counters.messagesOut += 1
        }
        context.counters.replayedEvents += events.count
        return true
    }

    private func dropFloors(upTo token: Int) {
        if answering != nil { floors.retire(upTo: token) }
    }

    private func unsubscribe(_ names: [String], id: RawJSON?) {
        guard let indices = resolve(names, id: id) else { return }
        var left: [StreamKey] = []
        for index in indices {
            if channels.contains(index) {
                context.registry.unsubscribe(self, account: account, channel: index)  // removes it from `channels`
                if answering != nil { floors.retire(channel: index) }
                left.append(StreamKey(channel: index, account: account))
                left.append(StreamKey(channel: index, account: nil))
            }
        }
        hub.broker.detach(left, loop: context.loop.index)
        reply { w in ClientReplies.unsubscribed(channels: names, id: id, into: &w) }
    }

    /// Close codes of first-message auth (docs/PROTOCOL.md 1.4): 4001 expired, 4003 any other refusal (or a first
    /// message that is not `auth`), 4029 the account's connection limit, 4408 no `auth` within the handshake timeout.
    static let unauthorizedClose = CloseCode(4003)

    /// The first message of a connection that came without a token: verify it, admit the account, and the session
    /// is what a header-authenticated one is from the start. A refusal is an error reply (with the message) and a
    /// close whose reason is the error code, which a browser can read (it cannot read an HTTP 401 body).
    private func authenticateFirst(_ token: String, platform: String?, appVersion: String?, id: RawJSON?) {
        switch hub.verifier.verify(token, now: Int64(time(nil))) {
        case .failure(let failure):
            logRefusedToken(failure)
            context.counters.authFailures[failure.reason.rawValue, default: 0] += 1
            reply { w in ClientReplies.error(code: failure.code, message: failure.message, details: nil, id: id, into: &w) }
            close(code: failure.reason == .expired ? CloseCode(4001) : Self.unauthorizedClose, reason: failure.code)
        case .success(let verified):
            let account = AccountID(verified.subject)
            guard hub.admitAccount(account) else {
                context.counters.rejectedConnections += 1
                let message = accountLimitMessage
                reply { w in ClientReplies.error(code: "RATE_LIMITED", message: message, details: nil, id: id, into: &w) }
                return close(code: CloseCode(4029), reason: "RATE_LIMITED")
            }
            self.account = account
            countedForAccount = true
            tokenExpiresAt = verified.expiresAt
            self.platform = platform.map { FrontDoor.clip($0) }
            self.appVersion = appVersion.map { FrontDoor.clip($0) }
            awaitingAuth = false
            count(as: .upgraded)
            reply { w in ClientReplies.authenticated(expiresAt: verified.expiresAt, id: id, into: &w) }
            armTimer()
        }
    }

    /// A debug line about this connection: its id, peer, the close `code` if any, and its account (`--log-accounts`).
    /// The code is logged when the frame goes out, not kept for the teardown line: the object has no byte to spare.
    private func logDebug(_ message: String, connection: Connection, code: CloseCode?) {
        var fields: [LogField] = [.conn(id), .remote(connection.peer)]
        if let code { fields.append(.code(Int(code.rawValue))) }
        if countedForAccount, let field = hub.logger.accountField(account.string) { fields.append(field) }
        hub.logger.debug(message, fields)
    }

    /// A debug line for a refused token: why (the reason code), never the token or any part of it.
    private func logRefusedToken(_ failure: AuthFailure) {
        guard hub.logger.enabled(.debug) else { return }
        hub.logger.debug("token refused", [.conn(id), .remote(connection?.peer ?? "?"), .reason(failure.reason.rawValue)])
    }

    /// Why an account at `--max-connections-per-account` is refused (the upgrade's 429, first-message auth's 4029).
    private var accountLimitMessage: String {
        "this account already has \(hub.configuration.maxConnectionsPerAccount) open connections (--max-connections-per-account)"
    }

    private func refreshToken(_ token: String, id: RawJSON?) {
        switch hub.verifier.verify(token, now: Int64(time(nil))) {
        case .failure(let failure):
            logRefusedToken(failure)
            context.counters.authFailures[failure.reason.rawValue, default: 0] += 1
            reply { w in ClientReplies.error(code: failure.code, message: failure.message, details: nil, id: id, into: &w) }
        case .success(let verified) where AccountID(verified.subject) != account:
            reply { w in
                ClientReplies.error(code: "FORBIDDEN", message: "the new token belongs to another account", details: nil, id: id, into: &w)
            }
        case .success(let verified):
            tokenExpiresAt = verified.expiresAt
            warnedExpiry = false
            reply { w in ClientReplies.authenticated(expiresAt: verified.expiresAt, id: id, into: &w) }
            armTimer()
        }
    }

    /// Writes one JSON reply built by `build` as a text frame.
    private func reply(_ build: (inout JSONWriter) -> Void) {
        guard let connection, phase == .webSocket else { return }
        context.writer.reset()
        build(&context.writer)
        if context.sendWriterText(to: connection) == .overCap { return slowConsumer() }
        messagesOut += 1
        context.counters.messagesOut += 1
    }

    // MARK: Fan-out

    /// Hands an event to this connection. Returns whether it was accepted (counted as delivered): false also for
    /// an event the connection already has (at or below its floor for that stream).
    @inline(__always)
    func deliver(_ event: PublishedEvent) -> Bool {
        if let answering, !answering.rule.floors.isEmpty {
            switch floors.decide(channel: event.channel, broadcast: event.account == nil, seq: event.seq) {
            case .skip: return false
            case .hold: return hold(event)
            case .pass: break
            }
        }
        return deliver(frame: event.frame)
    }

    /// Keeps a live event until the waiting subscribe's answer; past the outbound cap the client is too slow.
    private func hold(_ event: PublishedEvent) -> Bool {
        guard floors.keep(event, cap: hub.configuration.maxQueuedBytes) else {
            slowConsumer()
            return false
        }
        return true
    }

    private func deliver(frame: SharedBytes) -> Bool {
        guard phase == .webSocket, let connection else { return false }
        switch connection.write(frame) {
        case .accepted:
            messagesOut += 1
            context.counters.messagesOut += 1
            return true
        case .overCap:
            slowConsumer()
            return false
        case .closed:
            return false
        }
    }

    private func slowConsumer() {
        context.counters.slowConsumerCloses += 1
        // What the kernel has not taken yet is dropped, so the close frame comes next and a client that resumes
        // reading learns why. It is tiny: let it past the cap (what is left is at most one partly sent frame).
        connection?.discardUnsent()
        connection?.maxQueuedBytes += 128
        close(code: CloseCode(4008), reason: "SLOW_CONSUMER")
    }

    // MARK: Closing

    /// Starts the closing handshake with `code` (1001 on shutdown, operator disconnects, policy closes).
    func close(code: CloseCode, reason: String) {
        guard phase == .webSocket else {
            if phase == .http { connection?.close(.abort) }
            return
        }
        guard case .sendClose = closeHandshake.close(code: code) else { return }
        sendCloseFrame(code, reason: reason)
        phase = .closing
        unsubscribeAll()
        phaseDeadline = monotonicNanos() + 2_000_000_000
        armTimer()
    }

    /// Fails the WebSocket connection (RFC 6455 section 7.1.7): a protocol violation or data we refuse. Sends the
    /// close code if no close frame was sent yet, processes no further input (the reader is poisoned and every
    /// later byte is discarded) and closes TCP at once, without waiting for the peer's close reply.
    private func fail(_ code: CloseCode, reason: String) {
        guard phase == .webSocket || phase == .closing else { return }
        if phase == .webSocket, case .sendClose = closeHandshake.close(code: code) {
            sendCloseFrame(code, reason: reason)
        }
        finishTCP()
    }

    /// A close frame; `code` nil sends an empty body (the echo of an empty close).
    /// It may pass `--max-queued-bytes` (by at most 127 bytes, the largest close frame): a peer whose queue is near the
    /// cap when it breaks the protocol or closes still gets the close frame behind what is queued, never a bare TCP close.
    private func sendCloseFrame(_ code: CloseCode?, reason: String) {
        guard let connection else { return }
        if hub.logger.enabled(.debug) { logDebug("close frame sent", connection: connection, code: code ?? CloseCode(1005)) }
        let payload = code.map { closePayload(code: $0, reason: reason) } ?? []
        let frame = payload.withUnsafeBytes { SharedBytes.frame(opcode: .close, $0) }
        connection.maxQueuedBytes = max(connection.maxQueuedBytes, connection.queuedBytes + frame.count)
        _ = connection.write(frame)
    }

    /// The close handshake is complete (or abandoned): flush what is queued and close the TCP connection now
    /// (RFC 6455 section 5.5.1: the server closes TCP as soon as it has sent and received a close frame). From here
    /// on no input is processed: the engine discards whatever the peer still sends while it closes.
    private func finishTCP() {
        guard let connection else { return }
        unsubscribeAll()
        phase = .done
        context.loop.cancel(timer)
        timer = .none
        connection.close(.graceful(linger: .seconds(2)))
    }

    private func unsubscribeAll() {
        if attaching {
            // The broker's answer is no longer wanted; the peer's close reply must be readable.
            attaching = false
            connection?.resumeReading()
        }
        guard !channels.isEmpty else { return }
        var left: [StreamKey] = []
        left.reserveCapacity(2 * channels.count)
        for channel in channels {
            context.registry.unsubscribe(self, account: account, channel: channel)
            left.append(StreamKey(channel: channel, account: account))
            left.append(StreamKey(channel: channel, account: nil))
        }
        answering = nil  // floors and held events
        hub.broker.detach(left, loop: context.loop.index)
    }

    // MARK: Timers

    /// Sets the connection's one wheel entry to the earliest deadline: a pending entry is moved (no allocation); a
    /// new one's action holds the connection strongly, not through a weak reference (which would give every
    /// connection a 32-byte side table, and the closure a box for it). Every way out cancels the entry
    /// (`connectionClosed`, `finishTCP`, a `.done` phase here), so the wheel never keeps a closed connection.
    private func armTimer() {
        let deadline = nextDeadline()
        guard deadline != .max else {
            context.loop.cancel(timer)
            timer = .none
            return
        }
        let now = self.now
        let delay = deadline > now ? deadline - now : 0
        if context.loop.reschedule(timer, afterNanos: delay) { return }
        timer = context.loop.schedule(afterNanos: delay) { [self] in timerFired() }
    }

    private func nextDeadline() -> UInt64 {
        switch phase {
        case .http:
            // One tick early: the wheel fires up to a tick late, and the slot must be free by the deadline.
            return phaseDeadline > context.loop.timerTickNanos ? phaseDeadline - context.loop.timerTickNanos : 0
        case .webSocket:
            if awaitingAuth { return phaseDeadline }
            var d = nextPingAt
            if pongDeadline != 0 { d = min(d, pongDeadline) }
            if mode == .hub {
                d = min(d, deadline(forUnixTime: expiryTime))
                if !warnedExpiry { d = min(d, deadline(forUnixTime: warningTime)) }
            }
            return d
        case .closing:
            return phaseDeadline
        case .done:
            return .max
        }
    }

    /// When the token stops being accepted (`exp` + leeway), saturating: a validly signed token may carry any
    /// `exp` up to Int64.max, and overflowing here trapped and took the whole hub down.
    private var expiryTime: Int64 {
        let (t, overflow) = tokenExpiresAt.addingReportingOverflow(Int64(hub.verifier.leeway))
        return overflow ? .max : t
    }

    /// When `token_expiring` is due.
    private var warningTime: Int64 {
        let (t, overflow) = tokenExpiresAt.subtractingReportingOverflow(Int64(hub.configuration.tokenWarningSeconds))
        return overflow ? .min : t
    }

    /// A monotonic deadline for a Unix time. Capped at a year ahead: the timer then fires, finds nothing due and
    /// re-arms, so a far-future `exp` costs one wake-up a year instead of an overflow.
    private func deadline(forUnixTime t: Int64) -> UInt64 {
        let (remaining, overflow) = t.subtractingReportingOverflow(Int64(time(nil)))
        let seconds = overflow ? (t > 0 ? Self.maxTimerSeconds : 0) : min(Self.maxTimerSeconds, UInt64(max(0, remaining)))
        return now &+ seconds * 1_000_000_000
    }

    static let maxTimerSeconds: UInt64 = 365 * 24 * 3600

    private func timerFired() {
        timer = .none
        let now = monotonicNanos()
        let configuration = hub.configuration
        switch phase {
        case .http:
            // The timer was set one tick early (see start()): a handshake that never completes holds its slot for
            // at most the handshake timeout, not timeout + tick + linger.
            if now &+ context.loop.timerTickNanos >= phaseDeadline {
                return respondHTTP(HTTPError(status: 408, code: "REQUEST_TIMEOUT",
                                             message: "the request head did not arrive within \(configuration.handshakeTimeoutSeconds)s").response(),
                                   closeMode: .flushAndClose)
            }
        case .webSocket:
            if awaitingAuth {
                if now >= phaseDeadline {
                    return close(code: CloseCode(4408), reason: "AUTH_TIMEOUT")
                }
                return armTimer()
            }
            let unixNow = Int64(time(nil))
            if mode == .hub {
                if unixNow >= expiryTime {
                    return close(code: CloseCode(4001), reason: "ErrAccessTokenExpired")
                }
                if !warnedExpiry && unixNow >= warningTime {
                    warnedExpiry = true
                    let remaining = max(0, tokenExpiresAt - unixNow)
                    reply { w in ClientReplies.tokenExpiring(expiresIn: remaining, into: &w) }
                }
            }
            if pongDeadline != 0 && now >= pongDeadline {
                return close(code: CloseCode(4002), reason: "PONG_TIMEOUT")
            }
            if now >= nextPingAt {
                _ = connection?.write(context.pingFrame)
                // From the previous deadline, not from now: the timer fires up to one tick (1 s) late, and counting
                // from the late firing made every interval a tick longer (--ping-interval 1s pinged every 2 s).
                let interval = UInt64(configuration.pingIntervalSeconds) * 1_000_000_000
                nextPingAt = nextPingAt + interval > now ? nextPingAt + interval : now + interval
                if pongDeadline == 0 { pongDeadline = now + UInt64(configuration.pongTimeoutSeconds) * 1_000_000_000 }
            }
        case .closing:
            if now >= phaseDeadline { connection?.close(.abort); return }
        case .done:
            return
        }
        armTimer()
    }
}

/// A client connection found again later, on its loop, by its serial in `LoopContext.clients` (nil once it has
/// closed): what the subscribe path's deferred jobs hold (in a `LoopBound`) instead of a weak reference. Swift gives
/// an object a side table at its first weak reference, kept for the object's life (48 bytes of heap per subscribed
/// connection: idle memory).
struct ClientRef {
    private let context: LoopContext
    private let serial: Int
    init(_ client: ClientConnection) {
        context = client.context
        serial = client.serial
    }
    var client: ClientConnection? { context.clients[serial] }
}

extension ClientConnection: ChannelMember {
    func channelPosition(_ channel: Int) -> Int? { channels.position(of: channel) }
    func setChannelPosition(_ position: Int?, _ channel: Int) { channels.setPosition(position, of: channel) }
}
