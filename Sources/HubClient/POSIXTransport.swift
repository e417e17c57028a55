#if canImport(Glibc)
import Glibc
import Foundation
import Synchronization
import WSProtocol

/// A WebSocket over a plain TCP socket (`ws://`), made with WSProtocol's client handshake and codec: a thread of its
/// own reads and decodes (answering pings), sends are masked frames written under a lock. This is the transport
/// for Linux servers and the tests; `wss://` on Apple platforms goes through `URLSessionTransport`.
public final class POSIXTransport: HubTransport {
    private struct State {
        var fd: Int32 = -1
        var closed = false
        var closeSent = false
    }
    private let state = Mutex(State())
    private let messages: AsyncStream<HubTransportMessage>
    private let continuation: AsyncStream<HubTransportMessage>.Continuation
    /// The longest message accepted from the hub.
    let maxMessageBytes: Int
    let connectTimeout: Double
    /// How long `close` waits for the hub's answer before it cuts the socket.
    let closeTimeout: Duration

    public init(maxMessageBytes: Int = 1 << 20, connectTimeout: Double = 10, closeTimeout: Duration = .seconds(2)) {
        (messages, continuation) = AsyncStream.makeStream(of: HubTransportMessage.self)
        self.maxMessageBytes = maxMessageBytes
        self.connectTimeout = connectTimeout
        self.closeTimeout = closeTimeout
    }

    deinit {
        let fd = state.withLock { s -> Int32 in
            defer { s.fd = -1 }
            return s.fd
        }
        if fd >= 0 { _ = Glibc.close(fd) }
    }

    public func connect(url: URL, protocols: [String]) async throws {
        guard url.scheme == "ws" else {
            throw HubTransportError("POSIXTransport speaks ws:// only (use URLSessionTransport for wss://): \(url)", isConfigurationError: true)
        }
        guard let host = url.host, !host.isEmpty else { throw HubTransportError("no host in \(url)", isConfigurationError: true) }
        let port = url.port ?? 80
        let path = (url.path.isEmpty ? "/" : url.path) + (url.query.map { "?" + $0 } ?? "")
        let timeout = connectTimeout
        // The blocking connect and handshake run off the cooperative pool.
        let (fd, leftover) = try await withCheckedThrowingContinuation { (done: CheckedContinuation<(Int32, [UInt8]), any Error>) in
            Thread.detachNewThread {
                done.resume(with: Result { try Self.open(host: host, port: port, path: path, protocols: protocols, timeout: timeout) })
            }
        }
        let stillOpen = state.withLock { s -> Bool in
            guard !s.closed else { return false }
            s.fd = fd
            return true
        }
        guard stillOpen else {
            _ = Glibc.close(fd)
            throw HubTransportError("closed while connecting")
        }
        let thread = Thread { [self] in readLoop(fd: fd, leftover: leftover) }
        thread.name = "HubClient reader"
        thread.start()
    }

    public func send(text: String) async throws {
        try write(FrameEncoder.clientFrame(opcode: .text, payload: Array(text.utf8)))
    }

    public func receive() async -> HubTransportMessage {
        // One consumer (HubClient's receive loop), one element at a time.
        var it = messages.makeAsyncIterator()
        return await it.next() ?? .closed(code: 1006, reason: "")
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
        let fd = state.withLock { $0.fd }
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
        let fd = state.withLock { $0.fd }
        if fd >= 0 { _ = shutdown(fd, Int32(SHUT_RDWR)) }
    }

    // MARK: Socket work (blocking, off the cooperative pool)

    private func write(_ bytes: [UInt8]) throws {
        try state.withLock { s in
            guard s.fd >= 0, !s.closed else { throw HubTransportError("not connected") }
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

    private func finish(code: UInt16, reason: String) {
        let first = state.withLock { s -> Bool in
            defer { s.closed = true }
            return !s.closed
        }
        if first {
            continuation.yield(.closed(code: code, reason: reason))
            continuation.finish()
        }
    }

    private func readLoop(fd: Int32, leftover: [UInt8]) {
        var reader = MessageReader(configuration: MessageReaderConfiguration(role: .client, maxFrameSize: maxMessageBytes,
                                                                             maxMessageSize: maxMessageBytes))
        var pending = leftover
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var closeCode: UInt16 = 1006
        var closeReason = ""
        var done = false
        while !done {
            if !pending.isEmpty {
                do {
                    let consumed = try pending.withUnsafeMutableBytes { bytes in
                        try reader.read(bytes) { message in
                            switch message {
                            case .text(let payload):
                                continuation.yield(.text(String(decoding: payload, as: UTF8.self)))
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
            defer { s.fd = -1 }
            return s.fd
        }
        if fdToClose >= 0 { _ = Glibc.close(fdToClose) }
        finish(code: closeCode, reason: closeReason)
    }

    /// Connects (with a timeout) and performs the opening handshake; returns the socket and bytes read past the 101.
    private static func open(host: String, port: Int, path: String, protocols: [String], timeout: Double) throws -> (Int32, [UInt8]) {
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
            var tv = timeval(tv_sec: Int(timeout), tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if Glibc.connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) != 0 {
                lastError = String(cString: strerror(errno))
                _ = Glibc.close(fd)
                continue
            }
            do {
                let leftover = try handshake(fd: fd, host: host, port: port, path: path, protocols: protocols)
                // Reads block without a timeout from now on (the reader thread waits for the hub).
                var none = timeval(tv_sec: 0, tv_usec: 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, socklen_t(MemoryLayout<timeval>.size))
                return (fd, leftover)
            } catch {
                _ = Glibc.close(fd)
                throw error
            }
        }
        throw HubTransportError("cannot connect to \(host):\(port): \(lastError)")
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
#endif
