import Glibc
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
    let broker: any Broker
    /// The same broker, for what only the local one does (its state file); nil in cluster mode.
    let localBroker: LocalBroker?
    /// The same broker in cluster mode.
    let redisBroker: RedisBroker?
    let maxConnections: Int
    let descriptorLimit: Int
    private let listenAddressProvider: @Sendable () -> String
    var listenAddress: String { listenAddressProvider() }
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
    private let perAccount = Mutex<[AccountID: Int]>([:])

    init(configuration: HubConfiguration, verifier: JWTVerifier, authDescription: String, contexts: [LoopContext],
         maxConnections: Int, descriptorLimit: Int, listenAddress: @escaping @Sendable () -> String, log: @escaping @Sendable (String) -> Void,
         logger: HubLogger? = nil, restoring saved: SavedBrokerState? = nil, redisBroker: RedisBroker? = nil) {
        self.configuration = configuration
        rateLimit = RateLimit(limit: configuration.rateLimitPerMinute, periodSeconds: 60)
        channelNames = configuration.channels
        channelIndex = ChannelIndex(configuration.channels)
        self.verifier = verifier
        self.authDescription = authDescription
        self.contexts = contexts
        if let redisBroker {
            self.redisBroker = redisBroker
            localBroker = nil
            broker = redisBroker
        } else {
            let local = LocalBroker(channelNames: configuration.channels, shards: contexts.map { LoopShard(context: $0) },
                                    options: configuration.brokerOptions, restoring: saved)
            self.redisBroker = nil
            localBroker = local
            broker = local
        }
        self.maxConnections = maxConnections
        self.descriptorLimit = descriptorLimit
        listenAddressProvider = listenAddress
        self.log = log
        self.logger = logger ?? HubLogger(lines: log)
        redisBroker?.setControlHandler { [weak self] line, done in
            guard let self else { return done([]) }
            self.answerOtherNode(line, done)
        }
        redisBroker?.setNodeInfo { [weak self] done in
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
        let results = Mutex<(values: [T?], remaining: Int)>((Array(repeating: nil, count: contexts.count), contexts.count))
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

    // MARK: Admin replies (the fields after "ok":true; docs/PROTOCOL.md 2.2)

    func statsJSON(id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        clusterView { [self] view in self.statsJSON(id: id, clusterView: view, done) }
    }

    private func statsJSON(id: RawJSON?, clusterView: ClusterView?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        gather({ LoopSnapshot(context: $0, includeLatency: false) }) { [self] snapshots in
            var w = JSONWriter(capacity: 2048)
            SocketReplies.beginOK(into: &w)
            w.key("stats"); w.beginObject()
            w.field("version", HubVersion.string)
            w.field("uptimeSeconds", wallClockSeconds() - startedAt)
            w.field("pid", Int(getpid()))
            w.field("listen", listenAddress)
            w.field("socket", configuration.socketPath)
            w.field("auth", authDescription)
            w.key("threads"); w.beginArray()
            for s in snapshots {
                w.beginObject(); w.field("index", s.index); w.field("connections", s.counters.upgraded); w.field("busy", s.busy); w.endObject()
            }
            w.endArray()
            let total = snapshots.reduce(into: LoopSnapshot.Totals()) { $0.add($1) }
            w.key("connections"); w.beginObject()
            w.field("open", total.counters.upgraded); w.field("handshaking", total.counters.handshaking); w.field("limit", maxConnections)
            w.endObject()
            w.field("subscriptions", total.subscriptions)
            w.key("messages"); w.beginObject()
            w.field("in", total.counters.messagesIn); w.field("out", total.counters.messagesOut)
            w.field("inPerSecond", total.rates.messagesIn); w.field("outPerSecond", total.rates.messagesOut)
            w.endObject()
            w.key("bytes"); w.beginObject()
            w.field("in", total.engine.bytesIn); w.field("out", total.engine.bytesOut)
            w.field("inPerSecond", total.rates.bytesIn); w.field("outPerSecond", total.rates.bytesOut)
            w.endObject()
            let ledger = snapshots.first?.ledger
            w.key("publishes"); w.beginObject()
            w.field("total", ledger?.totalPublished ?? 0); w.field("perSecond", ledger?.rate ?? 0); w.field("delivered", ledger?.totalDelivered ?? 0)
            w.endObject()
            w.key("drops"); w.beginObject()
            w.field("slowConsumerCloses", total.counters.slowConsumerCloses)
            w.field("rateLimited", total.counters.rateLimited)
            w.field("rejectedConnections", total.counters.rejectedConnections + total.engine.shedConnections)
            w.field("protocolErrors", total.counters.protocolErrors)
            w.endObject()
            w.key("authFailures"); w.beginObject()
            for (reason, n) in total.counters.authFailures.sorted(by: { $0.key < $1.key }) { w.key(reason); w.int(n) }
            w.endObject()
            w.key("descriptors"); w.beginObject()
            w.field("open", openDescriptorCount()); w.field("limit", descriptorLimit)
            w.endObject()
            w.key("tls"); w.beginObject()
            w.field("handshakes", total.engine.tlsHandshakes); w.field("handshakeFailures", total.engine.tlsHandshakeFailures)
            w.field("plaintextRefused", total.engine.tlsPlaintextRefused)
            w.field("helloOnPlainPort", total.counters.tlsHelloOnPlainPort)
            w.field("refusingInTLS", total.counters.busyTLSAnswers)
            w.field("recordLayerConnections", total.engine.tlsRecordLayerConnections)
            w.endObject()
            let history = broker.statistics()
            w.key("history"); w.beginObject()
            w.field("epoch", history.epoch)
            w.field("bytes", history.historyBytes); w.field("limitBytes", history.historyLimitBytes)
            w.field("events", history.events); w.field("streams", history.streams)
            w.field("evictions", history.evictions); w.field("expirations", history.expirations)
            w.field("forgottenStreams", history.forgottenStreams)
            w.field("idempotencyKeys", history.idempotencyKeys); w.field("duplicates", history.duplicates)
            w.key("recoveries"); w.beginObject()
            for (i, label) in RecoveryOutcome.labels.enumerated() { w.key(label); w.int(total.counters.recoveries[i]) }
            w.endObject()
            w.field("replayedEvents", total.counters.replayedEvents)
            w.endObject()
            if let cluster = history.cluster {
                w.key("cluster"); w.beginObject()
                w.field("node", cluster.nodeID)
                w.field("connected", cluster.connected); w.field("subscribed", cluster.subscribed)
                if let error = cluster.lastError { w.field("lastError", error) }
                w.field("published", cluster.published); w.field("publishFailures", cluster.publishFailures)
                w.field("received", cluster.received); w.field("ignored", cluster.ignored)
                w.field("gaps", cluster.gaps); w.field("filledEvents", cluster.filledEvents); w.field("unfillable", cluster.unfillable)
                w.field("undecodable", cluster.undecodable)
                w.field("epochChanges", cluster.epochChanges); w.field("reconnects", cluster.reconnects)
                w.field("followedStreams", cluster.followedStreams)
                if let clusterView {
                    w.field("nodes", clusterView.nodes)
                    w.field("clusterConnections", clusterView.connections)
                }
                w.endObject()
            }
            w.endObject()
            SocketReplies.finishOK(id: id, into: &w)
            done(w.takeBytes())
        }
    }

    func channelsJSON(id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        clusterView { [self] cluster in self.channelsJSON(id: id, cluster: cluster, done) }
    }

    private func channelsJSON(id: RawJSON?, cluster: ClusterView?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        gather({ ChannelSnapshot(context: $0, channel: nil, account: nil) }) { [self] snapshots in
            var w = JSONWriter(capacity: 1024)
            SocketReplies.beginOK(into: &w)
            if let cluster { w.field("clusterNodes", cluster.nodes) }
            w.key("channels"); w.beginArray()
            for (i, name) in channelNames.enumerated() {
                let merged = ChannelSnapshot.merge(snapshots, channel: i)
                let ledger = snapshots.first?.ledger?.channels[i]
                w.beginObject()
                w.field("name", name)
                w.field("subscribers", merged.subscribers)
                if let cluster { w.field("clusterSubscribers", cluster.subscriptions[name] ?? 0) }
                w.field("accounts", merged.accounts.count)
                w.field("published", ledger?.published ?? 0)
                w.field("publishedPerSecond", ledger?.rate ?? 0)
                w.field("delivered", ledger?.delivered ?? 0)
                w.key("lastEventAt"); if let t = ledger?.lastEventAt { w.double(t) } else { w.null() }
                w.endObject()
            }
            w.endArray()
            SocketReplies.finishOK(id: id, into: &w)
            done(w.takeBytes())
        }
    }

    func channelJSON(_ channel: Int, account: AccountID?, id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        gather({ ChannelSnapshot(context: $0, channel: channel, account: account) }) { [self] snapshots in
            let merged = ChannelSnapshot.merge(snapshots, channel: channel)
            let ledger = snapshots.first?.ledger?.channels[channel]
            var w = JSONWriter(capacity: 2048)
            SocketReplies.beginOK(into: &w)
            w.key("channel"); w.beginObject()
            w.field("name", channelNames[channel])
            w.field("subscribers", merged.subscribers)
            w.field("accounts", merged.accounts.count)
            w.field("published", ledger?.published ?? 0)
            w.field("delivered", ledger?.delivered ?? 0)
            w.key("lastEventAt"); if let t = ledger?.lastEventAt { w.double(t) } else { w.null() }
            w.key("topAccounts"); w.beginArray()
            let top = merged.accounts.filter { account == nil || $0.key == account }
                .sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }.prefix(10)
            for (name, n) in top {
                w.beginObject(); w.field("account", name.string); w.field("subscribers", n); w.endObject()
            }
            w.endArray()
            w.key("recentEvents"); w.beginArray()
            for e in ledger?.recent ?? [] where account == nil || e.account == account {
                w.beginObject()
                w.field("type", e.type)
                w.key("account"); if let a = e.account { w.string(a.string) } else { w.null() }
                w.field("broadcast", e.account == nil)
                w.field("seq", e.seq); w.field("size", e.size); w.field("delivered", e.delivered); w.field("at", e.at)
                w.endObject()
            }
            w.endArray()
            w.endObject()
            SocketReplies.finishOK(id: id, into: &w)
            done(w.takeBytes())
        }
    }

    func connectionsJSON(account: AccountID?, channel: Int?, limit: Int, id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        gather({ context -> (matching: Int, oldest: [ConnectionInfo]) in
            let matching = context.clients.values.filter { c in
                c.phase == .webSocket && !c.awaitingAuth && (account == nil || c.account == account) && (channel == nil || c.channels.contains(channel!))
            }
            // Only a loop's `limit` oldest can be among the `limit` oldest of all: copy no more than those.
            let oldest = matching.sorted { $0.connectedAt < $1.connectedAt }.prefix(limit).map { ConnectionInfo($0) }
            return (matching.count, oldest)
        }) { [self] perLoop in
            let total = perLoop.reduce(0) { $0 + $1.matching }
            let listed = perLoop.flatMap(\.oldest).sorted { $0.connectedAt < $1.connectedAt }.prefix(limit)
            var w = JSONWriter(capacity: 4096)
            SocketReplies.beginOK(into: &w)
            w.field("total", total)
            w.key("connections"); w.beginArray()
            for c in listed {
                w.beginObject()
                w.field("id", c.id)
                w.field("account", c.account.string)
                w.field("remote", c.remote)
                w.key("platform"); if let p = c.platform { w.string(p) } else { w.null() }
                w.key("appVersion"); if let v = c.appVersion { w.string(v) } else { w.null() }
                w.key("channels"); w.beginArray(); for ch in c.channels { w.string(channelNames[ch]) }; w.endArray()
                w.field("connectedAt", c.connectedAt)
                w.field("queuedBytes", c.queuedBytes)
                w.field("messagesIn", c.messagesIn)
                w.field("messagesOut", c.messagesOut)
                w.endObject()
            }
            w.endArray()
            SocketReplies.finishOK(id: id, into: &w)
            done(w.takeBytes())
        }
    }

    /// Events retained more than this are listed in pages (`more`, then `since` = the last seq shown).
    static let historyPageSize = 1000

    /// `{"ok":true,"history":{...}}`: one stream's retained events after `since`, oldest first.
    /// `nodes`: the cluster's live nodes, each with what it says of itself; one line for a hub without `--broker`.
    func nodesJSON(id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        guard let redisBroker else {
            var w = JSONWriter(capacity: 64)
            SocketReplies.beginOK(into: &w)
            w.field("cluster", false)
            w.key("nodes"); w.beginArray(); w.endArray()
            SocketReplies.finishOK(id: id, into: &w)
            return done(w.takeBytes())
        }
        let me = redisBroker.nodeID
        redisBroker.listNodes { result in
            var w = JSONWriter(capacity: 1024)
            switch result {
            case .failure(let failure):
                SocketReplies.error(code: .brokerUnavailable, message: failure.message, id: id, into: &w)
            case .success(let nodes):
                SocketReplies.beginOK(into: &w)
                w.field("cluster", true)
                w.field("node", me)
                w.key("nodes"); w.beginArray()
                for node in nodes {
                    w.beginObject()
                    w.field("id", node.id)
                    w.field("self", node.id == me)
                    w.field("ageMillis", node.ageMillis)
                    // What another node wrote: embedded only if it is valid JSON (Redis is not trusted to hold ours).
                    w.key("info")
                    let info = Array(node.info.utf8)
                    let valid = info.withUnsafeBytes { (try? JSONScanner.validate($0)) != nil }
                    if valid { w.raw(info) } else { w.null() }
                    w.endObject()
                }
                w.endArray()
                SocketReplies.finishOK(id: id, into: &w)
            }
            done(w.takeBytes())
        }
    }

    /// What this node says of itself in the cluster registry: where it listens, its connections, and its
    /// subscriptions per channel (so any node can show the whole cluster).
    func nodeInfoJSON(_ done: @escaping @Sendable (String) -> Void) {
        gather({ context in (0..<context.hub.channelNames.count).map { context.registry.subscriberCount(channel: $0) } }) { [self] perLoop in
            var w = JSONWriter(capacity: 256)
            w.beginObject()
            w.field("listen", listenAddress)
            w.field("socket", configuration.socketPath)
            w.field("version", HubVersion.string)
            w.field("pid", Int(getpid()))
            w.field("connections", clientCount)
            w.field("startedAt", startedAt)
            w.key("subscriptions"); w.beginObject()
            for (i, name) in channelNames.enumerated() {
                w.key(name); w.int(perLoop.reduce(0) { $0 + ($1.indices.contains(i) ? $1[i] : 0) })
            }
            w.endObject()
            w.endObject()
            done(String(decoding: w.bytes, as: UTF8.self))
        }
    }

    /// Cluster mode: `local` (an admin reply of this node) with the same request's replies from every other live node
    /// appended as `"cluster":{"nodes":[{"node":ID,"reply":{…}}],"missing":[IDs that did not answer in 2 s]}`.
    /// Without a cluster, `local` unchanged.
    func withOtherNodes(_ local: [UInt8], asking request: [UInt8], _ done: @escaping @Sendable ([UInt8]) -> Void) {
        guard let redisBroker, local.count >= 2, local[local.count - 2] == UInt8(ascii: "}"), local.last == 0x0A,
              local.starts(with: Array(#"{"ok":true"#.utf8)) else { return done(local) }
        redisBroker.ask(request) { replies, missing in
            // `local` without its closing "}\n", then the cluster member and the close again.
            var w = JSONWriter(capacity: local.count + 64 + replies.reduce(0) { $0 + $1.reply.count + 32 })
            local.withUnsafeBytes { w.raw(UnsafeRawBufferPointer(rebasing: $0.dropLast(2))) }
            Self.writeCluster(replies, missing: missing, into: &w)
            w.endObject()
            w.newline()
            done(w.takeBytes())
        }
    }

    /// Another node asks for this node's own view (cluster-wide `connections` and `channel`) or action
    /// (`disconnect`): answered like a local admin request, without asking further.
    private func answerOtherNode(_ line: [UInt8], _ done: @escaping @Sendable ([UInt8]) -> Void) {
        let parsed: ParsedSocketRequest
        do {
            parsed = try SocketRequest.parse(line: line)
        } catch {
            return done(replyLine { SocketReplies.error(error, into: &$0) })
        }
        func notConfigured() -> [UInt8] {
            replyLine { SocketReplies.error(code: .unknownChannel, message: "channel is not configured on this node", id: nil, into: &$0) }
        }
        switch parsed.request {
        case .connections(let account, let channel, let limit):
            let index = channel.flatMap { channelIndex[$0] }
            if channel != nil && index == nil { return done(notConfigured()) }
            connectionsJSON(account: account, channel: index, limit: limit, id: nil, done)
        case .channel(let name, let account):
            guard let index = channelIndex[name] else { return done(notConfigured()) }
            channelJSON(index, account: account, id: nil, done)
        case .disconnect(let target, let code, let reason, _):
            disconnect(target, code: code, reason: reason) { count in
                done(Self.disconnectReply(count, target: target, node: nil, id: nil))
            }
        default:
            done(replyLine { SocketReplies.error(code: .unknownOp, message: "nodes answer only connections, channel and disconnect", id: nil, into: &$0) })
        }
    }

    /// The live nodes' own counts (cluster mode), for the cluster-wide lines of `stats` and `channels`; nil when this
    /// hub is not in a cluster or Redis cannot be asked.
    func clusterView(_ done: @escaping @Sendable (ClusterView?) -> Void) {
        guard let redisBroker else { return done(nil) }
        redisBroker.listNodes { result in
            guard case .success(let nodes) = result else { return done(nil) }
            var view = ClusterView(nodes: nodes.count)
            for node in nodes {
                let info = Array(node.info.utf8)
                info.withUnsafeBytes { bytes in
                    try? JSONScanner.forEachMember(in: bytes) { key, value in
                        let name = JSONScanner.decodeString(key, in: bytes)
                        if name == "connections", let n = JSONScanner.int64(value, in: bytes) {
                            view.connections += Int(clamping: n)
                        } else if name == "subscriptions" {
                            try? JSONScanner.forEachMember(of: value, in: bytes) { channel, count in
                                if let n = JSONScanner.int64(count, in: bytes) {
                                    view.subscriptions[JSONScanner.decodeString(channel, in: bytes), default: 0] += Int(clamping: n)
                                }
                            }
                        }
                    }
                }
            }
            done(view)
        }
    }

    func historyJSON(_ key: StreamKey, since: UInt64, id: RawJSON?) -> [UInt8] {
        historyJSON(view: broker.history(key, after: since), key: key, id: id)
    }

    /// `history` in cluster mode: the stream's retained events are read from Redis.
    func clusterHistoryJSON(_ key: StreamKey, since: UInt64, id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        guard let redisBroker else { return done(historyJSON(key, since: since, id: id)) }
        redisBroker.readHistory(key, after: since, limit: Self.historyPageSize + 1) { [self] result in
            switch result {
            case .success(let view):
                done(historyJSON(view: view, key: key, id: id))
            case .failure(let failure):
                done(replyLine { SocketReplies.error(code: .brokerUnavailable, message: failure.message, id: id, into: &$0) })
            }
        }
    }

    private func historyJSON(view: StreamHistory?, key: StreamKey, id: RawJSON?) -> [UInt8] {
        let events = view?.events ?? []
        let shown = events.prefix(Self.historyPageSize)
        var w = JSONWriter(capacity: 256 + 96 * shown.count)
        SocketReplies.beginOK(into: &w)
        w.key("history"); w.beginObject()
        w.field("channel", channelNames[key.channel])
        w.key("account"); if let a = key.account { w.string(a.string) } else { w.null() }
        w.field("broadcast", key.account == nil)
        w.key("epoch"); if let view { w.string(view.epoch) } else { w.null() }
        w.field("seq", view?.seq ?? 0)
        w.key("events"); w.beginArray()
        let (wallNow, monotonicNow) = (wallClockSeconds(), monotonicNanos())
        for e in shown {
            w.beginObject()
            w.field("seq", e.seq); w.field("type", e.type); w.field("at", e.wallTime(wallNow: wallNow, monotonicNow: monotonicNow))
            w.field("size", e.frame.count)
            w.endObject()
        }
        w.endArray()
        w.field("more", events.count > shown.count)
        w.endObject()
        SocketReplies.finishOK(id: id, into: &w)
        return w.takeBytes()
    }

    /// Closes the matching connections with `code`; `done` gets how many were closed.
    func disconnect(_ target: DisconnectTarget, code: UInt16, reason: String, _ done: @escaping @Sendable (Int) -> Void) {
        let text = reason.isEmpty && code == 1000 ? "disconnected by operator" : reason
        gather({ context in
            var matched: [ClientConnection] = []
            switch target {
            case .connection(let id):
                matched = context.clients.values.filter { $0.id == id && $0.phase == .webSocket }
            case .account(let account):
                matched = context.clients.values.filter { $0.account == account && $0.mode == .hub && $0.phase == .webSocket && !$0.awaitingAuth }
            }
            for c in matched { c.close(code: CloseCode(code), reason: text) }
            return matched.count
        }) { counts in done(counts.reduce(0, +)) }
    }

    // MARK: HTTP endpoints

    /// `/healthz`: `connections` counts open WebSocket connections (as `stats` and `hub_connections` do), not
    /// every TCP connection: the probe's own connection and other handshakes are not connections yet. In cluster
    /// mode, a node that cannot reach Redis answers 503 `degraded` (a load balancer sends new clients elsewhere; its
    /// connected clients stay).
    func gatherHealthJSON(_ done: @escaping @Sendable (Int, String) -> Void) {
        gather({ $0.counters.upgraded }) { [self] counts in
            let cluster = redisBroker?.cluster
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
