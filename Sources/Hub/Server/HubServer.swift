import Foundation
import Glibc
import HubAuth
import HubCluster
import HubEngine
import HubRouting
import HubSupport
import Synchronization
import WSProtocol

/// The hub: event loops, the client listener, the Unix socket, and their lifecycle.
///
/// Threads: one event loop per core (`--threads`). Each accepted client belongs to the loop that accepted it
/// (the loops share one listening socket and take turns accepting; see `TCPListener`) for its whole life. Every
/// Unix-socket connection lives on loop 0, which also keeps the publish ledger and the tails. The main thread only
/// takes signals (HubSignals.swift).
public final class HubServer: Sendable {
    let core: HubCore
    private let group: EventLoopGroup
    private let tcp: TCPListener
    /// The TLS listener next to the plain one (`--tls-listen`).
    private let tlsTCP: TCPListener?
    private let unix: UnixListener
    /// The address clients connect to (with the real port when port 0 was asked for). It speaks TLS when a
    /// certificate is configured without `--tls-listen`.
    public let listenAddress: String
    /// The `--tls-listen` address (with its real port), when there is one.
    public let tlsListenAddress: String?
    public let socketPath: String
    /// The server's TLS context, when a certificate is configured.
    let tls: TLSContext?
    /// sd_notify, when the hub runs under a service manager (`$NOTIFY_SOCKET`).
    let notifier: ServiceNotifier?
    /// The listening sockets came from the service manager, which keeps them open across restarts.
    let activated: Bool
    /// Reads the configuration again for SIGHUP.
    private let reloader: (@Sendable () throws(HubConfiguration.ConfigurationError) -> HubConfiguration)?
    /// The configuration in force: the start's, with what SIGHUPs reloaded since.
    private let live: LockedValue<HubConfiguration>
    /// The options a SIGHUP applies to a running hub; any other change waits for a restart.
    static let reloadableOptions: Set<String> = ["tls-cert", "tls-key", "allowed-origins", "rate-limit", "recovery-max", "log-level"]
    /// Set when shutdown begins: the notifier's thread stops.
    private let notifierStopped = Atomic<Bool>(false)

    /// Starts everything and returns once the hub accepts clients and publishes. Throws a message fit for a
    /// person when something is in the way (port in use, another hub on the socket, unreadable key).
    public static func start(configuration: HubConfiguration, log: @escaping @Sendable (String) -> Void) throws -> HubServer {
        try start(configuration: configuration, logger: HubLogger(lines: log))
    }

    /// `start(configuration:log:)` with the hub's logger (levels, fields, `--log-format`).
    /// - Parameter activation: listening sockets passed by the service manager (`SocketActivation.take()`), served
    ///   instead of binding `--listen`, `--tls-listen` and `--socket`.
    /// - Parameter reload: reads the configuration again (file, environment, flags) for SIGHUP; nil: SIGHUP reloads
    ///   the TLS certificate only.
    public static func start(configuration: HubConfiguration, logger: HubLogger, activation: SocketActivation? = nil,
                             reload: (@Sendable () throws(HubConfiguration.ConfigurationError) -> HubConfiguration)? = nil) throws -> HubServer {
        let log = logger.lines
        if activation?.wss != nil && configuration.tlsCertificateFile == nil {
            throw StartError("the service manager passed a socket named wss, but no --tls-cert and --tls-key are configured")
        }
        let limits = TCPListener.raiseDescriptorLimit()
        let threads = configuration.threads > 0 ? configuration.threads : EventLoopGroup.coreCount
        // Reserve: listeners, epoll and eventfds, the Unix socket and its clients, logs, and the shed slot.
        let reserve = 32 + 4 * threads
        let derivedLimit = max(16, limits.soft - reserve)
        let maxConnections = configuration.maxConnections > 0 ? min(configuration.maxConnections, derivedLimit) : derivedLimit
        // TLS clients over the limit are answered inside TLS only with descriptors that --max-connections leaves
        // below the reserve (the Unix socket's publishers must always find one).
        let busyAnswers = min(ClientAcceptor.maxBusyTLSAnswers, (derivedLimit - maxConnections) / threads)
        if configuration.maxConnections > derivedLimit {
            logger.warn("--max-connections \(configuration.maxConnections) is above what the open-file limit (\(limits.soft)) allows; using \(derivedLimit)")
        }

        let (verifier, authDescription) = try makeVerifier(configuration, logger: logger)
        let tls = try makeTLS(configuration)
        // Bind first, build after: the client ports are ours (and their addresses known) before anything that
        // serves them exists; a later failure closes them again on the way out.
        let mainSocket: BoundTCPSocket
        do {
            if let fd = activation?.ws {
                mainSocket = try BoundTCPSocket.adopt(fd: fd, clientSpeaksFirst: true)
            } else {
                mainSocket = try BoundTCPSocket.bind(configuration.listen, clientSpeaksFirst: true)
            }
        } catch {
            throw StartError("cannot listen on \(activation?.ws != nil ? "the ws socket passed by the service manager" : configuration.listen): \(error)")
        }
        var tlsSocket: BoundTCPSocket? = nil
        if tls != nil, configuration.tlsListen != nil || activation?.wss != nil {
            do {
                if let fd = activation?.wss {
                    tlsSocket = try BoundTCPSocket.adopt(fd: fd, clientSpeaksFirst: true)
                } else if let tlsListen = configuration.tlsListen {
                    tlsSocket = try BoundTCPSocket.bind(tlsListen, clientSpeaksFirst: true)
                }
            } catch {
                throw StartError("cannot listen on \(activation?.wss != nil ? "the wss socket passed by the service manager" : configuration.tlsListen ?? ""): \(error)")
            }
        }
        let address = mainSocket.address.description
        let group = try EventLoopGroup(loopCount: threads)
        let contexts = group.loops.map { LoopContext(loop: $0, channelCount: configuration.channels.count) }
        contexts[0].ledger = PublishLedger(channelNames: configuration.channels)

        var redisBroker: RedisBroker? = nil
        if let endpoint = configuration.broker {
            redisBroker = RedisBroker(channelNames: configuration.channels, shards: contexts.map { LoopShard(context: $0) },
                                      options: configuration.redisBrokerOptions(endpoint), loop: group.loops[0], log: log)
        }
        if let broker = redisBroker {
            // Cluster-wide tails: loop 0's ledger tells the other nodes of its tails and forwards them its events.
            let ledgerContext = contexts[0]
            ledgerContext.ledger?.cluster = PublishLedger.TailLinks(
                nodeID: broker.nodeID, announce: { broker.sendTail($0, to: nil) }, forward: { broker.sendTail($1, to: $0) })
            broker.setTailHandler { message in
                ledgerContext.loop.execute { ledgerContext.ledger?.received(message, now: monotonicNanos()) }
            }
        }
        // In cluster mode numbering and history live in Redis: no state file.
        let saved = redisBroker == nil ? StateFile.load(directory: configuration.stateDirectory, log: log) : nil
        let core = HubCore(configuration: configuration, verifier: verifier, authDescription: authDescription, contexts: contexts,
                           maxConnections: maxConnections, descriptorLimit: limits.soft,
                           listenAddress: address, log: log, logger: logger, restoring: saved, clusterNode: redisBroker)
        for context in contexts {
            context.hub = core
            context.loop.execute { context.startHousekeeping() }
        }

        let unix: UnixListener
        do {
            let acceptor: @Sendable (EventLoop) -> any ListenerDelegate = { _ in SocketAcceptor(context: contexts[0]) }
            if let fd = activation?.publish {
                unix = try UnixListener.adopt(fd: fd, on: group.loops[0], makeDelegate: acceptor)
            } else {
                unix = try UnixListener.bind(path: configuration.socketPath, on: group.loops[0], makeDelegate: acceptor)
            }
        } catch {
            group.shutdown()
            if saved != nil { core.saveState() }  // the state file was consumed at load: the next start resumes from this one
            throw StartError("cannot listen on the Unix socket \(activation?.publish != nil ? "passed by the service manager" : configuration.socketPath): \(error)")
        }
        // With a certificate and neither --tls-listen nor a passed wss socket, the one listener speaks TLS.
        let mainTLS = configuration.tlsListen == nil && activation?.wss == nil ? tls : nil
        let tcp: TCPListener
        var tlsTCP: TCPListener? = nil
        do {
            tcp = try TCPListener.serve(mainSocket, on: group.loops) { loop in
                ClientAcceptor(context: contexts[loop.index], tls: mainTLS, busyAnswers: busyAnswers)
            }
            if let tlsSocket, let tls {
                do {
                    tlsTCP = try TCPListener.serve(tlsSocket, on: group.loops) { loop in
                        ClientAcceptor(context: contexts[loop.index], tls: tls, busyAnswers: busyAnswers)
                    }
                } catch {
                    tcp.close()
                    throw error
                }
            }
        } catch {
            unix.close()
            group.shutdown()
            if saved != nil { core.saveState() }
            throw StartError("cannot serve the client ports: \(error)")
        }
        redisBroker?.start()
        var notifier: ServiceNotifier? = nil
        do {
            notifier = try ServiceNotifier(environment: ProcessInfo.processInfo.environment)
        } catch {
            logger.warn("not notifying the service manager: \(error)")
        }
        let server = HubServer(core: core, group: group, tcp: tcp, tlsTCP: tlsTCP, unix: unix, listenAddress: address,
                               socketPath: unix.path, tls: tls, notifier: notifier, activated: activation != nil,
                               reload: reload)
        let urls = (mainTLS != nil ? "wss://" : "ws://") + "\(address)/ws" + (tlsTCP.map { " and wss://\($0.address)/ws" } ?? "")
        log("hub \(HubVersion.string) listening on \(urls) (\(threads) threads, up to \(maxConnections) connections)"
            + "; socket \(unix.path)" + (activation != nil ? " (sockets from the service manager)" : "") + "; channels \(configuration.channels.joined(separator: ","))"
            + "; auth \(authDescription)" + (configuration.echo ? "; /echo enabled" : ""))
        core.logRecoveryStart(restored: saved)
        if let notifier {
            // Everything is bound and the state is loaded: the manager may now send traffic and start dependents.
            notifier.send("READY=1\nSTATUS=\(server.statusLine(messagesInPerSecond: 0, messagesOutPerSecond: 0))")
            let thread = Thread { [server] in server.runNotifier(notifier) }
            thread.name = "hub-notify"
            thread.start()
        }
        return server
    }

    private init(core: HubCore, group: EventLoopGroup, tcp: TCPListener, tlsTCP: TCPListener?, unix: UnixListener,
                 listenAddress: String, socketPath: String, tls: TLSContext?, notifier: ServiceNotifier?, activated: Bool,
                 reload: (@Sendable () throws(HubConfiguration.ConfigurationError) -> HubConfiguration)?) {
        self.core = core
        self.group = group
        self.tcp = tcp
        self.tlsTCP = tlsTCP
        self.unix = unix
        self.listenAddress = listenAddress
        tlsListenAddress = tlsTCP?.address.description
        self.socketPath = socketPath
        self.tls = tls
        self.notifier = notifier
        self.activated = activated
        reloader = reload
        live = LockedValue(core.configuration)
    }

    /// What `STATUS=` says: `12 connections, 3.0 messages/s in, 40.5 messages/s out`.
    func statusLine(messagesInPerSecond: Double, messagesOutPerSecond: Double) -> String {
        func rate(_ r: Double) -> String { String(Double((r * 10).rounded()) / 10) }
        return "\(core.clientCount) connections, \(rate(messagesInPerSecond)) messages/s in, \(rate(messagesOutPerSecond)) messages/s out"
    }

    /// The notifier's thread: every round (half the watchdog interval, at most 2 s) it pings the watchdog if every
    /// loop ran the previous round's tick, sends `STATUS=`, and posts the next tick to every loop. The tick runs on
    /// the loop's own thread, so a loop stuck in a handler or a syscall misses it and the pings stop.
    private func runNotifier(_ notifier: ServiceNotifier) {
        let period = min(notifier.watchdogPeriodNanos ?? 2_000_000_000, 2_000_000_000)
        let contexts = core.contexts
        let rounds = LockedValue(WatchdogRounds(loops: contexts.count))
        let counted = LockedValue([(messagesIn: Int, messagesOut: Int)](repeating: (0, 0), count: contexts.count))
        var last = (at: monotonicNanos(), messagesIn: 0, messagesOut: 0)
        while !notifierStopped.load(ordering: .relaxed) {
            let deadline = monotonicNanos() + period
            while monotonicNanos() < deadline && !notifierStopped.load(ordering: .relaxed) {
                usleep(UInt32(min(50_000, max(1, (deadline &- monotonicNanos()) / 1000))))
            }
            if notifierStopped.load(ordering: .relaxed) { break }
            let (complete, round) = rounds.withLock { r in (r.begin(), r.round) }
            if complete && notifier.watchdogPeriodNanos != nil { notifier.send("WATCHDOG=1") }
            let now = monotonicNanos()
            let totals = counted.withLock { c in c.reduce((0, 0)) { ($0.0 + $1.messagesIn, $0.1 + $1.messagesOut) } }
            let seconds = Double(now &- last.at) / 1e9
            if seconds > 0 {
                notifier.send("STATUS=" + statusLine(messagesInPerSecond: Double(max(0, totals.0 - last.messagesIn)) / seconds,
                                                     messagesOutPerSecond: Double(max(0, totals.1 - last.messagesOut)) / seconds))
            }
            last = (now, totals.0, totals.1)
            for (i, context) in contexts.enumerated() {
                context.loop.execute {
                    rounds.withLock { $0.tick(loop: i, round: round) }
                    let sample = (messagesIn: context.counters.messagesIn, messagesOut: context.counters.messagesOut)
                    counted.withLock { $0[i] = sample }
                }
            }
        }
    }

    /// The answer to a peer that speaks plain HTTP to a TLS port, in the clear.
    static let plaintextToTLSResponse = HTTPError(status: 400, code: "TLS_REQUIRED",
                                                  message: "this port speaks TLS: connect with wss:// (or https://)").response()

    /// The TLS context from `--tls-cert`/`--tls-key`, or nil; a bad or mismatched pair stops the start.
    static func makeTLS(_ c: HubConfiguration) throws -> TLSContext? {
        guard let cert = c.tlsCertificateFile, let key = c.tlsKeyFile else { return nil }
        do {
            try SecretFile.checkTrusted(path: cert, what: "TLS certificate file")
            try SecretFile.checkTrusted(path: key, what: "TLS key file")
            return try TLSContext.server(certificateFile: cert, keyFile: key, plaintextAnswer: plaintextToTLSResponse,
                                         records: c.tlsRecords)
        } catch {
            throw StartError("TLS: \(error)")
        }
    }

    /// Reloads the certificate and key from their files (SIGHUP). Established connections keep theirs; new ones get
    /// the new pair. On failure the old pair stays and the error says why.
    /// - Returns: a line for the log.
    @discardableResult
    public func reloadTLS() -> String {
        let (cert, key) = live.withLock { ($0.tlsCertificateFile, $0.tlsKeyFile) }
        guard let tls, let cert, let key else {
            return "nothing to reload (no TLS certificate is configured); still serving"
        }
        do {
            try SecretFile.checkTrusted(path: cert, what: "TLS certificate file")
            try SecretFile.checkTrusted(path: key, what: "TLS key file")
            try tls.reload(certificateFile: cert, keyFile: key)
            return "reloaded the TLS certificate \(cert) and key \(key); new connections use them"
        } catch {
            return "TLS reload failed, keeping the previous certificate: \(error)"
        }
    }

    /// SIGHUP: reads the configuration again and applies what can change while clients stay connected (the TLS
    /// certificate and key, allowed origins, rate limit, recovery maximum, log level); every other change is refused
    /// with a line saying it needs a restart, and the hub keeps the running value. An invalid configuration changes
    /// nothing. Then the certificate is reloaded from its (possibly new) files.
    /// - Returns: the lines for the log.
    func reload() -> [String] {
        var lines: [String] = []
        let current = live.withLock { $0 }
        if let reloader {
            do {
                let fresh = try reloader()
                var next = current
                var applied: [String] = [], refused: [String] = []
                for option in HubConfiguration.options {
                    let before = HubConfiguration.fileValue(option.name, current), after = HubConfiguration.fileValue(option.name, fresh)
                    guard before != after else { continue }
                    if Self.reloadableOptions.contains(option.name) && (tls != nil || !option.name.hasPrefix("tls-")) {
                        applied.append(option.name)
                    } else {
                        refused.append(option.name)
                    }
                }
                if applied.contains("tls-cert") || applied.contains("tls-key") {
                    next.tlsCertificateFile = fresh.tlsCertificateFile
                    next.tlsKeyFile = fresh.tlsKeyFile
                }
                next.allowedOrigins = fresh.allowedOrigins
                next.rateLimitPerMinute = fresh.rateLimitPerMinute
                next.recoveryMax = fresh.recoveryMax
                next.logLevel = fresh.logLevel
                live.withLock { $0 = next }
                core.logger.setLevel(next.logLevel)
                let settings = ReloadableSettings(next)
                for context in core.contexts { context.loop.execute { context.reloaded = settings } }
                for name in refused {
                    lines.append("received SIGHUP: \(name) changed, which needs a restart; keeping the running value")
                }
                let source = fresh.configFile.map { " from \($0)" } ?? ""
                if !applied.isEmpty {
                    lines.append("received SIGHUP: reloaded the configuration\(source): \(applied.joined(separator: ", "))")
                } else if fresh.configFile != nil {
                    lines.append("received SIGHUP: reloaded the configuration\(source): nothing that applies while running changed")
                }
            } catch {
                lines.append("received SIGHUP: the configuration is not valid, keeping the running one: \(error.message)")
            }
        }
        lines.append("received SIGHUP: " + reloadTLS())
        return lines
    }

    struct StartError: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    /// The token verifier from the configuration: a public key, a secret file, `HUB_JWT_SECRET`, or a generated
    /// secret in the state directory (the zero-configuration path).
    static func makeVerifier(_ c: HubConfiguration, logger: HubLogger) throws -> (JWTVerifier, String) {
        do {
            if let path = c.jwtPublicKeyFile {
                // Read like a secret (a regular file, not writable by others): whoever can replace it can mint tokens.
                let pem = String(decoding: try SecretFile.read(path: path, what: "JWT public key file").secret, as: UTF8.self)
                let verifier = try JWTVerifier(key: .publicKeyPEM(pem), issuer: c.jwtIssuer, audience: c.jwtAudience, leeway: c.jwtLeewaySeconds)
                return (verifier, "\(verifier.algorithm.rawValue) (public key \(path))")
            }
            if let secret = c.jwtSecret {
                let verifier = try JWTVerifier(key: .hmacSecret(Array(secret.utf8)), issuer: c.jwtIssuer, audience: c.jwtAudience, leeway: c.jwtLeewaySeconds)
                return (verifier, "HS256 (secret from HUB_JWT_SECRET)")
            }
            let loaded: SecretFile.Loaded
            let description: String
            if let path = c.jwtSecretFile {
                loaded = try SecretFile.read(path: path)
                description = "HS256 (secret file \(path))"
            } else {
                loaded = try SecretFile.loadOrCreate(stateDirectory: c.stateDirectory)
                description = "HS256 (secret file \(loaded.path))"
                if loaded.created {
                    logger.info("no JWT secret configured: generated a random one in \(loaded.path) (mode 0600); mint tokens with `hubctl token ACCOUNT`")
                }
            }
            if loaded.groupOrWorldReadable {
                logger.warn("\(loaded.path) is readable by other users; chmod 600 it")
            }
            let verifier = try JWTVerifier(key: .hmacSecret(loaded.secret), issuer: c.jwtIssuer, audience: c.jwtAudience, leeway: c.jwtLeewaySeconds)
            return (verifier, description)
        } catch let error as StartError {
            throw error
        } catch {
            throw StartError("JWT configuration: \(error)")
        }
    }

    /// Graceful shutdown: `/readyz` answers 503 at once, every client is closed with 1001, spread over
    /// `--drain-duration` (a load balancer's other hubs take the reconnects at a rate they can absorb), then up to
    /// `--shutdown-timeout` for the close handshakes; the Unix socket is removed and the loops stop.
    ///
    /// Without socket activation the listeners stay open during the drain, so probes see `/readyz` 503 and new clients
    /// get 503 with `Retry-After`; under activation the hub stops accepting first and new connections wait in the
    /// kernel's queue for the next process.
    public func shutdown() {
        notifierStopped.store(true, ordering: .relaxed)
        notifier?.send("STOPPING=1")
        if activated {
            // The manager keeps the listening sockets: once this process stops accepting, new clients and publishers
            // wait in the kernel's queue for the next one. Publishes on connections already open are still taken
            // until the loops stop (the state saved after that holds them, and resuming clients get them).
            tcp.close()
            tlsTCP?.close()
            unix.close()
            core.beginShutdown(keepPublishing: true)
        } else {
            core.beginShutdown()
        }
        drainClients()
        if !activated {
            tcp.close()
            tlsTCP?.close()
            unix.close()
        }
        let deadline = monotonicNanos() + UInt64(core.configuration.shutdownTimeoutSeconds) * 1_000_000_000
        while core.clientCount > 0 && monotonicNanos() < deadline {
            usleep(20_000)
        }
        let remaining = core.clientCount
        if remaining > 0 { core.logger.warn("shutdown: \(remaining) connections did not finish the close handshake in time; closing them") }
        // Cluster mode: leave the node registry and drop this node's presence while its loop still runs.
        core.clusterNode?.shutdown()
        group.shutdown()
        core.saveState()
        core.log("hub stopped")
    }

    /// The default drain rate: 10 000 connections per 2 s (what Phoenix drains at), so a deploy does not send every
    /// client to the other hubs at once.
    public static let drainConnectionsPerSecond = 5_000.0

    /// Closes every client with 1001 over `--drain-duration` (default: at `drainConnectionsPerSecond`): in steps 50 ms
    /// apart, each loop closes its share of its own clients, so the closes are spread evenly in time.
    private func drainClients() {
        let contexts = core.contexts
        let seconds = core.configuration.drainDurationSeconds.map(Double.init)
            ?? Double(core.clientCount) / Self.drainConnectionsPerSecond
        let steps = max(1, Int((seconds * 20).rounded(.up)))
        if steps > 1 { core.log("shutdown: draining \(core.clientCount) connections over \(seconds)s") }
        let queues = contexts.map { LoopBound(DrainQueue(), loop: $0.loop) }
        for (context, queue) in zip(contexts, queues) {
            context.loop.execute { queue.value.pending = Array(context.clients.values) }
        }
        let start = monotonicNanos()
        for step in 1...steps {
            for (context, queue) in zip(contexts, queues) {
                context.loop.execute { queue.value.close(step: step, of: steps) }
            }
            guard step < steps else { break }
            let next = start + UInt64(seconds * 1e9 * Double(step) / Double(steps))
            while monotonicNanos() < next { usleep(UInt32(min(50_000, max(1, (next &- monotonicNanos()) / 1000)))) }
        }
    }

    /// Current client connections (all phases), for tests and embedding.
    public var clientCount: Int { core.clientCount }
}

/// One loop's clients at the start of a drain, closed in order a share at a time. Touched only on its loop.
final class DrainQueue {
    var pending: [ClientConnection] = []
    private var closed = 0

    /// Closes clients until `step` of `steps` shares of them are closed (the last step closes the rest).
    func close(step: Int, of steps: Int) {
        let target = step >= steps ? pending.count : (pending.count * step + steps - 1) / steps
        while closed < min(target, pending.count) {
            pending[closed].close(code: .goingAway, reason: "the hub is shutting down")
            closed += 1
        }
        if step >= steps { pending = [] }
    }
}

/// Accepts client connections on one loop.
final class ClientAcceptor: ListenerDelegate {
    let context: LoopContext
    /// Set on a TLS listener: every connection it accepts speaks TLS.
    let tls: TLSContext?
    /// How many TLS clients over the limit this loop answers inside TLS at once (`maxBusyTLSAnswers` at most).
    let busyAnswers: Int
    init(context: LoopContext, tls: TLSContext?, busyAnswers: Int = 0) {
        self.context = context
        self.tls = tls
        self.busyAnswers = busyAnswers
    }

    static let busyResponse = HTTPError(status: 503, code: "SERVICE_UNAVAILABLE", message: "the hub is at its connection limit; retry later",
                                        headers: [("Retry-After", "5")]).response()
    /// A fatal TLS alert record, internal_error (RFC 8446 §6.2: "unrelated to the peer or the correctness of the
    /// protocol"), in the clear as before a handshake: how a TLS port refuses when it cannot even hold the
    /// connection for a handshake. A TLS client reports it at once ("tlsv1 alert internal error").
    static let busyTLSAlert: [UInt8] = [21, 3, 3, 0, 2, 2, 80]
    /// Per loop, how many TLS connections over the limit are answered 503 inside TLS at once at most (each costs a
    /// handshake and a descriptor for up to the handshake timeout); beyond it they get `busyTLSAlert`.
    static let maxBusyTLSAnswers = 64

    func accepted(fd: Int32, peer: String, on loop: EventLoop) {
        let hub = context.hub!  // set for every context before any listener exists (HubServer.start)
        let admitted = hub.admitClient()
        if !admitted {
            context.counters.rejectedConnections += 1
            // A plain client reads the 503 at once; a TLS client can read it only after a handshake.
            guard tls != nil, context.counters.busyTLSAnswers < busyAnswers else {
                refuse(fd)
                Glibc.close(fd)
                return
            }
        }
        let client = ClientConnection(context: context, serial: context.nextSerial)
        context.nextSerial += 1
        client.answersBusy = !admitted
        do {
            client.connection = try Connection(adopting: fd, on: loop, peer: peer, handler: client,
                                               maxQueuedBytes: hub.configuration.maxQueuedBytes, tls: tls)
        } catch {
            if admitted { hub.clientClosed() }
            return
        }
        if !admitted { context.counters.busyTLSAnswers += 1 }
        context.clients[client.serial] = client
        client.start()
        // The listener defers accepts until the client has sent something (`clientSpeaksFirst`): its request is
        // almost always here already, so it is read now rather than after another trip through `epoll_wait`.
        client.connection?.readEarly()
    }

    func shedding(fd: Int32, on loop: EventLoop) {
        context.hub.descriptorsStillExhausted()
        refuse(fd)
    }

    func descriptorsExhausted(errno: Int32, on loop: EventLoop) {
        let limit = context.hub.descriptorLimit
        context.hub.descriptorsExhausted("out of file descriptors (\(errno == EMFILE ? "EMFILE: the process limit \(limit)" : "ENFILE: the system limit") is reached): refusing new clients with HTTP 503 until descriptors free up")
    }

    /// Answers 503 (a TLS listener: `busyTLSAlert`) on a connection about to be closed. Its request (or hello;
    /// already here: accepts wait for it) is read
    /// and dropped first: closing a socket with unread input resets the connection, and the reset can destroy the
    /// answer before the client reads it.
    private func refuse(_ fd: Int32) {
        withUnsafeTemporaryAllocation(byteCount: 4096, alignment: 1) { scratch in
            var reads = 0  // at most 64 KiB: a client that keeps sending gets its reset
            while reads < 16, recv(fd, scratch.baseAddress, scratch.count, Int32(MSG_DONTWAIT)) == scratch.count { reads += 1 }
        }
        let answer = tls == nil ? Self.busyResponse : Self.busyTLSAlert
        _ = answer.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }
}

/// Accepts Unix-socket connections (publishers, hubctl) on loop 0.
final class SocketAcceptor: ListenerDelegate {
    let context: LoopContext
    init(context: LoopContext) { self.context = context }

    func accepted(fd: Int32, peer: String, on loop: EventLoop) {
        let handler = SocketConnection(context: context)
        do {
            // The connection bounds what it owes its peer itself (`SocketConnection.maxOwedBytes`); the queue holds
            // at most this much of it.
            handler.connection = try Connection(adopting: fd, on: loop, peer: peer, handler: handler,
                                                maxQueuedBytes: SocketConnection.maxQueuedBytes)
        } catch {
            return
        }
    }
}
