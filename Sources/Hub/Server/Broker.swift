import Foundation
import Synchronization
import WSProtocol

/// One publish, validated at intake, before it has a sequence number.
public struct EventDraft {
    public let channel: Int
    /// nil: a broadcast to every subscriber of the channel.
    public let account: AccountID?
    public let type: String
    /// The raw JSON of `data`, exactly as the backend sent it. Only valid during `Broker.publish`.
    public let data: UnsafeRawBufferPointer
    /// A publish repeating a key already seen in the same stream within the window is not delivered again.
    public let idempotencyKey: ExactString?

    public init(channel: Int, account: AccountID?, type: String, data: UnsafeRawBufferPointer, idempotencyKey: ExactString? = nil) {
        self.channel = channel
        self.account = account
        self.type = type
        self.data = data
        self.idempotencyKey = idempotencyKey
    }

    var stream: StreamKey { StreamKey(channel: channel, account: account) }
}

/// An event with its number, framed once as a WebSocket text frame; the same bytes go to every recipient.
public final class PublishedEvent: Sendable {
    public let channel: Int
    public let account: AccountID?
    public let type: String
    public let seq: UInt64
    /// The complete server frame (header + JSON payload), shared by every recipient.
    public let frame: SharedBytes
    /// Where the backend's `data` sits inside `frame` (for `tail`).
    public let dataRange: Range<Int>
    /// Monotonic nanoseconds when the broker accepted it (publish-to-write latency).
    public let acceptedAt: UInt64
    /// Wall-clock seconds when the broker accepted it (admin views).
    public let wallTime: Double

    init(channel: Int, account: AccountID?, type: String, seq: UInt64, frame: SharedBytes, dataRange: Range<Int>,
         acceptedAt: UInt64, wallTime: Double) {
        self.channel = channel
        self.account = account
        self.type = type
        self.seq = seq
        self.frame = frame
        self.dataRange = dataRange
        self.acceptedAt = acceptedAt
        self.wallTime = wallTime
    }

    public var data: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: frame.bytes[dataRange]) }

    var stream: StreamKey { StreamKey(channel: channel, account: account) }
}

/// What the backend is told about one publish line.
public struct PublishReply: Sendable, Equatable {
    /// Set when the event could not be numbered (cluster mode: Redis unreachable). Nothing was published; the
    /// backend retries, with its idempotency key. `seq`, `delivered` and `duplicate` are then meaningless.
    public var failure: BrokerFailure? = nil
    public var seq: UInt64
    /// Connections the event was handed to (for a duplicate: the first publish's count).
    public var delivered: Int
    /// The idempotency key was seen before in this stream: nothing was delivered again.
    public var duplicate: Bool

    public init(seq: UInt64, delivered: Int, duplicate: Bool) {
        self.seq = seq
        self.delivered = delivered
        self.duplicate = duplicate
    }
}

/// The result of one `Broker.publish` call.
public struct PublishOutcome: Sendable {
    /// The events this call numbered (duplicates are not among them), and for each its delivery count.
    public let events: [PublishedEvent]
    public let delivered: [Int]
    /// One reply per draft, in the order of the drafts.
    public let replies: [PublishReply]
}

/// Why a resume could not be honoured. The app then refetches its state through the REST API.
public enum RecoveryFailure: String, Error, Sendable, CaseIterable {
    /// The stream's numbering is not the one the position came from (fresh hub start, stream forgotten, or a
    /// position ahead of the stream).
    case epochChanged = "epoch_changed"
    /// Some event after the position is no longer in the history (evicted, expired, or history is off).
    case tooOld = "too_old"
    /// More events after the position than `--recovery-max`, or more bytes than the connection may queue.
    case tooMany = "too_many"
}

/// Why a broker could not number, read or publish (cluster mode: Redis is unreachable). The code is what clients
/// and the backend see (`BROKER_UNAVAILABLE`); they retry.
public struct BrokerFailure: Error, Sendable, Equatable {
    public var code: String
    public var message: String

    public init(code: String = "BROKER_UNAVAILABLE", message: String) {
        self.code = code
        self.message = message
    }
}

/// A position in a stream to resume after.
public struct ResumePoint: Sendable, Equatable {
    /// The stream's own epoch, as the broker gave it out (`StreamPosition.epoch`).
    public var epoch: String
    public var seq: UInt64

    public init(epoch: String, seq: UInt64) {
        self.epoch = epoch
        self.seq = seq
    }
}

/// One stream a subscribe asks the broker about.
public struct StreamRead: Sendable {
    public var stream: StreamKey
    /// The connection starts following this stream (a new subscription): the broker keeps the stream's numbering
    /// while anyone follows it. Balanced by `Broker.detach`.
    public var follow: Bool
    /// Read the history after this position.
    public var resume: ResumePoint?
    /// At most this many events are replayed.
    public var limit: Int
    /// The index of the loop the connection lives on (-1: unknown), so a broker can send a stream's events only to
    /// the loops that have followers of it.
    public var loop: Int

    public init(stream: StreamKey, follow: Bool, resume: ResumePoint?, limit: Int, loop: Int = -1) {
        self.stream = stream
        self.follow = follow
        self.resume = resume
        self.limit = limit
        self.loop = loop
    }
}

/// A stream's position when it was read, and what the history had after the requested one.
public struct StreamPosition: Sendable {
    /// The stream's own epoch: opaque, without a "." (the local broker: its generation; Redis: the stream's epoch).
    public var epoch: String
    /// The stream's last seq at the moment of the read: every later event reaches the connection live.
    public var seq: UInt64
    /// nil when no resume was asked; else every event after the position (oldest first), or why not.
    public var replay: Result<[RetainedEvent], RecoveryFailure>?
}

/// A stream's retained events, for admin views.
public struct StreamHistory: Sendable {
    public var epoch: String
    public var seq: UInt64
    public var events: [RetainedEvent]
}

/// Counters and gauges of the broker's history and idempotency keys (`stats`, `/metrics`).
public struct BrokerStatistics: Sendable {
    public var epoch: String
    public var historyBytes = 0
    public var historyLimitBytes = 0
    public var events = 0
    public var streams = 0
    public var evictions = 0
    public var expirations = 0
    public var forgottenStreams = 0
    public var duplicates = 0
    public var idempotencyKeys = 0
    /// Cluster mode only: the Redis side.
    public var cluster: ClusterStatistics? = nil
}

/// The boundary between publish intake and fan-out, and the read side of numbering and history. Intake (the Unix
/// socket) hands a batch of drafts to a broker; the broker numbers them, retains them and gets them to every
/// subscriber it serves. `LocalBroker` serves this process's loops; a cluster broker (Redis Streams) would number,
/// retain and share events between hubs behind the same calls.
///
/// The read side is synchronous for the local broker: a subscribe registers the connection, reads positions and
/// history, writes the replay and sets its floor in one go on its loop. A broker backed by a remote store
/// (`RedisBroker`) answers later: the connection holds the live events of those streams meanwhile and sorts them
/// against the read when it comes (see `ClientConnection.subscribe`).
public protocol Broker: Sendable {
    /// Numbers each draft in its stream, frames it once, retains it in the stream's history, fans it out, and then
    /// calls `completion` once (on an arbitrary loop thread) with the new events, their exact delivery counts, and
    /// one reply per draft. A draft whose idempotency key was seen in its stream within the window is not numbered
    /// again: its reply carries the first publish's seq and delivered, with `duplicate` set (if the first is still
    /// in flight, the reply waits for it). Encoding happens before `publish` returns, so `drafts` may point into a
    /// transient read buffer.
    func publish(_ drafts: [EventDraft], completion: @escaping @Sendable (PublishOutcome) -> Void)

    /// Random per fresh start of the numbering (kept across a graceful restart).
    var epoch: String { get }

    /// Reads the position of each stream and, where asked, the history after a position, atomically with respect
    /// to numbering: every event numbered after the read reaches the loops' inboxes after it, in seq order per
    /// stream. A broker that can answer at once (the local one) returns the positions; one backed by a remote store
    /// returns nil and does nothing, and the caller then asks `attach(_:completion:)`. (Two calls rather than one
    /// with an optional result: the caller builds the completion, three allocations per subscribe, only when it
    /// is needed.) Every `follow: true` read is balanced by a `detach`, whether the read succeeded or not.
    func attachNow(_ reads: [StreamRead]) -> [StreamPosition]?

    /// `attachNow`'s read for a broker that answers later: calls `completion` from any thread, exactly once.
    func attach(_ reads: [StreamRead], completion: @escaping @Sendable (Result<[StreamPosition], BrokerFailure>) -> Void)

    /// Connections on loop `loop` stopped following these streams (one call per `follow: true` read).
    func detach(_ streams: [StreamKey], loop: Int)

    /// The retained events of a stream with seq > `after` (nil when the broker has no such stream).
    func history(_ stream: StreamKey, after: UInt64) -> StreamHistory?

    /// Periodic housekeeping: expires old events, forgets idle streams and old idempotency keys.
    func maintain()

    func statistics() -> BrokerStatistics
}

/// One loop's part of fan-out: delivers a batch to that loop's subscribers, on that loop's thread.
public protocol FanoutShard: Sendable {
    /// Must hop to the shard's own thread, deliver, then call `done` (from that thread) with per-event counts.
    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void)

    /// The stream's numbering restarted under its subscribers (cluster mode: Redis lost it): close every connection
    /// subscribed to it (1012), so the app reconnects, is told `epoch_changed` and refetches.
    func numberingRestarted(_ stream: StreamKey)
}

extension Broker {
    public func attachNow(_ reads: [StreamRead]) -> [StreamPosition]? { nil }
}

extension FanoutShard {
    public func numberingRestarted(_ stream: StreamKey) {}
}

/// A batch of numbered events handed to every shard.
public final class EventBatch: Sendable {
    public let events: [PublishedEvent]
    /// Per event, the loops (bit i: loop i) with followers of its stream when it was numbered; empty when every loop
    /// the batch is handed to follows every event of it (one loop, or the same loops for all). A loop skips the
    /// events it does not follow instead of looking each one up in its registry to find nobody there.
    let loops: [UInt64]
    init(events: [PublishedEvent], loops: [UInt64] = []) {
        self.events = events
        self.loops = loops
    }

    /// Whether loop `loop` may have subscribers of event `i`.
    @inline(__always)
    func reaches(_ i: Int, loop: Int) -> Bool {
        loops.isEmpty || (loop < 64 && loops[i] & (1 << UInt64(loop)) != 0)
    }
}

/// Options of the local broker (from `HubConfiguration`).
public struct LocalBrokerOptions: Sendable {
    public var history: HistoryLimits
    public var idempotencyWindowNanos: UInt64
    public var idempotencyMaxKeys: Int

    public init(history: HistoryLimits, idempotencyWindowNanos: UInt64, idempotencyMaxKeys: Int) {
        self.history = history
        self.idempotencyWindowNanos = idempotencyWindowNanos
        self.idempotencyMaxKeys = idempotencyMaxKeys
    }
}

/// Broker for a single hub process: numbering and history under one lock, then one hand-off per batch to each loop
/// that has followers of the batch's streams (a loop with none is not woken; an event nobody follows reaches no loop).
///
/// Why the lock also covers the hand-off: two intake connections publishing to the same stream must not have
/// their events overtake each other on the way to a loop, or a client would see seq 18 before seq 17. Taking
/// the numbers and enqueuing on every loop inside the same critical section makes the loops' inboxes agree
/// with the numbering. The critical section encodes each event once (~100 ns for a small event), appends it to
/// its stream's history (a few ring and counter updates), and appends one closure per batch to each loop that
/// follows one of its streams.
///
/// The same ordering serves recovery: `attach` reads under this lock, so an event is either numbered before the
/// read (and already in the inbox of each loop that followed its stream then, where the connection's floor skips
/// it) or after it (and delivered live: the read also made the connection's loop a follower, under the same lock).
public final class LocalBroker: Broker {
    let channelNames: [String]
    private let shards: [any FanoutShard]
    public let epoch: String
    let options: LocalBrokerOptions

    struct State {
        var history: HistoryStore
        var idempotency: IdempotencyTable
        /// The writer events are encoded with.
        var writer = JSONWriter(capacity: 4096)
        var duplicates = 0
    }
    let state: Mutex<State>

    /// A fresh broker (new epoch), or one restored from a graceful stop's saved state.
    init(channelNames: [String], shards: [any FanoutShard], options: LocalBrokerOptions, restoring saved: SavedBrokerState?) {
        self.channelNames = channelNames
        self.shards = shards
        self.options = options
        let epoch = saved?.hubEpoch ?? LocalBroker.makeEpoch()
        self.epoch = epoch
        var s = State(history: HistoryStore(limits: options.history, hubEpoch: epoch, nextGeneration: saved?.nextGeneration ?? 1),
                      idempotency: IdempotencyTable(windowNanos: options.idempotencyWindowNanos, maxKeys: options.idempotencyMaxKeys))
        if let saved { Self.restore(saved, into: &s, channelNames: channelNames) }
        state = Mutex(s)
    }

    public convenience init(channelNames: [String], shards: [any FanoutShard], options: LocalBrokerOptions) {
        self.init(channelNames: channelNames, shards: shards, options: options, restoring: nil)
    }

    /// 8 random bytes, base64url (11 characters, never a ".").
    static func makeEpoch() -> String { Base64URL.randomToken(bytes: 8) }

    public func publish(_ drafts: [EventDraft], completion: @escaping @Sendable (PublishOutcome) -> Void) {
        guard !drafts.isEmpty else { completion(PublishOutcome(events: [], delivered: [], replies: [])); return }
        let now = monotonicNanos()
        let wall = wallClockSeconds()
        let collector = DeliveryCollector.make(broker: self, completion: completion)
        let handedOff = state.withLock { s -> Bool in
            var events: [PublishedEvent] = []
            events.reserveCapacity(drafts.count)
            var replies = [PublishReply](filledWith: PublishReply(seq: 0, delivered: 0, duplicate: false), count: drafts.count)
            // Per draft, the index of its event (-1: a duplicate). Made only once a duplicate turns up: until then
            // draft i is event i (an array less per batch; each costs ~700 instructions).
            var eventOfDraft: [Int] = []
            var owned: [(event: Int, entry: IdempotencyEntry)] = []
            var waiting = 0
            // The loops with followers of any of the batch's streams: the others are not handed it (nor woken).
            var loops: UInt64 = 0
            // Per event, its stream's loops: made once two events' loops differ (until then they are all `loops`).
            var eventLoops: [UInt64] = []
            // Each draft is read in place (`drafts[i]`, not a copy per draft with its strings retained and released).
            for i in drafts.indices {
                let key = drafts[i].stream
                if let idempotencyKey = drafts[i].idempotencyKey, let seen = s.idempotency.lookup(key, idempotencyKey, now: now) {
                    if eventOfDraft.isEmpty { eventOfDraft = Array(0..<i) }
                    eventOfDraft.append(-1)
                    s.duplicates += 1
                    replies[i] = PublishReply(seq: seen.seq, delivered: seen.delivered ?? 0, duplicate: true)
                    if seen.delivered == nil {
                        seen.waiters.append((collector, i))
                        waiting += 1
                    }
                    continue
                }
                let (stream, seq) = s.history.number(key, now: now)
                let followers = stream.loopFollowers.mask(loops: shards.count)
                if !eventLoops.isEmpty {
                    eventLoops.append(followers)
                } else if !events.isEmpty && followers != loops {
                    eventLoops.reserveCapacity(drafts.count)
                    eventLoops.append(contentsOf: repeatElement(loops, count: events.count))
                    eventLoops.append(followers)
                }
                loops |= followers
                let event = Self.frame(drafts[i], channelName: channelNames[drafts[i].channel], seq: seq, now: now, wall: wall,
                                       writer: &s.writer)
                s.history.retain(event, in: stream, now: now)
                if let idempotencyKey = drafts[i].idempotencyKey,
                   let entry = s.idempotency.insert(key, idempotencyKey, seq: seq, now: now, wallTime: wall) {
                    owned.append((events.count, entry))
                }
                if !eventOfDraft.isEmpty { eventOfDraft.append(events.count) }
                replies[i].seq = seq
                events.append(event)
            }
            // Past 64 loops the mask cannot say: every loop is handed the batch.
            let everyLoop = shards.count > 64
            let handed = events.isEmpty ? 0 : (everyLoop ? shards.count : loops.nonzeroBitCount)
            collector.prepare(events: events, replies: replies, eventOfDraft: eventOfDraft, owned: owned, waiting: waiting,
                              shards: handed)
            guard handed > 0 else { return false }
            let batch = EventBatch(events: events, loops: everyLoop ? [] : eventLoops)
            let reference = DeliveryCollector.Reference(collector: collector)
            for (i, shard) in shards.enumerated() where everyLoop || (loops >> UInt64(i)) & 1 == 1 {
                shard.deliver(batch) { counts in reference.collector.report(counts) }
            }
            return true
        }
        if !handedOff { collector.fannedOut() }
    }

    /// The first publishes of these keys completed: records their delivery counts and returns who waited for them.
    func resolve(_ owned: [(entry: IdempotencyEntry, delivered: Int)]) -> [(collector: DeliveryCollector, index: Int, delivered: Int)] {
        state.withLock { _ in
            var waiting: [(collector: DeliveryCollector, index: Int, delivered: Int)] = []
            for (entry, delivered) in owned {
                entry.delivered = delivered
                for waiter in entry.waiters { waiting.append((waiter.collector, waiter.index, delivered)) }
                entry.waiters = []
            }
            return waiting
        }
    }

    public func attachNow(_ reads: [StreamRead]) -> [StreamPosition]? { attach(reads) }

    /// The hub asks `attachNow`, which always answers here; this answers the same, through `completion`.
    public func attach(_ reads: [StreamRead], completion: @escaping @Sendable (Result<[StreamPosition], BrokerFailure>) -> Void) {
        completion(.success(attach(reads)))
    }

    func attach(_ reads: [StreamRead]) -> [StreamPosition] {
        let now = monotonicNanos()
        return state.withLock { s in
            reads.map { read in
                let stream = read.follow ? s.history.follow(read.stream, loop: read.loop, now: now)
                    : s.history.entry(read.stream, now: now)
                let epoch = String(stream.generation)
                var position = StreamPosition(epoch: epoch, seq: stream.lastSeq, replay: nil)
                if let resume = read.resume {
                    if resume.epoch != epoch {
                        position.replay = .failure(.epochChanged)
                    } else {
                        switch s.history.read(stream, after: resume.seq, limit: read.limit) {
                        case .events(let events): position.replay = .success(events)
                        case .tooOld: position.replay = .failure(.tooOld)
                        case .tooMany: position.replay = .failure(.tooMany)
                        case .ahead: position.replay = .failure(.epochChanged)
                        }
                    }
                }
                s.history.settle(stream, now: now)
                return position
            }
        }
    }

    /// `loop`: the one the reads that followed these streams named (-1: unknown).
    public func detach(_ streams: [StreamKey], loop: Int = -1) {
        guard !streams.isEmpty else { return }
        let now = monotonicNanos()
        state.withLock { s in
            for key in streams { s.history.unfollow(key, loop: loop, now: now) }
        }
    }

    public func history(_ key: StreamKey, after: UInt64) -> StreamHistory? {
        state.withLock { s in
            guard let stream = s.history.stream(key) else { return nil }
            return StreamHistory(epoch: "\(epoch).\(stream.generation)", seq: stream.lastSeq,
                                 events: s.history.retained(stream, after: after))
        }
    }

    /// False when history is on but its ring could not be mapped (the hub logs it at start).
    var historyReserved: Bool { state.withLock { $0.history.reserved } }

    public func maintain() {
        let now = monotonicNanos()
        state.withLock { s in
            s.history.maintain(now: now)
            s.idempotency.evict(now: now)
        }
    }

    public func statistics() -> BrokerStatistics {
        state.withLock { s in
            var stats = BrokerStatistics(epoch: epoch)
            stats.historyBytes = s.history.bytes
            stats.historyLimitBytes = options.history.memoryBytes
            stats.events = s.history.eventCount
            stats.streams = s.history.streamCount
            stats.evictions = s.history.evictions
            stats.expirations = s.history.expirations
            stats.forgottenStreams = s.history.forgottenStreams
            stats.duplicates = s.duplicates
            stats.idempotencyKeys = s.idempotency.count
            return stats
        }
    }

    /// Frames one event: the JSON is written once with `writer`, then copied behind its WebSocket header into the
    /// one buffer every recipient shares.
    static func frame(_ draft: EventDraft, channelName: String, seq: UInt64, now: UInt64, wall: Double,
                      writer w: inout JSONWriter) -> PublishedEvent {
        let broadcast = draft.account == nil
        w.reset()
        w.beginObject()
        w.field("type", draft.type)
        w.field("channel", channelName)
        w.field("seq", seq)
        if broadcast { w.field("broadcast", true) }
        w.key("data" as StaticString)  // a bare literal picks key(String), which escapes it
        w.raw(draft.data)
        w.endObject()
        let frame = w.withBytes { LoopContext.frame(opcode: .text, $0) }
        // `data` is the last member: it ends right before the closing brace.
        let dataEnd = frame.count - 1
        return PublishedEvent(channel: draft.channel, account: draft.account, type: draft.type, seq: seq, frame: frame,
                              dataRange: (dataEnd - draft.data.count)..<dataEnd, acceptedAt: now, wallTime: wall)
    }
}

/// Sums per-shard delivery counts, records idempotency outcomes, waits for the duplicates of in-flight publishes,
/// and completes the batch once, when all of that is done.
///
/// One allocation per batch: the state and its `pthread_mutex_t` are the header and the single element of one
/// `ManagedBuffer` (as a class with a `Mutex`, the collector took three: itself, the `Mutex` and the mutex's
/// memory). Made by `make`; the state is reached only through its pointer, under the lock.
final class DeliveryCollector: ManagedBuffer<DeliveryCollector.Header, pthread_mutex_t> {
    /// The collector as a `@Sendable` closure captures it: `ManagedBuffer` is never `Sendable`, but every access to
    /// the collector's state is under its lock, and the rest of its header never changes.
    struct Reference: @unchecked Sendable {
        let collector: DeliveryCollector
    }

    struct Header {
        let broker: LocalBroker
        let completion: @Sendable (PublishOutcome) -> Void
        var state = State()
    }

    struct State {
        var events: [PublishedEvent] = []
        var delivered: [Int] = []
        var replies: [PublishReply] = []
        /// Per draft: the index of its event, or -1 for a duplicate; empty when the batch has no duplicate (draft i
        /// is then event i).
        var eventOfDraft: [Int] = []
        /// Idempotency entries this batch created, by event index.
        var owned: [(event: Int, entry: IdempotencyEntry)] = []
        var remainingShards = 0
        var waitingDuplicates = 0
        var fannedOut = false
        var completed = false
    }

    static func make(broker: LocalBroker, completion: @escaping @Sendable (PublishOutcome) -> Void) -> DeliveryCollector {
        let made = unsafeDowncast(create(minimumCapacity: 1) { _ in Header(broker: broker, completion: completion) },
                                  to: DeliveryCollector.self)
        made.withUnsafeMutablePointerToElements { mutex in
            mutex.initialize(to: pthread_mutex_t())
            pthread_mutex_init(mutex, nil)
        }
        return made
    }

    deinit {
        withUnsafeMutablePointerToElements { mutex in
            pthread_mutex_destroy(mutex)
            mutex.deinitialize(count: 1)
        }
    }

    private func withLock<Result>(_ body: (inout State) -> Result) -> Result {
        withUnsafeMutablePointers { header, mutex in
            pthread_mutex_lock(mutex)
            defer { pthread_mutex_unlock(mutex) }
            return body(&header.pointee.state)
        }
    }

    /// Called under the broker's lock, before any shard can report.
    func prepare(events: [PublishedEvent], replies: [PublishReply], eventOfDraft: [Int],
                 owned: [(event: Int, entry: IdempotencyEntry)], waiting: Int, shards: Int) {
        withLock { s in
            s.events = events
            // The first shard's counts become `delivered` (see `report`): no array of zeros per batch.
            s.replies = replies
            s.eventOfDraft = eventOfDraft
            s.owned = owned
            // Nothing resolves a waiter before the broker's lock is released, so no count-down has happened yet.
            s.waitingDuplicates = waiting
            s.remainingShards = shards
        }
    }

    func report(_ counts: [Int]) {
        let done = withLock { s -> Bool in
            if s.delivered.isEmpty && counts.count == s.events.count {
                s.delivered = counts
            } else {
                if s.delivered.isEmpty { s.delivered = Array(filledWith: 0, count: s.events.count) }
                for i in counts.indices where i < s.delivered.count { s.delivered[i] += counts[i] }
            }
            s.remainingShards -= 1
            return s.remainingShards == 0
        }
        if done { fannedOut() }
    }

    /// Every shard has reported (or there was nothing to fan out). Without idempotency entries to resolve, the batch
    /// completes under the same lock.
    func fannedOut() {
        let (owned, outcome) = withLock { s -> ([(entry: IdempotencyEntry, delivered: Int)], PublishOutcome?) in
            if s.delivered.count != s.events.count { s.delivered = Array(filledWith: 0, count: s.events.count) }  // no shard had followers
            if s.eventOfDraft.isEmpty {
                for i in s.replies.indices where i < s.delivered.count { s.replies[i].delivered = s.delivered[i] }
            } else {
                for (i, e) in s.eventOfDraft.enumerated() where e >= 0 { s.replies[i].delivered = s.delivered[e] }
            }
            s.fannedOut = true
            guard s.owned.isEmpty else { return (s.owned.map { ($0.entry, s.delivered[$0.event]) }, nil) }
            return ([], Self.complete(&s))
        }
        guard !owned.isEmpty else {
            // Completion was decided under that lock: now, or else by the last awaited duplicate's `duplicateResolved`
            // (which sees `fannedOut`).
            if let outcome { finish(outcome) }
            return
        }
        let broker = withUnsafeMutablePointerToHeader { $0.pointee.broker }
        for waiter in broker.resolve(owned) { waiter.collector.duplicateResolved(waiter.index, delivered: waiter.delivered) }
        finishIfDone()
    }

    /// The first publish of a key one of our drafts repeated has completed.
    func duplicateResolved(_ index: Int, delivered: Int) {
        withLock { s in
            if index < s.replies.count { s.replies[index].delivered = delivered }
            s.waitingDuplicates -= 1
        }
        finishIfDone()
    }

    private func finishIfDone() {
        if let outcome = withLock({ Self.complete(&$0) }) { finish(outcome) }
    }

    /// The outcome, once and only once everything is in (under the lock).
    private static func complete(_ s: inout State) -> PublishOutcome? {
        guard s.fannedOut, s.waitingDuplicates <= 0, !s.completed else { return nil }
        s.completed = true
        return PublishOutcome(events: s.events, delivered: s.delivered, replies: s.replies)
    }

    /// The completion is read through the header's pointer (`ManagedBuffer.header` is a stored `var` of a class:
    /// each access would cost a run-time exclusivity check); it never changes.
    private func finish(_ outcome: PublishOutcome) {
        let completion = withUnsafeMutablePointerToHeader { $0.pointee.completion }
        completion(outcome)
    }
}

/// Seconds since the Unix epoch, with sub-second precision.
func wallClockSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
