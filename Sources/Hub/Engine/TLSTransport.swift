import COpenSSL
import Glibc

/// How a TLS connection's bytes cross its socket: OpenSSL's `SSL` through the handshake (and for the whole
/// connection under TLS 1.2, as a client, or with `--tls-records openssl`), then for a TLS 1.3 server the hub's own
/// record layer (`TLSRecordLayer`), which frees the `SSL`. `Connection` asks it to read, to flush its queue and to
/// say goodbye; which of the two runs the records is this object's business alone. A plain connection has none.
final class TLSTransport {
    enum Phase { case handshaking, established }
    private(set) var phase = Phase.handshaking
    let context: TLSContext
    /// OpenSSL's session until the record layer takes over (freed then, or when the connection closes).
    private var ssl: OpaquePointer?
    private var records: TLSRecordLayer?
    /// Where OpenSSL's key-log callback leaves the application traffic secrets during a server handshake.
    private var secrets: UnsafeMutablePointer<hub_tls13_secrets>?
    /// A server has looked at the first byte (a TLS record, or plain HTTP to answer in the clear).
    private var sniffed: Bool
    /// OpenSSL wants the socket writable to finish a read (a TLS 1.3 KeyUpdate answer): EPOLLOUT retries the read.
    var readWantsWrite = false
    /// OpenSSL wants the socket readable to finish a write: the next successful read retries the write.
    private var writeWantsRead = false

    /// A transport in the context's role on `fd`; nil when OpenSSL cannot make a session.
    init?(context: TLSContext, fd: Int32) {
        guard let session = context.makeSession(fd: fd) else { return nil }
        self.context = context
        ssl = session
        sniffed = !context.isServer  // a client speaks first: there is nothing to look at
        if context.handsOffRecords {
            let s = UnsafeMutablePointer<hub_tls13_secrets>.allocate(capacity: 1)
            s.initialize(to: hub_tls13_secrets())
            secrets = s
            _ = hub_SSL_set_secrets(session, s)
        }
    }

    deinit { release() }

    /// Frees the session and wipes the secrets (the connection closed, or it goes on in the clear).
    func release() {
        if let ssl { SSL_free(ssl) }
        ssl = nil
        records = nil
        releaseSecrets()
    }

    /// Wipes and frees the captured traffic secrets (the record layer keeps its own copy).
    private func releaseSecrets() {
        guard let secrets else { return }
        OPENSSL_cleanse(secrets, MemoryLayout<hub_tls13_secrets>.size)
        secrets.deallocate()
        self.secrets = nil
    }

    // MARK: Handshake

    enum HandshakeStep {
        /// Not done: wait for these epoll events (nil: as they are).
        case waiting(interest: UInt32?)
        /// Plain HTTP at a TLS port: write this answer in the clear and close; the transport is done with.
        case answerInClear([UInt8])
        /// Done; `handedOff`: the hub's record layer runs the records from now on.
        case established(handedOff: Bool)
        /// The connection must close; `counted`: a TLS handshake failure (not a peer gone before its first byte).
        case failed(CloseReason, counted: Bool)
    }

    /// Advances the handshake (a server first looks at the first byte).
    func advanceHandshake(fd: Int32) -> HandshakeStep {
        guard let ssl else { return .failed(.error(EPROTO), counted: true) }
        if !sniffed {
            var first: UInt8 = 0
            let n = recv(fd, &first, 1, Int32(MSG_PEEK))
            if n < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return .waiting(interest: nil) }
                return .failed(.error(errno), counted: false)
            }
            if n == 0 { return .failed(.peerClosed, counted: false) }
            sniffed = true
            // 22 = a TLS handshake record. An ASCII letter is plain HTTP (GET, POST, HEAD, …): answer it in the clear.
            if first != 22, (0x41...0x5A).contains(first), !context.plaintextAnswer.isEmpty {
                release()
                return .answerInClear(context.plaintextAnswer)
            }
        }
        ERR_clear_error()
        let r = SSL_do_handshake(ssl)
        if r == 1 {
            phase = .established
            guard let secrets else {
                SSL_set_read_ahead(ssl, 1)  // OpenSSL keeps the connection (a client, or `--tls-records openssl`)
                return .established(handedOff: false)
            }
            defer { releaseSecrets() }
            switch TLSRecordLayer.takeOver(ssl, secrets: secrets, issueTicket: true) {
            case .handedOff(let layer):
                records = layer
                SSL_free(ssl)
                self.ssl = nil
                return .established(handedOff: true)
            case .keepOpenSSL:
                SSL_set_read_ahead(ssl, 1)
                return .established(handedOff: false)
            case .failed:
                return .failed(.error(EPROTO), counted: true)
            }
        }
        switch SSL_get_error(ssl, r) {
        case SSL_ERROR_WANT_READ:
            return .waiting(interest: Epoll.readable)
        case SSL_ERROR_WANT_WRITE:
            return .waiting(interest: Epoll.readable | Epoll.writable)
        default:
            // A bad hello, an old protocol version, no common cipher, a certificate the client refused, or the
            // peer gone: OpenSSL has written its alert (if any) through the socket.
            let code = errno
            ERR_clear_error()
            return .failed(.error(code == 0 ? EPROTO : code), counted: true)
        }
    }

    // MARK: Reading

    /// What one read did besides its bytes.
    struct ReadEffects {
        /// Output waits that this read made sendable (a KeyUpdate answer, or a write that waited for a read).
        var flush = false
        /// OpenSSL needs the socket writable to finish reading: arm EPOLLOUT.
        var wantsWritable = false
    }

    /// Reads and opens what the socket has into `into` (`room` bytes, at least a record's plaintext): plaintext
    /// bytes, `.wouldBlock`, or 0 at the peer's close_notify or EOF. Throws when the peer breaks TLS.
    func read(fd: Int32, into: UnsafeMutableRawPointer, room: Int, crypto: TLSRecordCrypto,
              effects: inout ReadEffects) throws(SyscallError) -> IOResult<Int> {
        if let records {
            let result = try records.read(fd: fd, into: into, room: room, crypto: crypto)
            if records.hasPendingOut { effects.flush = true }  // a KeyUpdate answer
            return result
        }
        guard let ssl else { return .processed(0) }
        ERR_clear_error()
        var n = 0
        if SSL_read_ex(ssl, into, room, &n) == 1 {
            if writeWantsRead {
                writeWantsRead = false
                effects.flush = true
            }
            return .processed(n)
        }
        switch SSL_get_error(ssl, 0) {
        case SSL_ERROR_WANT_READ:
            return .wouldBlock
        case SSL_ERROR_WANT_WRITE:
            readWantsWrite = true
            effects.wantsWritable = true
            return .wouldBlock
        case SSL_ERROR_ZERO_RETURN:
            return .processed(0)
        default:
            let code = errno
            ERR_clear_error()
            throw SyscallError(call: "SSL_read", code: code == 0 ? EPROTO : code)
        }
    }

    /// Input already taken from the socket that epoll will not report: OpenSSL's read-ahead. (The hub's record layer
    /// never holds a whole record back: each `read` opens every whole record it read, keeping only an incomplete
    /// one, which epoll reports.)
    var hasPendingInput: Bool {
        guard records == nil, let ssl, phase == .established else { return false }
        return SSL_has_pending(ssl) == 1
    }

    // MARK: Writing

    /// Sealed bytes the socket has not taken yet (the rest of a record of the hub's layer).
    var pendingOutBytes: Int { records?.pendingOutBytes ?? 0 }
    var hasPendingOut: Bool { records?.hasPendingOut == true }

    /// Encrypts and writes as much of `out` as the socket takes.
    /// - Returns: the outcome, the plaintext bytes written, and whether the write waits for a read first (then the
    ///   next successful read flushes again, and EPOLLOUT would only spin).
    func flush(_ out: inout OutboundQueue, fd: Int32, loop: EventLoop) -> (OutboundQueue.FlushResult, Int, waitsForRead: Bool) {
        if let records {
            let (result, written) = Self.flush(&out, through: records, fd: fd, crypto: loop.tlsRecords)
            return (result, written, false)
        }
        guard let ssl else { return (.failed(SyscallError(call: "SSL_write", code: EPROTO)), 0, false) }
        let (result, written, waitsForRead) = Self.flush(&out, through: ssl, staging: loop.tlsStaging)
        if waitsForRead { writeWantsRead = true }
        return (result, written, waitsForRead)
    }

    /// OpenSSL: up to one record (16 KiB of plaintext) per `SSL_write`. Small frames are gathered into `staging`
    /// (one record for many frames); a chunk holding a record's worth is passed in place. After WANT_WRITE or
    /// WANT_READ OpenSSL must be offered the same bytes again: the queue keeps them as its promised prefix.
    private static func flush(_ out: inout OutboundQueue, through ssl: OpaquePointer,
                              staging: UnsafeMutableRawBufferPointer) -> (OutboundQueue.FlushResult, Int, waitsForRead: Bool) {
        var written = 0
        while out.queuedBytes > 0 {
            let n = out.promisedBytes > 0 ? out.promisedBytes : min(out.queuedBytes, staging.count)
            let source = out.contiguousPrefix(n, staging: staging)
            ERR_clear_error()
            var w = 0
            if SSL_write_ex(ssl, source, n, &w) == 1 {
                out.promisedBytes = 0
                written += w
                out.consume(w)
                continue
            }
            switch SSL_get_error(ssl, 0) {
            case SSL_ERROR_WANT_WRITE:
                out.promisedBytes = n
                return (.pending, written, false)
            case SSL_ERROR_WANT_READ:
                out.promisedBytes = n
                return (.pending, written, true)
            default:
                let code = errno
                ERR_clear_error()
                return (.failed(SyscallError(call: "SSL_write", code: code == 0 ? EPROTO : code)), written, false)
            }
        }
        return (.drained, written, false)
    }

    /// The hub's record layer: seals up to 16 KiB of queued plaintext per record straight from the queued frames (no
    /// gathering copy) and sends each record with one `send`. A record the socket takes only part of stays with the
    /// layer (its plaintext is consumed: the record is sealed with its sequence number).
    private static func flush(_ out: inout OutboundQueue, through layer: TLSRecordLayer, fd: Int32,
                              crypto: TLSRecordCrypto) -> (OutboundQueue.FlushResult, Int) {
        var written = 0
        do throws(SyscallError) {
            while true {
                guard try layer.sendPending(fd: fd) else { return (.pending, written) }
                guard out.queuedBytes > 0 else { return (.drained, written) }
                let n = min(out.queuedBytes, TLSRecordLayer.maxPlaintext)
                guard layer.beginRecord(length: n, crypto: crypto),
                      out.forEachPiece(ofFirst: n, { layer.sealMore($0, $1, crypto: crypto) }),
                      let length = layer.finishRecord(type: 23, crypto: crypto) else {
                    return (.failed(SyscallError(call: "TLS seal", code: EPROTO)), written)
                }
                out.consume(n)
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

    // MARK: Closing

    /// close_notify on a graceful close (one attempt: a full socket loses it, as the WebSocket close already said
    /// goodbye).
    func sendCloseNotify(fd: Int32, crypto: TLSRecordCrypto) {
        if let records {
            records.sendCloseNotify(fd: fd, crypto: crypto)
        } else if let ssl, phase == .established {
            ERR_clear_error()
            _ = SSL_shutdown(ssl)
            ERR_clear_error()
        }
    }
}

@available(*, unavailable)
extension TLSTransport: Sendable {}
