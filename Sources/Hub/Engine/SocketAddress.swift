import Glibc

/// An IPv4 or IPv6 socket address, parsed from the operator's "HOST:PORT" spelling.
///
/// Accepted: "127.0.0.1:8080", "0.0.0.0:80", ":8080" / "*:8080" (all IPv4 interfaces),
/// "[::1]:8080", "[::]:8080", "localhost:8080" (127.0.0.1). No DNS: a hub binds literal addresses.
public struct SocketAddress: @unchecked Sendable, CustomStringConvertible {
    // sockaddr_storage is plain bytes; @unchecked only because the C import isn't marked Sendable.
    private var storage = sockaddr_storage()
    public private(set) var length: socklen_t = 0

    public var family: Int32 { Int32(storage.ss_family) }

    /// Parses "HOST:PORT".
    public init(parsing text: String) throws(EngineError) {
        var host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                throw EngineError("bad address \"\(text)\": expected [IPv6]:PORT")
            }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":") else { throw EngineError("bad address \"\(text)\": expected HOST:PORT") }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        }
        guard let port = UInt16(portText) else { throw EngineError("bad port in \"\(text)\"") }
        if host.isEmpty || host == "*" { host = "0.0.0.0" }
        if host == "localhost" { host = "127.0.0.1" }
        var v4 = in_addr()
        var v6 = in6_addr()
        if inet_pton(AF_INET, String(host), &v4) == 1 {
            var sin = sockaddr_in()
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = port.bigEndian
            sin.sin_addr = v4
            self.init(raw: sin)
        } else if inet_pton(AF_INET6, String(host), &v6) == 1 {
            var sin6 = sockaddr_in6()
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            sin6.sin6_addr = v6
            self.init(raw: sin6)
        } else {
            throw EngineError("bad host in \"\(text)\": expected an IPv4/IPv6 literal or localhost")
        }
    }

    private init<T>(raw: T) {
        withUnsafeMutableBytes(of: &storage) { dst in
            withUnsafeBytes(of: raw) { dst.copyMemory(from: $0) }
        }
        length = socklen_t(MemoryLayout<T>.size)
    }

    /// Wraps what `accept4`/`getsockname` filled in.
    init(storage: sockaddr_storage, length: socklen_t) {
        self.storage = storage
        self.length = length
    }

    /// The port (host byte order); 0 for non-IP families.
    public var port: Int {
        get {
            withUnsafeBytes(of: storage) { raw in
                switch family {
                case AF_INET, AF_INET6: Int(UInt16(bigEndian: raw.loadUnaligned(fromByteOffset: 2, as: UInt16.self)))
                default: 0
                }
            }
        }
        set {
            withUnsafeMutableBytes(of: &storage) { raw in
                raw.storeBytes(of: UInt16(truncatingIfNeeded: newValue).bigEndian, toByteOffset: 2, as: UInt16.self)
            }
        }
    }

    func withSockAddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws -> R) rethrows -> R {
        try withUnsafeBytes(of: storage) { raw in
            try body(raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), length)
        }
    }

    /// "ip:port" or "[v6]:port" ("unix" for Unix sockets).
    public var description: String {
        withUnsafeBytes(of: storage) { raw -> String in
            switch family {
            case AF_INET:
                // Written digit by digit (every accepted connection names its peer), at a tenth of the cost of
                // `inet_ntop` and string interpolation. Same text as `inet_ntop`.
                // Written in a stack buffer first: a String made with a capacity over 15 bytes keeps a heap buffer
                // even when the text is short ("127.0.0.2:54321" fits a small string: no allocation per connection).
                let port = self.port
                return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 21) { out in
                    var n = 0
                    func decimal(_ value: Int) {
                        if value >= 10_000 { out[n] = UInt8(truncatingIfNeeded: 0x30 + value / 10_000); n += 1 }
                        if value >= 1_000 { out[n] = UInt8(truncatingIfNeeded: 0x30 + value / 1_000 % 10); n += 1 }
                        if value >= 100 { out[n] = UInt8(truncatingIfNeeded: 0x30 + value / 100 % 10); n += 1 }
                        if value >= 10 { out[n] = UInt8(truncatingIfNeeded: 0x30 + value / 10 % 10); n += 1 }
                        out[n] = UInt8(truncatingIfNeeded: 0x30 + value % 10)
                        n += 1
                    }
                    for k in 0..<4 {
                        if k > 0 { out[n] = UInt8(ascii: "."); n += 1 }
                        decimal(Int(raw[4 + k]))
                    }
                    out[n] = UInt8(ascii: ":")
                    n += 1
                    decimal(port)  // 0...65535: at most 21 bytes in all
                    return String(decoding: UnsafeBufferPointer(rebasing: out[..<n]), as: UTF8.self)
                }
            case AF_INET6:
                var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
                var a = raw.loadUnaligned(fromByteOffset: 8, as: in6_addr.self)
                inet_ntop(AF_INET6, &a, &text, socklen_t(text.count))
                return "[\(text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) })]:\(port)"
            case AF_UNIX:
                return "unix"
            default:
                return "unknown"
            }
        }
    }

    /// A Unix socket path (`sun_path` holds at most 107 bytes and its NUL).
    public init(unixPath path: String) throws(EngineError) {
        var sun = sockaddr_un()
        sun.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        let fits = withUnsafeMutableBytes(of: &sun.sun_path) { raw -> Bool in
            guard !bytes.isEmpty, bytes.count < raw.count else { return false }
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
            return true
        }
        guard fits else { throw EngineError("unix socket path empty or too long (max 107 bytes): \(path)") }
        self.init(raw: sun)
    }

    /// A non-blocking, cloexec socket whose connect has been started (done, or EINPROGRESS: the engine sees the
    /// outcome as writable or as an error once the fd is adopted); TCP_NODELAY for IP. For clients on the loop,
    /// which must not block on a connect.
    public func startConnect() throws(SyscallError) -> Int32 {
        let fd = try syscallBlocking("socket") { socket(family, Int32(SOCK_STREAM.rawValue) | LinuxSyscalls.CLOEXEC | LinuxSyscalls.NONBLOCK, 0) }
        let rc = withSockAddr { Glibc.connect(fd, $0, $1) }
        if rc != 0 && errno != EINPROGRESS {
            let code = errno
            closeFD(fd)
            throw SyscallError(call: "connect", code: code)
        }
        if family != AF_UNIX { Socket.setNoDelay(fd) }
        return fd
    }

    /// Opens a TCP connection (blocking connect, then non-blocking, cloexec, TCP_NODELAY) for
    /// clients such as the load generator; adopt the fd with `Connection(adopting:on:peer:handler:)`.
    public func connect() throws(SyscallError) -> Int32 {
        let fd = try syscallBlocking("socket") { socket(family, Int32(SOCK_STREAM.rawValue) | LinuxSyscalls.CLOEXEC, 0) }
        do {
            _ = try syscallBlocking("connect") { withSockAddr { Glibc.connect(fd, $0, $1) } }
            try Socket.setNonBlocking(fd)
            Socket.setNoDelay(fd)
        } catch {
            closeFD(fd)
            throw error
        }
        return fd
    }
}
