/// What a listener tells its owner. All callbacks run on the listener's loop thread.
///
/// One delegate is made per loop (`makeDelegate` on `TCPListener.bind`/`UnixListener.bind`), so it
/// can hold loop-local state (the loop's connection table) without locks.
public protocol ListenerDelegate: AnyObject {
    /// A new connection: `fd` is non-blocking and close-on-exec (TCP: TCP_NODELAY, inherited from the listening socket).
    /// Take ownership (typically `Connection(adopting: fd, on: loop, peer: peer, handler: …)`)
    /// or close it.
    func accepted(fd: Int32, peer: String, on loop: EventLoop)

    /// The process is out of descriptors and this connection was accepted on the reserve slot.
    /// Write a short refusal if you like (the hub sends HTTP 503 JSON) with one non-blocking
    /// `send(fd, …, MSG_NOSIGNAL)`; the engine closes `fd` right after this returns.
    func shedding(fd: Int32, on loop: EventLoop)

    /// Descriptor exhaustion began (EMFILE or ENFILE). Called once per burst — not per failed
    /// accept — so it can be logged; `EngineMetrics.descriptorExhaustions` counts bursts and
    /// `shedConnections` the refused connections.
    func descriptorsExhausted(errno: Int32, on loop: EventLoop)
}

extension ListenerDelegate {
    public func shedding(fd: Int32, on loop: EventLoop) {}
    public func descriptorsExhausted(errno: Int32, on loop: EventLoop) {}
}
