import COpenSSL
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
    // The chunk index and the TLS retry length are stored in 32 bits each, so the queue is 40 bytes, not 48 (with
    // `Connection`'s maximum queue as 32 bits, the connection fits a smaller malloc block). Both
    // are bounded far below Int32.max: the index by the number of queued chunks (each at least one byte, and a
    // connection's queue is capped by --max-queued-bytes, at most 1 GiB, plus one chunk), the retry length by the
    // TLS staging buffer (16 KiB).
    private var head32: Int32 = 0
    private var tlsRetryLength32: Int32 = 0
    private var head: Int {
        get { Int(head32) }
        set { head32 = Int32(newValue) }
    }
    /// Bytes of `chunks[head]` already written.
    private var headOffset = 0
    /// Total unwritten bytes.
    private(set) var queuedBytes = 0
    /// TLS: the length of the record OpenSSL holds half-written (WANT_WRITE). OpenSSL requires the retry to pass the
    /// same length, so these leading bytes are fixed until it succeeds.
    private var tlsRetryLength: Int {
        get { Int(tlsRetryLength32) }
        set { tlsRetryLength32 = Int32(newValue) }
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
        tlsRetryLength = 0
    }

    /// Drops every byte not yet handed to the kernel, except the rest of a chunk that is partly written (the
    /// peer has its first bytes: cutting it would corrupt the stream). Chunks are whole frames or responses.
    /// Under TLS the chunks a half-written record was made from stay too (the peer has part of that record).
    mutating func dropUnsent() {
        guard queuedBytes > 0 else { return }
        if headOffset == 0 && tlsRetryLength == 0 {
            removeAll()
            return
        }
        // Keep every chunk that holds a byte the peer has part of: the partly written head, and under TLS the
        // chunks of the half-written record.
        var kept = 0
        var end = head
        var bytes = -headOffset
        while end < chunks.count && (end == head && headOffset > 0 || bytes < tlsRetryLength) {
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

    /// Encrypts and writes as much as the socket takes, up to one TLS record (16 KiB of plaintext) per `SSL_write`:
    /// small frames are gathered into `staging` (one record for many frames); a chunk holding a record's worth is
    /// passed in place.
    /// - Returns: the outcome, the plaintext bytes written, and whether OpenSSL waits to read first (WANT_READ).
    mutating func flushTLS(_ ssl: OpaquePointer, staging: UnsafeMutableRawBufferPointer) -> (FlushResult, Int, wantsRead: Bool) {
        var written = 0
        while queuedBytes > 0 {
            let n = tlsRetryLength > 0 ? tlsRetryLength : min(queuedBytes, staging.count)
            let source: UnsafeRawPointer
            let headBytes = chunks[head].bytes
            if headBytes.count - headOffset >= n {
                source = UnsafeRawPointer(headBytes.baseAddress!) + headOffset
            } else {
                gather(n, into: staging)
                source = UnsafeRawPointer(staging.baseAddress!)
            }
            ERR_clear_error()
            var w = 0
            if SSL_write_ex(ssl, source, n, &w) == 1 {
                tlsRetryLength = 0
                written += w
                consume(w)
                continue
            }
            switch SSL_get_error(ssl, 0) {
            case SSL_ERROR_WANT_WRITE:
                tlsRetryLength = n
                return (.pending, written, false)
            case SSL_ERROR_WANT_READ:
                tlsRetryLength = n
                return (.pending, written, true)
            default:
                let code = errno
                ERR_clear_error()
                return (.failed(SyscallError(call: "SSL_write", code: code == 0 ? EPROTO : code)), written, false)
            }
        }
        return (.drained, written, false)
    }

    /// TLS 1.3 through the hub's own record layer: seals up to 16 KiB of queued plaintext per record, straight from
    /// the queued frames (no gathering copy), and sends each record with one `send`. A record the socket takes only
    /// part of stays with the layer (its plaintext is consumed: the record is sealed with its sequence number).
    /// - Returns: the outcome and the plaintext bytes sealed.
    mutating func flushRecords(_ layer: TLSRecordLayer, fd: Int32, crypto: TLSRecordCrypto) -> (FlushResult, Int) {
        var written = 0
        do throws(SyscallError) {
            while true {
                guard try layer.sendPending(fd: fd) else { return (.pending, written) }
                guard queuedBytes > 0 else { return (.drained, written) }
                let n = min(queuedBytes, TLSRecordLayer.maxPlaintext)
                guard layer.beginRecord(length: n, crypto: crypto), sealPrefix(n, layer, crypto),
                      let length = layer.finishRecord(type: 23, crypto: crypto) else {
                    return (.failed(SyscallError(call: "TLS seal", code: EPROTO)), written)
                }
                consume(n)
                written += n
                let record = crypto.record.baseAddress!
                let sent: Int
                switch try syscall("send", { Glibc.send(fd, record, length, Int32(MSG_NOSIGNAL)) }) {
                case .processed(let w): sent = w
                case .wouldBlock: sent = 0
                }
                if sent < length {
                    layer.appendPending(record + sent, length - sent)
                    return (.pending, written)
                }
            }
        } catch {
            return (.failed(error), written)
        }
    }

    /// Feeds the first `count` queued bytes to the record being sealed.
    private func sealPrefix(_ count: Int, _ layer: TLSRecordLayer, _ crypto: TLSRecordCrypto) -> Bool {
        forEachPiece(ofFirst: count) { layer.sealMore($0, $1, crypto: crypto) }
    }

    /// Hands the first `count` queued bytes to `body`, one contiguous piece at a time, until it returns false.
    /// - Returns: whether every piece was taken.
    @inline(__always)
    private func forEachPiece(ofFirst count: Int, _ body: (UnsafeRawPointer, Int) -> Bool) -> Bool {
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

    /// Copies the first `count` queued bytes into `staging`.
    private func gather(_ count: Int, into staging: UnsafeMutableRawBufferPointer) {
        var copied = 0
        _ = forEachPiece(ofFirst: count) { piece, length in
            (staging.baseAddress! + copied).copyMemory(from: piece, byteCount: length)
            copied += length
            return true
        }
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
