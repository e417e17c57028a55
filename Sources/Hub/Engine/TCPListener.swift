import Glibc

/// One listening TCP socket per event loop, all bound to the same port with SO_REUSEPORT so the
/// kernel spreads incoming connections across loops (no accept thread, no fd hand-off).
///
/// Port 0 works: the first loop binds port 0 and learns the port, the others bind that port.
/// This handle is Sendable; the per-loop accept state lives on each loop.
public final class TCPListener: Sendable {
    /// The bound address (with the real port when 0 was asked for).
    public let address: SocketAddress
    public var port: Int { address.port }
    private let sockets: [(loop: EventLoop, fd: Int32)]

    private init(address: SocketAddress, sockets: [(loop: EventLoop, fd: Int32)]) {
        self.address = address
        self.sockets = sockets
    }

    /// Binds `address` ("HOST:PORT") on every loop of `group` and starts accepting.
    /// Call from outside the loops (it waits for each loop to register its socket).
    /// - Parameter makeDelegate: runs once on each loop thread; its result receives that loop's
    ///   accepted connections.
    public static func bind(_ address: String, on group: EventLoopGroup, backlog: Int32 = 1024,
                            makeDelegate: @escaping @Sendable (EventLoop) -> any ListenerDelegate) throws -> TCPListener {
        try bind(SocketAddress(parsing: address), on: group.loops, backlog: backlog, makeDelegate: makeDelegate)
    }

    /// Binds on an explicit list of loops.
    public static func bind(_ address: SocketAddress, on loops: [EventLoop], backlog: Int32 = 1024,
                            makeDelegate: @escaping @Sendable (EventLoop) -> any ListenerDelegate) throws -> TCPListener {
        precondition(!loops.isEmpty)
        var bound = address
        var fds: [Int32] = []
        if address.port != 0 { try ensurePortIsFree(address) }
        do {
            for _ in loops {
                let fd = try openListeningSocket(bound, backlog: backlog)
                fds.append(fd)
                if bound.port == 0 { bound = try localAddress(fd) }
            }
        } catch {
            for fd in fds { closeFD(fd) }
            throw error
        }
        var sockets: [(loop: EventLoop, fd: Int32)] = []
        for (loop, fd) in zip(loops, fds) {
            do {
                try loop.submitAndWait {
                    _ = try Listener(fd: fd, loop: loop, isTCP: true, delegate: makeDelegate(loop))
                }
                sockets.append((loop, fd))
            } catch {
                // Listener's init registered nothing on failure; close what is not yet owned.
                for (l, owned) in sockets { l.execute { (l.registered(fd: owned) as? Listener)?.close() } }
                for unowned in fds[sockets.count...] { closeFD(unowned) }
                throw error
            }
        }
        return TCPListener(address: bound, sockets: sockets)
    }

    private static func openListeningSocket(_ address: SocketAddress, backlog: Int32) throws(SyscallError) -> Int32 {
        let fd = try syscallBlocking("socket") {
            socket(address.family, Int32(SOCK_STREAM.rawValue) | LinuxSyscalls.CLOEXEC | LinuxSyscalls.NONBLOCK, 0)
        }
        do {
            try Socket.setFlag(fd, SOL_SOCKET, SO_REUSEADDR)
            try Socket.setFlag(fd, SOL_SOCKET, SO_REUSEPORT)
            _ = try syscallBlocking("bind") { address.withSockAddr { Glibc.bind(fd, $0, $1) } }
            _ = try syscallBlocking("listen") { listen(fd, backlog) }
        } catch {
            closeFD(fd)
            throw error
        }
        return fd
    }

    /// SO_REUSEPORT would let a second process of the same user bind the same port and silently take half of
    /// the connections. A plain bind (SO_REUSEADDR only) fails with EADDRINUSE while anyone listens there, so probe
    /// with one first and release it.
    private static func ensurePortIsFree(_ address: SocketAddress) throws(EngineError) {
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | LinuxSyscalls.CLOEXEC, 0)
        guard fd >= 0 else { return }  // the real bind below reports what is wrong
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let rc = address.withSockAddr { Glibc.bind(fd, $0, $1) }
        let code = errno
        closeFD(fd)
        if rc != 0 && code == EADDRINUSE {
            throw EngineError("address \(address) is already in use (is another hub or server running on it?)")
        }
    }

    private static func localAddress(_ fd: Int32) throws(SyscallError) -> SocketAddress {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = try syscallBlocking("getsockname") {
            withUnsafeMutableBytes(of: &storage) { getsockname(fd, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), &length) }
        }
        return SocketAddress(storage: storage, length: length)
    }

    /// Stops accepting on every loop and closes the sockets (established connections stay).
    /// Call from outside the loops.
    public func close() {
        for (loop, fd) in sockets {
            _ = try? loop.submitAndWait { (loop.registered(fd: fd) as? Listener)?.close() }
        }
    }

    /// Runs `body` on the listener of `loop` (tests use it to inject accept errors).
    func withListener(on loop: EventLoop, _ body: @escaping @Sendable (Listener) -> Void) {
        guard let fd = sockets.first(where: { $0.loop === loop })?.fd else { return }
        _ = try? loop.submitAndWait { if let l = loop.registered(fd: fd) as? Listener { body(l) } }
    }

    /// The process's descriptor limit (RLIMIT_NOFILE).
    public static func descriptorLimit() -> (soft: Int, hard: Int) {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        return (Int(clamping: limit.rlim_cur), Int(clamping: limit.rlim_max))
    }

    /// Raises the soft descriptor limit to the hard limit (call once at startup; a hub with 100k
    /// connections needs far more than the usual 1024). Returns the resulting limits.
    @discardableResult
    public static func raiseDescriptorLimit() -> (soft: Int, hard: Int) {
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return descriptorLimit()
    }
}
