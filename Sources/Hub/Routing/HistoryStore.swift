/// Limits of the retained history (`--history-size`, `--history-ttl`, `--history-memory`).
public struct HistoryLimits: Sendable, Equatable {
    /// Events kept per stream; 0 keeps none (numbering and epochs still work, recovery always says `too_old`).
    public var size: Int
    /// Events older than this are dropped, and a stream with no event, no follower and no publish for this long
    /// is forgotten.
    public var ttlNanos: UInt64
    /// Frame bytes plus `perEventOverhead` per retained event, over every stream.
    public var memoryBytes: Int

    public init(size: Int, ttlNanos: UInt64, memoryBytes: Int) {
        self.size = size
        self.ttlNanos = ttlNanos
        self.memoryBytes = memoryBytes
    }

    /// What a retained event is counted for besides its frame bytes: an upper bound of its real cost, which is its
    /// `RetainedEvent` ring slot (32 bytes, up to twice that while the ring is not full), the `SharedBytes` object
    /// (48) and its buffer's malloc header and rounding (16-31), and its FIFO entry (24, up to about four times that
    /// with the ring's slack and stale entries of hot streams). Measured: about 150 bytes beyond the frame with
    /// 100-event streams (`BrokerBench memory`, see Benchmarks/README.md, "Recovery").
    public static let perEventOverhead = 256
}

/// An event as the history keeps it: the frame every recipient was sent (replayed byte for byte) and what replays
/// need, 32 bytes inline in the stream's ring. Not the `PublishedEvent` object (channel, account, type, wall time:
/// ~110 bytes more per event), which is freed after fan-out; the frame's size is kept here, so accounting for a
/// dropped event reads only its ring slot. Rarely needed facts (type, wall time) are derived.
public struct RetainedEvent: Sendable {
    public let frame: SharedBytes
    public let seq: UInt64
    /// Monotonic ns when the broker accepted it (TTL, and the order of a replay across two streams).
    public let acceptedAt: UInt64
    /// Where `data` starts in `frame` (it ends right before the payload's closing brace, the frame's last byte).
    let dataStart: UInt32
    let frameCount: UInt32

    init(frame: SharedBytes, seq: UInt64, acceptedAt: UInt64, dataStart: Int) {
        self.frame = frame
        self.seq = seq
        self.acceptedAt = acceptedAt
        frameCount = UInt32(clamping: frame.count)
        self.dataStart = UInt32(clamping: min(dataStart, max(0, frame.count - 1)))
    }

    init(_ event: PublishedEvent) {
        self.init(frame: event.frame, seq: event.seq, acceptedAt: event.acceptedAt, dataStart: event.dataRange.lowerBound)
    }

    /// What the history counts for it.
    var cost: Int { Int(frameCount) + HistoryLimits.perEventOverhead }

    var dataRange: Range<Int> { Int(dataStart)..<max(Int(dataStart), Int(frameCount) - 1) }

    /// The backend's `data`, byte for byte.
    var data: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: frame.bytes[dataRange]) }

    /// The JSON payload behind the frame header (an unmasked server header is 2, 4 or 10 bytes).
    var payload: UnsafeRawBufferPointer {
        let n = frame.count
        let header = n - 2 <= 125 ? 2 : (n - 4 <= 0xFFFF ? 4 : 10)
        return UnsafeRawBufferPointer(rebasing: frame.bytes[min(header, n)...])
    }

    /// The event's type, read back from its frame (admin views and the state file only).
    public var type: String {
        var found = ""
        let payload = self.payload
        try? JSONScanner.forEachMember(in: payload) { key, value in
            if found.isEmpty, value.kind == .string, key.stringEquals("type", in: payload) {
                found = JSONScanner.decodeString(value, in: payload)
            }
        }
        return found
    }

    /// Wall-clock seconds when it was accepted, from its age on the monotonic clock.
    func wallTime(wallNow: Double = wallClockSeconds(), monotonicNow: UInt64 = monotonicNanos()) -> Double {
        wallNow - Double(monotonicNow > acceptedAt ? monotonicNow - acceptedAt : 0) / 1e9
    }
}

/// One stream: its numbering, its retained events (contiguous seqs, oldest first) and how many connections of this
/// hub follow it. Owned by a `HistoryStore` and only touched under the broker's lock.
final class StreamState {
    let key: StreamKey
    /// Bumped by the store for every stream entry it creates: a stream forgotten and created again is told apart.
    let generation: UInt64
    var lastSeq: UInt64
    var events = Ring<RetainedEvent>()
    /// Monotonic ns of the last publish, or of the last follower leaving.
    var lastActivity: UInt64
    /// Connections subscribed to this stream (a followed stream is never forgotten: its numbering must go on).
    var followers = 0
    /// In the store's idle queue (at most once).
    var idleQueued = false
    /// Removed from the store's table; entries still pointing at it are stale.
    var forgotten = false

    init(key: StreamKey, generation: UInt64, lastSeq: UInt64 = 0, now: UInt64) {
        self.key = key
        self.generation = generation
        self.lastSeq = lastSeq
        self.lastActivity = now
    }

    /// The seq of the oldest retained event. Retained seqs are contiguous and end at `lastSeq` (events are retained
    /// as they are numbered and only ever dropped from the front), so this touches no event: eviction checks run on
    /// cold streams.
    var firstRetainedSeq: UInt64? { events.isEmpty ? nil : lastSeq &- UInt64(events.count) &+ 1 }
}

/// What a read of a stream's history found.
public enum HistoryRead: Sendable, Equatable {
    /// Every event after the position, oldest first (empty when the position is the stream's top).
    case events([RetainedEvent])
    /// Some event after the position is no longer retained (evicted, expired, or history is off).
    case tooOld
    /// More events after the position than the caller may replay.
    case tooMany
    /// The position is ahead of the stream: it belongs to another numbering.
    case ahead

    public static func == (a: HistoryRead, b: HistoryRead) -> Bool {
        switch (a, b) {
        case (.events(let x), .events(let y)): return x.map(\.seq) == y.map(\.seq)
        case (.tooOld, .tooOld), (.tooMany, .tooMany), (.ahead, .ahead): return true
        default: return false
        }
    }
}

/// Every stream's sequence numbers and its bounded history, for one hub process. A value type used under the
/// broker's lock: numbering, retaining and reading happen in the same critical section as the hand-off to the loops,
/// which is what makes "acknowledged ⇒ retained" and the gap-free resume hold.
///
/// Bounds and their cost, all O(1) amortised per publish:
/// - per stream, `limits.size` events (the oldest is dropped when one more arrives);
/// - over all streams, `limits.memoryBytes`: `order` is a FIFO of (stream, seq) in publish order, so its front is
///   the globally oldest retained event. Eviction and TTL expiry pop the front. Events dropped elsewhere (by the
///   per-stream count) leave stale entries behind, recognised because their seq is below the stream's oldest
///   retained one (or the stream was forgotten); when stale entries outnumber live ones the FIFO is rebuilt,
///   which each stale entry pays for once;
/// - idle streams: a stream that has no event left and no follower goes into `idle` (a FIFO by the time it went
///   there); once `ttl` has passed, it is forgotten if still idle and nothing was published meanwhile, or queued
///   again. So the table holds followed streams, streams with history, and streams active within about 2 × ttl.
struct HistoryStore {
    let limits: HistoryLimits
    /// Random per fresh start (kept across a graceful restart).
    let hubEpoch: String
    private(set) var nextGeneration: UInt64
    private var streams: [StreamKey: StreamState] = [:]

    private struct OrderEntry {
        let stream: StreamState
        let seq: UInt64
        /// The event's `acceptedAt`: the TTL check looks at the front entry alone.
        let acceptedAt: UInt64
    }
    private var order = Ring<OrderEntry>()
    private var staleInOrder = 0

    private struct IdleEntry {
        let stream: StreamState
        let since: UInt64
    }
    private var idle = Ring<IdleEntry>()

    /// Counted bytes of retained events (frames + overhead).
    private(set) var bytes = 0
    private(set) var eventCount = 0
    /// Events dropped to stay under `memoryBytes`.
    private(set) var evictions = 0
    /// Events dropped because they were older than the TTL.
    private(set) var expirations = 0
    /// Streams forgotten after being idle.
    private(set) var forgottenStreams = 0

    init(limits: HistoryLimits, hubEpoch: String, nextGeneration: UInt64 = 1) {
        self.limits = limits
        self.hubEpoch = hubEpoch
        self.nextGeneration = max(1, nextGeneration)
    }

    var streamCount: Int { streams.count }
    /// Entries in the publish-order FIFO, live and stale (for tests: it must stay O(retained events)).
    var orderEntryCount: Int { order.count }
    var idleEntryCount: Int { idle.count }

    /// The stream, if the store has it.
    func stream(_ key: StreamKey) -> StreamState? { streams[key] }

    /// The stream, created (with the next generation, numbering from 1) when absent.
    mutating func entry(_ key: StreamKey, now: UInt64) -> StreamState {
        if let stream = streams[key] { return stream }
        let stream = StreamState(key: key, generation: nextGeneration, now: now)
        nextGeneration += 1
        streams[key] = stream
        return stream
    }

    // MARK: Publishing

    /// Assigns the next seq of `key`'s stream.
    mutating func number(_ key: StreamKey, now: UInt64) -> (StreamState, UInt64) {
        let stream = entry(key, now: now)
        stream.lastSeq &+= 1
        stream.lastActivity = now
        return (stream, stream.lastSeq)
    }

    /// Retains `event` (just numbered in `stream`), then applies the bounds.
    mutating func retain(_ published: PublishedEvent, in stream: StreamState, now: UInt64) {
        guard limits.size > 0 else {
            becameEmpty(stream, now: now)  // never holds an event: only the idle queue can forget it
            return
        }
        let event = RetainedEvent(published)
        stream.events.append(event)
        eventCount += 1
        bytes += event.cost
        order.append(OrderEntry(stream: stream, seq: event.seq, acceptedAt: event.acceptedAt))
        if stream.events.count > limits.size {
            drop(from: stream)
            staleInOrder += 1  // its FIFO entry stays behind
        }
        while bytes > limits.memoryBytes, evictOldest(now: now) {}
        expire(now: now, budget: 2)  // keeps up with a steady stream; `maintain` does the rest
        compactIfNeeded()
    }

    /// Removes the stream's oldest event (the caller accounts for its FIFO entry).
    private mutating func drop(from stream: StreamState) {
        guard let event = stream.events.removeFirst() else { return }
        eventCount -= 1
        bytes -= event.cost
    }

    /// Pops the FIFO's front; if live, drops that event. Returns false when the FIFO is empty.
    private mutating func evictOldest(now: UInt64) -> Bool {
        guard let entry = order.removeFirst() else { return false }
        if entry.stream.firstRetainedSeq == entry.seq {
            drop(from: entry.stream)
            evictions += 1
            if entry.stream.events.isEmpty { becameEmpty(entry.stream, now: now) }
        } else {
            staleInOrder -= 1
        }
        return true
    }

    /// Drops events older than the TTL from the FIFO's front (at most `budget` entries). Stale entries at the front
    /// go with them; a young stale entry stops the scan like a live one (it is dropped later).
    private mutating func expire(now: UInt64, budget: Int) {
        var left = budget
        while left > 0, let t = order.first?.acceptedAt, t &+ limits.ttlNanos <= now, let entry = order.removeFirst() {
            left -= 1
            if entry.stream.firstRetainedSeq == entry.seq {
                drop(from: entry.stream)
                expirations += 1
                if entry.stream.events.isEmpty { becameEmpty(entry.stream, now: now) }
            } else {
                staleInOrder -= 1
            }
        }
    }

    private mutating func compactIfNeeded() {
        guard staleInOrder > 1024, staleInOrder * 2 > order.count else { return }
        order.retainAll { entry in
            guard let first = entry.stream.firstRetainedSeq, !entry.stream.forgotten else { return false }
            return entry.seq >= first
        }
        staleInOrder = 0
    }

    /// A stream just read or created: if it holds no event and nobody follows it, it is idle from now.
    mutating func settle(_ stream: StreamState, now: UInt64) {
        if stream.events.isEmpty { becameEmpty(stream, now: now) }
    }

    /// A stream with no retained event: forget it now if it is idle past the TTL, else queue it for a later look.
    private mutating func becameEmpty(_ stream: StreamState, now: UInt64) {
        guard stream.followers == 0, !stream.idleQueued, !stream.forgotten else { return }
        if stream.lastActivity &+ limits.ttlNanos <= now {
            forget(stream)
        } else {
            stream.idleQueued = true
            idle.append(IdleEntry(stream: stream, since: now))
        }
    }

    private mutating func forget(_ stream: StreamState) {
        if streams[stream.key] === stream { streams[stream.key] = nil }
        stream.forgotten = true
        forgottenStreams += 1
    }

    // MARK: Housekeeping

    /// Expires old events and forgets idle streams; call about once a second. Bounded work per call (`budget`
    /// entries of each queue), so a burst that expires at once is spread over a few calls.
    mutating func maintain(now: UInt64, budget: Int = 65_536) {
        expire(now: now, budget: budget)
        var left = budget
        while left > 0, let entry = idle.first, entry.since &+ limits.ttlNanos <= now {
            left -= 1
            idle.removeFirst()
            let stream = entry.stream
            stream.idleQueued = false
            guard !stream.forgotten, stream.events.isEmpty, stream.followers == 0 else { continue }
            if stream.lastActivity &+ limits.ttlNanos <= now {
                forget(stream)
            } else {
                stream.idleQueued = true
                idle.append(IdleEntry(stream: stream, since: now))
            }
        }
        compactIfNeeded()
    }

    // MARK: Followers

    /// A connection follows `key` (created when absent, so its numbering is kept while anyone follows it).
    mutating func follow(_ key: StreamKey, now: UInt64) -> StreamState {
        let stream = entry(key, now: now)
        stream.followers += 1
        return stream
    }

    mutating func unfollow(_ key: StreamKey, now: UInt64) {
        guard let stream = streams[key], stream.followers > 0 else { return }
        stream.followers -= 1
        if stream.followers == 0 {
            stream.lastActivity = now
            if stream.events.isEmpty { becameEmpty(stream, now: now) }
        }
    }

    // MARK: Reading

    /// The events after `after`, if every one of them is retained and there are at most `limit`.
    static func read(_ stream: StreamState, after: UInt64, limit: Int) -> HistoryRead {
        let top = stream.lastSeq
        if after == top { return .events([]) }
        if after > top { return .ahead }
        guard let first = stream.firstRetainedSeq, first <= after &+ 1 else { return .tooOld }
        guard top - after <= UInt64(max(0, limit)) else { return .tooMany }
        let start = Int(after &+ 1 - first)
        guard start <= stream.events.count else { return .tooOld }  // never: retained seqs end at lastSeq
        var events: [RetainedEvent] = []
        events.reserveCapacity(Int(top - after))
        for i in start..<stream.events.count { events.append(stream.events[i]) }
        return .events(events)
    }

    /// Every retained event with seq > `after` (admin views), oldest first.
    static func retained(_ stream: StreamState, after: UInt64) -> [RetainedEvent] {
        var events: [RetainedEvent] = []
        for i in 0..<stream.events.count where stream.events[i].seq > after { events.append(stream.events[i]) }
        return events
    }

    // MARK: Persistence

    /// Every stream, and the retained events in publish order, for the state file.
    func exportStreams() -> (streams: [StreamState], events: [(stream: StreamState, event: RetainedEvent)]) {
        var live: [(stream: StreamState, event: RetainedEvent)] = []
        live.reserveCapacity(eventCount)
        for i in 0..<order.count {
            let entry = order[i]
            guard !entry.stream.forgotten, let first = entry.stream.firstRetainedSeq, entry.seq >= first else { continue }
            let offset = Int(entry.seq - first)
            if offset < entry.stream.events.count { live.append((entry.stream, entry.stream.events[offset])) }
        }
        return (Array(streams.values), live)
    }

    /// Restores a stream saved by `exportStreams` (numbering and generation as saved; idle from `now`).
    mutating func restoreStream(_ key: StreamKey, generation: UInt64, lastSeq: UInt64, now: UInt64) -> StreamState {
        let stream = StreamState(key: key, generation: generation, lastSeq: lastSeq, now: now)
        streams[key] = stream
        nextGeneration = max(nextGeneration, generation &+ 1)
        return stream
    }

    /// Restores one retained event, in publish order; the caller restores a stream's events in seq order.
    mutating func restoreEvent(_ event: RetainedEvent, in stream: StreamState, now: UInt64) {
        stream.events.append(event)
        eventCount += 1
        bytes += event.cost
        order.append(OrderEntry(stream: stream, seq: event.seq, acceptedAt: event.acceptedAt))
        while stream.events.count > limits.size {
            drop(from: stream)
            staleInOrder += 1
        }
    }

    /// After a restore: applies the memory cap and the TTL, queues the streams without events as idle.
    mutating func finishRestore(now: UInt64) {
        while bytes > limits.memoryBytes, evictOldest(now: now) {}
        expire(now: now, budget: Int.max)
        for stream in streams.values where stream.events.isEmpty { becameEmpty(stream, now: now) }
        compactIfNeeded()
    }
}
