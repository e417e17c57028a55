import Glibc

/// A loop-bound non-blocking stream socket (TCP or Unix) with its outbound queue.
///
/// Reads land in the loop's one read buffer and are handed to the handler in place; only an
/// unconsumed tail (a partial frame) is copied to a small per-connection spill buffer. When the tail
/// gets large (a big message arriving in pieces) the connection reads straight into its spill
/// buffer instead, so nothing is copied twice.
///
/// Writes are corked by default: they are queued and flushed once, with `writev`, at the end of the
/// loop iteration, so all of an iteration's events reach a subscriber in one syscall. EPOLLOUT is
/// registered only while bytes remain after a flush.
///
/// Closing never frees state under a running epoll batch: the fd is closed at once (its stale events
/// are dropped by generation), and the handler's `connectionClosed` runs at the end of the iteration.
///
/// TLS (a connection made with a `TLSContext`): the handler sees plaintext only, in both directions. Its
/// `TLSTransport` runs the handshake first, driven by the loop (EPOLLOUT follows OpenSSL's WANT_WRITE); handler
/// writes queue meanwhile. Reads decrypt into the same buffers; writes are sealed straight from the queued frames,
/// so an event framed once for many subscribers is encrypted per subscriber and copied nowhere else. A graceful
/// close sends close_notify before shutting down the write side.
public final class Connection {
    /// Whether a write was accepted.
    public enum WriteResult: Sendable, Equatable {
        /// Written or queued.
        case accepted
        /// Queueing it would exceed `maxQueuedBytes`; nothing was queued. The peer reads too slowly:
        /// close the connection (the loop and other subscribers are never blocked by it).
        case overCap
        /// The connection is closing or closed; nothing was queued.
        case closed
    }

    /// How to close.
    public enum CloseMode: Sendable, Equatable {
        /// Drop queued bytes and close now (RST to the peer).
        case abort
        /// Stop reading, flush the queue, `shutdown(SHUT_WR)`, wait for the peer's EOF (none to wait for when
        /// it came first: see `ConnectionHandler.connectionInputEnded`), close; abort if that takes longer than
        /// `linger`.
        case graceful(linger: Duration)
        /// Hand what is queued to the kernel now (one attempt), then close the descriptor at once: the kernel sends
        /// what it took, then FIN (RST if the peer's unread bytes are pending). For answers to peers that hold a slot
        /// without purpose (a handshake that timed out): the slot is free the moment the answer is written.
        case flushAndClose
    }

    private enum State { case open, draining, halfClosed, closed }

    // Stored properties are laid out in declaration order: the small ones are grouped so that no padding is left
    // between them (an idle connection's memory; `EngineTCPTests` checks the object's size).

    /// The socket; valid until the connection closes.
    public let fd: Int32
    private let generation: UInt32
    /// Strong, not `unowned`: reading an `unowned` reference retains and releases it each time (the run time checks
    /// the object is still alive), a dozen times per delivered event. A connection never outlives its loop's use of
    /// it: the loop's teardown closes and deregisters every connection, which is what ends the cycle.
    public let loop: EventLoop
    /// "ip:port", "[v6]:port" or "unix".
    public let peer: String
    public private(set) var handler: (any ConnectionHandler)?
    /// The outbound cap (bytes queued but not yet accepted by the kernel). Stored in 32 bits beside the other small
    /// fields (--max-queued-bytes is at most 1 GiB; a larger value is clamped, never trapped).
    public var maxQueuedBytes: Int {
        get { Int(maxQueued32) }
        set { maxQueued32 = Int32(clamping: newValue) }
    }
    // `@exclusivity(unchecked)`: Swift checks every access to a class's stored `var` at run time, and a delivered
    // event makes a dozen of them here. These fields skip it (docs/ENGINE.md): all but `out` and
    // `tls` are plain values (integers, flags, an enum without references, a raw pointer), which an overlapping
    // access could leave stale but not unsafe; `out` and `tls` are reached only in short accesses that never
    // call out (the queue's methods take no closure and hold no reference back here; `tls` is set in `init` and
    // only cleared after). `handler` keeps the check: its calls do call back.
    @exclusivity(unchecked) private var out = OutboundQueue()
    @exclusivity(unchecked) private var spill = UnsafeMutableRawBufferPointer(start: nil, count: 0)
    @exclusivity(unchecked) private var spillCount = 0
    @exclusivity(unchecked) private var lingerTimer = TimerHandle.none
    /// This connection's key in its loop's registration table.
    @exclusivity(unchecked) private var key: UInt32 = 0
    @exclusivity(unchecked) private var interest: UInt32 = Epoll.readable
    @exclusivity(unchecked) private var maxQueued32: Int32
    @exclusivity(unchecked) private var closeReason = CloseReason.closed
    @exclusivity(unchecked) private var state = State.open
    /// When true (the default) writes are flushed at the end of the loop iteration; when false each
    /// write is attempted immediately.
    @exclusivity(unchecked) public var corked = true
    @exclusivity(unchecked) private var flushScheduled = false
    @exclusivity(unchecked) private var readingPaused = false
    /// `resumeReading` queued a `redeliver` of the held bytes.
    @exclusivity(unchecked) private var redeliveryScheduled = false
    /// The peer's EOF was read and the handler kept the connection open to finish writing
    /// (`connectionInputEnded`): reading is off for good.
    @exclusivity(unchecked) private var inputEnded = false

    /// A TLS connection's transport (a side object: a plain connection carries one nil pointer). Set in `init`;
    /// cleared only when a TLS port answers plain HTTP in the clear.
    @exclusivity(unchecked) private var tls: TLSTransport?

    /// Adopts a connected non-blocking fd (from a listener or `SocketAddress.connect`) on `loop`.
    /// Call on the loop thread. On error the fd is closed. The fd must be the only descriptor of its socket
    /// (never `dup`ed): closing it is what removes it from epoll (see `EventLoop.deregister(closingFD:)`).
    /// - Parameter tls: speak TLS on the socket, in the context's role (server: wait for the client's hello).
    public init(adopting fd: Int32, on loop: EventLoop, peer: String, handler: any ConnectionHandler,
                maxQueuedBytes: Int = 1 << 20, tls: TLSContext? = nil) throws(SyscallError) {
        loop.assertInLoop()
        self.fd = fd
        self.loop = loop
        self.peer = peer
        self.handler = handler
        self.maxQueued32 = Int32(clamping: maxQueuedBytes)
        if let tls {
            guard let transport = TLSTransport(context: tls, fd: fd) else {
                closeFD(fd)
                throw SyscallError(call: "SSL_new", code: ENOMEM)
            }
            self.tls = transport
            // A TLS client speaks first (its hello): it waits for the socket to be writable (connected).
            if !tls.isServer { interest = Epoll.readable | Epoll.writable }
        }
        generation = loop.reserveGeneration()
        do {
            key = try loop.register(self, fd: fd, generation: generation, events: interest)
        } catch {
            closeFD(fd)
            throw error
        }
        loop.metrics.connectionsOpened += 1
    }

    deinit {
        spill.deallocate()
    }

    /// Whether the connection speaks TLS.
    public var isTLS: Bool { tls != nil }

    /// True until a close is requested.
    public var isOpen: Bool { state == .open }
    /// Bytes queued but not yet written (under TLS 1.3, with the sealed rest of a record the socket did not take).
    public var queuedBytes: Int { out.queuedBytes + (tls?.pendingOutBytes ?? 0) }

    // MARK: Writing

    /// Queues a shared buffer (no copy) and flushes it now or at the end of the iteration.
    @discardableResult
    public func write(_ bytes: SharedBytes) -> WriteResult {
        guard state == .open else { return .closed }
        if queuedBytes + bytes.count > maxQueuedBytes { return .overCap }
        out.append(bytes)
        if interest & Epoll.writable != 0 {
            // The socket is full and EPOLLOUT is armed: it will flush; trying now would only EAGAIN.
        } else if corked {
            if !flushScheduled {
                flushScheduled = true
                loop.scheduleFlush(self)
            }
        } else {
            flushNow()
        }
        return .accepted
    }

    /// Copies `bytes` into a new buffer and writes it. Prefer `write(_: SharedBytes)` for fan-out.
    @discardableResult
    public func write(copying bytes: UnsafeRawBufferPointer) -> WriteResult {
        guard state == .open else { return .closed }
        if queuedBytes + bytes.count > maxQueuedBytes { return .overCap }
        return write(SharedBytes(copying: bytes))
    }

    /// Drops queued bytes the kernel has not taken yet (keeping the rest of a partly written chunk), so that
    /// what is written next, such as a close frame for a slow reader, is the next thing the peer reads.
    public func discardUnsent() {
        guard state == .open else { return }
        out.dropUnsent()
    }

    /// Flushes now instead of at the end of the iteration. When the queue drains here, the caller sees
    /// `queuedBytes == 0` and `connectionWritable` is not called; when it does not, EPOLLOUT is armed.
    public func flush() {
        if state == .open || state == .draining { flushNow() }
    }

    /// Called by the loop at the end of the iteration for corked connections.
    func flushCorked() {
        flushScheduled = false
        if state == .open || state == .draining { flushNow(notify: true) }
    }

    /// - Parameter notify: tell the handler (`connectionWritable`) if this drains a queue that had pushed back;
    ///   false when the handler itself asked for the flush.
    private func flushNow(notify: Bool = false) {
        if tls?.phase == .handshaking { return }  // flushed when the handshake completes
        guard !out.isEmpty || tls?.hasPendingOut == true else {
            if state == .draining { shutdownWrite() }
            return
        }
        let result: OutboundQueue.FlushResult
        let written: Int
        var waitsForRead = false
        if let tls {
            (result, written, waitsForRead) = tls.flush(&out, fd: fd, loop: loop)
        } else {
            (result, written) = out.flush(fd: fd, iov: loop.iovecs)
        }
        loop.metrics.bytesOut += written
        switch result {
        case .pending:
            // A write that waits for a read is retried by the next read; EPOLLOUT would only spin.
            if !waitsForRead { setInterest(interest | Epoll.writable) }
        case .drained:
            let pushedBack = interest & Epoll.writable != 0
            if pushedBack { setInterest(interest & ~Epoll.writable) }
            if state == .draining {
                shutdownWrite()
            } else if pushedBack && notify {
                handler?.connectionWritable(self)
            }
        case .failed(let error):
            closeNow(reason: .error(error.code), abortive: false)
        }
    }

    private func setInterest(_ events: UInt32) {
        guard events != interest, state != .closed else { return }
        interest = events
        do {
            try loop.reregister(fd: fd, key: key, generation: generation, events: events)
        } catch {
            closeNow(reason: .error(error.code), abortive: false)
        }
    }

    // MARK: Reading

    /// Stops delivering reads (backpressure towards the peer); the kernel buffers, then TCP pushes back.
    public func pauseReading() {
        guard state == .open, !readingPaused else { return }
        readingPaused = true
        setInterest(interest & ~Epoll.readable)
    }

    /// Delivers reads again. Bytes the handler left unconsumed are handed back soon (on this loop, not
    /// from inside this call) even if the socket brings nothing new: a handler that paused between two
    /// complete messages gets the rest without waiting for the peer to send more.
    public func resumeReading() {
        guard state == .open, readingPaused, !inputEnded else { return }
        readingPaused = false
        setInterest(interest | Epoll.readable)
        if (spillCount > 0 || tlsHasPending) && !redeliveryScheduled {
            redeliveryScheduled = true
            let me = LoopBound(Weak(self), loop: loop)
            loop.execute { me.value.object?.redeliver() }
        }
    }

    /// The transport holds input already taken from the socket (OpenSSL's read-ahead): epoll will not report it.
    private var tlsHasPending: Bool { tls?.hasPendingInput == true }

    /// Hands the held bytes back to the handler without reading (after `resumeReading`).
    private func redeliver() {
        guard redeliveryScheduled else { return }
        redeliveryScheduled = false
        guard state == .open, !readingPaused, let handler else { return }
        guard spillCount > 0 else {
            if tlsHasPending { readAvailable() }
            return
        }
        let total = spillCount
        let consumed = handler.connectionReadable(self, UnsafeMutableRawBufferPointer(rebasing: spill[0..<total]))
        precondition(consumed >= 0 && consumed <= total, "handler consumed \(consumed) of \(total) bytes")
        guard state == .open else { return }
        keepTail(total - consumed, of: spill, consumed: consumed, inSpill: true)
        if !readingPaused && tlsHasPending { readAvailable() }
    }

    private func ensureSpill(capacity: Int) {
        guard spill.count < capacity else { return }
        var size = max(spill.count * 2, 4096)
        while size < capacity { size *= 2 }
        let bigger = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
        if spillCount > 0 { bigger.baseAddress!.copyMemory(from: spill.baseAddress!, byteCount: spillCount) }
        spill.deallocate()
        spill = bigger
    }

    private func readAvailable() {
        if redeliveryScheduled {
            // Held bytes first: they came before anything the socket has now (an EOF included).
            redeliver()
            guard state == .open, !readingPaused else { return }
        }
        var budget = loop.configuration.readBudgetPerWakeup
        let shared = loop.readBuffer
        while state != .closed && budget > 0 {
            // Small tails go in front of fresh bytes in the shared buffer; large ones stay put and
            // the socket is read straight into the spill buffer behind them.
            let useSpill = spillCount > shared.count / 2
            let buffer: UnsafeMutableRawBufferPointer
            let prefix = spillCount
            if useSpill {
                ensureSpill(capacity: spillCount + 64 * 1024)
                buffer = spill
            } else {
                buffer = shared
            }
            let room = buffer.count - prefix
            let result: IOResult<Int>
            do {
                if let tls {
                    // `room` is at least 64 KiB (the shared buffer's second half, or the spill's headroom): a record fits.
                    var effects = TLSTransport.ReadEffects()
                    result = try tls.read(fd: fd, into: buffer.baseAddress! + prefix, room: room, crypto: loop.tlsRecords, effects: &effects)
                    if effects.wantsWritable { setInterest(interest | Epoll.writable) }
                    if effects.flush && (state == .open || state == .draining) { flushNow(notify: true) }
                } else {
                    result = try syscall("read") { Glibc.read(fd, buffer.baseAddress! + prefix, room) }
                }
            } catch {
                closeNow(reason: .error(error.code), abortive: false)
                return
            }
            guard case .processed(let n) = result else { return }
            if n == 0 {
                if state == .open, let handler {
                    endInput()
                    if handler.connectionInputEnded(self) { return }  // it finishes its replies, then closes
                }
                closeNow(reason: state == .open ? .peerClosed : .closed, abortive: false)
                return
            }
            loop.metrics.bytesIn += n
            budget -= n
            guard state == .open, let handler else {
                spillCount = 0  // closing: discard what the peer still sends
                continue
            }
            if !useSpill && prefix > 0 {
                buffer.baseAddress!.copyMemory(from: spill.baseAddress!, byteCount: prefix)
            }
            let total = prefix + n
            let consumed = handler.connectionReadable(self, UnsafeMutableRawBufferPointer(rebasing: buffer[0..<total]))
            precondition(consumed >= 0 && consumed <= total, "handler consumed \(consumed) of \(total) bytes")
            guard state == .open else { return }
            keepTail(total - consumed, of: buffer, consumed: consumed, inSpill: useSpill)
            if readingPaused { return }
            // A short read means the socket is drained (skip the EAGAIN round trip), unless OpenSSL read ahead.
            if n < room && !tlsHasPending { return }
        }
        if state == .open && !readingPaused && tlsHasPending {
            // Out of budget with records already read from the socket: epoll will not say so; come back.
            let me = LoopBound(Weak(self), loop: loop)
            loop.execute { me.value.object?.continueReading() }
        }
    }

    /// Reads now what the peer may already have sent, without waiting for epoll to say so: for a connection just
    /// accepted, whose client usually sent its request (or TLS hello) right after connecting. Finds nothing at the
    /// cost of one `read` returning EAGAIN; finds the request at the saving of a trip through `epoll_wait`.
    public func readEarly() {
        handleEvents(Epoll.readable)
    }

    private func continueReading() {
        if state == .open && !readingPaused { readAvailable() }
    }

    // MARK: TLS

    /// Advances the TLS handshake and acts on where it got.
    private func driveHandshake(_ tls: TLSTransport) {
        switch tls.advanceHandshake(fd: fd) {
        case .waiting(let events):
            if let events { setInterest(events) }
        case .answerInClear(let answer):
            // The connection goes on in the clear, for this answer only: queued, then a graceful close that reads
            // and discards the rest of the request (closing with it unread would reset the connection, and a
            // client still writing its request would get EPIPE or lose the answer).
            loop.metrics.tlsPlaintextRefused += 1
            self.tls = nil
            setInterest(Epoll.readable)
            out.append(SharedBytes(answer))
            close(.graceful(linger: .seconds(2)))
        case .established(let handedOff):
            if handedOff { loop.metrics.tlsRecordLayerConnections += 1 }
            loop.metrics.tlsHandshakes += 1
            setInterest(readingPaused ? 0 : Epoll.readable)
            flushNow(notify: true)
            if state == .open && !readingPaused && tlsHasPending { readAvailable() }
        case .failed(let reason, let counted):
            if counted { loop.metrics.tlsHandshakeFailures += 1 }
            closeNow(reason: reason, abortive: false)
        }
    }

    /// The peer's EOF was read: nothing more will be read (EPOLLIN and EPOLLRDHUP stay on at EOF, so they go off;
    /// EPOLLHUP, reported regardless, still closes the connection if the peer hangs up entirely).
    private func endInput() {
        inputEnded = true
        readingPaused = true
        redeliveryScheduled = false
        spillCount = 0
        setInterest(interest & ~Epoll.readable)
    }

    /// Keeps the `tail` bytes after `consumed` in `buffer` (the spill buffer itself when `inSpill`) for the next
    /// delivery, in the spill buffer.
    private func keepTail(_ tail: Int, of buffer: UnsafeMutableRawBufferPointer, consumed: Int, inSpill: Bool) {
        if tail > 0 {
            if inSpill {
                if consumed > 0 { spill.baseAddress!.copyMemory(from: spill.baseAddress! + consumed, byteCount: tail) }
            } else {
                spillCount = 0
                ensureSpill(capacity: tail)
                spill.baseAddress!.copyMemory(from: buffer.baseAddress! + consumed, byteCount: tail)
            }
        } else if spill.count > 64 * 1024 {
            // A large message passed; give the memory back.
            spill.deallocate()
            spill = UnsafeMutableRawBufferPointer(start: nil, count: 0)
        }
        spillCount = tail
    }

    // MARK: Events

    func handleEvents(_ events: UInt32) {
        if let tls, tls.phase == .handshaking {
            if events & Epoll.error != 0 {
                loop.metrics.tlsHandshakeFailures += 1
                closeNow(reason: socketError().map { .error($0) } ?? .peerClosed, abortive: false)
            } else if state != .closed {
                driveHandshake(tls)
            }
            return
        }
        if events & Epoll.writable != 0 && tls?.readWantsWrite == true && state != .closed {
            tls?.readWantsWrite = false
            if out.isEmpty { setInterest(interest & ~Epoll.writable) }
            if !readingPaused { readAvailable() }
        }
        if events & Epoll.writable != 0 && state != .closed {
            flushNow(notify: true)
        }
        if events & (Epoll.readable | Epoll.hangup | Epoll.error) != 0 && state != .closed {
            if readingPaused && events & (Epoll.hangup | Epoll.error) != 0 {
                closeNow(reason: socketError().map { .error($0) } ?? .peerClosed, abortive: false)
            } else if !readingPaused {
                readAvailable()
            }
        }
    }

    private func socketError() -> Int32? {
        var code: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &code, &len)
        return code == 0 ? nil : code
    }

    // MARK: Closing

    /// Closes the connection. `connectionClosed` follows at the end of the loop iteration.
    public func close(_ mode: CloseMode = .abort) {
        switch mode {
        case .abort:
            closeNow(reason: .aborted, abortive: true)
        case .flushAndClose:
            guard state == .open else { return }
            flushNow()
            if state != .closed { closeNow(reason: .closed, abortive: false) }
        case .graceful(let linger):
            guard state == .open else { return }
            state = .draining
            if readingPaused && !inputEnded {
                readingPaused = false
                setInterest(interest | Epoll.readable)
            }
            lingerTimer = loop.timers.schedule(afterNanos: linger.engineNanos) { [weak self] in
                self?.closeNow(reason: .lingerTimeout, abortive: true)
            }
            flushNow()
        }
    }

    private func shutdownWrite() {
        guard state == .draining else { return }
        state = .halfClosed
        tls?.sendCloseNotify(fd: fd, crypto: loop.tlsRecords)
        _ = Glibc.shutdown(fd, Int32(SHUT_WR))
        // Now wait for the peer's EOF (readAvailable discards data and closes on 0), unless it came first.
        if inputEnded { closeNow(reason: .closed, abortive: false) }
    }

    private func closeNow(reason: CloseReason, abortive: Bool) {
        guard state != .closed else { return }
        state = .closed
        closeReason = reason
        loop.timers.cancel(lingerTimer)
        if abortive {
            // SO_LINGER 0: the kernel sends RST and drops unsent data instead of lingering.
            var l = linger(l_onoff: 1, l_linger: 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
        }
        loop.deregister(fd: fd, key: key, generation: generation, closingFD: true)
        closeFD(fd)
        out.removeAll()
        spillCount = 0
        loop.scheduleClose(self)
    }

    /// End of iteration: tell the handler and drop it (breaking any handler ↔ connection cycle).
    func finishClose() {
        loop.metrics.connectionsClosed += 1
        tls?.release()
        let h = handler
        handler = nil
        h?.connectionClosed(self, reason: closeReason)
    }
}

extension Connection: LoopSelectable {
    func loopStopping() {
        closeNow(reason: .loopStopped, abortive: false)
    }
}

@available(*, unavailable)
extension Connection: Sendable {}
