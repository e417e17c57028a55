import Foundation
import Glibc
import HubEngine
import WSProtocol

/// What a worker process is told (one JSON argument).
struct WorkerConfig: Codable {
    var index: Int
    /// Loopback source address every client socket of this worker binds to (127.0.0.2, …).
    var source: String
    var target: TargetSpec
    var accountPrefix: String
    var accountStart: Int
    var count: Int
    /// Connections opened per second by this worker.
    var rate: Double
    /// Most handshakes in flight at once.
    var maxPending: Int
    /// Share of connections that stop reading once subscribed (the `slow` scenario).
    var slowShare: Double
    /// After the ramp: extra connections opened per second and closed after `churnLifetimeMs` (the `churn` scenario).
    var churnRate: Double
    var churnLifetimeMs: Int
    /// Keep the latest arrival per event id (broadcast: time until the last subscriber has it).
    var trackEvents: Bool
    var handshakeTimeoutMs: Int
    /// `reconnect-storm`: the first `controlCount` clients of this worker stay connected (their latency is
    /// recorded); the others follow their stream's seq and, on `storm`, drop and resubscribe with `since` after
    /// `awayMs`, at most `stormRate` reconnects/s (0: as fast as `maxPending` allows).
    var storm = false
    var controlCount = 0
    var awayMs = 0
    var stormRate = 0.0
}

/// Counters a worker reports (progress lines carry them without histograms).
struct WorkerSnap: Codable {
    var index = 0
    var attempted = 0
    /// Currently open and subscribed.
    var open = 0
    var everEstablished = 0
    var failed: [String: Int] = [:]
    /// Established connections that ended, by reason (server close code, reset, …).
    var closed: [String: Int] = [:]
    var slowOpen = 0
    var received: UInt64 = 0
    var receivedSlow: UInt64 = 0
    var otherMessages: UInt64 = 0
    var churnAttempted = 0
    var churnEstablished = 0
    var rampDone = false
    var cpuSeconds = 0.0
    var latency: Histogram? = nil
    var handshake: Histogram? = nil
    /// [[event id, latest arrival latency ns, receivers]].
    var events: [[UInt64]]? = nil
    // reconnect-storm
    var stormDropped = 0
    var reconnected = 0
    var recovered = 0
    var notRecovered: [String: Int] = [:]
    var reconnectFailed = 0
    /// Events received before the `subscribed` reply of a resume (the replay).
    var replayed: UInt64 = 0
    /// Events whose seq was not the next one of their stream (lower: duplicates; higher: gaps).
    var duplicates: UInt64 = 0
    var gaps: UInt64 = 0
    /// CLOCK_MONOTONIC ns of the last resume answered (recovered or not) or failed.
    var lastRecoveryDoneAt: UInt64 = 0
    /// Per resume: from its connect() to the `subscribed` reply (the replay included).
    var recovery: Histogram? = nil
}

/// Where a storm client resumes from (kept across its connections).
struct StormPosition {
    var epoch = ""
    var seq: UInt64 = 0
    var broadcastSeq: UInt64 = 0
}

/// One client WebSocket: handshake (with the token in the query), subscribe, then count and time events.
final class ClientSession: ConnectionHandler {
    enum State { case handshaking, subscribing, open, closing }
    enum Role { case stable, slow, churn, storm }

    unowned let fleet: Fleet
    let role: Role
    let key: String
    let account: String
    /// The stream's position (storm scenario: control and storm clients follow their seq).
    var position = StormPosition()
    /// Set for a storm client's reconnect: subscribe with `since`.
    let resume: StormPosition?
    var state = State.handshaking
    var parser = HTTPResponseParser()
    var reader = MessageReader(configuration: MessageReaderConfiguration(role: .client))
    let startedAt = monotonicNanos()
    var timer = TimerHandle.none
    var connection: Connection?
    var outcomeCounted = false

    init(fleet: Fleet, role: Role, account: String, resume: StormPosition? = nil) {
        self.fleet = fleet
        self.role = role
        self.account = account
        self.resume = resume
        if let resume { position = resume }
        key = ClientHandshake.makeKey()
    }

    func start(_ connection: Connection, path: String) {
        self.connection = connection
        let request = ClientHandshake.request(host: fleet.hostHeader, path: path, key: key)
        connection.write(SharedBytes(request))
        timer = fleet.loop.schedule(after: .milliseconds(fleet.config.handshakeTimeoutMs)) { [weak self] in
            guard let self, self.state == .handshaking || self.state == .subscribing else { return }
            self.failOnce(self.state == .handshaking ? "handshake timeout" : "subscribe timeout")
            self.connection?.close(.abort)
        }
    }

    func failOnce(_ reason: String) {
        guard !outcomeCounted else { return }
        outcomeCounted = true
        if resume != nil {
            fleet.snap.failed["reconnect: " + reason, default: 0] += 1
            fleet.snap.reconnectFailed += 1
            fleet.snap.lastRecoveryDoneAt = max(fleet.snap.lastRecoveryDoneAt, monotonicNanos())
        } else {
            fleet.snap.failed[reason, default: 0] += 1
        }
        fleet.pending -= 1
    }

    func established() {
        state = .open
        _ = fleet.loop.cancel(timer)
        outcomeCounted = true
        fleet.pending -= 1
        fleet.handshake.record(monotonicNanos() &- startedAt)
        switch role {
        case .stable:
            fleet.snap.open += 1
            fleet.snap.everEstablished += 1
        case .storm:
            fleet.snap.open += 1
            if resume == nil { fleet.snap.everEstablished += 1 } else { fleet.snap.reconnected += 1 }
        case .slow:
            fleet.snap.open += 1
            fleet.snap.slowOpen += 1
            fleet.snap.everEstablished += 1
            connection?.pauseReading()
        case .churn:
            fleet.snap.churnEstablished += 1
            _ = fleet.loop.schedule(after: .milliseconds(fleet.config.churnLifetimeMs)) { [weak self] in
                self?.closeNormally()
            }
        }
    }

    func closeNormally() {
        guard state == .open, let connection else { return }
        state = .closing
        var frame: [UInt8] = []
        var body: [UInt8] = [0x03, 0xE8]
        body.withUnsafeMutableBytes { FrameEncoder.encodeClient(opcode: .close, payload: UnsafeRawBufferPointer($0), into: &frame) }
        connection.write(SharedBytes(frame))
        connection.close(.graceful(linger: .seconds(1)))
    }

    func connectionReadable(_ connection: Connection, _ bytes: UnsafeMutableRawBufferPointer) -> Int {
        var offset = 0
        if state == .handshaking {
            do {
                switch try parser.parse(UnsafeRawBufferPointer(bytes)) {
                case .needMoreData:
                    return bytes.count
                case .complete(let head, let consumed):
                    offset = consumed
                    do {
                        _ = try ClientHandshake.verify(head, key: key, offeredSubprotocols: [], deflate: nil)
                    } catch {
                        failOnce(head.status == 101 ? "bad handshake" : "http \(head.status)")
                        connection.close(.abort)
                        return bytes.count
                    }
                    if fleet.config.target.subscribesByMessage {
                        state = .subscribing
                        var frame: [UInt8] = []
                        let channel = fleet.config.target.channel
                        var since = ""
                        if let r = resume {
                            since = #","since":{"\#(channel)":{"epoch":"\#(r.epoch)","seq":\#(r.seq),"broadcastSeq":\#(r.broadcastSeq)}}"#
                        }
                        let msg = Array(#"{"type":"subscribe","channels":["\#(channel)"]\#(since),"id":1}"#.utf8)
                        msg.withUnsafeBytes { FrameEncoder.encodeClient(opcode: .text, payload: $0, into: &frame) }
                        connection.write(SharedBytes(frame))
                    } else {
                        established()
                    }
                }
            } catch {
                failOnce("bad http response")
                connection.close(.abort)
                return bytes.count
            }
        }
        if offset == bytes.count { return offset }
        let rest = UnsafeMutableRawBufferPointer(rebasing: bytes[offset...])
        do {
            let n = try reader.read(rest) { message in
                self.handle(message, connection)
                return .continue
            }
            return offset + n
        } catch {
            if state == .open { fleet.snap.closed["protocol error", default: 0] += 1; leaveOpen() } else { failOnce("protocol error") }
            state = .closing
            connection.close(.abort)
            return bytes.count
        }
    }

    private func leaveOpen() {
        guard role != .churn else { return }
        fleet.snap.open -= 1
        if role == .slow { fleet.snap.slowOpen -= 1 }
    }

    private func handle(_ message: InboundMessage, _ connection: Connection) {
        switch message {
        case .text(let p):
            if state == .subscribing {
                if countOccurrences(patSubscribed, in: p, from: 0, to: p.count) > 0 {
                    if fleet.config.storm { subscribedReply(p) }
                    established()
                } else if countOccurrences(patError, in: p, from: 0, to: p.count) > 0 {
                    failOnce("subscribe refused")
                    state = .closing
                    connection.close(.abort)
                } else if fleet.config.storm, resume != nil, scanValue(patT, in: p) != nil {
                    fleet.snap.replayed += 1  // the replay comes before the reply
                    follow(p)
                }
                return
            }
            guard let stamp = scanValue(patT, in: p) else {
                fleet.snap.otherMessages += 1
                return
            }
            if fleet.config.storm {
                follow(p)
                if role == .storm {
                    fleet.snap.received += 1
                    return
                }
            }
            let now = monotonicNanos()
            let latency = now > stamp.value ? now - stamp.value : 0
            if role == .slow {
                fleet.snap.receivedSlow += 1
                return
            }
            fleet.snap.received += 1
            fleet.latency.record(latency)
            if fleet.config.trackEvents, let id = scanValue(patI, in: p, from: stamp.next) {
                fleet.recordEvent(id.value, latency)
            }
        case .ping(let p):
            var frame: [UInt8] = []
            FrameEncoder.encodeClient(opcode: .pong, payload: p, into: &frame)
            connection.write(SharedBytes(frame))
        case .pong, .binary:
            fleet.snap.otherMessages += 1
        case .close(let code, _):
            let reason = code.map { "close \($0)" } ?? "close (no code)"
            if state == .open {
                fleet.snap.closed[reason, default: 0] += 1
                leaveOpen()
            } else if state != .closing {
                failOnce(reason)
            }
            state = .closing
            var frame: [UInt8] = []
            var body: [UInt8] = code.map { [UInt8($0 >> 8), UInt8($0 & 0xFF)] } ?? []
            body.withUnsafeMutableBytes { FrameEncoder.encodeClient(opcode: .close, payload: UnsafeRawBufferPointer($0), into: &frame) }
            connection.write(SharedBytes(frame))
            connection.close(.graceful(linger: .seconds(1)))
        }
    }

    /// Checks an event's seq against the stream's position (events of one stream arrive in seq order).
    private func follow(_ p: UnsafeRawBufferPointer) {
        guard let seq = scanValue(patSeq, in: p)?.value else { return }
        if seq <= position.seq {
            fleet.snap.duplicates += 1
        } else {
            if seq != position.seq + 1 { fleet.snap.gaps += 1 }
            position.seq = seq
        }
    }

    /// The `subscribed` reply: the stream's position; for a resume, whether it recovered (and then the replay,
    /// already received, must have brought the position to the reply's seq).
    private func subscribedReply(_ p: UnsafeRawBufferPointer) {
        let seq = scanValue(patSeq, in: p)?.value ?? 0
        let broadcastSeq = scanValue(patBroadcastSeq, in: p)?.value ?? 0
        let epoch = scanString(patEpoch, in: p) ?? ""
        if resume != nil {
            let now = monotonicNanos()
            if countOccurrences(patRecoveredTrue, in: p, from: 0, to: p.count) > 0 {
                fleet.snap.recovered += 1
                if position.seq != seq { fleet.snap.gaps += 1 }
            } else {
                fleet.snap.notRecovered[scanString(patReason, in: p) ?? "unknown", default: 0] += 1
            }
            fleet.recovery.record(now &- startedAt)
            fleet.snap.lastRecoveryDoneAt = max(fleet.snap.lastRecoveryDoneAt, now)
        }
        position = StormPosition(epoch: epoch, seq: seq, broadcastSeq: broadcastSeq)
    }

    func connectionClosed(_ connection: Connection, reason: CloseReason) {
        _ = fleet.loop.cancel(timer)
        self.connection = nil
        fleet.live.removeValue(forKey: ObjectIdentifier(self))
        switch state {
        case .handshaking, .subscribing:
            let text: String
            switch reason {
            case .error(let code): text = errnoName(code)
            case .peerClosed: text = "closed by server during \(state == .handshaking ? "handshake" : "subscribe")"
            default: text = reason.description
            }
            failOnce(text)
        case .open:
            let text: String
            switch reason {
            case .error(let code): text = errnoName(code)
            default: text = reason.description
            }
            fleet.snap.closed[text, default: 0] += 1
            leaveOpen()
        case .closing:
            break
        }
    }
}

/// All the client connections of one worker process, on its one event loop.
final class Fleet: @unchecked Sendable {
    let loop: EventLoop
    let config: WorkerConfig
    let hostHeader: String
    let mint: TokenMint
    var snap = WorkerSnap()
    var latency = Histogram()
    var handshake = Histogram()
    var recovery = Histogram()
    var events: [UInt64: (UInt64, UInt64)] = [:]
    /// Storm clients waiting to reconnect: (account, position, dropped at).
    var reconnects: [(account: String, position: StormPosition, droppedAt: UInt64)] = []
    var reconnectNext = 0
    var stormStartedAt: UInt64 = 0
    var live: [ObjectIdentifier: ClientSession] = [:]
    var pending = 0
    var nextIndex = 0
    var churnNext = 0
    var startedAt: UInt64 = 0
    var churnStartedAt: UInt64 = 0
    var source = sockaddr_in()
    var destination = sockaddr_in()
    /// Connections opened so far (which node of a cluster the next one goes to).
    var opened = 0
    let slowEvery: Int
    /// The client TLS context, for a wss:// target.
    lazy var tls: TLSContext? = {
        guard config.target.tls == true else { return nil }
        do { return try TLSContext.client(verify: false, serverName: "localhost") } catch { fail("TLS: \(error)") }
    }()

    init(loop: EventLoop, config: WorkerConfig) {
        self.loop = loop
        self.config = config
        hostHeader = "\(config.target.host):\(config.target.port)"
        mint = TokenMint(required: config.target.usesToken)
        snap.index = config.index
        source.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, config.source, &source.sin_addr)
        destination.sin_family = sa_family_t(AF_INET)
        destination.sin_port = UInt16(config.target.port).bigEndian
        inet_pton(AF_INET, config.target.host, &destination.sin_addr)
        slowEvery = config.slowShare > 0 ? max(1, Int((1 / config.slowShare).rounded())) : 0
    }

    func recordEvent(_ id: UInt64, _ latency: UInt64) {
        if let e = events[id] {
            events[id] = (max(e.0, latency), e.1 + 1)
        } else {
            events[id] = (latency, 1)
        }
    }

    func start() {
        startedAt = monotonicNanos()
        _ = loop.scheduleRepeating(every: .milliseconds(2)) { [self] in pace() }
    }

    private func pace() {
        let now = monotonicNanos()
        if nextIndex < config.count {
            let due = Int(Double(now - startedAt) / 1e9 * config.rate) + 1
            var n = min(due, config.count) - nextIndex
            n = min(n, config.maxPending - pending)
            while n > 0 {
                var role: ClientSession.Role = slowEvery > 0 && nextIndex % slowEvery == slowEvery - 1 ? .slow : .stable
                if config.storm && nextIndex >= config.controlCount { role = .storm }
                open(account: "\(config.accountPrefix)\(config.accountStart + nextIndex)", role: role)
                nextIndex += 1
                n -= 1
            }
        } else if !snap.rampDone && pending == 0 {
            snap.rampDone = true
            churnStartedAt = now
        } else if reconnectNext < reconnects.count {
            var n = config.maxPending - pending
            let back = stormStartedAt &+ UInt64(config.awayMs) * 1_000_000
            if config.stormRate > 0 {
                n = min(n, Int(Double(now > back ? now - back : 0) / 1e9 * config.stormRate) + 1 - reconnectNext)
            }
            while n > 0, reconnectNext < reconnects.count, reconnects[reconnectNext].droppedAt &+ UInt64(config.awayMs) * 1_000_000 <= now, back <= now {
                let r = reconnects[reconnectNext]
                open(account: r.account, role: .storm, resume: r.position)
                reconnectNext += 1
                n -= 1
            }
        } else if snap.rampDone && config.churnRate > 0 {
            let due = Int(Double(now - churnStartedAt) / 1e9 * config.churnRate) + 1
            var n = min(due - churnNext, config.maxPending - pending)
            while n > 0 {
                open(account: "churn\(config.index)_\(churnNext)", role: .churn)
                churnNext += 1
                n -= 1
            }
        }
    }

    /// Drops every open storm client at once (an abortive close, like a network loss) and queues its reconnect.
    func storm() {
        let now = monotonicNanos()
        stormStartedAt = now
        for (_, session) in live where session.role == .storm && session.state == .open {
            session.state = .closing
            snap.open -= 1
            snap.stormDropped += 1
            reconnects.append((session.account, session.position, now))
            session.connection?.close(.abort)
        }
    }

    private func open(account: String, role: ClientSession.Role, resume: StormPosition? = nil) {
        if role == .churn { snap.churnAttempted += 1 } else if resume == nil { snap.attempted += 1 }
        pending += 1
        let session = ClientSession(fleet: self, role: role, account: account, resume: resume)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { session.failOnce("socket: \(errnoName(errno))"); return }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_IP), 24 /* IP_BIND_ADDRESS_NO_PORT */, &one, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        if role == .slow {
            var small: Int32 = 4096
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        }
        var src = source
        let bound = withUnsafePointer(to: &src) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if bound != 0 {
            let code = errno
            Glibc.close(fd)
            session.failOnce("bind: \(errnoName(code))")
            return
        }
        var dst = destination
        if let ports = config.target.ports, !ports.isEmpty {
            // A cluster: connections are spread over the nodes in turn.
            dst.sin_port = UInt16(ports[opened % ports.count]).bigEndian
        }
        opened += 1
        let rc = withUnsafePointer(to: &dst) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if rc != 0 && errno != EINPROGRESS {
            let code = errno
            Glibc.close(fd)
            session.failOnce("connect: \(errnoName(code))")
            return
        }
        let connection: Connection
        do {
            connection = try Connection(adopting: fd, on: loop, peer: hostHeader, handler: session, maxQueuedBytes: 1 << 20, tls: tls)
        } catch {
            session.failOnce("adopt: \(errnoName(error.code))")
            return
        }
        live[ObjectIdentifier(session)] = session
        let account = account
        session.start(connection, path: config.target.path(account: account, token: config.target.usesToken ? mint.token(for: account) : nil))
    }

    /// Counters (and, with `histograms`, the histograms since the last such call, which are then reset).
    func snapshot(histograms: Bool) -> WorkerSnap {
        var s = snap
        s.cpuSeconds = ProcSample.single(getpid())?.cpuSeconds ?? 0
        if histograms {
            s.latency = latency
            s.handshake = handshake
            latency.reset()
            handshake.reset()
            if config.storm {
                s.recovery = recovery
                recovery.reset()
            }
            if config.trackEvents {
                s.events = events.map { [$0.key, $0.value.0, $0.value.1] }
                events.removeAll(keepingCapacity: true)
            }
        }
        return s
    }

    func closeAll() {
        for (_, s) in live { s.connection?.close(.abort) }
    }
}

/// `hubbench worker CONFIG-JSON`: runs a fleet, prints `{"ev":"progress",…}` every 250 ms, answers `snap`
/// (with histograms, reset after) and `stop` (final snap, then exit) read from stdin.
enum WorkerMain {
    static func run(_ json: String) -> Never {
        guard let config = try? JSONDecoder().decode(WorkerConfig.self, from: Data(json.utf8)) else { fail("worker: bad config") }
        _ = TCPListener.raiseDescriptorLimit()
        var loopConfig = EventLoop.Configuration()
        loopConfig.timerTickNanos = 1_000_000
        let group: EventLoopGroup
        do { group = try EventLoopGroup(loopCount: 1, configuration: loopConfig) } catch { fail("worker: \(error)") }
        let loop = group.loops[0]
        let fleet = Fleet(loop: loop, config: config)
        let out = NSLock()
        @Sendable func emit(_ kind: String, _ s: WorkerSnap) {
            let line = #"{"ev":"\#(kind)","snap":"# + encodeLine(s) + "}\n"
            out.lock()
            FileHandle.standardOutput.write(Data(line.utf8))
            out.unlock()
        }
        loop.execute { fleet.start() }
        let progress = Thread {
            while true {
                usleep(250_000)
                guard let s = try? loop.submitAndWait({ fleet.snapshot(histograms: false) }) else { return }
                emit("progress", s)
            }
        }
        progress.start()
        while let line = readLine() {
            switch line.trimmingCharacters(in: .whitespaces) {
            case "snap":
                if let s = try? loop.submitAndWait({ fleet.snapshot(histograms: true) }) { emit("snap", s) }
            case "storm":
                loop.execute { fleet.storm() }
            case "stop":
                if let s = try? loop.submitAndWait({ fleet.snapshot(histograms: true) }) { emit("final", s) }
                _ = try? loop.submitAndWait { fleet.closeAll() }
                usleep(100_000)
                exit(0)
            default:
                break
            }
        }
        exit(0)
    }
}
