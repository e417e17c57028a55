import Glibc
import HubEngine
import Synchronization

/// The service manager's notification protocol (sd_notify(3)) without libsystemd: newline-separated `KEY=VALUE`
/// datagrams to the Unix datagram socket in `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
/// Without `$NOTIFY_SOCKET` there is no notifier and the hub sends nothing.
///
/// What the hub sends: `READY=1` once every listener and the Unix socket are bound and the state is loaded;
/// `STATUS=` with connections and message rates every round; `RELOADING=1` with `MONOTONIC_USEC=` before a SIGHUP
/// reload and `READY=1` after it; `STOPPING=1` when shutdown begins; `WATCHDOG=1` (with `$WATCHDOG_USEC`) only when
/// every event loop has run the previous round's tick, so a wedged loop stops the pings and the manager restarts
/// the hub.
public final class ServiceNotifier: Sendable {
    private let fd: Int32
    private let address: sockaddr_un
    private let addressLength: socklen_t
    /// Half of `$WATCHDOG_USEC` in nanoseconds (the manager's recommendation), or nil without a watchdog (or one meant
    /// for another process: `$WATCHDOG_PID`).
    public let watchdogPeriodNanos: UInt64?

    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` from `environment`. Nil when `NOTIFY_SOCKET` is unset
    /// or empty; throws (a message for the log) when it is set but unusable.
    public init?(environment: [String: String], pid: pid_t = getpid()) throws(NotifyError) {
        guard let target = environment["NOTIFY_SOCKET"], !target.isEmpty else { return nil }
        var sun = sockaddr_un()
        sun.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(target.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }  // the abstract namespace: a leading NUL, no terminator
        let capacity = MemoryLayout.size(ofValue: sun.sun_path)
        let length = bytes.count, shortest = abstract ? 2 : 1
        guard length >= shortest, length < capacity else {
            throw NotifyError(description: "NOTIFY_SOCKET \(target) is not a usable socket address (at most \(capacity - 1) bytes)")
        }
        withUnsafeMutableBytes(of: &sun.sun_path) { raw in raw.copyBytes(from: bytes) }
        address = sun
        addressLength = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (abstract ? 0 : 1))
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | LinuxSyscalls.CLOEXEC, 0)
        guard fd >= 0 else { throw NotifyError(description: "NOTIFY_SOCKET: socket(): \(String(cString: strerror(errno)))") }
        watchdogPeriodNanos = Self.watchdogPeriod(environment: environment, pid: pid)
    }

    deinit { close(fd) }

    public struct NotifyError: Error, CustomStringConvertible, Sendable { public let description: String }

    /// Half of `WATCHDOG_USEC` in ns, when it is a positive number and `WATCHDOG_PID` (if set) is this process.
    static func watchdogPeriod(environment: [String: String], pid: pid_t) -> UInt64? {
        guard let text = environment["WATCHDOG_USEC"], let usec = UInt64(text), usec > 0, usec < UInt64.max / 1000 else { return nil }
        if let owner = environment["WATCHDOG_PID"], !owner.isEmpty, pid_t(owner) != pid { return nil }
        return usec * 1000 / 2
    }

    /// Sends one datagram. False when it could not be sent (the manager is gone): notifications are best effort.
    @discardableResult
    public func send(_ message: String) -> Bool {
        let bytes = Array(message.utf8)
        var target = address
        let sent = withUnsafePointer(to: &target) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), sa, addressLength) }
            }
        }
        return sent == bytes.count
    }

    /// `RELOADING=1` with the current CLOCK_MONOTONIC time, as `Type=notify-reload` expects.
    public func reloading() {
        send("RELOADING=1\nMONOTONIC_USEC=\(monotonicNanos() / 1000)")
    }
}

/// Whether every loop ticked since the last watchdog ping. The pinger starts a round (`begin`), each loop marks it
/// from its own thread (`tick`), and the next round's `begin` says whether the previous one completed: a loop that
/// is blocked never marks, so the pings stop.
struct WatchdogRounds: Sendable {
    private(set) var round: UInt64 = 0
    private var ticked: [UInt64]

    init(loops: Int) { ticked = Array(repeating: 0, count: loops) }

    /// Loop `index` ran round `round`'s tick.
    mutating func tick(loop index: Int, round: UInt64) {
        guard ticked.indices.contains(index) else { return }
        ticked[index] = max(ticked[index], round)
    }

    /// Starts the next round; true when every loop ticked the one before (false for the first: nothing has
    /// ticked yet).
    mutating func begin() -> Bool {
        let complete = round > 0 && ticked.allSatisfy { $0 >= round }
        round += 1
        return complete
    }
}
