#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Finds the lines of a newline-delimited stream (`\n`, a trailing `\r` stripped) one at a time, in place.
///
/// Built for the engine's read contract (`ConnectionHandler.connectionReadable`): the caller scans the bytes it
/// was handed line by line, may stop between any two lines (to apply backpressure), and returns how much it
/// consumed; the engine keeps the rest, an incomplete last line included, and hands it back in front of the next
/// read. So the framer itself holds no bytes, only whether it is skipping an over-long line.
///
/// A line longer than `maxLineBytes` (not counting its `\n` and a trailing `\r`) is reported once, as soon as it
/// is known to be too long, even before its newline arrives; the rest of it is then skipped as it arrives, without
/// being buffered.
public struct LineFramer: Sendable {
    public enum Next: Equatable, Sendable {
        /// A complete line at `range` (without its terminator); the next one starts at `next`.
        case line(Range<Int>, next: Int)
        /// A line over the limit; scanning goes on at `next` (the end of the buffer when its newline has not
        /// arrived yet: the framer then skips the rest of it in later reads).
        case tooLong(next: Int)
        /// No complete line from `keep` on: consume up to `keep` and keep the rest for the next read.
        case incomplete(keep: Int)
    }

    public let maxLineBytes: Int
    /// Skipping the rest of an over-long line, up to its newline.
    public private(set) var discarding = false

    public init(maxLineBytes: Int = 1 << 20) {
        precondition(maxLineBytes > 0)
        self.maxLineBytes = maxLineBytes
    }

    /// The next line of `buffer` at or after `start`.
    public mutating func next(in buffer: UnsafeRawBufferPointer, from start: Int) -> Next {
        let count = buffer.count
        var from = start
        guard from < count, let base = buffer.baseAddress else { return .incomplete(keep: max(from, 0)) }
        if discarding {
            guard let skip = memchrNewline(base + from, count - from) else { return .incomplete(keep: count) }
            discarding = false
            from += skip + 1
            if from == count { return .incomplete(keep: count) }
        }
        guard let offset = memchrNewline(base + from, count - from) else {
            if overLimit(count - from, last: buffer[count - 1]) {
                discarding = true
                return .tooLong(next: count)
            }
            return .incomplete(keep: from)
        }
        let newline = from + offset
        var end = newline
        if end > from && buffer[end - 1] == 0x0D { end -= 1 }
        if end - from > maxLineBytes { return .tooLong(next: newline + 1) }
        return .line(from..<end, next: newline + 1)
    }

    /// Whether `count` bytes of an unfinished line already exceed the limit (a final `\r` may still be stripped,
    /// so one extra byte is allowed when it is `\r`).
    func overLimit(_ count: Int, last: UInt8) -> Bool {
        count > maxLineBytes + 1 || (count == maxLineBytes + 1 && last != 0x0D)
    }
}

@inline(__always)
func memchrNewline(_ p: UnsafeRawPointer, _ n: Int) -> Int? {
    guard let hit = memchr(p, 0x0A, n) else { return nil }
    return UnsafeRawPointer(hit) - p
}
