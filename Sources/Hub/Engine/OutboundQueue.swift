import Glibc
import HubSupport

/// The bytes a connection still owes its peer: references to shared immutable buffers plus an
/// offset into the first one, flushed with `sendmsg` (a `writev` with MSG_NOSIGNAL), or with `send`
/// when one chunk is queued.
///
/// Why references: fan-out enqueues one `SharedBytes` object per subscriber (a retain, no copy).
/// Why an explicit byte count: the per-connection cap (`maxQueuedBytes` on `Connection`) is checked on
/// every enqueue so a slow reader is detected in O(1) and never blocks the loop or other subscribers.
struct OutboundQueue {
    /// The first chunk inline, an array only once two are queued at the same time: most connections only ever have
    /// one thing queued at a time (the 101, a reply, an event at a moderate rate, a ping), so they never allocate the
    /// array (40 bytes and a malloc block less per idle connection). One that did queue several keeps the array's
    /// buffer (up to 64 slots) for the next burst.
    private var chunks = InlineList<SharedBytes>()
    // The chunk index and the promised length are stored in 32 bits each, so the queue is 40 bytes, not 48 (with
    // `Connection`'s maximum queue as 32 bits, the connection fits a smaller malloc block). Both
    // are bounded far below Int32.max: the index by the number of queued chunks (each at least one byte, and a
    // connection's queue is capped by --max-queued-bytes, at most 1 GiB, plus one chunk), the promised length by
    // the TLS staging buffer (16 KiB).
    private var head32: Int32 = 0
    private var promised32: Int32 = 0
    private var head: Int {
        get { Int(head32) }
        set { head32 = Int32(newValue) }
    }
    /// Bytes of `chunks[head]` already written.
    private var headOffset = 0
    /// Total unwritten bytes.
    private(set) var queuedBytes = 0
    /// Leading bytes a transport was offered and must be offered again unchanged (OpenSSL after WANT_WRITE holds a
    /// record half-written, and requires the retry to pass the same bytes): fixed until it takes them.
    var promisedBytes: Int {
        get { Int(promised32) }
        set { promised32 = Int32(newValue) }
    }

    var isEmpty: Bool { queuedBytes == 0 }
    var chunkCount: Int { chunks.count - head }

    mutating func append(_ b: SharedBytes) {
        guard b.count > 0 else { return }
        chunks.append(b)
        queuedBytes += b.count
    }

    mutating func removeAll() {
        chunks.removeAll()
        head = 0
        headOffset = 0
        queuedBytes = 0
        promisedBytes = 0
    }

    /// Drops every byte not yet handed to the kernel, except the rest of a chunk that is partly written (the
    /// peer has its first bytes: cutting it would corrupt the stream). Chunks are whole frames or responses.
    /// The chunks of promised bytes stay too (under TLS, the peer has part of the record they were sealed into).
    mutating func dropUnsent() {
        guard queuedBytes > 0 else { return }
        if headOffset == 0 && promisedBytes == 0 {
            removeAll()
            return
        }
        // Keep every chunk that holds a byte the peer has part of: the partly written head, and the promised ones.
        var kept = 0
        var end = head
        var bytes = -headOffset
        while end < chunks.count && (end == head && headOffset > 0 || bytes < promisedBytes) {
            bytes += chunks[end].count
            end += 1
        }
        var keep = InlineList<SharedBytes>()
        for i in head..<end { keep.append(chunks[i]); kept += chunks[i].count }
        chunks = keep
        head = 0
        queuedBytes = kept - headOffset
    }

    enum FlushResult {
        /// Everything was written.
        case drained
        /// The socket buffer is full; the rest stays queued (register EPOLLOUT).
        case pending
        /// The write failed (peer reset, EPIPE): the connection is dead.
        case failed(SyscallError)
    }

    /// Writes as much as the socket takes, `iov.count` chunks per call.
    /// - Returns: the outcome and how many bytes went out.
    mutating func flush(fd: Int32, iov: UnsafeMutableBufferPointer<iovec>) -> (FlushResult, Int) {
        var written = 0
        while queuedBytes > 0 {
            var n = 0
            var i = head
            var offset = headOffset
            let end = chunks.count
            while i < end && n < iov.count {
                let b = chunks[i].bytes
                iov[n] = iovec(iov_base: UnsafeMutableRawPointer(mutating: b.baseAddress! + offset), iov_len: b.count - offset)
                n += 1
                i += 1
                offset = 0
            }
            let result: IOResult<Int>
            do {
                // MSG_NOSIGNAL turns a write to a reset peer into EPIPE instead of a process-killing SIGPIPE.
                if n == 1 {
                    // One chunk (the usual case: one event for one subscriber): `send` spares the kernel copying in
                    // a msghdr and an iovec array.
                    let only = iov[0]
                    result = try syscall("send") { Glibc.send(fd, only.iov_base, only.iov_len, Int32(MSG_NOSIGNAL)) }
                } else {
                    // sendmsg = writev + flags.
                    var message = msghdr()
                    message.msg_iov = iov.baseAddress
                    message.msg_iovlen = n
                    result = try syscall("sendmsg") { Glibc.sendmsg(fd, &message, Int32(MSG_NOSIGNAL)) }
                }
            } catch {
                return (.failed(error), written)
            }
            guard case .processed(let w) = result else { return (.pending, written) }
            written += w
            consume(w)
            // A short write means the socket buffer is full; don't spend another syscall to hear EAGAIN.
            if queuedBytes > 0 && w < iovTotal(iov, n) { return (.pending, written) }
        }
        return (.drained, written)
    }

    /// The first `count` queued bytes in one piece: in place when the head chunk holds them, else gathered into
    /// `staging` (at least `count` bytes).
    func contiguousPrefix(_ count: Int, staging: UnsafeMutableRawBufferPointer) -> UnsafeRawPointer {
        let headBytes = chunks[head].bytes
        if headBytes.count - headOffset >= count { return UnsafeRawPointer(headBytes.baseAddress!) + headOffset }
        var copied = 0
        _ = forEachPiece(ofFirst: count) { piece, length in
            (staging.baseAddress! + copied).copyMemory(from: piece, byteCount: length)
            copied += length
            return true
        }
        return UnsafeRawPointer(staging.baseAddress!)
    }

    /// Hands the first `count` queued bytes to `body`, one contiguous piece at a time, until it returns false.
    /// - Returns: whether every piece was taken.
    @inline(__always)
    func forEachPiece(ofFirst count: Int, _ body: (UnsafeRawPointer, Int) -> Bool) -> Bool {
        var left = count
        var i = head
        var offset = headOffset
        while left > 0 {
            let b = chunks[i].bytes
            let take = min(b.count - offset, left)
            guard body(UnsafeRawPointer(b.baseAddress!) + offset, take) else { return false }
            left -= take
            i += 1
            offset = 0
        }
        return true
    }

    private func iovTotal(_ iov: UnsafeMutableBufferPointer<iovec>, _ n: Int) -> Int {
        var t = 0
        for k in 0..<n { t += iov[k].iov_len }
        return t
    }

    /// Drops the first `count` queued bytes (written).
    mutating func consume(_ count: Int) {
        var left = count
        queuedBytes -= count
        while left > 0 {
            let remainingInHead = chunks[head].count - headOffset
            if left >= remainingInHead {
                left -= remainingInHead
                head += 1
                headOffset = 0
            } else {
                headOffset += left
                left = 0
            }
        }
        if head == chunks.count {
            chunks.removeAll(keepingCapacity: chunks.spillCapacity <= 64)
            head = 0
        } else if head >= 32 && head * 2 >= chunks.count {
            chunks.removeFirst(head)
            head = 0
        }
    }
}

@available(*, unavailable)
extension OutboundQueue: Sendable {}
