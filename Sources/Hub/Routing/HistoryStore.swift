import Glibc
import HubEngine
import HubJSON

/// Limits of the retained history (`--history-size`, `--history-ttl`, `--history-memory`).
public struct HistoryLimits: Sendable, Equatable {
    /// Events kept per stream; 0 keeps none (numbering and epochs still work, recovery always says `too_old`).
    public var size: Int
    /// Events older than this are dropped, and a stream with no follower and no publish for this long is forgotten.
    public var ttlNanos: UInt64
    /// The size of the ring every retained frame is copied into (frame bytes + `perEventOverhead`, 8-aligned).
    public var memoryBytes: Int

    public init(size: Int, ttlNanos: UInt64, memoryBytes: Int) {
        self.size = size
        self.ttlNanos = ttlNanos
        self.memoryBytes = memoryBytes
    }

    /// The header an event has in the ring (its size, frame size, data offset, seq and time). Besides its
    /// ring entry, a retained event costs 8 bytes in its stream's index (outside the ring).
    public static let perEventOverhead = EventRing.headerSize

    /// What an event of `frameCount` bytes takes in the ring.
    public static func entrySize(frameCount: Int) -> Int { (EventRing.headerSize + frameCount + 7) & ~7 }
}

/// An event as the history hands it out: the frame every recipient was sent (replayed byte for byte) and what
/// replays need, 32 bytes. The history itself keeps the frame's bytes in its ring; a read copies them into a new
/// `SharedBytes` (no re-encoding). Rarely needed facts (type, wall time) are derived.
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

    package init(_ event: PublishedEvent) {
        self.init(frame: event.frame, seq: event.seq, acceptedAt: event.acceptedAt, dataStart: event.dataRange.lowerBound)
    }

    /// What it takes in the history's ring.
    var cost: Int { HistoryLimits.entrySize(frameCount: Int(frameCount)) }

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
    package func wallTime(wallNow: Double = wallClockSeconds(), monotonicNow: UInt64 = monotonicNanos()) -> Double {
        wallNow - Double(monotonicNow > acceptedAt ? monotonicNow - acceptedAt : 0) / 1e9
    }
}

/// The memory of the history's ring: one anonymous mapping of `capacity` bytes (a multiple of 8), reserved at
/// start without being touched, so it costs RSS only as events are written into it. `MAP_NORESERVE`: a large
/// `--history-memory` is address space, not a commitment. `base` is nil when the ring is too small to be useful
/// (or the mapping failed: the store then keeps no events, and says so through `reserved`).
final class EventRing {
    static let headerSize = 32
    /// The size field of a padding entry: the rest of the buffer is skipped (an entry never wraps).
    static let padding = UInt32.max

    let capacity: Int
    let base: UnsafeMutableRawPointer?
    /// A ring was asked for but `mmap` refused it.
    let mappingFailed: Bool
    /// One bit per 32-byte block of the ring, set for an entry starting there that its stream dropped (over
    /// `--history-size`; its bytes stay until the ring passes them). Entries take at least 40 bytes, so no two
    /// start in one block. A bitmap beside the ring, not a flag in the entry's header: the entry a stream drops is
    /// usually far behind the head and long out of the cache, where the bitmap (capacity / 256 bytes: 256 KiB
    /// for 64 MiB) mostly stays in it.
    private let dropped: UnsafeMutablePointer<UInt64>?
    private let droppedBytes: Int

    init(capacity requested: Int) {
        let capacity = max(0, requested) & ~7
        guard capacity >= 64 else {
            self.capacity = 0
            base = nil
            dropped = nil
            droppedBytes = 0
            mappingFailed = false
            return
        }
        let mapped = mmap(nil, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        let droppedBytes = ((capacity / 32 + 63) / 64) * 8
        let bits = mmap(nil, droppedBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if let mapped, mapped != MAP_FAILED, let bits, bits != MAP_FAILED {
            // Huge pages where the kernel allows them (THP "madvise" or "always"): a 64 MiB ring is 32 TLB entries
            // instead of 16 384, and the stores into entries far behind the head (a stream dropping its oldest by
            // count) do not each walk the page table. Advice only: without THP it stays 4 KiB pages.
            _ = madvise(mapped, capacity, MADV_HUGEPAGE)
            self.capacity = capacity
            base = mapped
            dropped = bits.assumingMemoryBound(to: UInt64.self)
            self.droppedBytes = droppedBytes
            mappingFailed = false
        } else {
            if let mapped, mapped != MAP_FAILED { munmap(mapped, capacity) }
            if let bits, bits != MAP_FAILED { munmap(bits, droppedBytes) }
            self.capacity = 0
            base = nil
            dropped = nil
            self.droppedBytes = 0
            mappingFailed = true
        }
    }

    deinit {
        if let base { munmap(base, capacity) }
        if let dropped { munmap(dropped, droppedBytes) }
    }

    /// Marks the entry at ring offset `offset` as dropped by its stream.
    func markDropped(_ offset: Int) {
        guard let dropped else { return }
        let bit = offset >> 5
        dropped[bit >> 6] |= 1 << UInt64(bit & 63)
    }

    /// Whether the entry at `offset` was dropped by its stream, clearing the mark (the ring is passing it).
    func takeDropped(_ offset: Int) -> Bool {
        guard let dropped else { return false }
        let bit = offset >> 5
        let mask: UInt64 = 1 << UInt64(bit & 63)
        let word = dropped[bit >> 6]
        guard word & mask != 0 else { return false }
        dropped[bit >> 6] = word & ~mask
        return true
    }

    func clearDropped() {
        if let dropped { memset(dropped, 0, droppedBytes) }
    }

    /// Gives the pages back to the kernel (the ring is empty); they read as zeros when touched again.
    func release() {
        if let base {
            _ = madvise(base, capacity, MADV_DONTNEED)
            _ = madvise(base, capacity, MADV_HUGEPAGE)
        }
        if let dropped { _ = madvise(dropped, droppedBytes, MADV_DONTNEED) }
    }
}

/// A FIFO of ring positions (a stream's retained events, oldest first), 8 bytes a slot in one malloc'd block the
/// ring owns (freed with it). Not an `Array`: appending to an array kept in a class checks the buffer's uniqueness
/// and capacity in its header, one more cold cache line per publish.
struct PositionRing: ~Copyable {
    private var slots: UnsafeMutablePointer<UInt64>? = nil
    private var capacity: Int32 = 0
    private var head: Int32 = 0
    private(set) var count: Int32 = 0

    init() {}

    deinit { slots?.deallocate() }

    var isEmpty: Bool { count == 0 }
    var first: UInt64? { count == 0 ? nil : slots?[Int(head)] }

    /// `offset` in `0..<count` (0 is the oldest).
    subscript(offset: Int) -> UInt64 {
        precondition(offset >= 0 && offset < Int(count), "PositionRing index out of range")
        return slots.unsafelyUnwrapped[(Int(head) + offset) & (Int(capacity) - 1)]
    }

    mutating func append(_ position: UInt64) {
        if count == capacity { resize(to: max(4, Int(capacity) * 2)) }
        slots.unsafelyUnwrapped[(Int(head) + Int(count)) & (Int(capacity) - 1)] = position
        count += 1
    }

    @discardableResult
    mutating func removeFirst() -> UInt64? {
        guard count > 0, let slots else { return nil }
        let position = slots[Int(head)]
        head = (head + 1) & (capacity - 1)
        count -= 1
        if count == 0 {
            head = 0
            if capacity > 16 { removeAll() }
        } else if capacity > 16 && count * 4 <= capacity {
            resize(to: Int(capacity) / 2)
        }
        return position
    }

    mutating func removeAll() {
        slots?.deallocate()
        slots = nil
        capacity = 0
        head = 0
        count = 0
    }

    /// The first offset whose position is at least `position` (positions ascend), `count` if none.
    func firstOffset(atLeast position: UInt64) -> Int {
        var low = 0, high = Int(count)
        while low < high {
            let mid = (low + high) / 2
            if self[mid] < position { low = mid + 1 } else { high = mid }
        }
        return low
    }

    /// A power of two, at least `count` (sizes are bounded by `--history-size`, at most 1 000 000).
    private mutating func resize(to newCapacity: Int) {
        var size = 4
        while size < newCapacity { size *= 2 }
        let grown = UnsafeMutablePointer<UInt64>.allocate(capacity: size)
        for i in 0..<Int(count) { grown[i] = self[i] }
        slots?.deallocate()
        slots = grown
        capacity = Int32(size)
        head = 0
    }
}

/// One stream: its numbering, where its retained events are in the ring (contiguous seqs ending at `lastSeq`,
/// oldest first; entries the ring has since overwritten are at the front and are skipped) and how many connections
/// of this hub follow it. Owned by a `HistoryStore` and only touched under the broker's lock.
///
/// The mutable fields skip Swift's run-time exclusivity check (`@exclusivity(unchecked)`, several accesses per
/// published event; docs/ENGINE.md): they are touched only by the store's methods, under the
/// broker's lock, in accesses that call nothing outside the store while they last.
final class StreamState {
    let key: StreamKey
    /// Bumped by the store for every stream entry it creates: a stream forgotten and created again is told apart.
    let generation: UInt64
    @exclusivity(unchecked) var lastSeq: UInt64
    /// Ring positions of its retained events, ascending.
    @exclusivity(unchecked) var index = PositionRing()
    // The two flags sit in the 4 bytes the ring's 20 leave before the next 8-byte field: with the 16-byte follower
    // counts the object stays in the allocator's 112-byte size class.
    /// In the store's idle queue (at most once).
    @exclusivity(unchecked) var idleQueued = false
    /// Removed from the store's table; entries still pointing at it are stale.
    @exclusivity(unchecked) var forgotten = false
    /// Monotonic ns of the last publish, or of the last follower leaving.
    @exclusivity(unchecked) var lastActivity: UInt64
    /// Connections subscribed to this stream, by loop (a followed stream is never forgotten: its numbering must go
    /// on). The broker hands an event only to the loops that have followers of its stream.
    @exclusivity(unchecked) var loopFollowers = LoopFollowers()

    init(key: StreamKey, generation: UInt64, lastSeq: UInt64 = 0, now: UInt64) {
        self.key = key
        self.generation = generation
        self.lastSeq = lastSeq
        self.lastActivity = now
    }
}

/// How many connections of each loop follow a stream, in 16 bytes: loops 0 to 3 as four 16-bit counts inline (a
/// stream per account and channel: no allocation), everything else (a loop from 4 up, a loop not known (-1), a
/// count reaching 65 535) in a side object that then holds every count until the stream has no follower left.
///
/// `mask` says which loops must be handed the stream's events: exactly the loops with followers, or every loop
/// while a follower of unknown loop is there. An event must not miss a subscriber.
package struct LoopFollowers {
    /// Counts of loops 0-3, 16 bits each (loop i in bits 16i...16i+15), while `large` is nil.
    private var small: UInt64 = 0
    private var large: Large? = nil

    private final class Large {
        var perLoop: [UInt32]
        var anywhere: UInt32 = 0
        init(_ small: UInt64) { perLoop = (0..<4).map { UInt32(truncatingIfNeeded: small >> UInt64(16 * $0)) & 0xFFFF } }
    }

    package init() {}

    package var total: Int {
        if let large { return large.perLoop.reduce(Int(large.anywhere)) { $0 + Int($1) } }
        return (0..<4).reduce(0) { $0 + Int(truncatingIfNeeded: small >> UInt64(16 * $1) & 0xFFFF) }
    }
    package var isEmpty: Bool { large == nil && small == 0 }

    /// One more follower on `loop` (-1: unknown).
    package mutating func add(loop: Int) {
        if large == nil, loop >= 0, loop < 4, small >> UInt64(16 * loop) & 0xFFFF < 0xFFFE {
            small &+= 1 << UInt64(16 * loop)
            return
        }
        let l = large ?? Large(small)
        large = l
        small = 0
        if loop < 0 {
            l.anywhere &+= 1
        } else {
            if l.perLoop.count <= loop { l.perLoop.append(contentsOf: repeatElement(0, count: loop + 1 - l.perLoop.count)) }
            l.perLoop[loop] &+= 1
        }
    }

    /// One follower fewer on `loop`; false (and nothing changed) when that loop has none.
    package mutating func remove(loop: Int) -> Bool {
        guard let l = large else {
            guard loop >= 0, loop < 4, small >> UInt64(16 * loop) & 0xFFFF > 0 else { return false }
            small &-= 1 << UInt64(16 * loop)
            return true
        }
        if loop < 0 {
            guard l.anywhere > 0 else { return false }
            l.anywhere -= 1
        } else {
            guard loop < l.perLoop.count, l.perLoop[loop] > 0 else { return false }
            l.perLoop[loop] -= 1
        }
        if l.anywhere == 0 && l.perLoop.allSatisfy({ $0 == 0 }) { large = nil }  // back to inline counts
        return true
    }

    /// The loops (bit i: loop i) of `loops` (at most 64) that must be handed the stream's events.
    package func mask(loops: Int) -> UInt64 {
        let all: UInt64 = loops >= 64 ? ~0 : (1 << UInt64(max(loops, 0))) &- 1
        var m: UInt64 = 0
        if let large {
            if large.anywhere > 0 { return all }
            for (i, n) in large.perLoop.enumerated() where n > 0 {
                guard i < 64 else { return all }
                m |= 1 << UInt64(i)
            }
        } else {
            for i in 0..<4 where small >> UInt64(16 * i) & 0xFFFF != 0 { m |= 1 << UInt64(i) }
        }
        // A follower counted on a loop this hub does not have (never, as the hub names them): every loop, rather
        // than none.
        return m & ~all == 0 ? m : all
    }
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
/// **Storage: one ring of bytes** (`--history-memory`), written in publish order. Retaining an event copies its
/// frame (already encoded for fan-out) behind a 32-byte header at the ring's head and appends that position to its
/// stream's index; the fan-out's own frame is freed as soon as it is sent, as without history. When the ring is
/// full, the oldest entries are overwritten: eviction advances the tail over them and frees nothing, touches no
/// stream and no object (a bitmap beside the ring says whether the event was still live, for the counters). A stream's events
/// the ring has passed are recognised by their position (below the tail) when the stream is next read or written.
/// So the ring holds the last `--history-memory` bytes of everything published, and of that, per stream, the
/// last `--history-size` events no older than `--history-ttl`. Events a stream drops by its count stay in the
/// ring, marked, until it passes them: with streams far over their count within the ring's span, the span is
/// shorter than the live events alone would need (docs/OPERATIONS.md, "Recovery: history, epochs and the state
/// file").
///
/// Why not a `SharedBytes` per retained event (until 2026-11-26): every publish then also freed the frame of the
/// event it evicted, long out of the cache, and its object's release; malloc and free of those 200-300-byte
/// blocks, and the cold refcount, cost the publish intake about a quarter (Benchmarks/README.md, "Recovery").
///
/// Idle streams: a stream with no follower goes into `idle` (a FIFO by the time it went there) when it is
/// published to, read, or left by its last follower; once `ttl` has passed, it is forgotten if still unfollowed and
/// nothing was published meanwhile (so its events are all past the TTL), or queued again. So the table holds
/// followed streams and streams active within about 2 × ttl.
struct HistoryStore {
    let limits: HistoryLimits
    /// Random per fresh start (kept across a graceful restart).
    let hubEpoch: String
    private(set) var nextGeneration: UInt64
    private var streams: [StreamKey: StreamState] = [:]

    private let ring: EventRing
    /// Absolute byte positions (the ring offset is the position modulo its capacity): bytes in `tail..<head` are
    /// entries not yet overwritten.
    private var head: UInt64 = 0
    private var tail: UInt64 = 0
    /// Written since the ring last gave its pages back.
    private var dirty = false

    private struct IdleEntry {
        let stream: StreamState
        let since: UInt64
    }
    private var idle = Ring<IdleEntry>()

    /// Live retained events: in the ring, in their stream's last `size`, not past the TTL.
    private(set) var eventCount = 0
    /// Events the ring overwrote while they were live (to stay within `memoryBytes`).
    private(set) var evictions = 0
    /// Live events dropped because they were older than the TTL.
    private(set) var expirations = 0
    /// Streams forgotten after being idle.
    private(set) var forgottenStreams = 0

    init(limits: HistoryLimits, hubEpoch: String, nextGeneration: UInt64 = 1) {
        self.limits = limits
        self.hubEpoch = hubEpoch
        self.nextGeneration = max(1, nextGeneration)
        ring = EventRing(capacity: limits.size > 0 ? limits.memoryBytes : 0)
    }

    /// Bytes of the ring in use (entries not yet overwritten, live or not, and padding): the history's memory.
    var bytes: Int { Int(head &- tail) }
    /// False when the history should keep events but its ring could not be mapped.
    var reserved: Bool { !ring.mappingFailed }
    var streamCount: Int { streams.count }
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

    // MARK: The ring

    private func offset(_ position: UInt64) -> Int { Int(position % UInt64(ring.capacity)) }

    private func header(_ position: UInt64) -> (size: UInt32, frameCount: UInt32, dataStart: UInt32, seq: UInt64, acceptedAt: UInt64)? {
        guard let base = ring.base, position >= tail, position < head else { return nil }
        let p = base + offset(position)
        return (p.load(as: UInt32.self), p.load(fromByteOffset: 4, as: UInt32.self), p.load(fromByteOffset: 8, as: UInt32.self),
                p.load(fromByteOffset: 16, as: UInt64.self), p.load(fromByteOffset: 24, as: UInt64.self))
    }

    /// Advances the tail over its entry; false when the ring is empty, or (`onlyExpired`) the entry is within the TTL.
    private mutating func dropTail(now: UInt64, onlyExpired: Bool) -> Bool {
        guard let base = ring.base, tail < head else { return false }
        let p = base + offset(tail)
        let size = p.load(as: UInt32.self)
        if size == EventRing.padding {
            tail = (tail / UInt64(ring.capacity) + 1) * UInt64(ring.capacity)
            return true
        }
        guard size >= UInt32(EventRing.headerSize), Int(size) <= ring.capacity - offset(tail) else {
            // Never written by `write`; rather than loop on it, drop everything (replays then answer too_old).
            eventCount = 0
            tail = head
            ring.clearDropped()
            return true
        }
        let acceptedAt = p.load(fromByteOffset: 24, as: UInt64.self)
        let expired = acceptedAt &+ limits.ttlNanos <= now
        if onlyExpired && !expired { return false }
        if !ring.takeDropped(offset(tail)) {
            eventCount -= 1
            if expired { expirations += 1 } else { evictions += 1 }
        }
        tail &+= UInt64(size)
        return true
    }

    /// Writes an entry at the head (making room first) and returns its position; nil if it cannot fit at all.
    private mutating func write(_ frame: UnsafeRawBufferPointer, seq: UInt64, acceptedAt: UInt64, dataStart: UInt32, now: UInt64) -> UInt64? {
        let capacity = ring.capacity
        let size = HistoryLimits.entrySize(frameCount: frame.count)
        guard let base = ring.base, size <= capacity, frame.count < Int(UInt32.max) else { return nil }
        var at = offset(head)
        if capacity - at < size {
            // Not enough room before the end: skip the rest of the buffer with a padding entry (an entry never wraps).
            while capacity - bytes < capacity - at, dropTail(now: now, onlyExpired: false) {}
            (base + at).storeBytes(of: EventRing.padding, as: UInt32.self)
            head &+= UInt64(capacity - at)
            at = 0
        }
        while capacity - bytes < size, dropTail(now: now, onlyExpired: false) {}
        let p = base + at
        p.storeBytes(of: UInt32(size), as: UInt32.self)
        p.storeBytes(of: UInt32(frame.count), toByteOffset: 4, as: UInt32.self)
        p.storeBytes(of: dataStart, toByteOffset: 8, as: UInt32.self)
        p.storeBytes(of: 0, toByteOffset: 12, as: UInt32.self)
        p.storeBytes(of: seq, toByteOffset: 16, as: UInt64.self)
        p.storeBytes(of: acceptedAt, toByteOffset: 24, as: UInt64.self)
        if let source = frame.baseAddress, frame.count > 0 {
            (p + EventRing.headerSize).copyMemory(from: source, byteCount: frame.count)
        }
        let position = head
        head &+= UInt64(size)
        dirty = true
        return position
    }

    /// Marks a live entry as dropped by its stream (called once per entry: its stream's index lets go of it).
    private mutating func supersede(_ position: UInt64) {
        guard position >= tail, position < head else { return }
        ring.markDropped(offset(position))
        eventCount -= 1
    }

    /// The event at `position`, copied out of the ring, if it is still there and is `seq`.
    private func event(at position: UInt64, seq: UInt64) -> RetainedEvent? {
        guard let base = ring.base, let h = header(position), h.size != EventRing.padding, h.seq == seq,
              Int(h.frameCount) + EventRing.headerSize <= Int(h.size), offset(position) + Int(h.size) <= ring.capacity else { return nil }
        let frame = SharedBytes(copying: UnsafeRawBufferPointer(start: base + offset(position) + EventRing.headerSize, count: Int(h.frameCount)))
        return RetainedEvent(frame: frame, seq: seq, acceptedAt: h.acceptedAt, dataStart: Int(h.dataStart))
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
        store(published.frame.bytes, seq: published.seq, acceptedAt: published.acceptedAt,
              dataStart: published.dataRange.lowerBound, in: stream, now: now)
        queueIfIdle(stream, now: now)
    }

    private mutating func store(_ frame: UnsafeRawBufferPointer, seq: UInt64, acceptedAt: UInt64, dataStart: Int,
                                in stream: StreamState, now: UInt64) {
        guard limits.size > 0 else { return }
        let clampedStart = UInt32(clamping: min(dataStart, max(0, frame.count - 1)))
        guard let position = write(frame, seq: seq, acceptedAt: acceptedAt, dataStart: clampedStart, now: now) else {
            // It cannot be kept, so nothing before it can be replayed either (a replay is contiguous).
            while let p = stream.index.removeFirst() { supersede(p) }
            return
        }
        // Entries the ring has passed leave the front; then the stream's own count.
        while let first = stream.index.first, first < tail { stream.index.removeFirst() }
        if Int(stream.index.count) >= limits.size, let oldest = stream.index.removeFirst() { supersede(oldest) }
        stream.index.append(position)
        eventCount += 1
        expire(now: now, budget: 2)  // keeps up with a steady stream; `maintain` does the rest
    }

    /// Drops entries older than the TTL from the ring's tail (at most `budget`).
    private mutating func expire(now: UInt64, budget: Int) {
        var left = budget
        while left > 0, dropTail(now: now, onlyExpired: true) { left -= 1 }
    }

    /// A stream just read or created: if nobody follows it, it is idle from now.
    mutating func settle(_ stream: StreamState, now: UInt64) { queueIfIdle(stream, now: now) }

    private mutating func queueIfIdle(_ stream: StreamState, now: UInt64) {
        guard stream.loopFollowers.isEmpty, !stream.idleQueued, !stream.forgotten else { return }
        stream.idleQueued = true
        idle.append(IdleEntry(stream: stream, since: now))
    }

    private mutating func forget(_ stream: StreamState) {
        if streams[stream.key] === stream { streams[stream.key] = nil }
        stream.forgotten = true
        // Its entries still in the ring are past the TTL: they are counted as expired when the tail passes them.
        stream.index.removeAll()
        forgottenStreams += 1
    }

    // MARK: Housekeeping

    /// Expires old events and forgets idle streams; call about once a second. Bounded work per call (`budget`
    /// entries of each queue), so a burst that expires at once is spread over a few calls. An empty ring gives its
    /// pages back.
    mutating func maintain(now: UInt64, budget: Int = 65_536) {
        expire(now: now, budget: budget)
        var left = budget
        while left > 0, let entry = idle.first, entry.since &+ limits.ttlNanos <= now {
            left -= 1
            idle.removeFirst()
            let stream = entry.stream
            stream.idleQueued = false
            guard !stream.forgotten, stream.loopFollowers.isEmpty else { continue }
            if stream.lastActivity &+ limits.ttlNanos <= now {
                forget(stream)
            } else {
                stream.idleQueued = true
                idle.append(IdleEntry(stream: stream, since: now))
            }
        }
        if dirty, head == tail, ring.capacity > 0 {
            // Nothing left: start again at the buffer's beginning, on pages given back to the kernel.
            let capacity = UInt64(ring.capacity)
            head = (head + capacity - 1) / capacity * capacity
            tail = head
            ring.release()
            dirty = false
        }
    }

    // MARK: Followers

    /// A connection of loop `loop` (-1: unknown) follows `key` (created when absent, so its numbering is kept while
    /// anyone follows it).
    mutating func follow(_ key: StreamKey, loop: Int = -1, now: UInt64) -> StreamState {
        let stream = entry(key, now: now)
        stream.loopFollowers.add(loop: loop)
        return stream
    }

    /// Balances `follow(key, loop:)`.
    mutating func unfollow(_ key: StreamKey, loop: Int = -1, now: UInt64) {
        guard let stream = streams[key], stream.loopFollowers.remove(loop: loop) else { return }
        if stream.loopFollowers.isEmpty {
            stream.lastActivity = now
            queueIfIdle(stream, now: now)
        }
    }

    // MARK: Reading

    /// The offset in the stream's index of its oldest event still in the ring.
    private func liveStart(_ stream: StreamState) -> Int { stream.index.firstOffset(atLeast: tail) }

    /// The seq of the stream's oldest retained event (retained seqs are contiguous and end at `lastSeq`).
    func firstRetainedSeq(_ stream: StreamState) -> UInt64? {
        let live = Int(stream.index.count) - liveStart(stream)
        return live == 0 ? nil : stream.lastSeq &- UInt64(live) &+ 1
    }

    /// Events of the stream retained now (live).
    func retainedCount(_ stream: StreamState) -> Int { Int(stream.index.count) - liveStart(stream) }

    /// The events after `after`, if every one of them is retained and there are at most `limit`.
    func read(_ stream: StreamState, after: UInt64, limit: Int) -> HistoryRead {
        let top = stream.lastSeq
        if after == top { return .events([]) }
        if after > top { return .ahead }
        let start = liveStart(stream)
        guard let first = firstRetainedSeq(stream), first <= after &+ 1 else { return .tooOld }
        guard top - after <= UInt64(max(0, limit)) else { return .tooMany }
        var events: [RetainedEvent] = []
        events.reserveCapacity(Int(top - after))
        var seq = after &+ 1
        for i in (start + Int(seq - first))..<Int(stream.index.count) {
            // A mismatch is never expected (the index and the ring move together): refuse rather than replay wrong.
            guard let event = event(at: stream.index[i], seq: seq) else { return .tooOld }
            events.append(event)
            seq &+= 1
        }
        return .events(events)
    }

    /// Every retained event with seq > `after` (admin views), oldest first.
    func retained(_ stream: StreamState, after: UInt64) -> [RetainedEvent] {
        guard let first = firstRetainedSeq(stream) else { return [] }
        let start = liveStart(stream)
        var events: [RetainedEvent] = []
        for i in start..<Int(stream.index.count) {
            let seq = first &+ UInt64(i - start)
            if seq > after, let event = event(at: stream.index[i], seq: seq) { events.append(event) }
        }
        return events
    }

    // MARK: Persistence

    /// Every stream, and the retained events in publish order, for the state file.
    func exportStreams() -> (streams: [StreamState], events: [(stream: StreamState, event: RetainedEvent)]) {
        var live: [(position: UInt64, stream: StreamState, event: RetainedEvent)] = []
        live.reserveCapacity(eventCount)
        for stream in streams.values {
            guard let first = firstRetainedSeq(stream) else { continue }
            let start = liveStart(stream)
            for i in start..<Int(stream.index.count) {
                let position = stream.index[i]
                if let event = event(at: position, seq: first &+ UInt64(i - start)) { live.append((position, stream, event)) }
            }
        }
        live.sort { $0.position < $1.position }
        return (Array(streams.values), live.map { ($0.stream, $0.event) })
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
        store(event.frame.bytes, seq: event.seq, acceptedAt: event.acceptedAt, dataStart: Int(event.dataStart), in: stream, now: now)
    }

    /// After a restore: applies the TTL, queues the unfollowed streams as idle.
    mutating func finishRestore(now: UInt64) {
        expire(now: now, budget: Int.max)
        for stream in streams.values { queueIfIdle(stream, now: now) }
    }
}
