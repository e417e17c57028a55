/// Per-loop counters. They are plain integers mutated only on the loop thread (no atomics on the
/// hot path); read them with `EventLoop.metricsSnapshot()`, which copies them on the loop.
public struct EngineMetrics: Sendable, Equatable {
    public var bytesIn = 0
    public var bytesOut = 0
    public var accepts = 0
    /// Failed accept4 calls by errno (EMFILE, ENFILE, ENOBUFS, …); EAGAIN is not a failure.
    public var acceptFailures: [Int32: Int] = [:]
    /// Times a listener ran out of descriptors (counted once per burst, not per attempt).
    public var descriptorExhaustions = 0
    /// Connections accepted on the reserve descriptor and closed at once while out of descriptors.
    public var shedConnections = 0
    public var connectionsOpened = 0
    public var connectionsClosed = 0
    /// TLS handshakes completed, and failed (bad hello, old protocol version, no common cipher, peer gone).
    public var tlsHandshakes = 0
    public var tlsHandshakeFailures = 0
    /// TLS 1.3 connections whose record layer the hub runs itself after the handshake (OpenSSL's state freed).
    public var tlsRecordLayerConnections = 0
    /// Peers that spoke plain HTTP to a TLS port (answered in the clear, then closed).
    public var tlsPlaintextRefused = 0
    /// Iterations that ran waiting inbox jobs without polling epoll first (see `EventLoop.iterate`).
    public var pollsSkipped = 0
    /// Times this loop's inbox was run by another loop's thread while its own slept (see `EventLoop.runBorrowed`).
    public var borrowedRuns = 0
    public var openConnections: Int { connectionsOpened - connectionsClosed }

    public init() {}

    /// Sums counters across loops.
    public static func + (a: EngineMetrics, b: EngineMetrics) -> EngineMetrics {
        var r = a
        r.bytesIn += b.bytesIn
        r.bytesOut += b.bytesOut
        r.accepts += b.accepts
        r.acceptFailures.merge(b.acceptFailures, uniquingKeysWith: +)
        r.descriptorExhaustions += b.descriptorExhaustions
        r.shedConnections += b.shedConnections
        r.connectionsOpened += b.connectionsOpened
        r.connectionsClosed += b.connectionsClosed
        r.tlsHandshakes += b.tlsHandshakes
        r.tlsHandshakeFailures += b.tlsHandshakeFailures
        r.tlsRecordLayerConnections += b.tlsRecordLayerConnections
        r.tlsPlaintextRefused += b.tlsPlaintextRefused
        r.pollsSkipped += b.pollsSkipped
        r.borrowedRuns += b.borrowedRuns
        return r
    }
}
