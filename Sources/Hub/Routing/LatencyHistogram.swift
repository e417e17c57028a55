/// A small log-linear latency histogram (nanoseconds), mergeable across loops, for /metrics and the load
/// generator. Buckets: 4 sub-buckets per power of two from 1.024 µs up to ~19 h; relative error under 25%.
public struct LatencyHistogram: Sendable, Equatable {
    public static let subBucketsPerOctave = 4
    public static let minimumNanoseconds: UInt64 = 1_024
    static let minimumOctave = 10
    public static let octaves = 36
    public private(set) var counts: [UInt64]
    public private(set) var total: UInt64 = 0
    public private(set) var sumNanoseconds: UInt64 = 0
    public private(set) var maxNanoseconds: UInt64 = 0

    public init() {
        counts = Array(repeating: 0, count: Self.octaves * Self.subBucketsPerOctave + 1)
    }

    static func bucket(for value: UInt64) -> Int {
        if value < minimumNanoseconds { return 0 }
        let octave = 63 - value.leadingZeroBitCount  // >= minimumOctave
        let fraction = Int((value >> UInt64(octave - 2)) & 3)
        return min(1 + (octave - minimumOctave) * subBucketsPerOctave + fraction, octaves * subBucketsPerOctave)
    }

    /// The upper bound (exclusive) in nanoseconds of bucket `index`.
    public static func upperBound(ofBucket index: Int) -> UInt64 {
        if index == 0 { return minimumNanoseconds }
        let octave = (index - 1) / subBucketsPerOctave
        let fraction = UInt64((index - 1) % subBucketsPerOctave)
        let base = UInt64(1) << UInt64(octave + minimumOctave)
        return base + (base / 4) * (fraction + 1)
    }

    public mutating func record(_ nanoseconds: UInt64) {
        counts[Self.bucket(for: nanoseconds)] &+= 1
        total &+= 1
        sumNanoseconds &+= nanoseconds
        if nanoseconds > maxNanoseconds { maxNanoseconds = nanoseconds }
    }

    public mutating func merge(_ other: LatencyHistogram) {
        for i in counts.indices { counts[i] &+= other.counts[i] }
        total &+= other.total
        sumNanoseconds &+= other.sumNanoseconds
        maxNanoseconds = max(maxNanoseconds, other.maxNanoseconds)
    }

    /// The value at quantile `q` (0...1): the upper bound of the bucket holding it, capped at the maximum seen.
    public func quantile(_ q: Double) -> UInt64 {
        guard total > 0 else { return 0 }
        let rank = UInt64((q * Double(total)).rounded(.up))
        var seen: UInt64 = 0
        for (i, c) in counts.enumerated() {
            seen &+= c
            if seen >= max(rank, 1) { return min(Self.upperBound(ofBucket: i), maxNanoseconds) }
        }
        return maxNanoseconds
    }
}
