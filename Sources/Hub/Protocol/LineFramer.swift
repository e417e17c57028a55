#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Splits a byte stream into lines (`\n`, a trailing `\r` stripped) across arbitrary read splits.
///
/// A line entirely inside the current read buffer is handed out zero-copy (a view into that buffer); a line
/// split across reads is assembled in a reusable buffer. A line longer than `maxLineBytes` (not counting its
/// `\n` and a trailing `\r`) yields one `.tooLong` as soon as it is known to be too long; the framer then
/// skips to the next newline without buffering the excess.
///
/// The views passed to the callback are valid only during the call, and the callback must not access the
/// framer itself (it is being mutated: exclusivity). Read `maxLineBytes` before calling `feed`. If the
/// callback throws, `feed` rethrows at once and the rest of that chunk is dropped (the caller is closing).
/// The assembly buffer is released after a line over 64 KiB, so a burst of big lines does not pin memory.
public struct LineFramer: Sendable {
    public enum Line {
        case line(UnsafeRawBufferPointer)
        case tooLong
    }

    public let maxLineBytes: Int
    /// The start of a line carried over from earlier reads.
    var pending: [UInt8] = []
    /// Skipping an over-long line up to its newline.
    var discarding = false

    public init(maxLineBytes: Int = 1 << 20) {
        precondition(maxLineBytes > 0)
        self.maxLineBytes = maxLineBytes
    }

    /// Whether bytes of an unfinished line are held (or being skipped).
    public var hasPartialLine: Bool { !pending.isEmpty || discarding }

    /// Feeds one read's bytes; calls `body` for each complete line, in order.
    public mutating func feed<E: Error>(_ chunk: UnsafeRawBufferPointer,
                                        _ body: (Line) throws(E) -> Void) throws(E) {
        var start = 0
        let n = chunk.count
        guard n > 0, let base = chunk.baseAddress else { return }
        while start < n {
            let nl = memchrNewline(base + start, n - start).map { start + $0 }
            guard let nl else {
                // No newline in the rest of the chunk: carry it over, or skip it.
                if !discarding {
                    let rest = UnsafeRawBufferPointer(rebasing: chunk[start..<n])
                    if overLimit(pending.count + rest.count, last: chunk[n - 1]) {
                        pending.removeAll(keepingCapacity: true)
                        discarding = true
                        try body(.tooLong)
                    } else {
                        pending.append(contentsOf: rest)
                    }
                }
                return
            }
            if discarding {
                discarding = false
            } else if pending.isEmpty {
                var end = nl
                if end > start && chunk[end - 1] == 0x0D { end -= 1 }
                if end - start > maxLineBytes {
                    try body(.tooLong)
                } else {
                    try body(.line(UnsafeRawBufferPointer(rebasing: chunk[start..<end])))
                }
            } else {
                let total = pending.count + (nl - start)
                if total > maxLineBytes + 1 {
                    pending.removeAll(keepingCapacity: true)
                    try body(.tooLong)
                } else {
                    pending.append(contentsOf: UnsafeRawBufferPointer(rebasing: chunk[start..<nl]))
                    if pending.last == 0x0D { pending.removeLast() }
                    if pending.count > maxLineBytes {
                        pending.removeAll(keepingCapacity: true)
                        try body(.tooLong)
                    } else {
                        var error: E?
                        pending.withUnsafeBytes { buf in
                            do throws(E) { try body(.line(buf)) } catch let e { error = e }
                        }
                        releasePending()
                        if let error { throw error }
                    }
                }
            }
            start = nl + 1
        }
    }

    /// At end of stream: hands out a final line that had no newline (if any, and not over-long), then resets.
    public mutating func finish<E: Error>(_ body: (Line) throws(E) -> Void) throws(E) {
        defer { pending.removeAll(keepingCapacity: true); discarding = false }
        guard !discarding, !pending.isEmpty else { return }
        if pending.last == 0x0D { pending.removeLast() }
        if pending.isEmpty { return }
        var error: E?
        pending.withUnsafeBytes { buf in
            do throws(E) { try body(.line(buf)) } catch let e { error = e }
        }
        if let error { throw error }
    }

    mutating func releasePending() {
        if pending.capacity > 64 << 10 { pending = [] } else { pending.removeAll(keepingCapacity: true) }
    }

    /// Whether `count` buffered bytes of an unfinished line already exceed the limit (a final `\r` may still be
    /// stripped, so one extra byte is allowed when it is `\r`).
    func overLimit(_ count: Int, last: UInt8?) -> Bool {
        count > maxLineBytes + 1 || (count == maxLineBytes + 1 && last != 0x0D)
    }
}

@inline(__always)
func memchrNewline(_ p: UnsafeRawPointer, _ n: Int) -> Int? {
    guard let hit = memchr(p, 0x0A, n) else { return nil }
    return UnsafeRawPointer(hit) - p
}
