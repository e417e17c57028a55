import Glibc
import HubEngine
import HubSupport
import Synchronization

/// The signals an operator sends (docs/OPERATIONS.md, "Signals"). None of them may kill the hub by accident: each
/// is blocked in every thread and taken by the main thread with `sigwait`, so no handler runs on a loop thread and
/// the Swift runtime's crash handler never sees SIGQUIT.
///
/// - SIGTERM, SIGINT: graceful shutdown (`serveSignals` returns them).
/// - SIGHUP: reloads the configuration where it can change while running, and the TLS certificate and key
///   (`reload`); logs what happened.
/// - SIGUSR1, SIGUSR2: logged and ignored.
/// - SIGQUIT: a state dump to the log (`logStateDump`); the hub keeps serving.
/// - SIGPIPE: ignored (a vanished peer or log reader is an error return, not a signal).
extension HubServer {
    /// Every signal the main thread takes.
    static let operatorSignals: [Int32] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2]

    /// Call first thing in `main`, before any thread exists (threads inherit the mask): blocks the operator
    /// signals (they wait for `serveSignals`) and ignores SIGPIPE.
    public static func blockOperatorSignals() {
        signal(SIGPIPE, SIG_IGN)
        var set = signalSet(operatorSignals)
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    /// Takes the operator signals on the calling thread (the main thread, after `start`): handles SIGHUP, SIGUSR1,
    /// SIGUSR2 and SIGQUIT in place and returns at the first SIGTERM or SIGINT, which it returns.
    public func serveSignals() -> Int32 {
        var set = Self.signalSet(Self.operatorSignals)
        while true {
            var received: Int32 = 0
            guard sigwait(&set, &received) == 0 else { continue }
            switch received {
            case SIGTERM, SIGINT:
                return received
            case SIGHUP:
                notifier?.reloading()
                for line in reload() { core.log(line) }
                notifier?.send("READY=1")
            case SIGQUIT:
                logStateDump()
            default:
                core.log("received \(Self.name(of: received)): ignored; still serving")
            }
        }
    }

    /// "SIGTERM", "SIGUSR1", ... for the operator signals; "signal N" otherwise.
    public static func name(of signal: Int32) -> String {
        switch signal {
        case SIGTERM: "SIGTERM"
        case SIGINT: "SIGINT"
        case SIGHUP: "SIGHUP"
        case SIGQUIT: "SIGQUIT"
        case SIGUSR1: "SIGUSR1"
        case SIGUSR2: "SIGUSR2"
        default: "signal \(signal)"
        }
    }

    static func signalSet(_ signals: [Int32]) -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        for s in signals { sigaddset(&set, s) }
        return set
    }

    // MARK: SIGQUIT

    /// Writes the hub's state to the log, every line starting with `state`: a head line, one line per loop
    /// (its connections, subscriptions per channel, queued outbound bytes and the largest queue, counters), then
    /// the `{"op":"stats"}` reply (what `hubctl status` shows) as one line. Each loop answers on its own thread
    /// with the same snapshot `stats` uses; a loop that does not answer within `timeout` seconds is reported as
    /// such, which is itself the finding when a loop is stuck. Runs on the main thread, so a SIGTERM that
    /// arrives meanwhile waits until the dump is written.
    func logStateDump(timeout: Double = 2) {
        let contexts = core.contexts
        let loops = LockedValue<[LoopState?]>(Array(repeating: nil, count: contexts.count))
        let stats = LockedValue<[UInt8]?>(nil)
        for (i, context) in contexts.enumerated() {
            context.loop.execute {
                let state = LoopState(context: context)
                loops.withLock { $0[i] = state }
            }
        }
        core.statsJSON(id: nil) { line in stats.withLock { $0 = line } }
        let deadline = monotonicNanos() + UInt64(timeout * 1e9)
        while monotonicNanos() < deadline {
            let done = loops.withLock { !$0.contains { $0 == nil } } && stats.withLock { $0 != nil }
            if done { break }
            usleep(5_000)
        }
        let answered = loops.withLock { $0 }
        let clientCount = core.clientCount
        core.log("state dump (SIGQUIT): hub \(HubVersion.string) pid \(getpid()) uptime \(Int(wallClockSeconds() - core.startedAt))s"
                 + " loops=\(contexts.count) clients=\(clientCount) limit=\(core.maxConnections)"
                 + " descriptors=\(openDescriptorCount())/\(core.descriptorLimit) shuttingDown=\(core.isShuttingDown)")
        for (i, state) in answered.enumerated() {
            guard let state else {
                core.log("state: loop=\(i) no answer within \(timeout)s (the loop is busy or blocked)")
                continue
            }
            core.log("state: " + state.line(channelNames: core.channelNames))
        }
        if let line = stats.withLock({ $0 }) {
            core.log("state: stats " + String(decoding: line, as: UTF8.self))
        } else {
            core.log("state: stats not available (a loop did not answer)")
        }
        core.log("state dump ends")
    }
}

/// One loop's part of the SIGQUIT dump: the `stats` snapshot plus its connections' queued outbound bytes.
struct LoopState: Sendable {
    let snapshot: LoopSnapshot
    /// Client connections in every phase (HTTP, handshake, WebSocket, closing).
    var clients = 0
    var queuedBytes = 0
    var queuedConnections = 0
    var largestQueue: (id: String, bytes: Int)?

    init(context: LoopContext) {
        snapshot = LoopSnapshot(context: context, includeLatency: false)
        clients = context.clients.count
        for client in context.clients.values {
            let queued = client.connection?.queuedBytes ?? 0
            guard queued > 0 else { continue }
            queuedBytes += queued
            queuedConnections += 1
            if queued > largestQueue?.bytes ?? 0 { largestQueue = (client.id, queued) }
        }
    }

    /// `loop=0 open=3 handshaking=1 ...`: key=value pairs, stable names, for grep and awk.
    func line(channelNames: [String]) -> String {
        let s = snapshot, c = s.counters
        let channels = zip(channelNames, s.subscribersPerChannel).map { "\($0):\($1)" }.joined(separator: ",")
        let failures = c.authFailures.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ",")
        var parts = [
            "loop=\(s.index)", "clients=\(clients)", "open=\(c.upgraded)", "handshaking=\(c.handshaking)",
            "subscriptions=\(s.subscriptions)", "channels=\(channels.isEmpty ? "-" : channels)",
            "queuedBytes=\(queuedBytes)", "queuedConnections=\(queuedConnections)",
            "largestQueue=\(largestQueue.map { "\($0.id):\($0.bytes)" } ?? "-")",
            "messagesIn=\(c.messagesIn)", "messagesOut=\(c.messagesOut)",
            "bytesIn=\(s.engine.bytesIn)", "bytesOut=\(s.engine.bytesOut)", "busy=\(Int((s.busy * 100).rounded()))%",
            "slowConsumerCloses=\(c.slowConsumerCloses)", "rateLimited=\(c.rateLimited)",
            "protocolErrors=\(c.protocolErrors)", "rejectedConnections=\(c.rejectedConnections + s.engine.shedConnections)",
            "httpRequests=\(c.httpRequests)", "authFailures=\(failures.isEmpty ? "-" : failures)",
        ]
        if let ledger = s.ledger {
            parts += ["published=\(ledger.totalPublished)", "delivered=\(ledger.totalDelivered)"]
        }
        return parts.joined(separator: " ")
    }
}
