import Glibc
import Synchronization

/// One listening TCP socket, shared by every event loop.
///
/// Ownership of the address is atomic: the socket is bound without SO_REUSEPORT, so the kernel grants the address
/// to one listening socket only, and a second server's `bind` or `listen` fails with EADDRINUSE however close
/// together the two start (with one socket per loop and SO_REUSEPORT, two processes of the same user could both
/// bind and the kernel would split connections between them). SO_REUSEADDR stays, so a restart is not blocked by
/// the previous run's connections in TIME_WAIT.
///
/// Spreading accepts: each loop registers the socket in its own epoll with EPOLLEXCLUSIVE, so a new connection
/// wakes one loop waiting in `epoll_wait` (a busy loop is skipped), not all of them. The woken loop accepts
/// (non-blocking: EAGAIN is normal when another loop took the connection first) and then re-registers, which puts
/// it behind the other loops in the socket's wait queue, so the next connection wakes another loop first.
///
/// Port 0 works: the one socket learns its port from the kernel. This handle is Sendable; the per-loop accept state
/// lives on each loop.
public final class TCPListener: Sendable {
    /// The bound address (with the real port when 0 was asked for).
    public let address: SocketAddress
    public var port: Int { address.port }
    private let fd: Int32
    private let loops: [EventLoop]

    private init(address: SocketAddress, fd: Int32, loops: [EventLoop]) {
        self.address = address
        self.fd = fd
        self.loops = loops
    }

    /// Binds `address` ("HOST:PORT") and starts accepting on every loop of `group`.
    /// Call from outside the loops (it waits for each loop to register the socket).
    /// - Parameter makeDelegate: runs once on each loop thread; its result receives that loop's
    ///   accepted connections.
    /// - Throws: `EngineError` when the address is in use (another process listens on it).
    /// - Parameter clientSpeaksFirst: the protocol's client always sends first (HTTP, TLS): the kernel hands over a
    ///   connection once its first bytes have arrived, or once `deferSeconds` have passed without any
    ///   (`TCP_DEFER_ACCEPT`), so the loop is woken once per connection (accept and read its request) instead of twice
    ///   (accept, then its request), and a client that connects and says nothing waits in the kernel, not in the hub.
    public static func bind(_ address: String, on group: EventLoopGroup, backlog: Int32 = 1024, clientSpeaksFirst: Bool = false,
                            makeDelegate: @escaping @Sendable (EventLoop) -> any ListenerDelegate) throws -> TCPListener {
        try bind(SocketAddress(parsing: address), on: group.loops, backlog: backlog, clientSpeaksFirst: clientSpeaksFirst,
                 makeDelegate: makeDelegate)
    }

    /// How long the kernel holds a connection that has sent nothing before handing it over anyway
    /// (`clientSpeaksFirst`); Linux rounds it to its SYN-ACK retransmission schedule (1 s: the first retransmission).
    static let deferSeconds: Int32 = 1

    /// Binds on an explicit list of loops.
    public static func bind(_ address: SocketAddress, on loops: [EventLoop], backlog: Int32 = 1024, clientSpeaksFirst: Bool = false,
                            makeDelegate: @escaping @Sendable (EventLoop) -> any ListenerDelegate) throws -> TCPListener {
        try serve(BoundTCPSocket.bind(address, backlog: backlog, clientSpeaksFirst: clientSpeaksFirst), on: loops, makeDelegate: makeDelegate)
    }

    /// Starts accepting on `socket` on every loop; the listener takes the socket over (closed when this throws).
    public static func serve(_ socket: BoundTCPSocket, on loops: [EventLoop],
                             makeDelegate: @escaping @Sendable (EventLoop) -> any ListenerDelegate) throws -> TCPListener {
        precondition(!loops.isEmpty)
        return try serve(socket.take(), on: loops, makeDelegate: makeDelegate)
    }

    fileprivate static func prepareAdopted(fd: Int32, clientSpeaksFirst: Bool) throws {
        do {
            let flags = try syscallBlocking("fcntl") { fcntl(fd, F_GETFL) }
            _ = try syscallBlocking("fcntl") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
            _ = try syscallBlocking("fcntl") { fcntl(fd, F_SETFD, FD_CLOEXEC) }
            try Socket.setFlag(fd, Int32(IPPROTO_TCP), TCP_NODELAY)
            if clientSpeaksFirst {
                var seconds = deferSeconds
                _ = try syscallBlocking("setsockopt") {
                    setsockopt(fd, Int32(IPPROTO_TCP), TCP_DEFER_ACCEPT, &seconds, socklen_t(MemoryLayout<Int32>.size))
                }
            }
        } catch {
            closeFD(fd)
            throw error
        }
    }

    /// Registers the listening `fd` on every loop; closes it when that fails.
    private static func serve(_ fd: Int32, on loops: [EventLoop],
                              makeDelegate: @escaping @Sendable (EventLoop) -> any ListenerDelegate) throws -> TCPListener {
        let bound: SocketAddress
        do {
            bound = try localAddress(fd)
        } catch {
            closeFD(fd)
            throw error
        }
        // Every loop's listener holds the socket; the last to close it closes the descriptor.
        let shared = SharedDescriptor(fd, holders: loops.count)
        for (i, loop) in loops.enumerated() {
            do {
                try loop.submitAndWait {
                    _ = try Listener(fd: fd, loop: loop, isTCP: true, delegate: makeDelegate(loop), shared: shared)
                }
            } catch {
                // Listener's init registered nothing on failure: release for the loops without a listener, close the
                // others' (the descriptor is closed, and the port free, when this throws).
                for _ in i..<loops.count { shared.release() }
                for l in loops[..<i] { _ = try? l.submitAndWait { (l.registered(fd: fd) as? Listener)?.close() } }
                throw error
            }
        }
        return TCPListener(address: bound, fd: fd, loops: loops)
    }

    fileprivate static func openListeningSocket(_ address: SocketAddress, backlog: Int32, deferAccept: Bool) throws -> Int32 {
        let fd = try syscallBlocking("socket") {
            socket(address.family, Int32(SOCK_STREAM.rawValue) | LinuxSyscalls.CLOEXEC | LinuxSyscalls.NONBLOCK, 0)
        }
        do {
            // SO_REUSEADDR only (TIME_WAIT leftovers); never SO_REUSEPORT: the address must be exclusively ours.
            try Socket.setFlag(fd, SOL_SOCKET, SO_REUSEADDR)
            // Linux copies TCP_NODELAY from the listening socket to every socket `accept` returns: set once here,
            // not once per connection (one setsockopt of the seven syscalls a connection's set-up made).
            try Socket.setFlag(fd, Int32(IPPROTO_TCP), TCP_NODELAY)
            if deferAccept {
                var seconds = deferSeconds
                _ = try syscallBlocking("setsockopt") {
                    setsockopt(fd, Int32(IPPROTO_TCP), TCP_DEFER_ACCEPT, &seconds, socklen_t(MemoryLayout<Int32>.size))
                }
            }
            _ = try syscallBlocking("bind") { address.withSockAddr { Glibc.bind(fd, $0, $1) } }
            // With SO_REUSEADDR two sockets may both bind an address nobody listens on yet; `listen` is where the
            // kernel lets only one of them have it.
            _ = try syscallBlocking("listen") { listen(fd, backlog) }
        } catch {
            closeFD(fd)
            if error.code == EADDRINUSE {
                throw EngineError("address \(address) is already in use (is another hub or server running on it?)")
            }
            throw error
        }
        return fd
    }

    fileprivate static func localAddress(_ fd: Int32) throws(SyscallError) -> SocketAddress {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = try syscallBlocking("getsockname") {
            withUnsafeMutableBytes(of: &storage) { getsockname(fd, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), &length) }
        }
        return SocketAddress(storage: storage, length: length)
    }

    /// Stops accepting on every loop and closes the socket (established connections stay); the address is free
    /// when this returns. Call from outside the loops.
    public func close() {
        for loop in loops {
            _ = try? loop.submitAndWait { [fd] in (loop.registered(fd: fd) as? Listener)?.close() }
        }
    }

    /// Runs `body` on the listener of `loop` (tests use it to inject accept errors).
    func withListener(on loop: EventLoop, _ body: @escaping @Sendable (Listener) -> Void) {
        guard loops.contains(where: { $0 === loop }) else { return }
        _ = try? loop.submitAndWait { [fd] in if let l = loop.registered(fd: fd) as? Listener { body(l) } }
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

/// A descriptor held by several loops' listeners: closed when the last one releases it.
final class SharedDescriptor: Sendable {
    let fd: Int32
    private let holders: Atomic<Int>

    init(_ fd: Int32, holders: Int) {
        self.fd = fd
        self.holders = Atomic(holders)
    }

    func release() {
        if holders.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 { closeFD(fd) }
    }
}

/// A listening TCP socket that no loop serves yet: a server binds first, so it knows its address (and that the port
/// is its own) before it builds what serves it. `TCPListener.serve` takes it over; one never served is closed when
/// it goes away (a start that failed later leaves nothing bound).
public final class BoundTCPSocket {
    /// The bound address (with the real port when 0 was asked for).
    public let address: SocketAddress
    private var fd: Int32

    private init(fd: Int32) throws {
        do {
            address = try TCPListener.localAddress(fd)
        } catch {
            closeFD(fd)
            throw error
        }
        self.fd = fd
    }

    deinit { if fd >= 0 { closeFD(fd) } }

    /// Binds `address` ("HOST:PORT") and listens (see `TCPListener.bind` for `clientSpeaksFirst`).
    /// - Throws: `EngineError` when the address is in use (another process listens on it).
    public static func bind(_ address: String, backlog: Int32 = 1024, clientSpeaksFirst: Bool = false) throws -> BoundTCPSocket {
        try bind(SocketAddress(parsing: address), backlog: backlog, clientSpeaksFirst: clientSpeaksFirst)
    }

    public static func bind(_ address: SocketAddress, backlog: Int32 = 1024, clientSpeaksFirst: Bool = false) throws -> BoundTCPSocket {
        try BoundTCPSocket(fd: TCPListener.openListeningSocket(address, backlog: backlog, deferAccept: clientSpeaksFirst))
    }

    /// A listening socket someone else bound (socket activation: the service manager keeps its own copy, so
    /// connections queue in the kernel while no hub accepts). Takes `fd` over: it is closed when this throws or when
    /// the listener serving it closes; the manager's copy stays open.
    public static func adopt(fd: Int32, clientSpeaksFirst: Bool = false) throws -> BoundTCPSocket {
        try TCPListener.prepareAdopted(fd: fd, clientSpeaksFirst: clientSpeaksFirst)
        return try BoundTCPSocket(fd: fd)
    }

    /// Hands the descriptor to a listener (once).
    fileprivate func take() -> Int32 {
        precondition(fd >= 0, "a bound socket is served once")
        defer { fd = -1 }
        return fd
    }
}

@available(*, unavailable)
extension BoundTCPSocket: Sendable {}
