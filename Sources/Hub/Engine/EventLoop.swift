import COpenSSL
import Dispatch
import Glibc
import HubSupport
import Synchronization

/// Something the loop delivers epoll events to (a connection, a listener). Loop thread only.
protocol LoopSelectable: AnyObject {
    func handleEvents(_ events: UInt32)
    /// The loop is stopping: release the fd (the loop has already removed it from epoll or will).
    func loopStopping()
}

/// One thread, one epoll set, one eventfd: the unit of concurrency of the hub.
///
/// Ownership: everything reachable from a loop (its connections, timers, read buffer, metrics) is
/// touched only by the thread running the loop, so the data path takes no locks. That is the loop's own thread, or,
/// while it sleeps, another loop's thread running its short jobs (`executeBorrowable`, `runBorrowed`): the
/// `ownership` word makes the two exclusive. The only shared state is the inbox behind `execute`, a
/// mutex-protected job array that the loop swaps out in one go. Only a job that finds the loop asleep writes the
/// eventfd, once; while the loop is awake a job just appends, since the loop looks at the inbox under the same lock
/// before it sleeps.
///
/// An iteration is: `epoll_wait` → dispatch (stale fd generations dropped) → inbox jobs → timer wheel →
/// sleeping loops posted to (run here or woken) → flush of corked connections →
/// deferred closes. Closed connections are freed only at the end of the iteration, so an event later in the same
/// batch can't touch freed state.
///
/// The class is `@unchecked Sendable` because `execute`, `executeBorrowable`, `inEventLoop`, `stop` and
/// `metricsSnapshot` are safe from any thread; every other member must be used by the thread running the loop
/// (checked with `assertInLoop` in debug builds).
public final class EventLoop: @unchecked Sendable {
    /// Tunables; the defaults are what the hub uses.
    public struct Configuration: Sendable {
        /// Timer wheel resolution: 100 ms, so a deadline such as the handshake timeout is kept to within a tenth of
        /// a second (ten wheel ticks a second per loop cost nothing measurable; 1024 slots span 102 s).
        public var timerTickNanos: UInt64 = 100_000_000
        public var timerSlots = 1024
        /// The one read buffer shared by every connection of the loop.
        public var readBufferSize = 256 * 1024
        /// Bytes read from one connection per wake-up before moving on (fairness).
        public var readBudgetPerWakeup = 1024 * 1024
        public var maxEventsPerWait = 1024
        public init() {}
    }

    /// A job of the inbox. The closure sits in a struct so the array holds it as it is: an array of bare closures
    /// holds them at the generic abstraction, and appending one then allocates a reabstraction thunk around it (an
    /// allocation and an extra call per job, measured on every delivered event).
    struct Job {
        let run: @Sendable () -> Void
    }

    private struct Inbox {
        var jobs: [Job] = []
        /// The loop found nothing to do and is (about to be) blocked in `epoll_wait`: a new job must write the eventfd.
        /// While it is awake it checks the inbox before it sleeps again, so a job costs no syscall then.
        var sleeping = false
        /// The eventfd was written since the loop went to sleep (one write wakes it however many jobs follow).
        var wakePending = false
        var stopRequested = false
        var finished = false
        /// A job that may not run on another loop's thread is waiting (see `executeBorrowable`).
        var ownThreadOnly = false
    }

    private struct Registration {
        var target: (any LoopSelectable)?
        var generation: UInt32 = 0
        var fd: Int32 = -1
    }

    /// Position in its group (0 for a standalone loop).
    public let index: Int
    public let configuration: Configuration
    let epoll: Epoll
    private let wakeFD: Int32
    private let inbox = LockedValue(Inbox())
    /// Whether the loop is marked asleep (blocked, or about to block, in `epoll_wait`): a job posted now arrives
    /// outside any inbox run (tests that count skipped polls wait for this).
    var isAsleep: Bool { inbox.withLock { $0.sleeping } }

    /// The loop thread's mutable state, held behind a pointer rather than in stored properties: Swift checks every
    /// in-place access to a class's stored `var` at run time (exclusivity enforcement: a thread-local access set),
    /// and the loop makes a dozen such accesses an iteration and several per event (docs/ENGINE.md has the
    /// measurement). Accesses to this state are
    /// short and never call out while they last (a job or handler runs on a copy of the array it came from), which
    /// is what the check would have caught; the state is confined to the loop thread like everything else here.
    private struct LoopState {
        var running: [Job] = []
        /// By key (the slot handed out by `register`): this loop's registrations only, grown one at a time (a table
        /// by descriptor number spanned every descriptor of the process in every loop: ~80 bytes per connection with
        /// two loops).
        var registrations: [Registration] = []
        var freeKeys: [UInt32] = []
        var nextGeneration: UInt32 = 1
        var pendingFlush: [Connection] = []
        var flushSpare: [Connection] = []
        var pendingClose: [Connection] = []
        var closeSpare: [Connection] = []
        var metrics = EngineMetrics()
        /// Whether the last iteration skipped `epoll_wait` (see `iterate`).
        var skippedPoll = false
        /// Sleeping loops this thread's jobs posted to: woken, or run here (`runBorrowed`), at the end of the
        /// iteration.
        var deferredWakes: [EventLoop] = []
        /// The loop is blocked in `epoll_wait` without a timeout (no timer pending when it went to sleep).
        var sleepsUntilWoken = false
        /// How busy the thread is, over windows of at least `busyWindowNanos`: it runs sleeping loops' inboxes
        /// itself only while it was asleep at least half of the last window (a busy thread wakes them instead, so
        /// they work in parallel).
        var windowStart: UInt64 = 0
        var windowAsleep: UInt64 = 0
        var mayBorrow = true
    }
    private static let busyWindowNanos: UInt64 = 10_000_000
    private let state: UnsafeMutablePointer<LoopState>

    private var running: [Job] {
        _read { yield state.pointee.running }
        _modify { yield &state.pointee.running }
    }
    private var registrations: [Registration] {
        _read { yield state.pointee.registrations }
        _modify { yield &state.pointee.registrations }
    }
    private var freeKeys: [UInt32] {
        _read { yield state.pointee.freeKeys }
        _modify { yield &state.pointee.freeKeys }
    }
    private var nextGeneration: UInt32 {
        get { state.pointee.nextGeneration }
        _modify { yield &state.pointee.nextGeneration }
    }
    private var thread: pthread_t = 0
    private var threadID: pthread_t = 0
    /// 1 while a thread runs the loop: its own, or one borrowing it (`runBorrowed`). Its own thread sets 0 just
    /// before it blocks in `epoll_wait` and takes it back (waiting out a borrower) when `epoll_wait` returns.
    private let ownership = Atomic<Int>(1)
    /// The thread running the loop on its behalf, while one does (0 otherwise): `inEventLoop` is true there.
    private let borrower = Atomic<UInt>(0)
    private let joined = LockedValue(false)

    /// Loop-wide timer wheel for deadlines; loop thread only, reached through the loop's timer methods.
    let timers: TimerWheel
    /// The one receive buffer of this loop (handed to handlers in place).
    let readBuffer: UnsafeMutableRawBufferPointer
    /// Scratch iovec array for `writev`.
    let iovecs: UnsafeMutableBufferPointer<iovec>
    static let iovecCount = 64
    /// Where a TLS connection gathers small queued frames into one record's worth of plaintext (see `OutboundQueue`).
    let tlsStaging: UnsafeMutableRawBufferPointer
    static let tlsRecordSize = 16 * 1024
    /// Cipher contexts and buffers of the hub's TLS 1.3 record layer, made when the loop's first one needs them.
    private(set) lazy var tlsRecords = TLSRecordCrypto()

    // Read twice an iteration; every access is a copy or an append, never held across a call (a hook that adds a
    // hook appends to the array, not to the copy being run): no run-time exclusivity check (docs/ENGINE.md).
    var pendingFlush: [Connection] {
        _read { yield state.pointee.pendingFlush }
        _modify { yield &state.pointee.pendingFlush }
    }
    private var flushSpare: [Connection] {
        _read { yield state.pointee.flushSpare }
        _modify { yield &state.pointee.flushSpare }
    }
    var pendingClose: [Connection] {
        _read { yield state.pointee.pendingClose }
        _modify { yield &state.pointee.pendingClose }
    }
    private var closeSpare: [Connection] {
        _read { yield state.pointee.closeSpare }
        _modify { yield &state.pointee.closeSpare }
    }

    /// Counters; loop thread only. Use `metricsSnapshot()` from elsewhere.
    public internal(set) var metrics: EngineMetrics {
        get { state.pointee.metrics }
        _modify { yield &state.pointee.metrics }
    }

    /// Creates the loop and starts its thread. Returns once the thread runs.
    public convenience init(index: Int = 0, configuration: Configuration = .init()) throws(SyscallError) {
        try self.init(index: index, configuration: configuration, drivenByCaller: false)
    }

    /// A loop without a thread of its own, for fuzzing and deterministic tests: the calling thread becomes the
    /// loop thread and drives it with `runOnce()`, one non-blocking iteration at a time; `finishDriven()` tears it
    /// down (closes what is still registered). `execute` from another thread still works (the job waits for the
    /// next `runOnce`); `stop`, `join` and `submitAndWait` are not for such a loop.
    convenience init(drivenByCallerWith configuration: Configuration, index: Int = 0) throws(SyscallError) {
        try self.init(index: index, configuration: configuration, drivenByCaller: true)
    }

    private init(index: Int, configuration: Configuration, drivenByCaller: Bool) throws(SyscallError) {
        self.index = index
        self.configuration = configuration
        epoll = try Epoll(capacity: configuration.maxEventsPerWait)
        wakeFD = try syscallBlocking("eventfd") { sys_eventfd(0, LinuxSyscalls.CLOEXEC | LinuxSyscalls.NONBLOCK) }
        timers = TimerWheel(tickNanos: configuration.timerTickNanos, slots: configuration.timerSlots)
        readBuffer = .allocate(byteCount: configuration.readBufferSize, alignment: 64)
        iovecs = .allocate(capacity: EventLoop.iovecCount)
        iovecs.initialize(repeating: iovec())
        tlsStaging = .allocate(byteCount: EventLoop.tlsRecordSize, alignment: 16)
        state = .allocate(capacity: 1)
        state.initialize(to: LoopState())
        // Generation 0 is never handed out, so the wake fd's events can't be mistaken for a handler's.
        // (Every stored property is set by now, so on a throw `deinit` runs and closes the fds.)
        try epoll.add(fd: wakeFD, key: Epoll.wakeKey, generation: 0, events: Epoll.input)
        if drivenByCaller {
            threadID = pthread_self()
            joined.withLock { $0 = true }  // no thread to join
            return
        }
        let started = DispatchSemaphore(value: 0)
        let box = Unmanaged.passRetained(StartBox(loop: self, started: started))
        let rc = pthread_create(&thread, nil, { raw in
            let box = Unmanaged<StartBox>.fromOpaque(raw!).takeRetainedValue()
            box.loop.threadMain(started: box.started)
            return nil
        }, box.toOpaque())
        if rc != 0 {
            box.release()
            throw SyscallError(call: "pthread_create", code: rc)
        }
        started.wait()
    }

    deinit {
        state.deinitialize(count: 1)
        state.deallocate()
        readBuffer.deallocate()
        iovecs.deallocate()
        tlsStaging.deallocate()
        closeFD(wakeFD)
    }

    private final class StartBox: @unchecked Sendable {
        let loop: EventLoop
        let started: DispatchSemaphore
        init(loop: EventLoop, started: DispatchSemaphore) {
            self.loop = loop
            self.started = started
        }
    }

    // MARK: Any thread

    /// True when called on this loop's thread.
    public var inEventLoop: Bool {
        let me = pthread_self()
        return pthread_equal(me, threadID) != 0 || borrower.load(ordering: .relaxed) == UInt(me)
    }

    /// The loop whose thread calls (nil on other threads).
    static var current: EventLoop? {
        guard let raw = pthread_getspecific(currentKey) else { return nil }
        return Unmanaged<EventLoop>.fromOpaque(raw).takeUnretainedValue()
    }
    private static let currentKey: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    /// Runs `work` on the loop thread, soon. Callable from any thread, including the loop itself.
    /// Jobs run in submission order; a batch costs one eventfd write however many jobs it holds.
    /// Jobs submitted after the loop finished are dropped.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        _ = tryExecute(work)
    }

    /// `execute` for a short job (a few events for a few connections, a reply): posted from another loop's thread
    /// while this loop sleeps, it may run on that thread at the end of its iteration instead of waking this one
    /// (`runBorrowed`), if that thread has time to spare. Everything the job touches must be this loop's or
    /// thread-safe, as for any job; `inEventLoop` is true for this loop while it runs.
    package func executeBorrowable(_ work: @escaping @Sendable () -> Void) {
        _ = tryExecute(work, borrowable: true)
    }

    /// `execute` that reports whether the job was accepted (false once the loop has finished).
    func tryExecute(_ work: @escaping @Sendable () -> Void, borrowable: Bool = false) -> Bool {
        let (accepted, mustWake) = inbox.withLock { box -> (Bool, Bool) in
            guard !box.finished else { return (false, false) }
            box.jobs.append(Job(run: work))
            if !borrowable { box.ownThreadOnly = true }
            guard box.sleeping && !box.wakePending else { return (true, false) }
            box.wakePending = true
            return (true, true)
        }
        // The loop's own thread is awake by definition (`sleeping` is false there), so only other threads write.
        if mustWake {
            // From another loop's thread with time to spare: woken, or run there, when that loop's iteration ends
            // (not here: the caller may hold a lock, such as the broker's while it hands a batch to every loop).
            if borrowable, let current = EventLoop.current, current !== self, current.state.pointee.mayBorrow {
                current.state.pointee.deferredWakes.append(self)
            } else {
                wake()
            }
        }
        return accepted
    }

    /// Runs `work` on the loop and waits for its result. Not callable on the loop itself (deadlock).
    /// Throws `EngineError` if the loop has already finished.
    public func submitAndWait<T: Sendable>(_ work: @escaping @Sendable () throws -> T) throws -> T {
        precondition(!inEventLoop, "submitAndWait on the loop's own thread would deadlock")
        let done = DispatchSemaphore(value: 0)
        let result = LockedValue<Result<T, any Error>?>(nil)
        let accepted = tryExecute {
            let r = Result { try work() }
            result.withLock { $0 = r }
            done.signal()
        }
        guard accepted else { throw EngineError("event loop \(index) has stopped") }
        done.wait()
        return try result.withLock { $0! }.get()
    }

    /// A copy of the loop's counters, taken on the loop thread.
    public func metricsSnapshot() -> EngineMetrics {
        if inEventLoop { return metrics }
        return (try? submitAndWait { [unowned self] in self.metrics }) ?? EngineMetrics()
    }

    /// Asks the loop to stop after the current iteration: every connection is closed with
    /// `.loopStopped`, listeners are closed, then the thread exits. Returns at once; see `join()`.
    public func stop() {
        inbox.withLock { $0.stopRequested = true }
        wake()
    }

    /// Waits for the loop thread to exit. Idempotent; not callable on the loop itself.
    public func join() {
        precondition(!inEventLoop, "join on the loop's own thread would deadlock")
        let mustJoin = joined.withLock { j -> Bool in
            defer { j = true }
            return !j
        }
        if mustJoin { pthread_join(thread, nil) }
    }

    private func wake() {
        var one: UInt64 = 1
        // EAGAIN means the counter is already non-zero: the loop will wake anyway.
        _ = try? syscall("write(eventfd)") { Glibc.write(wakeFD, &one, 8) }
    }

    // MARK: Loop thread

    @inline(__always)
    @inlinable package func assertInLoop(_ file: StaticString = #fileID, _ line: UInt = #line) {
        assert(inEventLoop, "loop-bound API used off the loop thread", file: file, line: line)
    }

    /// Schedules `action` on this loop's timer wheel (one-tick precision).
    @discardableResult
    public func schedule(after delay: Duration, _ action: @escaping () -> Void) -> TimerHandle {
        assertInLoop()
        return timers.schedule(afterNanos: delay.engineNanos, action)
    }

    /// `schedule(after:)` for a delay already in nanoseconds (deadlines kept as `nowNanos`-based numbers).
    @discardableResult
    public func schedule(afterNanos delay: UInt64, _ action: @escaping () -> Void) -> TimerHandle {
        assertInLoop()
        return timers.schedule(afterNanos: delay, action)
    }

    /// This iteration's time, read once after `epoll_wait`: what deadlines count from (up to one iteration old).
    public var nowNanos: UInt64 { timers.nowNanos }

    /// The timer wheel's precision: a timer fires up to one tick late.
    public var timerTickNanos: UInt64 { timers.tickNanos }

    /// Runs `action` every `interval` (rounded to whole ticks) until the handle is cancelled.
    @discardableResult
    public func scheduleRepeating(every interval: Duration, _ action: @escaping () -> Void) -> TimerHandle {
        assertInLoop()
        return timers.scheduleRepeating(everyNanos: interval.engineNanos, action)
    }

    /// A fresh generation to stamp a registration's events with (never 0: that is the wake fd's).
    func reserveGeneration() -> UInt32 {
        let generation = nextGeneration
        nextGeneration &+= 1
        if nextGeneration == 0 { nextGeneration = 1 }
        return generation
    }

    /// Pushes a pending timer back to `delay` from now, keeping its action (O(1), no allocation:
    /// the idle-timeout path). Returns false if it already fired or was cancelled.
    @discardableResult
    public func reschedule(_ timer: TimerHandle, after delay: Duration) -> Bool {
        reschedule(timer, afterNanos: delay.engineNanos)
    }

    /// `reschedule(_:after:)` for a delay in nanoseconds.
    @discardableResult
    public func reschedule(_ timer: TimerHandle, afterNanos delay: UInt64) -> Bool {
        assertInLoop()
        return timers.reschedule(timer, afterNanos: delay)
    }

    /// Cancels a timer; harmless on a stale or `.none` handle.
    @discardableResult
    public func cancel(_ timer: TimerHandle) -> Bool {
        assertInLoop()
        return timers.cancel(timer)
    }

    /// Registers `target` for `events` on `fd` under `generation` (from `reserveGeneration`). Returns its key, which
    /// `reregister` and `deregister` take (and a listener that leaves epoll and comes back passes to `epoll.add`).
    func register(_ target: any LoopSelectable, fd: Int32, generation: UInt32, events: UInt32) throws(SyscallError) -> UInt32 {
        assertInLoop()
        let key: UInt32
        if let free = freeKeys.popLast() {
            key = free
        } else {
            key = UInt32(registrations.count)  // below wakeKey: a loop never holds 4 billion registrations
            registrations.append(Registration())
        }
        do {
            try epoll.add(fd: fd, key: key, generation: generation, events: events)
        } catch {
            freeKeys.append(key)
            throw error
        }
        registrations[Int(key)] = Registration(target: target, generation: generation, fd: fd)
        return key
    }

    func reregister(fd: Int32, key: UInt32, generation: UInt32, events: UInt32) throws(SyscallError) {
        try epoll.modify(fd: fd, key: key, generation: generation, events: events)
    }

    /// Removes `fd` from epoll, and its registration from the table (only if `key` still holds `generation`).
    /// - Parameter closingFD: the caller closes `fd` right after and it is the only descriptor of its open file
    ///   (an accepted or connected socket the hub never duplicates): closing removes it from epoll, so the
    ///   `EPOLL_CTL_DEL` syscall is skipped. A stale event still queued for it in this iteration is dropped by
    ///   the generation check where the loop dispatches events, as before.
    func deregister(fd: Int32, key: UInt32, generation: UInt32, closingFD: Bool = false) {
        assertInLoop()
        if !closingFD { epoll.remove(fd: fd) }
        let slot = Int(key)
        if slot < registrations.count && registrations[slot].generation == generation && registrations[slot].target != nil {
            registrations[slot] = Registration()
            freeKeys.append(key)
        }
    }

    /// Slots in the registration table, live or free (tests: keys are reused).
    var registrationSlots: Int { registrations.count }

    /// The object registered for `fd`, if any (used to reach listeners from their handles; a scan: rare).
    func registered(fd: Int32) -> (any LoopSelectable)? {
        assertInLoop()
        return registrations.first { $0.fd == fd && $0.target != nil }?.target
    }

    func scheduleFlush(_ c: Connection) { pendingFlush.append(c) }
    func scheduleClose(_ c: Connection) { pendingClose.append(c) }

    private func threadMain(started: DispatchSemaphore) {
        threadID = pthread_self()
        pthread_setspecific(EventLoop.currentKey, Unmanaged.passUnretained(self).toOpaque())
        state.pointee.windowStart = monotonicNanos()
        started.signal()
        run()
        teardown()
    }

    /// How long the loop may block in `epoll_wait` now, in ms (-1: until woken; 0: not at all). Before it returns
    /// anything but 0 it marks the loop sleeping under the inbox lock, so a job appended from then on writes the
    /// eventfd (and one appended before was seen here); `iterate` clears the mark when `epoll_wait` returns.
    /// Also says whether jobs are waiting in the inbox (then the timeout is 0), and when it looked (the start of a
    /// sleep, for the busy window).
    private func sleepTimeout() -> (timeout: Int32, jobsWaiting: Bool, now: UInt64) {
        guard pendingFlush.isEmpty && pendingClose.isEmpty && state.pointee.deferredWakes.isEmpty else {
            return (0, false, 0)
        }
        var timeout: Int32 = -1
        let now = monotonicNanos()
        if let nanos = timers.nanosUntilNextTick(now: now) {
            timeout = Int32(clamping: (nanos + 999_999) / 1_000_000)
            if timeout == 0 { return (0, false, now) }
        }
        return inbox.withLock { box -> (Int32, Bool, UInt64) in
            guard box.jobs.isEmpty && !box.stopRequested else { return (0, !box.jobs.isEmpty, now) }
            box.sleeping = true
            return (timeout, false, now)
        }
    }

    private func run() {
        while !iterate(mayBlock: true).stop {}
    }

    /// One iteration. `mayBlock` false (a caller-driven loop) polls epoll without sleeping. Returns whether a stop
    /// was requested, and how much was done: events dispatched, jobs run, connections flushed or closed.
    private func iterate(mayBlock: Bool) -> (stop: Bool, work: Int) {
        let (timeout, jobsWaiting, lookedAt) = mayBlock ? sleepTimeout() : (0, false, 0)
        let ready: Int
        var asleepFrom: UInt64 = 0
        if jobsWaiting && !state.pointee.skippedPoll {
            // Jobs appended while the last inbox ran (a delivery's completion posting the publisher's replies)
            // would otherwise wait for an `epoll_wait` with timeout 0 first: this iteration runs them without it.
            // Never twice in a row, so the sockets are polled at least every other iteration.
            state.pointee.skippedPoll = true
            metrics.pollsSkipped += 1
            ready = 0
        } else {
            state.pointee.skippedPoll = false
            // Blocking: another loop's thread may run this one meanwhile (`runBorrowed`).
            if timeout != 0 {
                asleepFrom = lookedAt
                state.pointee.sleepsUntilWoken = timeout < 0
                ownership.store(0, ordering: .releasing)
            }
            do {
                ready = try epoll.wait(timeoutMs: timeout)
            } catch {
                preconditionFailure("epoll_wait: \(error)")
            }
            if timeout != 0 {
                while !ownership.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged { sched_yield() }
            }
        }
        // Awake again (the loop was marked sleeping exactly when the timeout is not 0): jobs appended from now on
        // need no eventfd write.
        if timeout != 0 { inbox.withLock { $0.sleeping = false } }
        // The loop may have slept for minutes; deadlines set during this iteration count from now.
        let now = monotonicNanos()
        timers.updateNow(now)
        noteBusy(now: now, asleepFrom: asleepFrom)
        var work = 0
        for i in 0..<ready {
            let (key, generation, events) = epoll.event(at: i)
            if key == Epoll.wakeKey && generation == 0 {
                var counter: UInt64 = 0
                _ = try? syscall("read(eventfd)") { Glibc.read(wakeFD, &counter, 8) }
                continue
            }
            let slot = Int(key)
            guard slot < registrations.count, registrations[slot].generation == generation,
                  let target = registrations[slot].target else { continue }  // stale: deregistered, key reused
            target.handleEvents(events)
            work += 1
        }
        let (stopNow, jobs) = runInbox()
        work += jobs
        work += timers.advance(toNanos: monotonicNanos())
        work += pendingFlush.count + pendingClose.count
        runDeferredWakes()
        finishIteration()
        runDeferredWakes()
        return (stopNow, work)
    }

    /// Wakes the sleeping loops this iteration's jobs went to, or runs their inboxes here when nobody else runs them
    /// and this thread has time to spare.
    private func runDeferredWakes() {
        guard !state.pointee.deferredWakes.isEmpty else { return }
        while let target = state.pointee.deferredWakes.popLast() {
            if !target.runBorrowed() { target.wake() }
        }
    }

    /// Counts the time blocked in `epoll_wait` this iteration (from `asleepFrom`, 0 if it did not block) in the busy
    /// window; a window of `busyWindowNanos` or more decides `mayBorrow` for the next one. Called every iteration,
    /// blocking or not, so a loop that stops sleeping stops borrowing.
    private func noteBusy(now: UInt64, asleepFrom: UInt64) {
        let s = state
        if asleepFrom != 0 { s.pointee.windowAsleep &+= now &- asleepFrom }
        let span = now &- s.pointee.windowStart
        guard span >= EventLoop.busyWindowNanos else { return }
        s.pointee.mayBorrow = s.pointee.windowAsleep * 2 >= span
        s.pointee.windowStart = now
        s.pointee.windowAsleep = 0
    }

    /// On another loop's thread, while this loop's thread is blocked in `epoll_wait`: runs the inbox and the flushes
    /// as an iteration would, without waking the thread (an eventfd write, a wake-up and a sleep
    /// saved). Returns false when the loop could not be taken (it is awake, or being run elsewhere) or still needs
    /// its own thread (a stop, leftover flushes, a first timer while it sleeps without a timeout): the caller wakes it.
    private func runBorrowed() -> Bool {
        guard ownership.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged else { return false }
        defer { ownership.store(0, ordering: .releasing) }
        guard let stop = takeInbox(borrowing: true) else { return false }
        borrower.store(UInt(pthread_self()), ordering: .relaxed)
        timers.updateNow(monotonicNanos())
        _ = runJobs()
        finishIteration()
        metrics.borrowedRuns += 1
        borrower.store(0, ordering: .relaxed)
        return !stop && pendingFlush.isEmpty && pendingClose.isEmpty
            && !(state.pointee.sleepsUntilWoken && timers.count > 0)
    }

    /// One non-blocking iteration of a caller-driven loop (`init(drivenByCallerWith:)`), on its caller's thread.
    /// Returns how much it did; 0 means nothing was ready.
    @discardableResult
    func runOnce() -> Int {
        assertInLoop()
        return iterate(mayBlock: false).work
    }

    /// Ends a caller-driven loop: every registered connection and listener is closed (`.loopStopped`), and what
    /// is left in the inbox runs.
    func finishDriven() {
        assertInLoop()
        teardown()
    }

    /// Swaps the inbox out under the lock and runs it outside. Returns whether a stop was requested, and how many jobs ran.
    private func runInbox() -> (stop: Bool, jobs: Int) {
        let stopRequested = takeInbox(borrowing: false) ?? false
        return (stopRequested, runJobs())
    }

    /// Moves the inbox's jobs to `running` and returns whether a stop was requested; when `borrowing`, takes nothing
    /// and returns nil if a job that must run on the loop's own thread waits.
    private func takeInbox(borrowing: Bool) -> Bool? {
        inbox.withLock { box -> Bool? in
            if borrowing && box.ownThreadOnly { return nil }
            swap(&box.jobs, &running)
            box.wakePending = false
            box.ownThreadOnly = false
            return box.stopRequested
        }
    }

    private func runJobs() -> Int {
        let jobs = running.count
        for job in running { job.run() }
        running.removeAll(keepingCapacity: running.capacity <= 1024)
        return jobs
    }

    /// Flushes corked connections, then frees closed ones; repeats briefly because close callbacks
    /// may write to other connections.
    private func finishIteration() {
        var rounds = 0
        while (!pendingFlush.isEmpty || !pendingClose.isEmpty) && rounds < 4 {
            rounds += 1
            swap(&pendingFlush, &flushSpare)
            for c in flushSpare { c.flushCorked() }
            flushSpare.removeAll(keepingCapacity: true)
            swap(&pendingClose, &closeSpare)
            for c in closeSpare { c.finishClose() }
            closeSpare.removeAll(keepingCapacity: true)
        }
    }

    private func teardown() {
        for slot in registrations.indices {
            if let target = registrations[slot].target { target.loopStopping() }
        }
        registrations.removeAll()
        freeKeys.removeAll()
        finishIteration()
        // Run what is left so nobody blocked in `submitAndWait` hangs; later jobs are dropped.
        while true {
            let jobs = inbox.withLock { box -> [Job] in
                let j = box.jobs
                box.jobs.removeAll()
                if j.isEmpty { box.finished = true }
                return j
            }
            if jobs.isEmpty { break }
            for job in jobs { job.run() }
        }
        for target in state.pointee.deferredWakes { target.wake() }
        state.pointee.deferredWakes.removeAll()
    }
}

extension Duration {
    /// Whole nanoseconds, saturating; negative durations are zero.
    package var engineNanos: UInt64 {
        let (s, atto) = components
        if s < 0 { return 0 }
        return UInt64(s).multipliedReportingOverflow(by: 1_000_000_000).partialValue &+ UInt64(atto / 1_000_000_000)
    }
}
