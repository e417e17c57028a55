#if canImport(Glibc)
import COpenSSL
import Glibc
import Foundation
import Synchronization
import WSProtocol

/// A WebSocket over a TCP socket, `ws://` or `wss://` (TLS through OpenSSL), made with WSProtocol's client handshake
/// and codec: a thread of its own reads and decodes (answering pings), sends are masked frames written under a lock.
/// This is the transport for Linux servers and the tests; on Apple platforms `URLSessionTransport` is the default.
///
/// `wss://` verifies the hub's certificate against the system's trust store, or against `TLSOptions.caFile`, and
/// checks that it names the URL's host (a DNS name, or an IP literal against the certificate's IP addresses); TLS 1.2
/// at least. A certificate that does not verify is a connect failure like a refused connection (retried with
/// backoff: a captive portal, a clock, a certificate being renewed), not a configuration error.
///
/// One `SSL` object must never be used by two threads at once: every OpenSSL call on it is made under `state`'s lock.
/// After the handshake the socket is non-blocking; the reader waits in `poll` without the lock, then decrypts what
/// arrived under it, so a send is never held up behind a reader waiting for the hub.
public final class POSIXTransport: HubTransport {
    /// How `wss://` connections trust the hub.
    public struct TLSOptions: Sendable {
        /// A PEM file of the certificate authorities to trust instead of the system's store (a private CA, tests).
        public var caFile: String?
        public init(caFile: String? = nil) { self.caFile = caFile }
    }

    private struct State {
        var fd: Int32 = -1
        var closed = false
        var closeSent = false
        /// The socket a connect is working on (before `fd` is set): `close` and `abort` cut it, so no connect thread
        /// and no descriptor outlives them.
        var connecting: Int32 = -1
        /// The TLS session of a `wss://` connection; released with the descriptor, by whoever closes it.
        var tls: TLSSession?
    }
    private let state = Mutex(State())
    /// Set by `abort()`: a TLS send waiting for room in the socket gives up (it holds the lock `abort` needs).
    private let aborted = Atomic<Bool>(false)
    /// Messages read and not yet received: bounded, so an app that falls behind stops this transport's reading.
    private let inbox: Inbox
    /// The longest message accepted from the hub.
    let maxMessageBytes: Int
    let connectTimeout: Double
    /// How long `close` waits for the hub's answer before it cuts the socket.
    let closeTimeout: Duration
    let tls: TLSOptions

    /// - Parameter maxQueuedMessages: messages read ahead of `receive()`; when as many wait, the reader stops
    ///   reading from the socket until one is taken (the hub then sees its queue grow: 4008 if it stays so).
    public init(maxMessageBytes: Int = 1 << 20, connectTimeout: Double = 10, closeTimeout: Duration = .seconds(2),
                tls: TLSOptions = TLSOptions(), maxQueuedMessages: Int = 256) {
        inbox = Inbox(limit: maxQueuedMessages)
        self.maxMessageBytes = maxMessageBytes
        self.connectTimeout = connectTimeout
        self.closeTimeout = closeTimeout
        self.tls = tls
    }

    deinit {
        let fd = state.withLock { s -> Int32 in
            defer { s.fd = -1 }
            return s.fd
        }
        if fd >= 0 { _ = Glibc.close(fd) }
    }

    public func connect(url: URL, protocols: [String]) async throws {
        let secure: Bool
        switch url.scheme {
        case "ws": secure = false
        case "wss": secure = true
        default: throw HubTransportError("POSIXTransport speaks ws:// and wss:// only: \(url)", isConfigurationError: true)
        }
        guard let host = url.host, !host.isEmpty else { throw HubTransportError("no host in \(url)", isConfigurationError: true) }
        let port = url.port ?? (secure ? 443 : 80)
        let path = (url.path.isEmpty ? "/" : url.path) + (url.query.map { "?" + $0 } ?? "")
        let timeout = connectTimeout
        let options = secure ? tls : nil
        // The blocking connect and handshake run off the cooperative pool.
        let (fd, leftover, session) = try await withCheckedThrowingContinuation {
            (done: CheckedContinuation<(Int32, [UInt8], TLSSession?), any Error>) in
            Thread.detachNewThread {
                done.resume(with: Result {
                    try Self.open(host: host, port: port, path: path, protocols: protocols, timeout: timeout, tls: options, owner: self)
                })
            }
        }
        let stillOpen = state.withLock { s -> Bool in
            if s.connecting == fd { s.connecting = -1 }
            guard !s.closed else { return false }
            s.fd = fd
            s.tls = session
            return true
        }
        guard stillOpen else {
            _ = Glibc.close(fd)
            throw HubTransportError("closed while connecting")
        }
        let thread = Thread { [self] in readLoop(fd: fd, leftover: leftover, tls: session) }
        thread.name = "HubClient reader"
        thread.start()
    }

    public func send(text: String) async throws {
        try write(FrameEncoder.clientFrame(opcode: .text, payload: Array(text.utf8)))
    }

    public func receive() async -> HubTransportMessage {
        // One consumer (HubClient's receive loop), one element at a time.
        await inbox.take()
    }

    /// Sends the close frame and returns once the connection has ended: the hub answers and closes TCP, or after
    /// `closeTimeout` (a hub that does not answer) the socket is cut, so the reader thread and the descriptor never
    /// outlive this call.
    public func close(code: UInt16, reason: String) async {
        let payload = closePayload(code: CloseCode(code), reason: reason)
        let shouldSend = state.withLock { s -> Bool in
            defer { s.closeSent = true }
            return !s.closeSent && s.fd >= 0
        }
        if shouldSend { try? write(FrameEncoder.clientFrame(opcode: .close, payload: payload)) }
        let fd = state.withLock { s -> Int32 in
            if s.fd < 0 { cutConnect(&s) }
            return s.fd
        }
        guard fd >= 0 else { return finish(code: code, reason: reason) }
        _ = shutdown(fd, Int32(SHUT_WR))
        let deadline = ContinuousClock.now + closeTimeout
        while !isFinished, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(10)) }
        if !isFinished {
            abort()  // the blocked read returns; the reader closes the descriptor and finishes
            let cut = ContinuousClock.now + .seconds(1)
            while !isFinished, ContinuousClock.now < cut { try? await Task.sleep(for: .milliseconds(5)) }
        }
    }

    /// The reader has ended and the descriptor is closed.
    var isFinished: Bool { state.withLock { $0.closed && $0.fd < 0 } }



    /// Cuts the TCP connection without a close frame (tests: a network that drops).
    public func abort() {
        aborted.store(true, ordering: .relaxed)
        inbox.discard()  // a reader waiting for room goes on (and ends: the socket is shut down)
        let fd = state.withLock { s -> Int32 in
            cutConnect(&s)
            return s.fd
        }
        if fd >= 0 { _ = shutdown(fd, Int32(SHUT_RDWR)) }
    }

    /// A connect in progress: its blocked connect, handshake or read returns at once and closes its socket. Under
    /// the lock, as `closeConnecting`, so the number is still that socket's.
    private func cutConnect(_ s: inout State) {
        if s.connecting >= 0 { _ = shutdown(s.connecting, Int32(SHUT_RDWR)) }
    }

    /// Records the socket a connect works on; false once the transport is closed (the connect gives up).
    fileprivate func startConnecting(_ fd: Int32) -> Bool {
        state.withLock { s -> Bool in
            guard !s.closed else { return false }
            s.connecting = fd
            return true
        }
    }

    /// Closes a socket the connect gave up on, under the lock `cutConnect` uses.
    fileprivate func closeConnecting(_ fd: Int32) {
        state.withLock { s in
            if s.connecting == fd { s.connecting = -1 }
            _ = Glibc.close(fd)
        }
    }

    // MARK: Socket work (blocking, off the cooperative pool)

    private func write(_ bytes: [UInt8]) throws {
        try state.withLock { s in
            guard s.fd >= 0, !s.closed else { throw HubTransportError("not connected") }
            if let session = s.tls { return try writeTLS(session, fd: s.fd, bytes) }
            var offset = 0
            while offset < bytes.count {
                let n = bytes.withUnsafeBytes { Glibc.send(s.fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
                if n < 0 {
                    if errno == EINTR { continue }
                    throw HubTransportError("send failed: \(String(cString: strerror(errno)))")
                }
                offset += n
            }
        }
    }

    /// `SSL_write` on the non-blocking socket, under the caller's lock. A full socket is waited for in short polls, for
    /// at most `connectTimeout` (as a plain socket's send timeout) and not after `abort()`.
    private func writeTLS(_ session: TLSSession, fd: Int32, _ bytes: [UInt8]) throws {
        let deadline = ContinuousClock.now + .seconds(connectTimeout)
        try bytes.withUnsafeBytes { raw in
            guard let base = raw.baseAddress else { return }
            var offset = 0
            while offset < raw.count {
                var written = 0
                ERR_clear_error()
                let ok = SSL_write_ex(session.ssl, base + offset, raw.count - offset, &written)
                if ok == 1 {
                    offset += written
                    continue
                }
                let events: Int32
                switch SSL_get_error(session.ssl, ok) {
                case SSL_ERROR_WANT_WRITE: events = POLLOUT
                case SSL_ERROR_WANT_READ: events = POLLIN
                default: throw HubTransportError("send failed: \(Self.openSSLErrors())")
                }
                guard !aborted.load(ordering: .relaxed) else { throw HubTransportError("send failed: the connection was cut") }
                guard ContinuousClock.now < deadline else { throw HubTransportError("send failed: timed out") }
                var p = pollfd(fd: fd, events: Int16(events), revents: 0)
                _ = poll(&p, 1, 100)
            }
        }
    }

    private func finish(code: UInt16, reason: String) {
        let first = state.withLock { s -> Bool in
            defer { s.closed = true }
            return !s.closed
        }
        if first { inbox.end(.closed(code: code, reason: reason)) }
    }

    private func readLoop(fd: Int32, leftover: [UInt8], tls session: TLSSession?) {
        var reader = MessageReader(configuration: MessageReaderConfiguration(role: .client, maxFrameSize: maxMessageBytes,
                                                                             maxMessageSize: maxMessageBytes))
        var pending = leftover
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var closeCode: UInt16 = 1006
        var closeReason = ""
        var done = false
        var ended = false
        while !done {
            if !pending.isEmpty {
                do {
                    let consumed = try pending.withUnsafeMutableBytes { bytes in
                        try reader.read(bytes) { message in
                            switch message {
                            case .text(let payload):
                                inbox.put(.text(String(decoding: payload, as: UTF8.self)))
                            case .binary:
                                break  // the hub's protocol is text
                            case .ping(let payload):
                                try? write(FrameEncoder.clientFrame(opcode: .pong, payload: Array(payload)))
                            case .pong:
                                break
                            case .close(let code, let reason):
                                closeCode = code ?? 1005
                                closeReason = String(decoding: reason, as: UTF8.self)
                                done = true
                                return .stop
                            }
                            return .continue
                        }
                    }
                    pending.removeFirst(min(consumed, pending.count))
                } catch {
                    closeCode = 1002
                    closeReason = "\(error)"
                    done = true
                }
                if done { break }
            }
            if ended { break }
            if let session {
                ended = !readTLS(session, fd: fd, buffer: &buffer, into: &pending)
                continue
            }
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            pending += buffer[0..<n]
        }
        if done && closeCode != 1006 {
            // Echo the hub's close (RFC 6455 §5.5.1) unless we sent ours first.
            let echo = state.withLock { s -> Bool in
                defer { s.closeSent = true }
                return !s.closeSent
            }
            if echo { try? write(FrameEncoder.clientFrame(opcode: .close, payload: closePayload(code: CloseCode(closeCode), reason: ""))) }
        }
        let fdToClose = state.withLock { s -> Int32 in
            defer {
                s.fd = -1
                s.tls = nil  // no send can reach the session now; it is freed with the last reference
            }
            return s.fd
        }
        if fdToClose >= 0 { _ = Glibc.close(fdToClose) }
        finish(code: closeCode, reason: closeReason)
    }

    /// Waits for the hub (in `poll`, without the lock) and appends what it sent to `pending`; false once the
    /// connection has ended (`pending` may still have grown). OpenSSL is asked under the lock until it wants the
    /// socket again, so nothing it has buffered (`SSL_pending`, read-ahead) waits for a poll that would not wake; at
    /// most 256 KiB at a time, so a flood does not hold the lock from senders.
    private func readTLS(_ session: TLSSession, fd: Int32, buffer: inout [UInt8], into pending: inout [UInt8]) -> Bool {
        enum Step { case data, end, wait(Int32) }
        while true {
            let step = state.withLock { _ -> Step in
                var taken = 0
                while taken < 256 * 1024 {
                    var n = 0
                    ERR_clear_error()
                    let ok = buffer.withUnsafeMutableBytes { SSL_read_ex(session.ssl, $0.baseAddress, $0.count, &n) }
                    if ok == 1 {
                        pending += buffer[0..<min(n, buffer.count)]
                        taken += n
                        continue
                    }
                    let got = taken > 0
                    switch SSL_get_error(session.ssl, ok) {
                    case SSL_ERROR_WANT_READ: return got ? .data : .wait(POLLIN)
                    case SSL_ERROR_WANT_WRITE: return got ? .data : .wait(POLLOUT)
                    default: return .end  // close_notify, EOF (abort's shutdown included), a reset, a TLS error
                    }
                }
                return .data
            }
            switch step {
            case .data: return true
            case .end: return false
            case .wait(let events):
                var p = pollfd(fd: fd, events: Int16(events), revents: 0)
                if poll(&p, 1, -1) < 0 && errno != EINTR { return false }
            }
        }
    }

    /// Connects (with a timeout), makes the TLS handshake when `tls` is set (`wss://`), and performs the opening
    /// handshake; returns the socket, bytes read past the 101, and the TLS session.
    private static func open(host: String, port: Int, path: String, protocols: [String], timeout: Double,
                             tls: TLSOptions?, owner: POSIXTransport) throws -> (Int32, [UInt8], TLSSession?) {
        let context = try tls.map { try TLSContext(caFile: $0.caFile) }
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(host, String(port), &hints, &list)
        guard rc == 0, let first = list else {
            throw HubTransportError("cannot resolve \(host): \(String(cString: gai_strerror(rc)))")
        }
        defer { freeaddrinfo(list) }
        var lastError = "no address"
        var candidate: UnsafeMutablePointer<addrinfo>? = first
        while let ai = candidate {
            candidate = ai.pointee.ai_next
            let fd = socket(ai.pointee.ai_family, ai.pointee.ai_socktype | Int32(SOCK_CLOEXEC.rawValue), ai.pointee.ai_protocol)
            guard fd >= 0 else { continue }
            guard owner.startConnecting(fd) else {
                _ = Glibc.close(fd)
                throw HubTransportError("closed while connecting")
            }
            var tv = timeval(tv_sec: Int(timeout), tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if Glibc.connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) != 0 {
                lastError = String(cString: strerror(errno))
                owner.closeConnecting(fd)
                continue
            }
            do {
                guard let context else {
                    let leftover = try handshake(fd: fd, host: host, port: port, path: path, protocols: protocols)
                    // Reads block without a timeout from now on (the reader thread waits for the hub).
                    var none = timeval(tv_sec: 0, tv_usec: 0)
                    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, socklen_t(MemoryLayout<timeval>.size))
                    return (fd, leftover, nil)
                }
                // Until the session is returned, it frees itself (its deinit) on every throw below.
                let session = try TLSSession(context: context, fd: fd, host: host, port: port)
                let leftover = try secureHandshake(session, host: host, port: port, path: path, protocols: protocols)
                // From now on the socket is non-blocking: the reader polls for it without holding the lock.
                let flags = fcntl(fd, F_GETFL)
                guard flags >= 0, fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 else {
                    throw HubTransportError("cannot make the socket non-blocking: \(String(cString: strerror(errno)))")
                }
                return (fd, leftover, session)
            } catch {
                owner.closeConnecting(fd)
                throw error
            }
        }
        throw HubTransportError("cannot connect to \(host):\(port): \(lastError)")
    }

    /// The upgrade over TLS (the socket still blocking, with the connect timeout): Host is `host` on 443.
    private static func secureHandshake(_ session: TLSSession, host: String, port: Int, path: String, protocols: [String]) throws -> [UInt8] {
        let key = ClientHandshake.makeKey()
        let request = ClientHandshake.request(host: port == 443 ? host : "\(host):\(port)", path: path, key: key, subprotocols: protocols)
        try request.withUnsafeBytes { raw in
            guard let base = raw.baseAddress else { return }
            var offset = 0
            while offset < raw.count {
                var n = 0
                ERR_clear_error()
                guard SSL_write_ex(session.ssl, base + offset, raw.count - offset, &n) == 1 else {
                    throw HubTransportError("sending the upgrade request failed: \(openSSLErrors())")
                }
                offset += n
            }
        }
        var parser = HTTPResponseParser()
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            var n = 0
            ERR_clear_error()
            let ok = buffer.withUnsafeMutableBytes { SSL_read_ex(session.ssl, $0.baseAddress, $0.count, &n) }
            guard ok == 1, n > 0 else {
                let closed = SSL_get_error(session.ssl, ok) == SSL_ERROR_ZERO_RETURN
                throw HubTransportError(closed ? "the hub closed during the handshake" : "no handshake response")
            }
            let chunk = Array(buffer[0..<min(n, buffer.count)])  // the parser is incremental: each read once
            let result = try chunk.withUnsafeBytes { try parser.parse($0) }
            guard case .complete(let head, let consumed) = result else { continue }
            guard head.status == 101 else {
                let body = String(decoding: chunk[min(consumed, chunk.count)...], as: UTF8.self)
                throw HubTransportError("the upgrade was refused: HTTP \(head.status) \(body)", httpStatus: head.status)
            }
            _ = try ClientHandshake.verify(head, key: key, offeredSubprotocols: protocols, deflate: nil)
            return Array(chunk[min(consumed, chunk.count)...])
        }
    }

    /// OpenSSL's error queue as one line (and cleared).
    static func openSSLErrors() -> String {
        var parts: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            parts.append(String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return parts.isEmpty ? "no detail from OpenSSL" : parts.joined(separator: "; ")
    }

    private static func handshake(fd: Int32, host: String, port: Int, path: String, protocols: [String]) throws -> [UInt8] {
        let key = ClientHandshake.makeKey()
        let request = ClientHandshake.request(host: "\(host):\(port)", path: path, key: key, subprotocols: protocols)
        var offset = 0
        while offset < request.count {
            let n = request.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw HubTransportError("sending the upgrade request failed: \(String(cString: strerror(errno)))") }
            offset += n
        }
        var parser = HTTPResponseParser()
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { throw HubTransportError(n == 0 ? "the hub closed during the handshake" : "no handshake response") }
            let chunk = Array(buffer[0..<n])  // the parser is incremental: each read once
            let result = try chunk.withUnsafeBytes { try parser.parse($0) }
            guard case .complete(let head, let consumed) = result else { continue }
            guard head.status == 101 else {
                let body = String(decoding: chunk[consumed...], as: UTF8.self)
                throw HubTransportError("the upgrade was refused: HTTP \(head.status) \(body)", httpStatus: head.status)
            }
            _ = try ClientHandshake.verify(head, key: key, offeredSubprotocols: protocols, deflate: nil)
            return Array(chunk[consumed...])
        }
    }
}

/// A client `SSL_CTX`: the trust (system store or a CA file), TLS 1.2 at least, peer verification. One per connect;
/// freed in deinit, once (the sessions made from it hold their own references).
private final class TLSContext {
    let ctx: OpaquePointer

    init(caFile: String?) throws {
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_client_method()) else {
            throw HubTransportError("SSL_CTX_new failed: \(POSIXTransport.openSSLErrors())")
        }
        self.ctx = ctx  // owned from here: deinit frees it on every throw below
        _ = hub_SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION)
        // Partial writes and a moving buffer: a send resumed after WANT_WRITE passes the rest of its bytes.
        _ = hub_SSL_CTX_set_mode(ctx, Int(SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
        // No renegotiation or compression; a TCP close without close_notify reads as EOF (WebSocket has its own close).
        _ = SSL_CTX_set_options(ctx, hub_SSL_OP_defaults())
        if let caFile {
            // A CA file that cannot be read is the app's setup, which no retry mends.
            guard access(caFile, R_OK) == 0 else {
                throw HubTransportError("cannot read the CA file \(caFile): \(String(cString: strerror(errno)))", isConfigurationError: true)
            }
            guard SSL_CTX_load_verify_locations(ctx, caFile, nil) == 1 else {
                throw HubTransportError("the CA file \(caFile) holds no usable PEM certificate: \(POSIXTransport.openSSLErrors())",
                                        isConfigurationError: true)
            }
        } else {
            guard SSL_CTX_set_default_verify_paths(ctx) == 1 else {
                throw HubTransportError("cannot load the system's trust store: \(POSIXTransport.openSSLErrors())", isConfigurationError: true)
            }
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        let alpn: [UInt8] = [8] + Array("http/1.1".utf8)
        _ = SSL_CTX_set_alpn_protos(ctx, alpn, UInt32(alpn.count))
    }

    deinit { SSL_CTX_free(ctx) }
}

/// One connection's `SSL`, reading and writing the socket through the package's MSG_NOSIGNAL BIO (a send to a reset
/// hub is EPIPE, never SIGPIPE). Freed in deinit, once, when its last reference goes: the reader thread's and the
/// transport's state's. It does not own the descriptor. Unchecked Sendable: the transport makes every call on `ssl`
/// under its lock (the handshake, before the session is shared, excepted).
private final class TLSSession: @unchecked Sendable {
    let ssl: OpaquePointer

    /// A session on `fd`, handshaken (the socket blocking, with the connect timeout), and verified for `host`.
    init(context: TLSContext, fd: Int32, host: String, port: Int) throws {
        ERR_clear_error()
        guard let ssl = SSL_new(context.ctx) else { throw HubTransportError("SSL_new failed: \(POSIXTransport.openSSLErrors())") }
        self.ssl = ssl  // owned from here: deinit frees it on every throw below
        guard let method = Self.bioMethod.value, let bio = hub_bio_new(method, fd) else {
            throw HubTransportError("cannot make the TLS socket BIO: \(POSIXTransport.openSSLErrors())")
        }
        SSL_set_bio(ssl, bio, bio)  // one BIO for both directions: SSL_free frees it once
        SSL_set_connect_state(ssl)
        let name = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        if Self.isIPLiteral(name) {
            // No SNI for an address (RFC 6066 §3); the certificate must list it as an IP address.
            guard X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1 else {
                throw HubTransportError("cannot verify the hub against the address \(name)", isConfigurationError: true)
            }
        } else {
            SSL_set_hostflags(ssl, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS))
            guard hub_SSL_set_tlsext_host_name(ssl, name) == 1, SSL_set1_host(ssl, name) == 1 else {
                throw HubTransportError("cannot verify the hub against the name \(name)", isConfigurationError: true)
            }
        }
        ERR_clear_error()
        let ok = SSL_connect(ssl)
        guard ok == 1 else {
            let verify = SSL_get_verify_result(ssl)
            if verify != Int(X509_V_OK) {
                // Not a configuration error: a captive portal or a certificate being renewed may be the cause.
                let why = X509_verify_cert_error_string(verify).map { String(cString: $0) } ?? "error \(verify)"
                throw HubTransportError("the hub's certificate did not verify for \(name): \(why) (\(POSIXTransport.openSSLErrors()))")
            }
            switch SSL_get_error(ssl, ok) {
            case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
                throw HubTransportError("the TLS handshake with \(host):\(port) timed out")
            default:
                throw HubTransportError("the TLS handshake with \(host):\(port) failed: \(POSIXTransport.openSSLErrors())")
            }
        }
    }

    deinit { SSL_free(ssl) }

    private static func isIPLiteral(_ name: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, name, &v4) == 1 || inet_pton(AF_INET6, name, &v6) == 1
    }

    private struct Method: @unchecked Sendable { let value: OpaquePointer? }
    /// The BIO method, made once per process and never freed (immutable once made).
    private static let bioMethod = Method(value: hub_bio_method_new())
}

/// The reader thread's queue to `receive()`: `put` blocks the reader while `limit` messages wait; the end
/// (`.closed`) comes after everything queued before it, and to every later `take`.
private final class Inbox: @unchecked Sendable {  // every field under `condition`
    private let condition = NSCondition()
    private var queue: [HubTransportMessage] = []
    private var head = 0
    private var last: HubTransportMessage?
    private var discarding = false
    private var waiting: CheckedContinuation<HubTransportMessage, Never>?
    private let limit: Int

    init(limit: Int) { self.limit = max(1, limit) }

    /// On the reader thread: waits while the queue is full (after `discard()`, or once ended, drops instead).
    func put(_ message: HubTransportMessage) {
        condition.lock()
        while queue.count - head >= limit && !discarding && last == nil { condition.wait() }
        guard !discarding, last == nil else { return condition.unlock() }
        if let waiting {
            self.waiting = nil
            condition.unlock()
            return waiting.resume(returning: message)
        }
        queue.append(message)
        condition.unlock()
    }

    /// The connection ended with `message`.
    func end(_ message: HubTransportMessage) {
        condition.lock()
        guard last == nil else { return condition.unlock() }
        last = message
        condition.broadcast()
        let waiter = head == queue.count ? waiting : nil
        if waiter != nil { waiting = nil }
        condition.unlock()
        waiter?.resume(returning: message)
    }

    /// Stops holding the reader back: what it reads from now on is dropped.
    func discard() {
        condition.lock()
        discarding = true
        condition.broadcast()
        condition.unlock()
    }

    func take() async -> HubTransportMessage {
        await withCheckedContinuation { (next: CheckedContinuation<HubTransportMessage, Never>) in
            condition.lock()
            if head < queue.count {
                let message = queue[head]
                head += 1
                if head > 64 && head * 2 > queue.count {
                    queue.removeFirst(head)
                    head = 0
                }
                condition.signal()
                condition.unlock()
                next.resume(returning: message)
            } else if let last {
                condition.unlock()
                next.resume(returning: last)
            } else {
                waiting = next
                condition.unlock()
            }
        }
    }
}
#endif
