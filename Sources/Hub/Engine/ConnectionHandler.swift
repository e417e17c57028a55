/// Why a connection ended; delivered once, at the end of the loop iteration in which it closed.
public enum CloseReason: Sendable, Equatable, CustomStringConvertible {
    /// The peer sent EOF (or hung up).
    case peerClosed
    /// A read or write failed with this errno (ECONNRESET, EPIPE, ETIMEDOUT, …).
    case error(Int32)
    /// We closed abortively (`close(.abort)`).
    case aborted
    /// A graceful close completed: queue flushed, write side shut down, peer's EOF seen.
    case closed
    /// A graceful close did not finish within its linger time.
    case lingerTimeout
    /// The event loop stopped.
    case loopStopped

    public var description: String {
        switch self {
        case .peerClosed: "peer closed"
        case .error(let code): "error \(code)"
        case .aborted: "aborted"
        case .closed: "closed"
        case .lingerTimeout: "linger timeout"
        case .loopStopped: "loop stopped"
        }
    }
}

/// The callbacks of one connection. All run on the connection's loop thread.
///
/// The engine holds the handler strongly until `connectionClosed`, then drops it, so a handler may
/// keep a strong reference to its `Connection` without leaking.
public protocol ConnectionHandler: AnyObject {
    /// Bytes arrived. `bytes` is the loop's shared read buffer (or this connection's spill buffer),
    /// preceded by any tail left unconsumed last time; the handler may mutate it in place (unmask).
    /// - Returns: how many leading bytes were consumed. The unconsumed tail is kept by the engine
    ///   and handed back, in front of the next bytes, on the next call; a handler that paused
    ///   reading gets it back soon after `resumeReading` even if no new bytes arrive (so it may stop
    ///   between two complete messages). The buffer is only valid during the call.
    func connectionReadable(_ connection: Connection, _ bytes: UnsafeMutableRawBufferPointer) -> Int

    /// The outbound queue drained after the socket had pushed back (EPOLLOUT armed), whether the
    /// drain came from EPOLLOUT or from the end-of-iteration flush. A good moment to resume
    /// producing. Not called for writes that went out immediately, nor for a drain inside the
    /// handler's own `flush()` call.
    func connectionWritable(_ connection: Connection)

    /// The connection is closed and its fd is gone; called exactly once.
    func connectionClosed(_ connection: Connection, reason: CloseReason)

    /// The peer has finished sending: its EOF was read (a half-close, `shutdown(SHUT_WR)`, or a close), after
    /// every byte before it was handed to `connectionReadable` (an unconsumed tail, such as a last line without
    /// its newline, is dropped).
    /// - Returns: false (the default) to close the connection now (`.peerClosed`); true to keep it open for
    ///   writing: the engine reads no more, and the handler finishes its replies and then closes it, usually with
    ///   `close(.graceful(linger:))` (which then closes as soon as the queue is flushed). A peer that hangs up
    ///   entirely meanwhile still closes the connection (`.peerClosed`).
    func connectionInputEnded(_ connection: Connection) -> Bool
}

extension ConnectionHandler {
    public func connectionWritable(_ connection: Connection) {}
    public func connectionInputEnded(_ connection: Connection) -> Bool { false }
}
