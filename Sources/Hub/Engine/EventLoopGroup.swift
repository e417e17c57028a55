import Glibc
import Synchronization

/// N event loops (default: one per online core), handed out round-robin.
///
/// The hub runs one loop per core and lets them share one listening socket (`TCPListener`); the load generator uses
/// `next()` to spread its outgoing connections.
public final class EventLoopGroup: Sendable {
    public let loops: [EventLoop]
    private let cursor = Atomic<Int>(0)

    /// Online CPU cores (at least 1).
    public static var coreCount: Int { max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN))) }

    /// Starts `loopCount` loops, each on its own thread.
    public init(loopCount: Int = EventLoopGroup.coreCount, configuration: EventLoop.Configuration = .init()) throws(SyscallError) {
        precondition(loopCount > 0)
        var loops: [EventLoop] = []
        do {
            for i in 0..<loopCount { loops.append(try EventLoop(index: i, configuration: configuration)) }
        } catch {
            for loop in loops { loop.stop() }
            for loop in loops { loop.join() }
            throw error
        }
        self.loops = loops
    }

    /// The next loop, round-robin. Any thread.
    public func next() -> EventLoop {
        loops[(cursor.wrappingAdd(1, ordering: .relaxed).oldValue & Int.max) % loops.count]
    }

    /// Stops every loop and waits for their threads. Not callable from a loop thread.
    public func shutdown() {
        for loop in loops { loop.stop() }
        for loop in loops { loop.join() }
    }

    /// Sum of every loop's counters (each taken on its loop).
    public func metricsSnapshot() -> EngineMetrics {
        loops.reduce(EngineMetrics()) { $0 + $1.metricsSnapshot() }
    }
}
