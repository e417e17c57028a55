import Foundation
import HubEngine
import HubJSON
import HubSupport
import Synchronization
import WSProtocol

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
/// with the numbering. The critical section encodes each event once, appends it to
/// its stream's history (a few ring and counter updates), and appends one closure per batch to each loop that
/// follows one of its streams.
///
/// The same ordering serves recovery: `attach` reads under this lock, so an event is either numbered before the
/// read (and already in the inbox of each loop that followed its stream then, where the connection's floor skips
/// it) or after it (and delivered live: the read also made the connection's loop a follower, under the same lock).
public final class LocalBroker: Broker {
    let channelNames: [String]
    private let fanout: Fanout
    public let epoch: String
    let options: LocalBrokerOptions

    struct State {
        var history: HistoryStore
        var idempotency: IdempotencyTable
        /// The writer events are encoded with.
        var writer = JSONWriter(capacity: 4096)
        var duplicates = 0
    }
    let state: LockedValue<State>

    /// A fresh broker (new epoch), or one restored from a graceful stop's saved state.
    package init(channelNames: [String], shards: [any FanoutShard], options: LocalBrokerOptions, restoring saved: SavedBrokerState?) {
        self.channelNames = channelNames
        fanout = Fanout(shards: shards)
        self.options = options
        let epoch = saved?.hubEpoch ?? LocalBroker.makeEpoch()
        self.epoch = epoch
        var s = State(history: HistoryStore(limits: options.history, hubEpoch: epoch, nextGeneration: saved?.nextGeneration ?? 1),
                      idempotency: IdempotencyTable(windowNanos: options.idempotencyWindowNanos, maxKeys: options.idempotencyMaxKeys))
        if let saved { Self.restore(saved, into: &s, channelNames: channelNames) }
        state = LockedValue(s)
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
        let collector = DeliveryCollector(broker: self, completion: completion)
        let handedOff = state.withLock { s -> Bool in
            var batch = Fanout.Batch(capacity: drafts.count)
            var replies = [PublishReply](filledWith: PublishReply(seq: 0, delivered: 0, duplicate: false), count: drafts.count)
            // Per draft, the index of its event (-1: a duplicate). Made only once a duplicate turns up: until then
            // draft i is event i (an array less per batch).
            var eventOfDraft: [Int] = []
            var owned: [(event: Int, entry: IdempotencyEntry)] = []
            var waiting = 0
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
                let event = Self.frame(drafts[i], channelName: channelNames[drafts[i].channel], seq: seq, now: now, wall: wall,
                                       writer: &s.writer)
                s.history.retain(event, in: stream, now: now)
                if let idempotencyKey = drafts[i].idempotencyKey,
                   let entry = s.idempotency.insert(key, idempotencyKey, seq: seq, now: now, wallTime: wall) {
                    owned.append((batch.events.count, entry))
                }
                if !eventOfDraft.isEmpty { eventOfDraft.append(batch.events.count) }
                replies[i].seq = seq
                batch.append(event, loops: stream.loopFollowers.mask(loops: fanout.shards.count))
            }
            let handed = fanout.loopsHanded(batch)
            collector.prepare(events: batch.events, replies: replies, eventOfDraft: eventOfDraft, owned: owned, waiting: waiting,
                              shards: handed)
            guard handed > 0 else { return false }
            fanout.dispatch(batch) { counts in collector.report(counts) }
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
    package var historyReserved: Bool { state.withLock { $0.history.reserved } }

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
    package static func frame(_ draft: EventDraft, channelName: String, seq: UInt64, now: UInt64, wall: Double,
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
        let frame = w.withBytes { SharedBytes.frame(opcode: .text, $0) }
        // `data` is the last member: it ends right before the closing brace.
        let dataEnd = frame.count - 1
        return PublishedEvent(channel: draft.channel, account: draft.account, type: draft.type, seq: seq, frame: frame,
                              dataRange: (dataEnd - draft.data.count)..<dataEnd, acceptedAt: now, wallTime: wall)
    }
}
