import Dispatch
import HubEngine
import HubJSON
import HubRouting
import HubSupport
import Synchronization
import WSProtocol

/// Options of the cluster broker (`--broker redis://…`).
public struct RedisBrokerOptions: Sendable {
    public var endpoint: RedisEndpoint
    public var prefix = "hub"
    public var shards = 16
    public var historySize = 100
    /// Milliseconds a stream's keys live after its last publish (0: forever).
    public var historyTTLMillis = 600_000
    public var idempotencyWindowMillis = 300_000
    /// Redis 7 sharded pub/sub (`SSUBSCRIBE`/`SPUBLISH`); always on with a Redis Cluster (`redis-cluster://`).
    public var sharded = false
    public var heartbeatMillis = 1_000
    public var staleMillis = 5_000
    /// A Redis connection owing replies that hears nothing for this long is taken for dead (see `heartbeat`).
    public var stallMillis = 3_000
    /// Per-stream channels (a node receives only the streams it serves) or shard channels (every node receives
    /// every event). See docs/OPERATIONS.md, "Cluster", for the measurements behind the default.
    public var layout = RedisStreams.FanoutLayout.streams

    public init(endpoint: RedisEndpoint) {
        self.endpoint = endpoint
    }
}

/// Cluster-wide tails (`hubctl tail` on one node shows the events published on every node): a node with a tail
/// tells the others (`start`, renewed every few seconds, and `stop`), and they forward each matching event's tail
/// line to it (`line`). `from` is the sending node.
public enum TailMessage: Sendable, Equatable {
    case start(id: UInt64, from: String, channel: String, account: String?)
    case stop(id: UInt64, from: String)
    case line(id: UInt64, from: String, bytes: [UInt8])
}

/// The cluster broker: numbering, history and fan-out through Redis (see `RedisStreams` for the keys and scripts),
/// behind the same `Broker` calls as `LocalBroker`.
///
/// It runs on one of the hub's event loops (loop 0) with two Redis connections: one for commands (publish scripts,
/// reads, presence, heartbeats, admin requests to other nodes) and one for pub/sub: the channels of the streams this
/// node's connections follow (or every shard channel, `--broker-fanout shards`) and its control channel. A node
/// delivers an event only to the loops, and there the connections, that follow its stream.
///
/// Per stream a connection of this node follows, the node remembers the epoch and the last seq it delivered. A
/// message at or below it is a duplicate; one beyond the next seq means messages were missed (around a reconnect),
/// and the gap is read from the stream history before delivery goes on, so the loops see each stream contiguous and
/// in order. After a reconnect, every followed stream is read from its last seq.
public final class RedisBroker: Broker, @unchecked Sendable {
    /// Shards (hash tags) of the streams on a Redis Cluster.
    public static let clusterShards = 256
    /// All channel epochs of the cluster start with this (the streams' own epochs follow it).
    public let epoch = "r"
    let channelNames: [String]
    private let fanout: Fanout
    private let options: RedisBrokerOptions
    private let streams: RedisStreams
    private let nodes: RedisNodes
    public let nodeID: String
    /// This node's control channel (`controlChannel(prefix:node:)`), as text and as the bytes pushes carry.
    private let controlChannel: String
    private let controlChannelBytes: [UInt8]
    let loop: EventLoop
    private let log: @Sendable (String) -> Void
    private let stats: LockedValue<ClusterStatistics>
    /// The node's description in the registry (a JSON object: listen address, connections…), asked at each heartbeat.
    private let nodeInfo = LockedValue<@Sendable (@escaping @Sendable (String) -> Void) -> Void>({ $0("{}") })

    // Loop thread only.
    private var commands: (any RedisLink)? = nil
    private var subscriber: (any RedisLink)? = nil
    /// Sharded pub/sub: asked for, or a Redis Cluster.
    private let sharded: Bool
    /// With sharded pub/sub the publish script cannot read the node registry (another slot): the live nodes' ids as
    /// of the last heartbeat are passed to it instead (nil until the first list).
    private var liveNodes: (ids: [String], asOf: Int64)? = nil
    /// By the stream id's bytes (`ExactString`): canonically equivalent accounts are two streams here too.
    private var followed: [ExactString: Follow] = [:]
    /// Events received and not yet handed to the loops (at the next flush).
    private var outgoing = Fanout.Batch()
    private var flushScheduled = false
    /// Publishes waiting for the next script call (`publishOnLoop`): each call's item by its index.
    private var queuedPublishes: [(call: PublishCall, index: Int)] = []
    private var publishFlushScheduled = false
    /// A Redis Cluster: one script call touches one slot, so batches are per shard.
    private let clusterSlots: Bool
    private var heartbeatTimer = TimerHandle.none
    private var writer = JSONWriter(capacity: 4096)
    private var wasReady = false
    /// Layout `shards`: every shard channel is subscribed and confirmed on the current subscriber link.
    private var shardChannelsConfirmed = false
    /// Candidate epochs for streams this node may create: a random prefix per process and a counter, so each is
    /// unique without a random draw per publish.
    private let epochPrefix = Base64URL.randomToken(bytes: 6)
    private var epochCounter: UInt64 = 0
    /// Fan-out counters kept on the loop thread, copied into `stats` at each heartbeat (not locked per message).
    private var receivedCount = 0
    private var ignoredCount = 0
    /// Admin requests this node asked the others (`ask`), by request id.
    private var asking: [UInt64: Asking] = [:]
    private var nextAskID: UInt64 = 0
    /// Answers another node's admin request with this node's own view (set by the hub).
    private let controlHandler = LockedValue<@Sendable ([UInt8], @escaping @Sendable ([UInt8]) -> Void) -> Void>({ _, done in done([]) })
    /// Receives the cluster-wide tail messages of other nodes (set by the hub).
    private let tailHandler = LockedValue<@Sendable (TailMessage) -> Void>({ _ in })

    private final class Asking {
        var waiting: Set<String>
        var replies: [(node: String, reply: [UInt8])] = []
        let completion: @Sendable ([(node: String, reply: [UInt8])], [String]) -> Void
        var timer = TimerHandle.none

        init(waiting: Set<String>, completion: @escaping @Sendable ([(node: String, reply: [UInt8])], [String]) -> Void) {
            self.waiting = waiting
            self.completion = completion
        }
    }

    /// What the node knows of a stream some of its connections follow.
    private final class Follow {
        let key: StreamKey
        let stream: RedisStreams.Stream
        /// This node's connections that follow the stream, by loop.
        var followers = LoopFollowers()
        var epoch: String? = nil
        /// The last seq delivered to the loops (nil: not known yet; the first read or message sets it).
        var lastSeq: UInt64? = nil
        /// A gap fill is in flight: messages wait in `parked`.
        var filling = false
        /// Per-stream layout: the subscriber connection has confirmed the SUBSCRIBE to the stream's channel.
        var confirmed = false
        var parked: [RedisStreams.Message] = []

        init(key: StreamKey, stream: RedisStreams.Stream) {
            self.key = key
            self.stream = stream
        }
    }

    /// `loop`: where the Redis connections and the broker's state live. The hub passes its loop 0, which also holds
    /// the Unix-socket connections: a publish goes to Redis and its reply comes back without changing threads.
    public init(channelNames: [String], shards: [any FanoutShard], options: RedisBrokerOptions, loop: EventLoop,
                log: @escaping @Sendable (String) -> Void) {
        self.channelNames = channelNames
        fanout = Fanout(shards: shards)
        self.options = options
        sharded = options.sharded || options.endpoint.cluster
        clusterSlots = options.endpoint.cluster
        // On a Redis Cluster the shards are the unit the masters share (a shard's keys are one slot): 256 of them
        // spread evenly over any realistic number of masters (16 would put 6, 6 and 4 on three).
        let shardCount = options.endpoint.cluster ? max(options.shards, RedisBroker.clusterShards) : options.shards
        streams = RedisStreams(prefix: options.prefix, shards: shardCount, historySize: options.historySize,
                               ttlMillis: options.historyTTLMillis, sharded: sharded, layout: options.layout)
        nodes = RedisNodes(prefix: options.prefix, staleMillis: options.staleMillis)
        nodeID = Base64URL.randomToken(bytes: 6)
        controlChannel = Self.controlChannel(prefix: options.prefix, node: nodeID)
        controlChannelBytes = Array(controlChannel.utf8)
        self.log = log
        var s = ClusterStatistics()
        s.nodeID = nodeID
        stats = LockedValue(s)
        self.loop = loop
    }

    /// Connects to Redis and joins the cluster (once the hub listens, so its first heartbeat says where).
    public func start() {
        loop.execute { [unowned self] in self.startOnLoop() }
    }

    /// A fresh candidate epoch (loop thread): `<prefix>-<counter in base 36>`, never with a ".".
    private func candidateEpoch() -> String {
        epochCounter += 1
        return epochPrefix + "-" + String(epochCounter, radix: 36)
    }

    // MARK: Lifecycle (loop thread)

    private func startOnLoop() {
        guard commands == nil else { return }
        let commands: any RedisLink
        let subscriber: any RedisLink
        if options.endpoint.cluster {
            commands = RedisClusterClient(endpoint: options.endpoint, loop: loop, subscriber: false)
            subscriber = RedisClusterClient(endpoint: options.endpoint, loop: loop, subscriber: true)
        } else {
            let c = RedisConnection(endpoint: options.endpoint, loop: loop)
            commands = c
            subscriber = RedisConnection(endpoint: options.endpoint, loop: loop)
            c.onReady = { [unowned self, unowned c] in
                if c.serverMode == "cluster" {
                    self.log("cluster: Redis at \(self.options.endpoint) is a Redis Cluster node: use --broker redis-cluster://HOST:PORT so that commands go to each slot's master")
                }
                self.commandsReady()
            }
        }
        self.commands = commands
        self.subscriber = subscriber
        if options.endpoint.cluster { commands.onReady = { [unowned self] in self.commandsReady() } }
        commands.onDown = { [unowned self] error in self.connectionDown("commands", error) }
        subscriber.onReady = { [unowned self] in self.subscriberReady() }
        subscriber.onDown = { [unowned self] error in self.connectionDown("subscriber", error) }
        subscriber.onPush = { [unowned self] push in self.received(push) }
        commands.start()
        subscriber.start()
        heartbeatTimer = loop.scheduleRepeating(every: .milliseconds(options.heartbeatMillis)) { [unowned self] in self.heartbeat() }
        let layout = options.layout == .streams ? "a channel per stream" : "\(streams.shards) shard channels"
        log("cluster: node \(nodeID) using Redis at \(options.endpoint) (\(layout)" + (sharded ? ", sharded pub/sub)" : ")"))
    }

    /// Leaves the registry and removes this node's presence, then closes its Redis connections (bounded: waits at
    /// most `timeout`). Call it from outside the loop, while the loop still runs.
    public func shutdown(timeout: Duration = .seconds(2)) {
        let done = DispatchSemaphore(value: 0)
        loop.execute { [unowned self] in
            _ = self.loop.cancel(self.heartbeatTimer)
            guard let commands = self.commands, commands.canSend else { done.signal(); return }
            for follow in self.followed.values {
                self.streams.setPresence(follow.stream, node: self.nodeID, count: 0, stamped: self.sharded, on: commands)
            }
            self.nodes.leave(id: self.nodeID, on: commands) { _ in done.signal() }
        }
        _ = done.wait(timeout: .now() + .nanoseconds(Int(clamping: timeout.engineNanos)))
        _ = try? loop.submitAndWait { [unowned self] in
            self.commands?.close()
            self.subscriber?.close()
        }
    }

    private func commandsReady() {
        stats.withLock { $0.connected = true; $0.lastError = nil }
        log("cluster: connected to Redis (commands)")
        heartbeat()
        // Presence may have been lost (Redis restarted) or dropped (this node looked dead): write it again.
        guard let commands else { return }
        for follow in followed.values {
            streams.setPresence(follow.stream, node: nodeID, count: follow.followers.total, stamped: sharded, on: commands)
        }
        if wasReady { refill() }
        wasReady = true
    }

    private var subscribeCommand: String { sharded ? "SSUBSCRIBE" : "SUBSCRIBE" }
    private var unsubscribeCommand: String { sharded ? "SUNSUBSCRIBE" : "UNSUBSCRIBE" }
    private var publishCommand: String { sharded ? "SPUBLISH" : "PUBLISH" }

    private func subscriberReady() {
        guard let subscriber else { return }
        let channels: [String]
        switch options.layout {
        case .shards:
            channels = streams.fanoutChannels + [controlChannel]
        case .streams:
            for follow in followed.values { follow.confirmed = false }
            channels = [controlChannel] + followed.values.map { streams.streamChannel($0.stream) }
        }
        let what = options.layout == .shards ? "\(channels.count - 1) fan-out channels" : "\(channels.count - 1) stream channels"
        let confirmedNow = Array(followed.values)
        subscribeChunked(channels, on: subscriber) { [unowned self] error in
            if let error {
                self.stats.withLock { $0.lastError = error.message }
                self.log("cluster: cannot subscribe to the \(what): \(error.message)")
                return
            }
            for follow in confirmedNow { follow.confirmed = true }
            if self.options.layout == .shards { self.shardChannelsConfirmed = true }
            self.stats.withLock { $0.subscribed = true }
            self.log("cluster: subscribed to \(what)")
            // Messages may have been missed while unsubscribed: read every followed stream from its last seq.
            self.refill()
        }
    }

    /// SUBSCRIBE in commands of at most 1000 channels; `done` once all are confirmed (or at the first error).
    private func subscribeChunked(_ channels: [String], on subscriber: any RedisLink, done: @escaping (RedisError?) -> Void) {
        guard !channels.isEmpty else { return done(nil) }
        var remaining = (channels.count + 999) / 1000
        var failed = false
        for start in stride(from: 0, to: channels.count, by: 1000) {
            subscriber.subscribe([subscribeCommand] + channels[start..<min(start + 1000, channels.count)]) { error in
                guard !failed else { return }
                if let error {
                    failed = true
                    return done(error)
                }
                remaining -= 1
                if remaining == 0 { done(nil) }
            }
        }
    }

    private func connectionDown(_ which: String, _ error: RedisError) {
        if which == "subscriber" {
            for follow in followed.values { follow.confirmed = false }
            shardChannelsConfirmed = false
        }
        let first = stats.withLock { s -> Bool in
            let was = which == "commands" ? s.connected : s.subscribed
            if which == "commands" { s.connected = false } else { s.subscribed = false }
            s.lastError = error.message
            if was { s.reconnects += 1 }
            return was
        }
        if first { log("cluster: Redis \(which) connection down: \(error.message); retrying with backoff") }
    }

    private func heartbeat() {
        let (received, ignored) = (receivedCount, ignoredCount)
        stats.withLock { $0.received = received; $0.ignored = ignored }
        // A partition shows no error on a quiet TCP connection: a connection that owes replies and has heard
        // nothing for `stallMillis` is closed (publishes waiting on it fail with BROKER_UNAVAILABLE) and reconnects.
        // The subscriber gets a PING each beat, so it always owes something while it lives.
        let stall = Duration.milliseconds(options.stallMillis)
        commands?.closeIfStalled(after: stall)
        if let subscriber, !subscriber.closeIfStalled(after: stall), subscriber.canSend {
            subscriber.send(["PING"]) { _ in }
        }
        guard let commands, commands.canSend else { return }
        let provider = nodeInfo.withLock { $0 }
        provider { [unowned self] info in
            self.loop.execute { [unowned self] in
                guard let commands = self.commands, commands.canSend else { return }
                self.nodes.heartbeat(id: self.nodeID, info: info, on: commands) { _ in }
                guard self.sharded else { return }
                self.nodes.live(on: commands) { [unowned self] result in
                    if case .success(let live) = result { self.liveNodes = live }
                }
            }
        }
    }

    /// What the node says of itself in the registry (JSON object text), asked at each heartbeat (the provider may
    /// answer from any thread).
    public func setNodeInfo(_ provider: @escaping @Sendable (@escaping @Sendable (String) -> Void) -> Void) {
        nodeInfo.withLock { $0 = provider }
    }

    /// The live nodes of the cluster (from the registry), or why not.
    public func listNodes(_ completion: @escaping @Sendable (Result<[RedisNodes.Node], BrokerFailure>) -> Void) {
        loop.execute { [unowned self] in
            guard let commands = self.commands, commands.canSend else {
                completion(.failure(BrokerFailure(message: "Redis is unavailable")))
                return
            }
            self.nodes.nodes(on: commands) { result in
                completion(result.mapError { BrokerFailure(message: "Redis: \($0.message)") })
            }
        }
    }

    // MARK: Publishing

    public func publish(_ drafts: [EventDraft], completion: @escaping @Sendable (PublishOutcome) -> Void) {
        guard !drafts.isEmpty else { completion(PublishOutcome(events: [], delivered: [], replies: [])); return }
        // Encoded here: `data` points into the caller's read buffer.
        let wallMillis = Int64(wallClockSeconds() * 1000)
        let items = drafts.map { draft in
            PublishItem(stream: stream(for: draft.stream), key: draft.stream,
                        text: Self.eventText(type: draft.type, wallMillis: wallMillis, data: draft.data),
                        idempotencyKey: draft.idempotencyKey?.string)
        }
        if loop.inEventLoop { return publishOnLoop(items, completion: completion) }
        let box = LoopBound(items, loop: loop)
        loop.execute { [unowned self] in self.publishOnLoop(box.value, completion: completion) }
    }

    private struct PublishItem {
        let stream: RedisStreams.Stream
        let key: StreamKey
        let text: String
        let idempotencyKey: String?
    }

    /// The event as the history keeps it and the fan-out carries it (`ClusterWire`; the stream says channel and
    /// account, the script says seq). Type and data are validated UTF-8, so the text is too.
    static func eventText(type: String, wallMillis: Int64, data: UnsafeRawBufferPointer) -> String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(type.utf8.count + data.count + 24)
        ClusterWire.appendEvent(type: type.utf8, wallMillis: UInt64(max(0, wallMillis)), data: data, to: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// What a failed publish script tells the backend. "Nothing was published" only when the script cannot have
    /// reached Redis (not connected, over the queue cap, refused by Redis before running: the script's preamble
    /// publishes nothing); once it was written, an event that failed inside the script or a lost connection (a
    /// stall past `stallMillis` included: Redis may run it when it wakes) leaves it unknown.
    static func publishFailure(_ error: RedisError) -> BrokerFailure {
        switch error.kind {
        case .scriptFailed:
            return BrokerFailure(code: SocketErrorCode.publishOutcomeUnknown.rawValue,
                                 message: "\(error.message): it may or may not have been published; retry with the same idempotencyKey")
        case .connectionLost, .closed, .protocolError:
            return BrokerFailure(code: SocketErrorCode.publishOutcomeUnknown.rawValue,
                                 message: "the publish was sent to Redis and its answer lost (\(error.message)): it may or may not "
                                    + "have been published; retry with the same idempotencyKey")
        case .unavailable, .overloaded, .server, .handshake, .badURL:
            return BrokerFailure(message: "Redis is unavailable (\(error.message)); nothing was published, retry")
        }
    }

    /// One `publish` call: its items, their replies as they come, and the completion that runs when the last one has.
    private final class PublishCall {
        let items: [PublishItem]
        var replies: [PublishReply]
        var numbered: [(index: Int, seq: UInt64)] = []
        var remaining: Int
        let started = monotonicNanos()
        let completion: @Sendable (PublishOutcome) -> Void

        init(items: [PublishItem], completion: @escaping @Sendable (PublishOutcome) -> Void) {
            self.items = items
            replies = [PublishReply](filledWith: PublishReply(seq: 0, delivered: 0, duplicate: false), count: items.count)
            remaining = items.count
            self.completion = completion
        }
    }

    /// At most this many events, and about this many bytes of events, per script call: a script blocks Redis while
    /// it runs.
    static let maxBatchEvents = 128
    static let maxBatchBytes = 1 << 20

    /// Queues the call's events for the next script call. The queue is sent by a job posted behind the ones already
    /// waiting, so the publishes of every socket read handled in this iteration (on this loop, or hopped here from
    /// the others) share one call: Redis pays for reading a command, entering Lua and waking up once per batch.
    private func publishOnLoop(_ items: [PublishItem], completion: @escaping @Sendable (PublishOutcome) -> Void) {
        guard commands != nil else {
            var replies = [PublishReply](filledWith: PublishReply(seq: 0, delivered: 0, duplicate: false), count: items.count)
            for i in replies.indices { replies[i].failure = BrokerFailure(message: "the cluster broker is not running") }
            completion(PublishOutcome(events: [], delivered: [], replies: replies))
            return
        }
        let call = PublishCall(items: items, completion: completion)
        for i in items.indices { queuedPublishes.append((call, i)) }
        guard !publishFlushScheduled else { return }
        publishFlushScheduled = true
        loop.execute { [unowned self] in self.sendQueuedPublishes() }
    }

    /// Sends the queued publishes, one script call per batch (per shard on a Redis Cluster: a script touches one slot).
    private func sendQueuedPublishes() {
        publishFlushScheduled = false
        let queued = queuedPublishes
        queuedPublishes.removeAll(keepingCapacity: true)
        guard !queued.isEmpty else { return }
        guard let commands else {
            for (call, i) in queued { finish(call, i, .failure(RedisError(.unavailable, "the cluster broker is not running"))) }
            return
        }
        var groups: [[(call: PublishCall, index: Int)]]
        if clusterSlots {
            var byShard: [Int: Int] = [:]
            groups = []
            for entry in queued {
                let shard = streams.shard(of: entry.call.items[entry.index].stream)
                if let g = byShard[shard] {
                    groups[g].append(entry)
                } else {
                    byShard[shard] = groups.count
                    groups.append([entry])
                }
            }
        } else {
            groups = [queued]
        }
        for group in groups {
            var start = 0
            while start < group.count {
                var end = start
                var bytes = 0
                while end < group.count, end - start < Self.maxBatchEvents, end == start || bytes < Self.maxBatchBytes {
                    bytes += group[end].call.items[group[end].index].text.utf8.count
                    end += 1
                }
                send(Array(group[start..<end]), on: commands)
                start = end
            }
        }
    }

    private func send(_ batch: [(call: PublishCall, index: Int)], on commands: any RedisLink) {
        let publications = batch.map { entry in
            let item = entry.call.items[entry.index]
            return RedisStreams.Publication(item.text, to: item.stream, idempotencyKey: item.idempotencyKey)
        }
        stats.withLock { $0.publishScriptCalls += 1 }
        streams.publish(publications, candidateEpoch: candidateEpoch(), windowMillis: options.idempotencyWindowMillis,
                        liveness: sharded ? nil : nodes, liveNodes: sharded ? liveNodes : nil, on: commands) { [unowned self] result in
            switch result {
            case .success(let each):
                for (entry, one) in zip(batch, each) { self.finish(entry.call, entry.index, one) }
            case .failure(let error):
                for entry in batch { self.finish(entry.call, entry.index, .failure(error)) }
            }
        }
    }

    /// One event's answer; the call completes with its last.
    private func finish(_ call: PublishCall, _ i: Int, _ result: Result<RedisStreams.Numbered, RedisError>) {
        switch result {
        case .success(let n):
            call.replies[i] = PublishReply(seq: n.seq, delivered: n.delivered, duplicate: n.duplicate)
            if !n.duplicate { call.numbered.append((i, n.seq)) }
        case .failure(let error):
            call.replies[i].failure = Self.publishFailure(error)
        }
        call.remaining -= 1
        guard call.remaining == 0 else { return }
        let elapsed = monotonicNanos() &- call.started
        let failures = call.replies.filter { $0.failure != nil }.count
        stats.withLock { s in
            s.published += call.items.count - failures
            s.publishFailures += failures
            s.publishRoundTrips += 1
            s.publishNanos &+= elapsed
            s.publishMaxNanos = max(s.publishMaxNanos, elapsed)
        }
        // The events as the ledger (admin `tail`, `channel`) sees them: framed here, delivered through Redis.
        var events: [PublishedEvent] = []
        var delivered: [Int] = []
        for (index, seq) in call.numbered.sorted(by: { $0.index < $1.index }) {
            let item = call.items[index]
            if let event = frame(key: item.key, seq: seq, event: Array(item.text.utf8)) {
                events.append(event)
                delivered.append(call.replies[index].delivered)
            }
        }
        call.completion(PublishOutcome(events: events, delivered: delivered, replies: call.replies))
    }

    // MARK: Fan-out (loop thread)

    private func received(_ push: RESPValue) {
        if case .push(let items) = push, items.count == 3, case .bulk(let channel) = items[1], channel == controlChannelBytes,
           case .bulk(let payload) = items[2] {
            return control(payload)
        }
        guard let message = streams.message(from: push) else { return }
        receivedCount += 1
        guard let follow = followed[message.streamID] else {
            ignoredCount += 1
            return
        }
        accept(message, follow)
    }

    /// Sorts one message of a followed stream into its order: deliver, drop as a duplicate, or fill a gap first.
    private func accept(_ message: RedisStreams.Message, _ follow: Follow) {
        if follow.filling {
            follow.parked.append(message)
            return
        }
        if let epoch = follow.epoch, epoch != message.epoch {
            // The stream's numbering restarted (its keys expired, or Redis lost them): its subscribers' positions
            // mean nothing any more. They are closed (1012) and resubscribe; the node follows the new numbering.
            restarted(follow, from: epoch, to: message.epoch)
            follow.lastSeq = nil
        }
        follow.epoch = message.epoch
        if let last = follow.lastSeq {
            if message.seq <= last {
                stats.withLock { $0.duplicates += 1 }
                return
            }
            if message.seq > last + 1 {
                stats.withLock { $0.gaps += 1 }
                follow.parked.append(message)
                fill(follow)
                return
            }
        }
        follow.lastSeq = message.seq
        emit(follow, seq: message.seq, event: message.event)
    }

    /// Reads what the stream has after the node's last seq, delivers it, then the parked messages.
    private func fill(_ follow: Follow) {
        guard let commands, let last = follow.lastSeq else { return }
        follow.filling = true
        streams.read(follow.stream, after: last, limit: max(1, options.historySize * 2), on: commands) { [unowned self] result in
            follow.filling = false
            switch result {
            case .success(let read):
                if let known = follow.epoch, read.epoch != known {
                    // The stream is gone from Redis, or numbered anew: what was missed cannot be found.
                    self.restarted(follow, from: known, to: read.epoch ?? "(none)")
                    follow.epoch = read.epoch
                    follow.lastSeq = read.epoch == nil ? nil : read.seq
                    let parked = follow.parked.filter { $0.epoch == read.epoch && $0.seq > read.seq }.sorted { $0.seq < $1.seq }
                    follow.parked = []
                    for message in parked { self.accept(message, follow) }
                    return
                }
                if let epoch = read.epoch, epoch == follow.epoch {
                    for entry in read.entries where entry.seq > (follow.lastSeq ?? 0) {
                        if let last = follow.lastSeq, entry.seq > last + 1 {
                            // Trimmed from the history before this node could read it.
                            self.stats.withLock { $0.unfillable += Int(entry.seq - last - 1) }
                        }
                        follow.lastSeq = entry.seq
                        self.emit(follow, seq: entry.seq, event: entry.event)
                        self.stats.withLock { $0.filledEvents += 1 }
                    }
                }
            case .failure(let error):
                // Redis went away again: the parked messages wait, and the next reconnect refills from the last seq
                // delivered (see `refill`).
                self.log("cluster: gap fill of \(follow.stream.channel) failed: \(error.message)")
                return
            }
            let parked = follow.parked.sorted { $0.seq < $1.seq }
            follow.parked = []
            for message in parked {
                if let last = follow.lastSeq, message.seq > last + 1, message.epoch == follow.epoch {
                    // Still a hole after the fill: those events are gone from the history.
                    self.stats.withLock { $0.unfillable += Int(message.seq - last - 1) }
                    follow.lastSeq = message.seq - 1
                }
                self.accept(message, follow)
            }
        }
    }

    /// A followed stream's numbering restarted: its subscribers on this node are closed with 1012.
    private func restarted(_ follow: Follow, from old: String, to new: String) {
        stats.withLock { $0.epochChanges += 1 }
        // The account is quoted with its control characters escaped: an id may hold a newline, and must not forge a line.
        log("cluster: stream \(follow.stream.channel)\(follow.stream.account.map { " of \($0.debugDescription)" } ?? " (broadcast)") restarted its numbering"
            + " (epoch \(old) → \(new)); closing its subscribers here with 1012 so they resubscribe")
        fanout.numberingRestarted(follow.key)
    }

    /// After a reconnect: every followed stream is read from its last delivered seq.
    private func refill() {
        for follow in followed.values where follow.lastSeq != nil && !follow.filling {
            fill(follow)
        }
    }

    private func emit(_ follow: Follow, seq: UInt64, event bytes: [UInt8]) {
        // Only the loops that have followers of the stream (none once nobody here follows it).
        guard !follow.followers.isEmpty else { return }
        guard let event = frame(key: follow.key, seq: seq, event: bytes) else {
            // Not an event this version writes (a node of another version, or a damaged history entry): said, not
            // silently dropped.
            stats.withLock { $0.undecodable += 1 }
            log("cluster: dropped event \(seq) of \(follow.stream.channel) that this node cannot decode; do all nodes run the same version?")
            return
        }
        outgoing.append(event, loops: follow.followers.mask(loops: fanout.shards.count))
        if !flushScheduled {
            flushScheduled = true
            loop.execute { [unowned self] in self.flush() }
        }
    }

    /// One batch for everything received in one pass, to the loops that have followers of its streams.
    private func flush() {
        flushScheduled = false
        fanout.dispatch(outgoing) { _ in }
        outgoing = Fanout.Batch()
    }

    /// The WebSocket frame of an event from its `ClusterWire` bytes; nil for bytes that are not one.
    private func frame(key: StreamKey, seq: UInt64, event: [UInt8]) -> PublishedEvent? {
        guard key.channel >= 0, key.channel < channelNames.count else { return nil }
        return event.withUnsafeBytes { bytes -> PublishedEvent? in
            guard let e = ClusterWire.event(0..<bytes.count, in: bytes),
                  let type = String(validating: bytes[e.type], as: UTF8.self) else { return nil }
            let wallMillis = Double(e.wallMillis)
            let nowWall = wallClockSeconds()
            let nowMono = monotonicNanos()
            // The publish time on this node's monotonic clock (for latency and replay order), never in the future.
            let ageNanos = UInt64(max(0, (nowWall * 1000 - wallMillis) * 1_000_000))
            let acceptedAt = nowMono > ageNanos ? nowMono - ageNanos : 0
            let data = UnsafeRawBufferPointer(rebasing: bytes[e.data])
            let draft = EventDraft(channel: key.channel, account: key.account, type: type, data: data)
            return LocalBroker.frame(draft, channelName: channelNames[key.channel], seq: seq, now: acceptedAt,
                                     wall: Double(wallMillis) / 1000, writer: &writer)
        }
    }

    private func stream(for key: StreamKey) -> RedisStreams.Stream {
        RedisStreams.Stream(channel: channelNames[key.channel], account: key.account?.string)
    }

    // MARK: Subscriptions

    public func attach(_ reads: [StreamRead], completion: @escaping @Sendable (Result<[StreamPosition], BrokerFailure>) -> Void) {
        let box = LoopBound(reads, loop: loop)
        loop.execute { [unowned self] in self.attachOnLoop(box.value, completion: completion) }
    }

    private func attachOnLoop(_ reads: [StreamRead], completion: @escaping @Sendable (Result<[StreamPosition], BrokerFailure>) -> Void) {
        // Following starts now, before the read is sent: every message numbered after the read reaches the loops.
        for read in reads where read.follow { follow(read.stream, loop: read.loop) }
        guard let commands, commands.canSend else {
            completion(.failure(Self.subscribeUnavailable(nil)))
            return
        }
        guard options.layout == .streams else {
            // Shard channels are subscribed all together when the subscriber link comes up: until they are
            // confirmed, a read could miss events published right after it.
            guard shardChannelsConfirmed else { return completion(.failure(Self.subscribeUnavailable(nil))) }
            return read(reads, on: commands, completion: completion)
        }
        // Per-stream channels: the read may only be sent once the subscription to every stream is confirmed.
        let unconfirmed = reads.compactMap { followed[stream(for: $0.stream).exactID] }.filter { !$0.confirmed }
        guard !unconfirmed.isEmpty else { return read(reads, on: commands, completion: completion) }
        guard let subscriber, subscriber.canSend else {
            completion(.failure(Self.subscribeUnavailable(nil)))
            return
        }
        var channels: [String] = []
        for follow in unconfirmed where !channels.contains(streams.streamChannel(follow.stream)) {
            channels.append(streams.streamChannel(follow.stream))
        }
        subscriber.subscribe([subscribeCommand] + channels) { [unowned self] error in
            if let error {
                completion(.failure(Self.subscribeUnavailable(error)))
                return
            }
            for follow in unconfirmed { follow.confirmed = true }
            guard let commands = self.commands, commands.canSend else {
                completion(.failure(Self.subscribeUnavailable(nil)))
                return
            }
            self.read(reads, on: commands, completion: completion)
        }
    }

    /// Why a subscribe could not read its streams.
    private static func subscribeUnavailable(_ error: RedisError?) -> BrokerFailure {
        BrokerFailure(message: "Redis is unavailable" + (error.map { " (\($0.message))" } ?? "") + "; subscribe again shortly")
    }

    /// The reads of an attach, once the streams' messages reach this node.
    private func read(_ reads: [StreamRead], on commands: any RedisLink,
                      completion: @escaping @Sendable (Result<[StreamPosition], BrokerFailure>) -> Void) {
        var positions = [StreamPosition?](repeating: nil, count: reads.count)
        var failure: BrokerFailure? = nil
        var remaining = reads.count
        for (i, read) in reads.enumerated() {
            let stream = self.stream(for: read.stream)
            let limit = read.resume == nil ? 0 : read.limit + 1
            streams.read(stream, after: read.resume?.seq ?? 0, limit: limit,
                         createEpoch: read.follow ? candidateEpoch() : nil, on: commands) { [unowned self] result in
                switch result {
                case .success(let r):
                    positions[i] = self.position(read, r)
                    if let follow = self.followed[stream.exactID], follow.lastSeq == nil, let epoch = r.epoch {
                        follow.epoch = epoch
                        follow.lastSeq = r.seq
                    }
                case .failure(let error):
                    failure = Self.subscribeUnavailable(error)
                }
                remaining -= 1
                guard remaining == 0 else { return }
                if let failure {
                    completion(.failure(failure))
                } else {
                    completion(.success(positions.map { $0 ?? StreamPosition(epoch: "0", seq: 0, replay: nil) }))
                }
            }
        }
    }

    /// A stream's position from its read, and the replay after the resume point if one was asked.
    private func position(_ read: StreamRead, _ r: RedisStreams.Read) -> StreamPosition {
        var position = StreamPosition(epoch: r.epoch ?? "0", seq: r.seq, replay: nil)
        guard let resume = read.resume else { return position }
        guard let epoch = r.epoch, epoch == resume.epoch, resume.seq <= r.seq else {
            position.replay = .failure(.epochChanged)
            return position
        }
        let missing = r.seq - resume.seq
        if missing == 0 {
            position.replay = .success([])
        } else if missing > UInt64(read.limit) {
            position.replay = .failure(.tooMany)
        } else if r.firstRetained == 0 || r.firstRetained > resume.seq + 1 {
            position.replay = .failure(.tooOld)
        } else {
            var events: [RetainedEvent] = []
            var expected = resume.seq + 1
            for entry in r.entries where entry.seq <= r.seq {
                guard entry.seq == expected, let event = frame(key: read.stream, seq: entry.seq, event: entry.event) else { break }
                events.append(RetainedEvent(event))
                expected += 1
            }
            position.replay = expected == r.seq + 1 ? .success(events) : .failure(.tooOld)
        }
        return position
    }

    private func follow(_ key: StreamKey, loop: Int) {
        let stream = self.stream(for: key)
        let id = stream.exactID
        let follow: Follow
        if let existing = followed[id] {
            follow = existing
        } else {
            follow = Follow(key: key, stream: stream)
            followed[id] = follow
            stats.withLock { $0.followedStreams = followed.count }
        }
        follow.followers.add(loop: loop)
        if let commands, commands.canSend {
            streams.setPresence(stream, node: nodeID, count: follow.followers.total, stamped: sharded, on: commands)
        }
    }

    public func detach(_ keys: [StreamKey], loop index: Int) {
        guard !keys.isEmpty else { return }
        loop.execute { [unowned self] in
            for key in keys {
                let stream = self.stream(for: key)
                let id = stream.exactID
                guard let follow = self.followed[id] else { continue }
                guard follow.followers.remove(loop: index) else { continue }
                if follow.followers.isEmpty {
                    self.followed[id] = nil
                    if self.options.layout == .streams, let subscriber = self.subscriber, subscriber.canSend {
                        subscriber.subscribe([self.unsubscribeCommand, self.streams.streamChannel(stream)])
                    }
                }
                if let commands = self.commands, commands.canSend {
                    self.streams.setPresence(stream, node: self.nodeID, count: follow.followers.total, stamped: self.sharded, on: commands)
                }
            }
            let count = self.followed.count
            self.stats.withLock { $0.followedStreams = count }
        }
    }

    // MARK: Asking the other nodes (cluster-wide admin views)

    /// A node's control channel: other nodes publish admin requests to it, and their answers to its own.
    private static func controlChannel(prefix: String, node: String) -> String { "\(prefix):ctl:\(node)" }

    /// How this node answers another node's admin request (`request`: an admin request line; `done`: its reply).
    public func setControlHandler(_ handler: @escaping @Sendable ([UInt8], @escaping @Sendable ([UInt8]) -> Void) -> Void) {
        controlHandler.withLock { $0 = handler }
    }

    /// Sends an admin request line to every other live node (or to `only` that one, if it is live) and collects
    /// their replies; `completion` gets them (sorted by node) and the nodes that did not answer within `timeout`.
    /// Without Redis, or no such live node: no replies, no nodes.
    public func ask(_ request: [UInt8], only: String? = nil, timeout: Duration = .seconds(2),
                    completion: @escaping @Sendable ([(node: String, reply: [UInt8])], [String]) -> Void) {
        listNodes { [unowned self] result in
            let others = ((try? result.get()) ?? []).map(\.id).filter { $0 != self.nodeID && (only == nil || $0 == only) }
            self.loop.execute { [unowned self] in
                guard !others.isEmpty, let commands = self.commands, commands.canSend else { return completion([], others) }
                self.nextAskID += 1
                let id = self.nextAskID
                let asking = Asking(waiting: Set(others), completion: completion)
                self.asking[id] = asking
                asking.timer = self.loop.schedule(after: timeout) { [unowned self] in self.finishAsking(id) }
                let message = "REQ\n\(id)\n\(self.nodeID)\n" + String(decoding: request, as: UTF8.self)
                for node in others {
                    commands.send([self.publishCommand, Self.controlChannel(prefix: self.options.prefix, node: node), message]) { _ in }
                }
            }
        }
    }

    private func finishAsking(_ id: UInt64) {
        guard let asking = asking.removeValue(forKey: id) else { return }
        _ = loop.cancel(asking.timer)
        asking.completion(asking.replies.sorted { $0.node < $1.node }, asking.waiting.sorted())
    }

    // MARK: Cluster-wide tails

    /// How this node hears of other nodes' tails and receives the event lines they forward (set by the hub).
    public func setTailHandler(_ handler: @escaping @Sendable (TailMessage) -> Void) {
        tailHandler.withLock { $0 = handler }
    }

    /// Sends a tail message on the control channel of `node`, or of every other live node (nil). Fire and forget:
    /// a start is renewed by its sender, and a lost line is a line a tail did not show.
    public func sendTail(_ message: TailMessage, to node: String?) {
        let text: String
        switch message {
        case .start(let id, _, let channel, let account):
            var w = JSONWriter(capacity: 64 + channel.utf8.count + (account?.utf8.count ?? 0))
            w.beginObject()
            w.field("channel", channel)
            if let account { w.field("account", account) }
            w.endObject()
            text = "TAIL\n\(id)\n\(nodeID)\n" + String(decoding: w.bytes, as: UTF8.self)
        case .stop(let id, _):
            text = "UNTAIL\n\(id)\n\(nodeID)\n"
        case .line(let id, _, let bytes):
            text = "EVT\n\(id)\n\(nodeID)\n" + String(decoding: bytes, as: UTF8.self)
        }
        let send: @Sendable ([String]) -> Void = { [unowned self] nodes in
            self.loop.execute { [unowned self] in
                guard let commands = self.commands, commands.canSend else { return }
                for node in nodes where node != self.nodeID {
                    commands.send([self.publishCommand, Self.controlChannel(prefix: self.options.prefix, node: node), text]) { _ in }
                }
            }
        }
        if let node { return send([node]) }
        listNodes { result in send(((try? result.get()) ?? []).map(\.id)) }
    }

    /// A message on this node's control channel: `REQ \n ID \n FROM \n LINE` or `REP \n ID \n FROM \n REPLY`; for
    /// tails, `TAIL \n ID \n FROM \n {"channel":C,"account":A}`, `UNTAIL \n ID \n FROM \n` and `EVT \n ID \n FROM \n LINE`.
    private func control(_ payload: [UInt8]) {
        var fields: [ArraySlice<UInt8>] = []
        var start = payload.startIndex
        for i in payload.indices where fields.count < 3 && payload[i] == 0x0A {
            fields.append(payload[start..<i])
            start = i + 1
        }
        guard fields.count == 3, let id = UInt64(String(decoding: fields[1], as: UTF8.self)) else { return }
        let from = String(decoding: fields[2], as: UTF8.self)
        let body = Array(payload[start...])
        switch String(decoding: fields[0], as: UTF8.self) {
        case "REQ":
            let handler = controlHandler.withLock { $0 }
            handler(body) { [unowned self] reply in
                self.loop.execute { [unowned self] in
                    guard let commands = self.commands, commands.canSend else { return }
                    let message = "REP\n\(id)\n\(self.nodeID)\n" + String(decoding: reply, as: UTF8.self)
                    commands.send([self.publishCommand, Self.controlChannel(prefix: self.options.prefix, node: from), message]) { _ in }
                }
            }
        case "REP":
            guard let asking = asking[id], asking.waiting.remove(from) != nil else { return }
            asking.replies.append((from, body))
            if asking.waiting.isEmpty { finishAsking(id) }
        case "TAIL":
            var channel: String? = nil, account: String? = nil
            body.withUnsafeBytes { bytes in
                try? JSONScanner.forEachMember(in: bytes) { key, value in
                    guard value.kind == .string else { return }
                    switch JSONScanner.decodeString(key, in: bytes) {
                    case "channel": channel = JSONScanner.decodeString(value, in: bytes)
                    case "account": account = JSONScanner.decodeString(value, in: bytes)
                    default: break
                    }
                }
            }
            guard let channel else { return }
            let handler = tailHandler.withLock { $0 }
            handler(.start(id: id, from: from, channel: channel, account: account))
        case "UNTAIL":
            let handler = tailHandler.withLock { $0 }
            handler(.stop(id: id, from: from))
        case "EVT":
            let handler = tailHandler.withLock { $0 }
            handler(.line(id: id, from: from, bytes: body))
        default:
            return
        }
    }

    // MARK: Views

    /// The synchronous view has nothing: in cluster mode history lives in Redis (see `readHistory`).
    public func history(_ stream: StreamKey, after: UInt64) -> StreamHistory? { nil }

    /// A stream's retained events in Redis with seq > `after` (at most `limit`), for `hubctl history`; nil when
    /// Redis has no such stream.
    public func readHistory(_ key: StreamKey, after: UInt64, limit: Int,
                            completion: @escaping @Sendable (Result<StreamHistory?, BrokerFailure>) -> Void) {
        loop.execute { [unowned self] in
            // A publish queued before this read (the same socket may have sent it first) is written first.
            self.sendQueuedPublishes()
            guard let commands = self.commands, commands.canSend else {
                return completion(.failure(BrokerFailure(message: "Redis is unavailable")))
            }
            self.streams.read(self.stream(for: key), after: after, limit: limit, on: commands) { [unowned self] result in
                switch result {
                case .failure(let error):
                    completion(.failure(BrokerFailure(message: "Redis: \(error.message)")))
                case .success(let read):
                    guard let epoch = read.epoch else { return completion(.success(nil)) }
                    let events = read.entries.compactMap { entry in
                        self.frame(key: key, seq: entry.seq, event: entry.event).map { RetainedEvent($0) }
                    }
                    completion(.success(StreamHistory(epoch: "\(self.epoch).\(epoch)", seq: read.seq, events: events)))
                }
            }
        }
    }

    public func maintain() {}

    public func statistics() -> BrokerStatistics {
        let s = stats.withLock { $0 }
        var b = BrokerStatistics(epoch: epoch)
        b.streams = s.followedStreams
        b.cluster = s
        return b
    }

    public var cluster: ClusterStatistics { stats.withLock { $0 } }
}

