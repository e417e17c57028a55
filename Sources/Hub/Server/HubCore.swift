import Glibc
import HubAuth
import HubCluster
import HubEngine
import HubJSON
import HubRouting
import HubSupport
import Synchronization
import WSProtocol

/// What every loop shares: configuration, the channel table, the token verifier, the broker, and the few
/// process-wide counters that must be atomic (client connections against the limit). Immutable after start
/// except for those atomics.
final class HubCore: Sendable {
    let configuration: HubConfiguration
    /// `--rate-limit` per minute, the rule every connection's `RateLimiter` applies.
    let rateLimit: RateLimit
    let channelNames: [String]
    let channelIndex: ChannelIndex
    let verifier: JWTVerifier
    let authDescription: String
    let contexts: [LoopContext]
    /// Numbers, keeps and carries events: the embedded `LocalBroker`, or a `RedisBroker` shared with other hubs.
    let broker: any Broker
    /// In cluster mode, this hub as a node of the cluster (the same object as `broker`): its id, the other nodes,
    /// admin requests across nodes, history in Redis. nil for the embedded broker.
    let clusterNode: RedisBroker?
    let maxConnections: Int
    let descriptorLimit: Int
    /// The client port's address ("127.0.0.1:8080"), bound before the core is built.
    let listenAddress: String
    let startedAt = wallClockSeconds()
    /// Plain info lines (`logger.lines`): most of the hub's log.
    let log: @Sendable (String) -> Void
    /// The logger itself, for lines with a level or fields.
    let logger: HubLogger
    private let openClients = Atomic<Int>(0)
    private let shuttingDown = Atomic<Bool>(false)
    private let capacityWarned = Atomic<Bool>(false)
    /// When a client was last refused for want of descriptors (monotonic ns; 0: never).
    private let lastDescriptorExhaustion = Atomic<UInt64>(0)
    /// Open upgraded `/ws` connections per account, against `--max-connections-per-account`. Touched once per
    /// connection set-up and once per close, never per message.
    private let perAccount = LockedValue<[AccountID: Int]>([:])

    init(configuration: HubConfiguration, verifier: JWTVerifier, authDescription: String, contexts: [LoopContext],
         maxConnections: Int, descriptorLimit: Int, listenAddress: String, log: @escaping @Sendable (String) -> Void,
         logger: HubLogger? = nil, restoring saved: SavedBrokerState? = nil, clusterNode: RedisBroker? = nil) {
        self.configuration = configuration
        rateLimit = RateLimit(limit: configuration.rateLimitPerMinute, periodSeconds: 60)
        channelNames = configuration.channels
        channelIndex = ChannelIndex(configuration.channels)
        self.verifier = verifier
        self.authDescription = authDescription
        self.contexts = contexts
        self.clusterNode = clusterNode
        broker = clusterNode ?? LocalBroker(channelNames: configuration.channels, shards: contexts.map { LoopShard(context: $0) },
                                            options: configuration.brokerOptions, restoring: saved)
        self.maxConnections = maxConnections
        self.descriptorLimit = descriptorLimit
        self.listenAddress = listenAddress
        self.log = log
        self.logger = logger ?? HubLogger(lines: log)
        clusterNode?.setControlHandler { [weak self] line, done in
            guard let self else { return done([]) }
            self.answerOtherNode(line, done)
        }
        clusterNode?.setNodeInfo { [weak self] done in
            guard let self else { return done("{}") }
            self.nodeInfoJSON(done)
        }
    }

    var isShuttingDown: Bool { shuttingDown.load(ordering: .relaxed) }
    /// Whether publishes get `SHUTTING_DOWN`: from the start of a shutdown, unless the listening sockets outlive the
    /// process (socket activation), where publishes are taken until the loops stop.
    var refusesPublishes: Bool { shuttingDown.load(ordering: .relaxed) && !publishesUntilStopped.load(ordering: .relaxed) }
    private let publishesUntilStopped = Atomic<Bool>(false)
    func beginShutdown(keepPublishing: Bool = false) {
        publishesUntilStopped.store(keepPublishing, ordering: .relaxed)
        shuttingDown.store(true, ordering: .relaxed)
    }
    var clientCount: Int { openClients.load(ordering: .relaxed) }

    /// Claims a client slot; false (and one log line per burst) when the hub is at its connection limit.
    func admitClient() -> Bool {
        let now = openClients.add(1, ordering: .relaxed).newValue
        if now <= maxConnections { return true }
        openClients.subtract(1, ordering: .relaxed)
        if !capacityWarned.exchange(true, ordering: .relaxed) {
            logger.warn("at the connection limit (\(maxConnections)): refusing new clients with HTTP 503 until connections close (raise the open-file limit or --max-connections)")
        }
        return false
    }

    /// Descriptor exhaustion: every loop's listener reports its own burst, so the hub logs only the first report of
    /// a burst for the whole hub (as OPERATIONS.md says). A burst ends after a second without a refusal. Not at an
    /// accept: during a burst a descriptor another loop frees for an instant (a refused client's, before its
    /// listener takes back its reserve) can let one client in between two refusals.
    func descriptorsExhausted(_ message: @autoclosure () -> String) {
        let now = monotonicNanos()
        let last = lastDescriptorExhaustion.exchange(now, ordering: .relaxed)
        if last == 0 || now &- last > 1_000_000_000 { log(message()) }
    }

    /// A client was refused for want of descriptors (each one, not only a burst's first): the burst goes on.
    func descriptorsStillExhausted() {
        lastDescriptorExhaustion.store(monotonicNanos(), ordering: .relaxed)
    }

    /// Counts one more connection for `account`; false (and nothing counted) when it already holds the maximum.
    func admitAccount(_ account: AccountID) -> Bool {
        let limit = configuration.maxConnectionsPerAccount
        // One hash of the account each way: the count is changed in place (`inout` through the defaulted subscript;
        // a refusal happens only at a count >= 1, so it never leaves a new zero behind), and found once on release.
        func admit(_ n: inout Int) -> Bool {
            guard n < limit else { return false }
            n += 1
            return true
        }
        return perAccount.withLock { counts in admit(&counts[account, default: 0]) }
    }

    func releaseAccount(_ account: AccountID) {
        perAccount.withLock { counts in
            guard let i = counts.index(forKey: account) else { return }
            if counts.values[i] <= 1 { counts.remove(at: i) } else { counts.values[i] -= 1 }
        }
    }

    func clientClosed() {
        let now = openClients.subtract(1, ordering: .relaxed).newValue
        if now < maxConnections * 9 / 10, capacityWarned.load(ordering: .relaxed) {
            if capacityWarned.exchange(false, ordering: .relaxed) { log("below the connection limit again (\(now) open)") }
        }
    }

    // MARK: Recovery state

    /// After a successful start: says which epoch the hub numbers in. The state file it resumed from is already
    /// gone (`StateFile.load` consumes it); from here on only a graceful stop writes one, so a crash or kill -9 means
    /// a new epoch next time.
    /// The embedded broker, for what only it does (recovery state, the state file); nil in cluster mode.
    private var localBroker: LocalBroker? { broker as? LocalBroker }

    func logRecoveryStart(restored saved: SavedBrokerState?) {
        guard localBroker != nil else {
            log("recovery: numbering and history live in Redis (cluster mode); no state file is used")
            return
        }
        let stats = broker.statistics()
        if let localBroker, !localBroker.historyReserved {
            logger.warn("recovery: could not reserve \(configuration.historyMemoryBytes) bytes for the history ring (mmap failed); "
                + "no events are kept, every resume answers too_old. Lower --history-memory")
        }
        if let saved {
            let age = max(0, wallClockSeconds() - saved.savedAt)
            log("recovery: resumed epoch \(stats.epoch) saved \(Int(age))s ago: \(stats.streams) streams, \(stats.events) events in history"
                + ", \(stats.idempotencyKeys) idempotency keys")
        } else {
            log("recovery: new epoch \(stats.epoch) (no saved state)")
        }
    }

    /// At the end of a graceful stop, once the loops have stopped: writes the epoch, every stream's numbering, the
    /// history and the idempotency keys to the state directory for the next start.
    func saveState() {
        guard let localBroker else { return }  // cluster mode: nothing to save (RedisBroker.shutdown left the cluster)
        let saved = localBroker.exportState()
        let bytes = StateFile.encode(saved)
        do throws(StateFile.Invalid) {
            try StateFile.write(bytes, directory: configuration.stateDirectory)
            log("recovery: saved epoch \(saved.hubEpoch): \(saved.streams.count) streams, \(saved.events.count) events, "
                + "\(saved.keys.count) idempotency keys (\(bytes.count) bytes) to \(StateFile.path(in: configuration.stateDirectory))")
        } catch {
            logger.error("recovery: could not save the state: \(error.description); the next start begins a new epoch")
        }
    }

    // MARK: Gathering from every loop

    /// Runs `body` on every loop and calls `done` with the results in loop order (on the last loop's thread).
    func gather<T: Sendable>(_ body: @escaping @Sendable (LoopContext) -> T, _ done: @escaping @Sendable ([T]) -> Void) {
        let results = LockedValue<(values: [T?], remaining: Int)>((Array(repeating: nil, count: contexts.count), contexts.count))
        for (i, context) in contexts.enumerated() {
            context.loop.execute {
                let value = body(context)
                let all: [T]? = results.withLock { state in
                    state.values[i] = value
                    state.remaining -= 1
                    // remaining reaches 0 only after every loop stored its value: none is nil then.
                    return state.remaining == 0 ? state.values.compactMap { $0 } : nil
                }
                if let all { done(all) }
            }
        }
    }

    // MARK: HTTP endpoints

    /// `/healthz`: `connections` counts open WebSocket connections (as `stats` and `hub_connections` do), not
    /// every TCP connection: the probe's own connection and other handshakes are not connections yet. In cluster
    /// mode, a node that cannot reach Redis answers 503 `degraded` (a load balancer sends new clients elsewhere; its
    /// connected clients stay).
    func gatherHealthJSON(_ done: @escaping @Sendable (Int, String) -> Void) {
        gather({ $0.counters.upgraded }) { [self] counts in
            let cluster = clusterNode?.cluster
            let degraded = cluster.map { !$0.healthy } ?? false
            done(degraded ? 503 : 200, healthJSON(connections: counts.reduce(0, +), cluster: cluster))
        }
    }

    func healthJSON(connections: Int, cluster: ClusterStatistics? = nil) -> String {
        var w = JSONWriter(capacity: 256)
        w.beginObject()
        let degraded = cluster.map { !$0.healthy } ?? false
        w.field("status", isShuttingDown ? "shutting_down" : degraded ? "degraded" : "ok")
        w.field("version", HubVersion.string)
        w.field("uptimeSeconds", wallClockSeconds() - startedAt)
        w.field("connections", connections)
        if let cluster {
            w.key("broker"); w.beginObject()
            w.field("kind", "redis")
            w.field("node", cluster.nodeID)
            w.field("connected", cluster.connected)
            w.field("subscribed", cluster.subscribed)
            if let error = cluster.lastError { w.field("lastError", error) }
            w.endObject()
        }
        w.endObject()
        return String(decoding: w.bytes, as: UTF8.self)
    }

    func gatherMetricsText(_ done: @escaping @Sendable (String) -> Void) {
        gather({ LoopSnapshot(context: $0, includeLatency: true) }) { [self] snapshots in
            done(MetricsText.render(snapshots: snapshots, channelNames: channelNames, maxConnections: maxConnections,
                                    descriptorLimit: descriptorLimit, openDescriptors: openDescriptorCount(),
                                    broker: broker.statistics()))
        }
    }
}

/// What one loop reports for `stats` and `/metrics`.
struct LoopSnapshot: Sendable {
    struct Rates: Sendable {
        var messagesIn = 0.0, messagesOut = 0.0, bytesIn = 0.0, bytesOut = 0.0
    }
    struct LedgerSummary: Sendable {
        var totalPublished: Int
        var totalDelivered: Int
        var rate: Double
        var publishedPerChannel: [Int]
        var deliveredPerChannel: [Int]
    }

    var index: Int
    var busy: Double
    var counters: LoopCounters
    var engine: EngineMetrics
    var subscriptions: Int
    var subscribersPerChannel: [Int]
    var rates: Rates
    var latency: LatencyHistogram?
    var ledger: LedgerSummary?

    init(context: LoopContext, includeLatency: Bool) {
        index = context.loop.index
        busy = context.busyFraction
        counters = context.counters
        engine = context.loop.metrics
        subscriptions = context.registry.totalSubscriptions
        subscribersPerChannel = (0..<context.hub.channelNames.count).map { context.registry.subscriberCount(channel: $0) }
        rates = Rates()
        if let first = context.rateSamples.first, let last = context.rateSamples.last, last.at > first.at {
            let seconds = Double(last.at - first.at) / 1e9
            rates.messagesIn = Double(last.messagesIn - first.messagesIn) / seconds
            rates.messagesOut = Double(last.messagesOut - first.messagesOut) / seconds
            rates.bytesIn = Double(last.bytesIn - first.bytesIn) / seconds
            rates.bytesOut = Double(last.bytesOut - first.bytesOut) / seconds
        }
        latency = includeLatency ? context.latency : nil
        if let ledger = context.ledger {
            self.ledger = LedgerSummary(totalPublished: ledger.totalPublished, totalDelivered: ledger.totalDelivered,
                                        rate: ledger.publishRate(channel: nil),
                                        publishedPerChannel: ledger.channels.map(\.published),
                                        deliveredPerChannel: ledger.channels.map(\.delivered))
        }
    }

    struct Totals {
        var counters = LoopCounters()
        var engine = EngineMetrics()
        var subscriptions = 0
        var rates = Rates()

        mutating func add(_ s: LoopSnapshot) {
            counters.messagesIn += s.counters.messagesIn
            counters.messagesOut += s.counters.messagesOut
            counters.handshaking += s.counters.handshaking
            counters.upgraded += s.counters.upgraded
            counters.slowConsumerCloses += s.counters.slowConsumerCloses
            counters.rateLimited += s.counters.rateLimited
            counters.rejectedConnections += s.counters.rejectedConnections
            counters.protocolErrors += s.counters.protocolErrors
            counters.httpRequests += s.counters.httpRequests
            counters.authFailures.merge(s.counters.authFailures, uniquingKeysWith: +)
            for i in counters.recoveries.indices { counters.recoveries[i] += s.counters.recoveries[i] }
            counters.replayedEvents += s.counters.replayedEvents
            counters.tlsHelloOnPlainPort += s.counters.tlsHelloOnPlainPort
            counters.busyTLSAnswers += s.counters.busyTLSAnswers
            engine = engine + s.engine
            subscriptions += s.subscriptions
            rates.messagesIn += s.rates.messagesIn
            rates.messagesOut += s.rates.messagesOut
            rates.bytesIn += s.rates.bytesIn
            rates.bytesOut += s.rates.bytesOut
        }
    }
}

/// One loop's view of a channel (or of every channel when `channel` is nil, counts only).
struct ChannelSnapshot: Sendable {
    struct LedgerChannel: Sendable {
        var published: Int
        var delivered: Int
        var lastEventAt: Double?
        var rate: Double
        var recent: [RecentEventInfo]
    }
    struct RecentEventInfo: Sendable {
        var type: String, account: AccountID?, seq: UInt64, size: Int, delivered: Int, at: Double
    }
    struct LedgerView: Sendable { var channels: [LedgerChannel] }

    /// Per channel: subscriber count and per-account counts.
    var perChannel: [(subscribers: Int, accounts: [AccountID: Int])]
    var ledger: LedgerView?

    init(context: LoopContext, channel: Int?, account: AccountID?) {
        perChannel = (0..<context.hub.channelNames.count).map { i in
            (context.registry.subscriberCount(channel: i), context.registry.accountCounts(channel: i))
        }
        if let ledger = context.ledger {
            self.ledger = LedgerView(channels: ledger.channels.indices.map { i in
                let record = ledger.channels[i]
                let recent = channel == i ? ledger.recentEvents(channel: i).map {
                    RecentEventInfo(type: $0.type, account: $0.account, seq: $0.seq, size: $0.size, delivered: $0.delivered, at: $0.at)
                } : []
                return LedgerChannel(published: record.published, delivered: record.delivered, lastEventAt: record.lastEventAt,
                                     rate: ledger.publishRate(channel: i), recent: recent)
            })
        }
    }

    static func merge(_ snapshots: [ChannelSnapshot], channel: Int) -> (subscribers: Int, accounts: [AccountID: Int]) {
        var subscribers = 0
        var accounts: [AccountID: Int] = [:]
        for s in snapshots {
            subscribers += s.perChannel[channel].subscribers
            accounts.merge(s.perChannel[channel].accounts, uniquingKeysWith: +)
        }
        return (subscribers, accounts)
    }
}

/// One connection as `hubctl connections` shows it.
struct ConnectionInfo: Sendable {
    var id: String, account: AccountID, remote: String, platform: String?, appVersion: String?
    var channels: [Int], connectedAt: Double, queuedBytes: Int, messagesIn: Int, messagesOut: Int

    init(_ c: ClientConnection) {
        id = c.id
        account = c.account
        remote = c.connection?.peer ?? ""
        platform = c.platform
        appVersion = c.appVersion
        channels = Array(c.channels)
        connectedAt = c.connectedAt
        queuedBytes = c.connection?.queuedBytes ?? 0
        messagesIn = c.messagesIn
        messagesOut = c.messagesOut
    }
}

extension HubConfiguration {
    /// The cluster broker's options: the same history and idempotency settings, kept in Redis.
    func redisBrokerOptions(_ endpoint: RedisEndpoint) -> RedisBrokerOptions {
        var o = RedisBrokerOptions(endpoint: endpoint)
        o.historySize = historySize
        o.historyTTLMillis = historyTTLSeconds * 1000
        o.idempotencyWindowMillis = idempotencyWindowSeconds * 1000
        o.layout = brokerFanout
        return o
    }

    /// The local broker's history and idempotency options.
    var brokerOptions: LocalBrokerOptions {
        LocalBrokerOptions(history: HistoryLimits(size: historySize, ttlNanos: UInt64(historyTTLSeconds) * 1_000_000_000,
                                                  memoryBytes: historyMemoryBytes),
                           idempotencyWindowNanos: UInt64(idempotencyWindowSeconds) * 1_000_000_000,
                           idempotencyMaxKeys: idempotencyMaxKeys)
    }
}

/// Descriptors this process has open (for `stats` and `/metrics`).
func openDescriptorCount() -> Int {
    guard let dir = opendir("/proc/self/fd") else { return -1 }
    defer { closedir(dir) }
    var n = 0
    while let entry = readdir(dir) {
        let name = entry.pointee.d_name.0
        if name != 0x2E { n += 1 }  // skip "." and ".."
    }
    return n - 1  // the directory stream's own descriptor
}

/// What the live nodes of a cluster say of themselves in the registry (each refreshed at its heartbeat, every second).
struct ClusterView: Sendable {
    var nodes: Int
    var connections = 0
    var subscriptions: [String: Int] = [:]
}
