import Glibc

/// The bytes a connection still owes its peer: references to shared immutable buffers plus an
/// offset into the first one, flushed with `sendmsg` (a `writev` with MSG_NOSIGNAL).
///
/// Why references: fan-out enqueues one `SharedBytes` object per subscriber (a retain, no copy).
/// Why an explicit byte count: the per-connection cap (`maxQueuedBytes` on `Connection`) is checked on
/// every enqueue so a slow reader is detected in O(1) and never blocks the loop or other subscribers.
struct OutboundQueue {
    private var chunks: [SharedBytes] = []
    private var head = 0
    /// Bytes of `chunks[head]` already written.
    private var headOffset = 0
    /// Total unwritten bytes.
    private(set) var queuedBytes = 0

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
    }

    /// Drops every byte not yet handed to the kernel, except the rest of a chunk that is partly written (the
    /// peer has its first bytes: cutting it would corrupt the stream). Chunks are whole frames or responses.
    mutating func dropUnsent() {
        guard queuedBytes > 0 else { return }
        if headOffset == 0 {
            removeAll()
            return
        }
        let partial = chunks[head]
        chunks.removeAll(keepingCapacity: false)
        chunks.append(partial)
        head = 0
        queuedBytes = partial.count - headOffset
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
            while i < chunks.count && n < iov.count {
                let b = chunks[i].bytes
                iov[n] = iovec(iov_base: UnsafeMutableRawPointer(mutating: b.baseAddress! + offset), iov_len: b.count - offset)
                n += 1
                i += 1
                offset = 0
            }
            let result: IOResult<Int>
            do {
                // sendmsg = writev + flags: MSG_NOSIGNAL turns a write to a reset peer into EPIPE
                // instead of a process-killing SIGPIPE.
                var message = msghdr()
                message.msg_iov = iov.baseAddress
                message.msg_iovlen = n
                result = try syscall("sendmsg") { Glibc.sendmsg(fd, &message, Int32(MSG_NOSIGNAL)) }
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

    private func iovTotal(_ iov: UnsafeMutableBufferPointer<iovec>, _ n: Int) -> Int {
        var t = 0
        for k in 0..<n { t += iov[k].iov_len }
        return t
    }

    private mutating func consume(_ count: Int) {
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
            chunks.removeAll(keepingCapacity: chunks.capacity <= 64)
            head = 0
        } else if head >= 32 && head * 2 >= chunks.count {
            chunks.removeFirst(head)
            head = 0
        }
    }
}

@available(*, unavailable)
extension OutboundQueue: Sendable {}
