import COpenSSL
import Glibc

/// TLS 1.3 after the handshake, run by the hub itself (RFC 8446 §5), so that an idle TLS connection costs what an
/// idle plain one does plus ~0.3 KiB.
///
/// Why: OpenSSL 3.0 keeps ~15 KiB per connection in its `SSL` object after a handshake, with its 16 KiB buffers
/// already released (`SSL_MODE_RELEASE_BUFFERS`): record-layer arrays, handshake leftovers, the session. Kernel TLS
/// would let the `SSL` go, but it is not available everywhere (this machine's kernel has no `CONFIG_TLS`). So once a
/// TLS 1.3 server handshake is done, OpenSSL hands over what the record layer needs (the two application traffic
/// secrets, from its key-log callback) and its `SSL` is freed. What stays per connection is this object: the
/// secrets, keys and IVs of both directions (192 bytes, one allocation, wiped when freed), two sequence numbers, and,
/// only while they hold bytes, an incomplete inbound record and the unsent rest of an outbound one.
///
/// The cryptography is OpenSSL's (EVP AEADs, HMAC for HKDF-Expand-Label); the cipher contexts are the loop's
/// (`TLSRecordCrypto`), re-keyed per record: a little time per record for ~1.2 KiB less per connection.
///
/// What it does: application data both ways, in records of at most 16 KiB of plaintext; the peer's close_notify
/// (EOF), user_canceled (ignored) and fatal alerts (the connection fails); KeyUpdate both ways (RFC 8446 §4.6.3),
/// answering one that asks for it; close_notify on a graceful close. Anything else after the handshake (a
/// plaintext record, a bad tag, a record whose inner plaintext passes 2^14 + 1 bytes, a handshake message other
/// than KeyUpdate, a KeyUpdate that does not end its record, more KeyUpdates than the budget below, a record with no
/// content type) fails the connection with the alert RFC 8446 §6 names, sent when no record is half-sent.
///
/// TLS 1.2 connections, and the engine's TLS client role, stay with OpenSSL throughout.
final class TLSRecordLayer {
    /// The TLS 1.3 AEAD suites OpenSSL offers by default; the raw value is `hub_aead_context_new`'s index.
    enum Suite: Int32 {
        case aes128GCM = 0, aes256GCM = 1, chacha20Poly1305 = 2

        init?(protocolID: UInt16) {
            switch protocolID {
            case 0x1301: self = .aes128GCM
            case 0x1302: self = .aes256GCM
            case 0x1303: self = .chacha20Poly1305
            default: return nil
            }
        }

        var keyLength: Int { self == .aes128GCM ? 16 : 32 }
        var usesSHA384: Bool { self == .aes256GCM }
        var hashLength: Int { usesSHA384 ? 48 : 32 }
    }

    /// RFC 8446 §5.1: at most 2^14 bytes of plaintext per record.
    static let maxPlaintext = 16 * 1024
    /// RFC 8446 §5.2: at most 2^14 + 256 bytes of ciphertext (a peer's record above this is record_overflow).
    static let maxCiphertext = maxPlaintext + 256
    /// RFC 8446 §5.4: TLSInnerPlaintext (content, type, padding) is at most 2^14 + 1 bytes; with the 16-byte tag of
    /// every suite here, a record's ciphertext says its length before it is opened.
    static let maxInnerPlaintext = maxPlaintext + 1
    /// A KeyUpdate costs three HKDF expansions, some thirty times a data record of the same size: a peer gets
    /// `keyUpdateBurst` of them, and earns one more with every `keyUpdateBytes` of application data it sends (up to
    /// the burst again). Clients update keys for the AEAD limits, after gigabytes; BoringSSL allows 32 in a row.
    static let keyUpdateBytes = 64 * 1024
    static let keyUpdateBurst = 32
    static let maxKeyUpdateCredit = keyUpdateBurst * keyUpdateBytes
    /// A whole record at most: header and ciphertext.
    static let maxRecord = 5 + maxCiphertext
    /// What one outbound record adds to its plaintext: header, content type, tag.
    static let overhead = 5 + 1 + 16
    /// The most that may wait unsent (the rest of one record plus our alerts and KeyUpdate answers) before a peer
    /// that keeps asking for KeyUpdates without reading is cut off.
    static let maxPendingOut = 2 * maxRecord

    let suite: Suite
    /// [read secret 48][read key 32][read IV 12][write secret 48][write key 32][write IV 12]: one allocation.
    private let keys: UnsafeMutableRawPointer
    private static let keysSize = 192
    private static let readBase = 0, writeBase = 92
    private var readSeq: UInt64 = 0
    private var writeSeq: UInt64
    /// An incomplete inbound record (allocated only while one is waiting for its rest).
    private var inSpill: UnsafeMutableRawPointer?
    private var inCount = 0
    /// Sealed bytes the socket has not taken yet (allocated only while there are some).
    private var outPending: UnsafeMutableRawPointer?
    private var outStart = 0
    private var outEnd = 0
    private var outCapacity = 0
    /// The peer's close_notify arrived: reads are at EOF from now on.
    private(set) var peerClosed = false
    /// KeyUpdate messages the peer sent.
    private(set) var keyUpdatesReceived = 0
    /// The description of the fatal alert the peer sent, once it has.
    private(set) var alertReceived: UInt8?
    /// Application bytes that pay for the peer's next KeyUpdates (each costs `keyUpdateBytes`).
    private var keyUpdateCredit = maxKeyUpdateCredit

    /// A server's layer from the two traffic secrets (`takeOver`; tests and the fuzzer make the client's mirror
    /// image by swapping them).
    init(suite: Suite, clientSecret: UnsafeRawPointer, serverSecret: UnsafeRawPointer, writeSeq: UInt64) {
        self.suite = suite
        self.writeSeq = writeSeq
        keys = .allocate(byteCount: Self.keysSize, alignment: 16)
        keys.initializeMemory(as: UInt8.self, repeating: 0, count: Self.keysSize)
        (keys + Self.readBase).copyMemory(from: clientSecret, byteCount: suite.hashLength)
        (keys + Self.writeBase).copyMemory(from: serverSecret, byteCount: suite.hashLength)
    }

    /// A layer with its keys derived from the two traffic secrets: a server's reads with the client's secret (what
    /// `takeOver` makes); a client's mirror image (tests) reads with the server's.
    convenience init?(suite: Suite, readSecret: UnsafeRawPointer, writeSecret: UnsafeRawPointer, writeSeq: UInt64) {
        self.init(suite: suite, clientSecret: readSecret, serverSecret: writeSecret, writeSeq: writeSeq)
        guard deriveKeys(base: Self.readBase), deriveKeys(base: Self.writeBase) else { return nil }
    }

    deinit {
        OPENSSL_cleanse(keys, Self.keysSize)
        keys.deallocate()
        inSpill?.deallocate()
        outPending?.deallocate()
    }

    /// What `takeOver` decided.
    enum TakeOver {
        /// The layer runs the connection from now on; it holds the session ticket OpenSSL sealed (if any) to send first.
        case handedOff(TLSRecordLayer)
        /// Not a TLS 1.3 connection with a suite this layer runs, or OpenSSL holds input: OpenSSL keeps it.
        case keepOpenSSL
        /// The session ticket could not be written after the `SSL`'s output was redirected: fail the connection.
        case failed
    }

    /// Takes a finished TLS 1.3 server session over from OpenSSL: derives the keys from the captured secrets, and
    /// issues the session ticket (the context sends none during the handshake) into a memory BIO, so that the write
    /// sequence number is the count of records in it. The caller frees the `SSL` after `.handedOff`.
    static func takeOver(_ ssl: OpaquePointer, secrets: UnsafeMutablePointer<hub_tls13_secrets>, issueTicket: Bool) -> TakeOver {
        guard SSL_version(ssl) == TLS1_3_VERSION, let cipher = SSL_get_current_cipher(ssl),
              let suite = Suite(protocolID: SSL_CIPHER_get_protocol_id(cipher)),
              Int(secrets.pointee.clientLength) == suite.hashLength, Int(secrets.pointee.serverLength) == suite.hashLength,
              SSL_has_pending(ssl) == 0, SSL_pending(ssl) == 0 else { return .keepOpenSSL }
        var ticket: [UInt8] = []
        if issueTicket, let memory = BIO_new(BIO_s_mem()) {
            guard let socketBIO = SSL_get_rbio(ssl), BIO_up_ref(socketBIO) == 1 else {
                BIO_free(memory)
                return .keepOpenSSL
            }
            SSL_set0_wbio(ssl, memory)  // drops the SSL's write reference to the socket BIO (the read one stays)
            ERR_clear_error()
            // A ticket OpenSSL declines to issue is no ticket (no resumption); one it fails to write fails the
            // connection, since its output now goes nowhere else.
            if SSL_new_session_ticket(ssl) == 1 {
                guard SSL_do_handshake(ssl) == 1 else {
                    ERR_clear_error()
                    return .failed
                }
            }
            ERR_clear_error()
            var data: UnsafeMutablePointer<CChar>?
            let count = hub_BIO_mem_bytes(memory, &data)
            if count > 0, let data {
                ticket = Array(UnsafeRawBufferPointer(start: data, count: count))
            }
        }
        guard let written = countRecords(ticket),
              let layer = TLSRecordLayer(suite: suite, readSecret: hub_secrets_client(secrets), writeSecret: hub_secrets_server(secrets),
                                         writeSeq: written) else { return .failed }
        if !ticket.isEmpty {
            ticket.withUnsafeBytes { layer.appendPending($0.baseAddress!, $0.count) }
        }
        return .handedOff(layer)
    }

    /// The number of whole records in `bytes`, or nil if they do not split into records exactly.
    private static func countRecords(_ bytes: [UInt8]) -> UInt64? {
        var at = 0
        var records: UInt64 = 0
        while at < bytes.count {
            guard bytes.count - at >= 5 else { return nil }
            at += 5 + (Int(bytes[at + 3]) << 8 | Int(bytes[at + 4]))
            records += 1
        }
        return at == bytes.count ? records : nil
    }

    // MARK: Keys

    private func secret(_ base: Int) -> UnsafeMutableRawPointer { keys + base }
    private func key(_ base: Int) -> UnsafeMutableRawPointer { keys + base + 48 }
    private func iv(_ base: Int) -> UnsafeMutableRawPointer { keys + base + 80 }

    /// The key and IV of one direction from its traffic secret (RFC 8446 §7.3).
    private func deriveKeys(base: Int) -> Bool {
        let sha384: Int32 = suite.usesSHA384 ? 1 : 0
        let s = secret(base).assumingMemoryBound(to: UInt8.self)
        return hub_tls13_expand_label(sha384, s, "key", key(base).assumingMemoryBound(to: UInt8.self), suite.keyLength) == 1
            && hub_tls13_expand_label(sha384, s, "iv", iv(base).assumingMemoryBound(to: UInt8.self), 12) == 1
    }

    /// The next traffic secret of one direction, and its keys (RFC 8446 §7.2).
    private func updateSecret(base: Int) -> Bool {
        var next = (UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        let ok = withUnsafeMutableBytes(of: &next) { buffer -> Bool in
            let out = buffer.baseAddress!.assumingMemoryBound(to: UInt8.self)
            guard hub_tls13_expand_label(suite.usesSHA384 ? 1 : 0, secret(base).assumingMemoryBound(to: UInt8.self),
                                         "traffic upd", out, suite.hashLength) == 1 else { return false }
            secret(base).copyMemory(from: out, byteCount: suite.hashLength)
            OPENSSL_cleanse(buffer.baseAddress, buffer.count)
            return true
        }
        return ok && deriveKeys(base: base)
    }

    /// The per-record nonce (RFC 8446 §5.3): the IV with the sequence number XORed into its last 8 bytes.
    private func nonce(base: Int, seq: UInt64, into out: UnsafeMutableRawPointer) {
        out.copyMemory(from: iv(base), byteCount: 12)
        for i in 0..<8 {
            out.storeBytes(of: out.load(fromByteOffset: 4 + i, as: UInt8.self) ^ UInt8(truncatingIfNeeded: seq >> (56 - 8 * UInt64(i))),
                           toByteOffset: 4 + i, as: UInt8.self)
        }
    }

    // MARK: Writing

    /// Starts sealing a record of `length` plaintext bytes into `crypto.record` (header written, cipher keyed).
    /// `maxLength` is the RFC's limit; only a test that plays a misbehaving peer passes a larger one.
    func beginRecord(length: Int, crypto: TLSRecordCrypto, maxLength: Int = maxPlaintext) -> Bool {
        guard length <= maxLength, let ctx = crypto.sealContext(suite) else { return false }
        let header = crypto.record.baseAddress!
        let wire = length + 1 + 16
        header.storeBytes(of: 23, as: UInt8.self)  // application_data (the real type is inside)
        header.storeBytes(of: 3, toByteOffset: 1, as: UInt8.self)
        header.storeBytes(of: 3, toByteOffset: 2, as: UInt8.self)
        header.storeBytes(of: UInt8(wire >> 8), toByteOffset: 3, as: UInt8.self)
        header.storeBytes(of: UInt8(wire & 0xFF), toByteOffset: 4, as: UInt8.self)
        nonce(base: Self.writeBase, seq: writeSeq, into: crypto.nonce)
        crypto.sealed = 5
        return hub_aead_start(ctx, key(Self.writeBase).assumingMemoryBound(to: UInt8.self),
                              crypto.nonce.assumingMemoryBound(to: UInt8.self), header.assumingMemoryBound(to: UInt8.self)) == 1
    }

    /// Encrypts the next plaintext bytes of the record begun with `beginRecord`.
    func sealMore(_ bytes: UnsafeRawPointer, _ count: Int, crypto: TLSRecordCrypto) -> Bool {
        guard let ctx = crypto.sealContext(suite), crypto.sealed + count + 16 <= crypto.record.count else { return false }
        let out = (crypto.record.baseAddress! + crypto.sealed).assumingMemoryBound(to: UInt8.self)
        guard hub_aead_update(ctx, out, bytes.assumingMemoryBound(to: UInt8.self), Int32(count)) == 1 else { return false }
        crypto.sealed += count
        return true
    }

    /// Seals the content type and the tag: the whole record is `crypto.record[0..<returned]`.
    func finishRecord(type: UInt8, crypto: TLSRecordCrypto) -> Int? {
        var contentType = type
        guard sealMore(&contentType, 1, crypto: crypto) else { return nil }
        return sealTag(crypto: crypto)
    }

    /// Ends the record with its tag (after `sealMore` has sealed the whole inner plaintext, content type and any
    /// padding included: `finishRecord` does both for the hub's own records).
    func sealTag(crypto: TLSRecordCrypto) -> Int? {
        guard let ctx = crypto.sealContext(suite) else { return nil }
        let tag = (crypto.record.baseAddress! + crypto.sealed).assumingMemoryBound(to: UInt8.self)
        guard hub_aead_seal_finish(ctx, tag) == 1 else { return nil }
        writeSeq &+= 1
        return crypto.sealed + 16
    }

    /// Seals one small record of our own (an alert, a KeyUpdate) and queues it behind what is pending.
    private func queueRecord(type: UInt8, _ content: [UInt8], crypto: TLSRecordCrypto) -> Bool {
        guard outEnd - outStart + content.count + Self.overhead <= Self.maxPendingOut,
              beginRecord(length: content.count, crypto: crypto),
              content.withUnsafeBytes({ sealMore($0.baseAddress!, $0.count, crypto: crypto) }),
              let length = finishRecord(type: type, crypto: crypto) else { return false }
        appendPending(crypto.record.baseAddress!, length)
        return true
    }

    /// Whether sealed bytes wait for the socket.
    var hasPendingOut: Bool { outEnd > outStart }
    var pendingOutBytes: Int { outEnd - outStart }

    /// Keeps sealed bytes the socket did not take, behind any already waiting.
    func appendPending(_ bytes: UnsafeRawPointer, _ count: Int) {
        if outStart == outEnd { outStart = 0; outEnd = 0 }
        if outEnd + count > outCapacity {
            let live = outEnd - outStart
            let capacity = max(live + count, Self.maxRecord)
            let bigger = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 16)
            if let old = outPending {
                if live > 0 { bigger.copyMemory(from: old + outStart, byteCount: live) }
                old.deallocate()
            }
            outPending = bigger
            outCapacity = capacity
            outStart = 0
            outEnd = live
        }
        (outPending! + outEnd).copyMemory(from: bytes, byteCount: count)
        outEnd += count
    }

    /// Sends what is pending. `.processed(true)` when nothing is left (the buffer is freed), `.processed(false)` when
    /// the socket is full.
    func sendPending(fd: Int32) throws(SyscallError) -> Bool {
        while let pending = outPending, outEnd > outStart {
            let result = try syscall("send") { Glibc.send(fd, pending + outStart, outEnd - outStart, Int32(MSG_NOSIGNAL)) }
            guard case .processed(let n) = result, n > 0 else { return false }
            outStart += n
        }
        outPending?.deallocate()
        outPending = nil
        outStart = 0
        outEnd = 0
        outCapacity = 0
        return true
    }

    /// A graceful close: close_notify behind what is pending, then one attempt to send it all (a full socket loses
    /// it, as the WebSocket close already said goodbye).
    func sendCloseNotify(fd: Int32, crypto: TLSRecordCrypto) {
        guard queueRecord(type: 21, [1, 0], crypto: crypto) else { return }
        _ = try? sendPending(fd: fd)
    }

    /// A fatal alert for a protocol error of the peer's, sent only if no record is half-sent (its bytes would cut
    /// into that record) and the socket takes it at once.
    private func sendFatalAlert(_ description: UInt8, fd: Int32, crypto: TLSRecordCrypto) {
        guard !hasPendingOut, queueRecord(type: 21, [2, description], crypto: crypto) else { return }
        _ = try? sendPending(fd: fd)
    }

    // MARK: Reading

    /// Reads from the socket and opens every whole record into `destination` (at least `maxRecord` bytes of room):
    /// `.processed(n)` with n > 0 plaintext bytes, `.processed(0)` at the peer's close_notify or EOF, `.wouldBlock`
    /// when the socket has nothing more. Throws (after a fatal alert where one is due) when the peer breaks TLS.
    func read(fd: Int32, into destination: UnsafeMutableRawPointer, room: Int, crypto: TLSRecordCrypto) throws(SyscallError) -> IOResult<Int> {
        guard !peerClosed else { return .processed(0) }
        guard room >= Self.maxRecord else { throw SyscallError(call: "TLS read", code: ENOBUFS) }
        let input = crypto.input.baseAddress!
        var produced = 0
        while true {
            var have = 0
            if let spill = inSpill, inCount > 0 {
                input.copyMemory(from: spill, byteCount: inCount)
                have = inCount
                inCount = 0
            }
            // Plaintext never outgrows its ciphertext: with at most `room - produced` bytes of input, all fits.
            let limit = min(crypto.input.count, room - produced)
            var eof = false
            var drained = false
            if have < limit {
                switch try syscall("read", { Glibc.read(fd, input + have, limit - have) }) {
                case .processed(0): eof = true
                case .processed(let n): have += n
                case .wouldBlock: drained = true
                }
            }
            var at = 0
            do throws(RecordError) {
                while have - at >= 5 && !peerClosed {
                    let length = Int(input.load(fromByteOffset: at + 3, as: UInt8.self)) << 8
                        | Int(input.load(fromByteOffset: at + 4, as: UInt8.self))
                    guard input.load(fromByteOffset: at, as: UInt8.self) == 23 else { throw RecordError.alert(10) }  // unexpected_message
                    guard input.load(fromByteOffset: at + 1, as: UInt8.self) == 3 else { throw RecordError.alert(50) }  // decode_error
                    guard length <= Self.maxCiphertext else { throw RecordError.alert(22) }  // record_overflow
                    guard length > 16 else { throw RecordError.alert(50) }
                    guard length - 16 <= Self.maxInnerPlaintext else { throw RecordError.alert(22) }
                    guard have - at >= 5 + length else { break }
                    produced += try open(input + at, length: length, into: destination + produced, crypto: crypto, fd: fd)
                    at += 5 + length
                }
            } catch {
                if case .alert(let description) = error { sendFatalAlert(description, fd: fd, crypto: crypto) }
                if case .peerAlert = error { throw SyscallError(call: "TLS (peer's alert)", code: ECONNRESET) }
                throw SyscallError(call: "TLS record", code: EPROTO)
            }
            if have > at && !peerClosed { keepIncomplete(input + at, have - at) } else { releaseSpill() }
            if produced > 0 { return .processed(produced) }  // an EOF after them is read again next time
            if peerClosed || eof { return .processed(0) }
            if drained { return .wouldBlock }
            // Bytes came but no plaintext yet (part of a record, or only a KeyUpdate): read on.
        }
    }

    private enum RecordError: Error {
        /// We fail the connection, sending this alert (RFC 8446 §6.2).
        case alert(UInt8)
        /// The peer sent a fatal alert.
        case peerAlert
    }

    /// Opens one record (the header at `record`) and handles its content; returns the application bytes it added.
    private func open(_ record: UnsafeMutableRawPointer, length: Int, into out: UnsafeMutableRawPointer,
                      crypto: TLSRecordCrypto, fd: Int32) throws(RecordError) -> Int {
        guard let ctx = crypto.openContext(suite) else { throw .alert(80) }  // internal_error
        nonce(base: Self.readBase, seq: readSeq, into: crypto.nonce)
        let body = length - 16
        guard hub_aead_start(ctx, key(Self.readBase).assumingMemoryBound(to: UInt8.self),
                             crypto.nonce.assumingMemoryBound(to: UInt8.self), record.assumingMemoryBound(to: UInt8.self)) == 1,
              hub_aead_update(ctx, out.assumingMemoryBound(to: UInt8.self), (record + 5).assumingMemoryBound(to: UInt8.self), Int32(body)) == 1,
              hub_aead_open_finish(ctx, (record + 5 + body).assumingMemoryBound(to: UInt8.self)) == 1 else {
            throw .alert(20)  // bad_record_mac
        }
        readSeq &+= 1
        // The content type is the last non-zero byte; zeros after it are padding (RFC 8446 §5.4).
        var end = body
        while end > 0 && out.load(fromByteOffset: end - 1, as: UInt8.self) == 0 { end -= 1 }
        guard end > 0 else { throw .alert(10) }
        let content = end - 1
        switch out.load(fromByteOffset: content, as: UInt8.self) {
        case 23:
            keyUpdateCredit = min(Self.maxKeyUpdateCredit, keyUpdateCredit + content)
            return content
        case 21:
            guard content == 2 else { throw .alert(50) }
            switch out.load(fromByteOffset: 1, as: UInt8.self) {
            case 0: peerClosed = true  // close_notify
            case 90: break  // user_canceled: a close_notify follows
            case let description:
                alertReceived = description
                throw .peerAlert
            }
            return 0
        case 22:
            try handshakeMessages(out, content, crypto: crypto)
            return 0
        default:
            throw .alert(10)
        }
    }

    /// Post-handshake messages: only KeyUpdate is allowed from a client here (no tickets from clients, no
    /// post-handshake authentication offered), whole, at the end of its record (RFC 8446 §5.1: a message before a
    /// key change ends its record), within the budget (`keyUpdateBurst`).
    private func handshakeMessages(_ bytes: UnsafeMutableRawPointer, _ count: Int, crypto: TLSRecordCrypto) throws(RecordError) {
        var at = 0
        while at < count {
            guard count - at >= 4 else { throw .alert(50) }
            let type = bytes.load(fromByteOffset: at, as: UInt8.self)
            let length = Int(bytes.load(fromByteOffset: at + 1, as: UInt8.self)) << 16
                | Int(bytes.load(fromByteOffset: at + 2, as: UInt8.self)) << 8 | Int(bytes.load(fromByteOffset: at + 3, as: UInt8.self))
            guard type == 24 else { throw .alert(10) }  // KeyUpdate only
            guard length == 1, count - at >= 5 else { throw .alert(50) }
            let requested = bytes.load(fromByteOffset: at + 4, as: UInt8.self)
            guard requested <= 1 else { throw .alert(47) }  // illegal_parameter
            guard at + 5 == count else { throw .alert(10) }  // unexpected_message: more after a key change
            guard keyUpdateCredit >= Self.keyUpdateBytes else { throw .alert(10) }  // as BoringSSL's too-many-key-updates
            keyUpdateCredit -= Self.keyUpdateBytes
            guard updateSecret(base: Self.readBase) else { throw .alert(80) }
            readSeq = 0
            keyUpdatesReceived += 1
            if requested == 1 {
                // Answer under the current write keys, then switch them (RFC 8446 §4.6.3).
                guard queueRecord(type: 22, [24, 0, 0, 1, 0], crypto: crypto) else { throw .alert(80) }
                guard updateSecret(base: Self.writeBase) else { throw .alert(80) }
                writeSeq = 0
            }
            at += 5
        }
    }

    /// This side sent a KeyUpdate (a test's client does): its write keys move on.
    func keyUpdateSent() -> Bool {
        guard updateSecret(base: Self.writeBase) else { return false }
        writeSeq = 0
        return true
    }

    private func keepIncomplete(_ bytes: UnsafeRawPointer, _ count: Int) {
        if inSpill == nil { inSpill = .allocate(byteCount: Self.maxRecord, alignment: 16) }
        inSpill!.copyMemory(from: bytes, byteCount: count)
        inCount = count
    }

    private func releaseSpill() {
        inSpill?.deallocate()
        inSpill = nil
        inCount = 0
    }
}

/// A loop's TLS record scratch: cipher contexts re-keyed per record (one per suite and direction, made on first
/// use), the buffer ciphertext is read into, the one a record is sealed into, and the nonce. Loop thread only.
final class TLSRecordCrypto {
    private var seal: [OpaquePointer?] = [nil, nil, nil]
    private var opening: [OpaquePointer?] = [nil, nil, nil]
    /// Ciphertext read from a socket: several records per `read`.
    let input: UnsafeMutableRawBufferPointer
    /// One sealed record.
    let record: UnsafeMutableRawBufferPointer
    /// Bytes of `record` sealed so far.
    var sealed = 0
    let nonce: UnsafeMutableRawPointer

    /// `recordCapacity` above the default only for a test that seals oversized records as a misbehaving peer.
    init(recordCapacity: Int = TLSRecordLayer.maxPlaintext + TLSRecordLayer.overhead) {
        input = .allocate(byteCount: 64 * 1024, alignment: 16)
        record = .allocate(byteCount: recordCapacity, alignment: 16)
        nonce = .allocate(byteCount: 16, alignment: 16)
    }

    deinit {
        for ctx in seal + opening { if let ctx { EVP_CIPHER_CTX_free(ctx) } }
        input.deallocate()
        record.deallocate()
        nonce.deallocate()
    }

    func sealContext(_ suite: TLSRecordLayer.Suite) -> OpaquePointer? { context(&seal, suite, encrypt: 1) }
    func openContext(_ suite: TLSRecordLayer.Suite) -> OpaquePointer? { context(&opening, suite, encrypt: 0) }

    private func context(_ table: inout [OpaquePointer?], _ suite: TLSRecordLayer.Suite, encrypt: Int32) -> OpaquePointer? {
        let i = Int(suite.rawValue)
        if let ctx = table[i] { return ctx }
        let ctx = hub_aead_context_new(suite.rawValue, encrypt)
        table[i] = ctx
        return ctx
    }
}
