/// One idempotency key of one stream: the first publish's seq and, once its fan-out completed, how many connections
/// it was delivered to. Publishes repeating the key while the first is in flight wait in `waiters`.
///
/// Mutated only under the broker's lock (that is what makes the `@unchecked Sendable` sound); the collector of the
/// first publish keeps a reference to resolve it.
final class IdempotencyEntry: @unchecked Sendable {
    let stream: StreamKey
    let key: ExactString
    let seq: UInt64
    /// nil while the first publish is in flight.
    var delivered: Int?
    /// Replies waiting for `delivered`: the waiting batch's collector and the index of the draft in its batch.
    var waiters: [(collector: DeliveryCollector, index: Int)] = []
    /// Monotonic ns when the key was first seen (the window counts from here).
    let createdAt: UInt64
    /// Wall-clock seconds, for the state file.
    let wallTime: Double
    var evicted = false

    init(stream: StreamKey, key: ExactString, seq: UInt64, delivered: Int?, createdAt: UInt64, wallTime: Double) {
        self.stream = stream
        self.key = key
        self.seq = seq
        self.delivered = delivered
        self.createdAt = createdAt
        self.wallTime = wallTime
    }
}

/// The idempotency keys seen within the window (`--idempotency-window`), at most `maxKeys` (oldest evicted first).
/// Keys are scoped per stream: the same key on another account or channel is another publish.
/// O(1) per publish: a dictionary plus a FIFO in insertion order (every key is inserted once and leaves once).
struct IdempotencyTable {
    struct Key: Hashable {
        let stream: StreamKey
        let key: ExactString
    }

    let windowNanos: UInt64
    let maxKeys: Int
    private var entries: [Key: IdempotencyEntry] = [:]
    private var order = Ring<IdempotencyEntry>()

    init(windowNanos: UInt64, maxKeys: Int) {
        self.windowNanos = windowNanos
        self.maxKeys = maxKeys
    }

    var isEnabled: Bool { windowNanos > 0 && maxKeys > 0 }
    var count: Int { entries.count }

    /// The entry for `key` in `stream`, if seen within the window.
    mutating func lookup(_ stream: StreamKey, _ key: ExactString, now: UInt64) -> IdempotencyEntry? {
        guard isEnabled else { return nil }
        evict(now: now)
        return entries[Key(stream: stream, key: key)]
    }

    /// Records the first publish with `key` (numbered `seq`, delivery count still unknown).
    @discardableResult
    mutating func insert(_ stream: StreamKey, _ key: ExactString, seq: UInt64, delivered: Int? = nil, now: UInt64,
                         wallTime: Double) -> IdempotencyEntry? {
        guard isEnabled else { return nil }
        let entry = IdempotencyEntry(stream: stream, key: key, seq: seq, delivered: delivered, createdAt: now, wallTime: wallTime)
        if let previous = entries.updateValue(entry, forKey: Key(stream: stream, key: key)) { previous.evicted = true }
        order.append(entry)
        evict(now: now)
        return entry
    }

    /// Drops keys past the window, and the oldest beyond `maxKeys`.
    mutating func evict(now: UInt64) {
        while let oldest = order.first, oldest.evicted || order.count > maxKeys || oldest.createdAt &+ windowNanos <= now {
            order.removeFirst()
            guard !oldest.evicted else { continue }
            oldest.evicted = true
            let key = Key(stream: oldest.stream, key: oldest.key)
            if entries[key] === oldest { entries[key] = nil }
        }
    }

    /// Every live key, oldest first (for the state file).
    func exportEntries() -> [IdempotencyEntry] {
        var all: [IdempotencyEntry] = []
        for i in 0..<order.count where !order[i].evicted { all.append(order[i]) }
        return all
    }
}
