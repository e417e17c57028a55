/// The next `seq` of every stream. Owned by the broker and used under its lock, so numbers are assigned in the
/// same order as events are handed to the loops.
///
/// Entries are never evicted in this version: evicting one would restart its numbering and look like a gap
/// going backwards to clients. Recovery (epochs and bounded history) will bound this.
public struct SequenceTable: Sendable {
    private var next: [StreamKey: UInt64] = [:]

    public init() {}

    /// Returns the stream's next number (1 for a new stream) and advances it.
    public mutating func advance(_ key: StreamKey) -> UInt64 {
        let value = (next[key] ?? 0) &+ 1
        next[key] = value
        return value
    }

    public var streamCount: Int { next.count }
}
