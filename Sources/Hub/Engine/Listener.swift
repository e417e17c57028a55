import Glibc

/// The loop-bound half of a listening socket: the accept loop and the reserve descriptor.
///
/// Accepts run until EAGAIN or `acceptBudget` per wake-up (fairness: a connection storm must not
/// starve established connections on the same loop; level-triggered epoll reports the rest).
///
/// A socket shared by several loops (`TCPListener`) is registered with EPOLLEXCLUSIVE in each loop's
/// epoll: a connection wakes one waiting loop (a loop busy outside `epoll_wait` is passed over). Once it has
/// accepted `yieldEvery` connections, the listener re-registers (DEL + ADD: EPOLLEXCLUSIVE registrations
/// cannot be modified), which moves its loop to the back of the socket's wait queue, so the next connections
/// wake another idle loop first. Re-registering after every wake-up spread connections one by one but cost two
/// `epoll_ctl` calls per one or two connections during a ramp (set-up cost); after every 4 accepts,
/// idle loops still take turns, 4 connections at a time. The last listener to close a shared socket closes its
/// descriptor.
///
/// Descriptor exhaustion: with EMFILE/ENFILE, the pending connection would sit in the backlog and
/// level-triggered epoll would spin on it. So each listener keeps one reserve fd (/dev/null): on
/// exhaustion it closes the reserve, accepts, lets the delegate answer (HTTP 503), closes, and
/// reopens the reserve. If even that fails, accepting pauses for one timer tick.
///
/// The reserve is only worth anything if the descriptor it frees goes to the accept that follows. Every listener
/// of the process (all loops, TCP and Unix) accepts holding one reader-writer lock shared, and sheds (close the
/// reserve, accept, answer, close, reopen) holding it exclusively, so no other loop's accept can take the freed
/// descriptor in between, while ordinary accepts on different loops never wait for each other (a plain mutex made
/// the loops sleep in futex on each other's accepts: about one futex call per connection in a ramp). A listener
/// that lost its reserve anyway (another thread of the process opened a descriptor in that instant) takes one back,
/// holding the lock exclusively, before it accepts again. Before this (scripts/test, once): two loops' reserves
/// were taken by clients that slipped in during the other loop's shed, and the next client waited for an answer
/// that never came.
final class Listener: LoopSelectable {
    static let acceptBudget = 64
    /// Accepts between two turns at the back of a shared socket's wait queue.
    static let yieldEvery = 4
    /// Shared around every `accept4` of every listener; exclusive around a whole shed and a reserve's re-take.
    private static let acceptGate = AcceptGate()

    let fd: Int32
    unowned let loop: EventLoop
    let isTCP: Bool
    let generation: UInt32
    /// Its key in the loop's registration table (kept while it leaves epoll and comes back).
    private var key: UInt32 = 0
    private let delegate: any ListenerDelegate
    /// Set when other loops listen on the same socket.
    private let shared: SharedDescriptor?
    private let events: UInt32
    private var reserveFD: Int32 = -1
    /// Accepted since this listener last went to the back of the shared socket's wait queue.
    private var acceptedSinceYield = 0
    private var exhausted = false
    private var paused = false
    private(set) var closed = false
    /// Test hook: pretend accept4 failed with this errno before the real call (nil in production).
    var injectedAcceptError: Int32?

    /// - Parameter shared: the socket's shared owner when other loops listen on it too (released on `close`
    ///   instead of closing `fd`); nil when this listener owns `fd`. On a throw nothing is registered and
    ///   nothing is released.
    init(fd: Int32, loop: EventLoop, isTCP: Bool, delegate: any ListenerDelegate, shared: SharedDescriptor? = nil) throws(SyscallError) {
        self.fd = fd
        self.loop = loop
        self.isTCP = isTCP
        self.delegate = delegate
        self.shared = shared
        events = shared == nil ? Epoll.input : Epoll.input | LinuxSyscalls.EPOLLEXCLUSIVE
        generation = loop.reserveGeneration()
        openReserve()
        key = try loop.register(self, fd: fd, generation: generation, events: events)
    }

    private func openReserve() {
        if reserveFD < 0 { reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC) }
    }

    private func accept() throws(SyscallError) -> IOResult<(Int32, String)> {
        if let code = injectedAcceptError { throw SyscallError(call: "accept4", code: code) }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let result = try syscall("accept4") {
            withUnsafeMutableBytes(of: &storage) { sys_accept4(fd, $0.baseAddress, &length, LinuxSyscalls.CLOEXEC | LinuxSyscalls.NONBLOCK) }
        }
        guard case .processed(let client) = result else { return .wouldBlock }
        return .processed((client, isTCP ? SocketAddress(storage: storage, length: length).description : "unix"))
    }

    func handleEvents(_ events: UInt32) {
        var budget = Listener.acceptBudget
        defer { if acceptedSinceYield >= Listener.yieldEvery { yieldTurn() } }
        while budget > 0 && !closed && !paused {
            budget -= 1
            do {
                // Without a reserve, the next free descriptor is the reserve's (see the type's comment): one open()
                // only while it is missing, holding the gate exclusively, so it never takes another listener's
                // reserve in the middle of its shed, nor races another loop's accept for the descriptor.
                if reserveFD < 0 { Listener.acceptGate.exclusive { openReserve() } }
                let result = try Listener.acceptGate.shared { () throws(SyscallError) in try accept() }
                guard case .processed(let (client, peer)) = result else { return }
                acceptedSinceYield += 1
                exhausted = false
                loop.metrics.accepts += 1
                delegate.accepted(fd: client, peer: peer, on: loop)
            } catch {
                loop.metrics.acceptFailures[error.code, default: 0] += 1
                switch error.code {
                case EMFILE, ENFILE:
                    if !exhausted {
                        exhausted = true
                        loop.metrics.descriptorExhaustions += 1
                        delegate.descriptorsExhausted(errno: error.code, on: loop)
                    }
                    switch shedOne() {
                    case .shed: continue
                    case .drained: return
                    case .impossible: pause(); return
                    }
                case ENOBUFS, ENOMEM:
                    pause()
                    return
                default:
                    // ECONNABORTED, EPROTO, EPERM (firewall): that one connection is gone; go on.
                    continue
                }
            }
        }
    }

    private enum ShedResult { case shed, drained, impossible }

    /// Test hook: close the reserve as if another thread had taken its descriptor in a shed's window.
    func dropReserveForTesting() {
        if reserveFD >= 0 { closeFD(reserveFD) }
        reserveFD = -1
    }

    /// Whether the listener holds its reserve descriptor now.
    var hasReserve: Bool { reserveFD >= 0 }

    /// Uses the reserve fd to accept one pending connection and refuse it, holding the accept gate exclusively.
    private func shedOne() -> ShedResult {
        Listener.acceptGate.exclusive { shedOneLocked() }
    }

    private func shedOneLocked() -> ShedResult {
        guard reserveFD >= 0 else { return .impossible }
        closeFD(reserveFD)
        reserveFD = -1
        defer { openReserve() }
        let saved = injectedAcceptError
        injectedAcceptError = nil
        defer { injectedAcceptError = saved }
        let client: Int32
        do {
            guard case .processed(let (accepted, _)) = try accept() else { return .drained }
            client = accepted
        } catch {
            return .impossible
        }
        loop.metrics.shedConnections += 1
        delegate.shedding(fd: client, on: loop)
        closeFD(client)
        return .shed
    }

    /// A shared socket: go to the back of its wait queue, so the next connection wakes another loop first.
    private func yieldTurn() {
        acceptedSinceYield = 0
        guard shared != nil, !closed, !paused else { return }
        loop.epoll.remove(fd: fd)
        rearm()
    }

    /// Registers the socket in this loop's epoll again (it is level-triggered: a connection that arrived
    /// meanwhile is reported). If even that fails, accepting pauses for one tick (other loops go on).
    private func rearm() {
        do {
            try loop.epoll.add(fd: fd, key: key, generation: generation, events: events)
        } catch {
            pause(registered: false)
        }
    }

    /// Stops accepting for one timer tick (the backlog waits in the kernel meanwhile). Removing the socket
    /// from epoll and adding it back works for every registration (EPOLLEXCLUSIVE ones cannot be modified).
    private func pause(registered: Bool = true) {
        guard !paused, !closed else { return }
        paused = true
        if registered { loop.epoll.remove(fd: fd) }
        loop.timers.schedule(afterNanos: 1) { [weak self] in
            guard let self, !self.closed else { return }
            self.paused = false
            self.rearm()
        }
    }

    func close() {
        guard !closed else { return }
        closed = true
        loop.deregister(fd: fd, key: key, generation: generation)
        if let shared { shared.release() } else { closeFD(fd) }
        if reserveFD >= 0 { closeFD(reserveFD) }
        reserveFD = -1
    }

    func loopStopping() { close() }

    deinit {
        // Only reached without close() when init failed after opening the reserve.
        if reserveFD >= 0 { closeFD(reserveFD) }
    }
}

@available(*, unavailable)
extension Listener: Sendable {}

/// A process-wide reader-writer lock (a `pthread_rwlock_t` at a fixed address, never freed: it lives as long as the
/// process). Holders of the shared side do not wait for each other, nor enter the kernel, unless someone holds or
/// waits for the exclusive side.
final class AcceptGate: @unchecked Sendable {
    private let lock: UnsafeMutablePointer<pthread_rwlock_t>

    init() {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_rwlock_t())
        pthread_rwlock_init(lock, nil)
    }

    func shared<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        pthread_rwlock_rdlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }

    func exclusive<R>(_ body: () -> R) -> R {
        pthread_rwlock_wrlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return body()
    }
}
