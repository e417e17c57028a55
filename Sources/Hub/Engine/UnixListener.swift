import Glibc

/// A Unix stream socket at a filesystem path (the hub's admin socket), served by one loop.
///
/// Safety rules, because the path is shared with the operator's filesystem:
/// - the socket gets mode 0660 (owner and group only) before `listen`, so nobody can connect
///   while it still has the umask's mode (connecting to a bound but not listening socket is refused);
/// - an existing socket file is probed: connection refused → stale, unlinked and replaced;
///   connection accepted → "another hub is listening on PATH";
/// - an existing non-socket is never unlinked;
/// - on `close()` the path is unlinked only if it is still our socket (same device and inode).
public final class UnixListener: Sendable {
    public let path: String
    private let loop: EventLoop
    private let fd: Int32
    private let device: UInt64
    private let inode: UInt64
    /// False for an adopted socket: its path belongs to whoever bound it, and is never unlinked here.
    private let ownsPath: Bool

    private init(path: String, loop: EventLoop, fd: Int32, device: UInt64, inode: UInt64, ownsPath: Bool = true) {
        self.path = path
        self.loop = loop
        self.fd = fd
        self.device = device
        self.inode = inode
        self.ownsPath = ownsPath
    }

    /// Serves a listening Unix socket someone else bound (socket activation). Takes `fd` over (closed when this
    /// throws or on `close()`); the path is the socket's own (`getsockname`), and is left in place on `close()`.
    public static func adopt(fd: Int32, on loop: EventLoop,
                             makeDelegate: @escaping @Sendable (EventLoop) -> any ListenerDelegate) throws -> UnixListener {
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        do {
            _ = try syscallBlocking("getsockname") {
                withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
            }
            let flags = try syscallBlocking("fcntl") { fcntl(fd, F_GETFL) }
            _ = try syscallBlocking("fcntl") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
            _ = try syscallBlocking("fcntl") { fcntl(fd, F_SETFD, FD_CLOEXEC) }
            try loop.submitAndWait { _ = try Listener(fd: fd, loop: loop, isTCP: false, delegate: makeDelegate(loop)) }
        } catch {
            closeFD(fd)
            throw error
        }
        // The path up to its NUL (an abstract address starts with one: shown as @name).
        let path = withUnsafeBytes(of: &address.sun_path) { raw -> String in
            let used = max(0, min(raw.count, Int(length) - MemoryLayout<sa_family_t>.size))
            let bytes = Array(raw.prefix(used))
            if bytes.first == 0 { return "@" + String(decoding: bytes.dropFirst(), as: UTF8.self) }
            return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
        return UnixListener(path: path, loop: loop, fd: fd, device: 0, inode: 0, ownsPath: false)
    }

    /// Binds `path` with `mode` and starts accepting on `loop`. Call from outside the loop.
    public static func bind(path: String, on loop: EventLoop, mode: mode_t = 0o660, backlog: Int32 = 128,
                            makeDelegate: @escaping @Sendable (EventLoop) -> any ListenerDelegate) throws -> UnixListener {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        let utf8 = Array(path.utf8)
        guard !utf8.isEmpty, utf8.count < capacity else { throw EngineError("unix socket path too long (max \(capacity - 1) bytes): \(path)") }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: utf8)
            raw[utf8.count] = 0
        }
        try removeStale(path: path, address: address)

        let fd = try syscallBlocking("socket") {
            socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | LinuxSyscalls.CLOEXEC | LinuxSyscalls.NONBLOCK, 0)
        }
        var st = stat()
        do {
            _ = try syscallBlocking("bind") {
                withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    Glibc.bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                } }
            }
            _ = try syscallBlocking("chmod") { chmod(path, mode) }
            _ = try syscallBlocking("lstat") { lstat(path, &st) }
            _ = try syscallBlocking("listen") { listen(fd, backlog) }
        } catch {
            closeFD(fd)
            unlinkIfOurs(path: path, device: UInt64(st.st_dev), inode: UInt64(st.st_ino), requireMatch: st.st_ino != 0)
            throw error
        }
        do {
            try loop.submitAndWait { _ = try Listener(fd: fd, loop: loop, isTCP: false, delegate: makeDelegate(loop)) }
        } catch {
            closeFD(fd)
            unlinkIfOurs(path: path, device: UInt64(st.st_dev), inode: UInt64(st.st_ino), requireMatch: true)
            throw error
        }
        return UnixListener(path: path, loop: loop, fd: fd, device: UInt64(st.st_dev), inode: UInt64(st.st_ino))
    }

    private static func removeStale(path: String, address: sockaddr_un) throws {
        var st = stat()
        if lstat(path, &st) != 0 {
            let code = errno
            if code == ENOENT { return }
            throw SyscallError(call: "lstat(\(path))", code: code)
        }
        guard st.st_mode & S_IFMT == S_IFSOCK else {
            throw EngineError("\(path) exists and is not a socket; refusing to remove it")
        }
        let probe = try syscallBlocking("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | LinuxSyscalls.CLOEXEC, 0) }
        defer { closeFD(probe) }
        // A live but wedged hub with a full backlog would block connect forever; bound the probe.
        var timeout = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(probe, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var target = address
        let rc = withUnsafePointer(to: &target) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(probe, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        } }
        let code = rc == 0 ? 0 : errno
        if rc == 0 || code == EAGAIN { throw EngineError("another hub is listening on \(path)") }
        guard code == ECONNREFUSED else { throw SyscallError(call: "connect(\(path))", code: code) }
        // Nobody is listening: a leftover from a crashed hub.
        if unlink(path) != 0 && errno != ENOENT { throw SyscallError(call: "unlink(\(path))", code: errno) }
    }

    private static func unlinkIfOurs(path: String, device: UInt64, inode: UInt64, requireMatch: Bool) {
        guard requireMatch else { return }
        var st = stat()
        guard lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFSOCK,
              UInt64(st.st_dev) == device, UInt64(st.st_ino) == inode else { return }
        unlink(path)
    }

    /// Stops accepting, closes the socket and unlinks the path (if it is still ours).
    /// Call from outside the loop.
    public func close() {
        let fd = self.fd
        let loop = self.loop
        _ = try? loop.submitAndWait { (loop.registered(fd: fd) as? Listener)?.close() }
        UnixListener.unlinkIfOurs(path: path, device: device, inode: inode, requireMatch: ownsPath)
    }
}
