import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// A Unix datagram socket standing in for the service manager's `$NOTIFY_SOCKET`.
final class NotifySocket: @unchecked Sendable {
    let fd: Int32
    /// What `NOTIFY_SOCKET` should say: the path, or `@name` for an abstract address.
    let address: String

    /// `path`: a filesystem socket there; nil: an abstract one with a random name.
    init(path: String?) throws {
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HubTestError("socket: errno \(errno)") }
        var sun = sockaddr_un()
        sun.sun_family = sa_family_t(AF_UNIX)
        var bytes: [UInt8]
        if let path {
            bytes = Array(path.utf8) + [0]
            address = path
        } else {
            let name = "hubtest-notify-\(UUID().uuidString.prefix(8))"
            bytes = [0] + Array(name.utf8)
            address = "@" + name
        }
        withUnsafeMutableBytes(of: &sun.sun_path) { $0.copyBytes(from: bytes) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count - (path == nil ? 0 : 1))
        let rc = withUnsafePointer(to: &sun) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        guard rc == 0 else { let e = errno; close(fd); throw HubTestError("bind \(address): errno \(e)") }
    }

    deinit { close(fd) }

    /// The next datagram, or nil when none arrives within `timeout` seconds.
    func receive(timeout: Double) -> String? {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, Int32(timeout * 1000)) == 1 else { return nil }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        return n >= 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : nil
    }

    /// Datagrams until one satisfies `match` (returned with everything before it), or nil at `timeout`.
    func receive(until match: (String) -> Bool, timeout: Double) -> (match: String, before: [String])? {
        let deadline = Date().addingTimeInterval(timeout)
        var before: [String] = []
        while Date() < deadline {
            guard let datagram = receive(timeout: max(0.01, deadline.timeIntervalSinceNow)) else { continue }
            if match(datagram) { return (datagram, before) }
            before.append(datagram)
        }
        return nil
    }
}

/// sd_notify against the real binary: the hub reports readiness, status, reloads and shutdown to a datagram socket
/// the test holds, and pings the watchdog.
@Suite struct ServiceNotifyTests {
    static func lines(_ datagram: String) -> [Substring] { datagram.split(separator: "\n") }

    @Test func readyOnlyOnceListeningThenStatusWatchdogReloadingAndStopping() throws {
        let directory = NSTemporaryDirectory() + "hubtest-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let notify = try NotifySocket(path: directory + "/notify")
        let port = try ListenOwnershipTests.freePort()
        let socketPath = directory + "/hub.sock"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: HubProcess.executablePath)
        process.arguments = ["--listen", "127.0.0.1:\(port)", "--socket", socketPath, "--state-dir", directory + "/state", "--threads", "2"]
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("HUB_") }
        environment["NOTIFY_SOCKET"] = notify.address
        environment["WATCHDOG_USEC"] = "400000"
        environment["WATCHDOG_PID"] = nil  // the manager sets it to the hub's pid, unknown before the start
        environment["HUB_LOG_FORMAT"] = "text"
        process.environment = environment
        let logPath = directory + "/hub.log"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        process.standardError = FileHandle(forWritingAtPath: logPath)
        process.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() } }
        func log() -> String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

        // The first datagram is READY=1 (with a STATUS), and at that moment both the port and the Unix socket
        // answer at the first try: READY comes after the binds, never before.
        let ready = try #require(notify.receive(timeout: 20), "no datagram: \(log())")
        #expect(Self.lines(ready).first == "READY=1", "\(ready)")
        let tcp = try TestWebSocket.tcpConnect(port: port)
        close(tcp)
        #expect(try AdminClient(socketPath: socketPath).request(#"{"op":"stats"}"#).isEmpty == false)
        let status = #/STATUS=\d+ connections, \d+\.\d messages/s in, \d+\.\d messages/s out/#
        #expect(Self.lines(ready).contains { $0.wholeMatch(of: status) != nil }, "\(ready)")

        // Rounds of 200 ms (half of WATCHDOG_USEC): watchdog pings and status lines keep coming.
        var received: [String] = []
        let until = Date().addingTimeInterval(2)
        while Date() < until { if let d = notify.receive(timeout: 0.1) { received.append(d) } }
        #expect(received.filter { $0 == "WATCHDOG=1" }.count >= 4, "\(received)")
        #expect(received.filter { $0.wholeMatch(of: status) != nil }.count >= 4, "\(received)")

        // SIGHUP: RELOADING=1 with the monotonic time, then READY=1 again.
        kill(process.processIdentifier, SIGHUP)
        let reloading = try #require(notify.receive(until: { $0.hasPrefix("RELOADING=1") }, timeout: 5), "\(log())")
        let usec = Self.lines(reloading.match).first { $0.hasPrefix("MONOTONIC_USEC=") }.flatMap { UInt64($0.dropFirst(15)) }
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let nowUsec = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
        #expect(usec.map { $0 <= nowUsec && nowUsec - $0 < 10_000_000 } == true, "\(reloading.match)")
        #expect(notify.receive(until: { $0 == "READY=1" }, timeout: 5) != nil)

        // SIGTERM: STOPPING=1, then a clean exit.
        kill(process.processIdentifier, SIGTERM)
        #expect(notify.receive(until: { $0 == "STOPPING=1" }, timeout: 5) != nil, "\(log())")
        let deadline = Date().addingTimeInterval(10)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        #expect(!process.isRunning && process.terminationStatus == 0, "\(log())")
    }

    @Test func anAbstractAddressWorksAndNoWatchdogWithoutWatchdogUsec() throws {
        let notify = try NotifySocket(path: nil)
        let hub = try HubProcess(environment: ["NOTIFY_SOCKET": notify.address])
        let ready = try #require(notify.receive(timeout: 10), "\(hub.log)")
        #expect(Self.lines(ready).first == "READY=1", "\(ready)")
        // One round is 2 s without a watchdog: a status line, and no ping.
        let next = notify.receive(timeout: 4)
        #expect(next?.hasPrefix("STATUS=") == true, "\(next ?? "nothing")")
        #expect(hub.stop() == 0)
        #expect(notify.receive(until: { $0 == "STOPPING=1" }, timeout: 2)?.before.contains("WATCHDOG=1") == false)
    }

    @Test func watchdogSettingsFromTheEnvironment() throws {
        #expect(ServiceNotifier.watchdogPeriod(environment: ["WATCHDOG_USEC": "30000000"], pid: 42) == 15_000_000_000)
        #expect(ServiceNotifier.watchdogPeriod(environment: ["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"], pid: 42) == 15_000_000_000)
        #expect(ServiceNotifier.watchdogPeriod(environment: ["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"], pid: 42) == nil)
        #expect(ServiceNotifier.watchdogPeriod(environment: ["WATCHDOG_USEC": "0"], pid: 42) == nil)
        #expect(ServiceNotifier.watchdogPeriod(environment: ["WATCHDOG_USEC": "soon"], pid: 42) == nil)
        #expect(ServiceNotifier.watchdogPeriod(environment: [:], pid: 42) == nil)
        #expect(try ServiceNotifier(environment: [:]) == nil)
        #expect(try ServiceNotifier(environment: ["NOTIFY_SOCKET": ""]) == nil)
        #expect(throws: ServiceNotifier.NotifyError.self) { try ServiceNotifier(environment: ["NOTIFY_SOCKET": "/" + String(repeating: "x", count: 200)]) }
        #expect(throws: ServiceNotifier.NotifyError.self) { try ServiceNotifier(environment: ["NOTIFY_SOCKET": "@"]) }
    }

    /// A loop that misses a tick stops the pings until it ticks again.
    @Test func aLoopThatDoesNotTickStopsThePings() {
        var rounds = WatchdogRounds(loops: 3)
        #expect(rounds.begin() == false)  // round 1 starts; nothing ticked before it
        for loop in 0..<3 { rounds.tick(loop: loop, round: 1) }
        #expect(rounds.begin() == true)  // round 2
        rounds.tick(loop: 0, round: 2)
        rounds.tick(loop: 2, round: 2)
        #expect(rounds.begin() == false)  // loop 1 is stuck; round 3
        #expect(rounds.begin() == false)  // still nothing from it; round 4
        for loop in 0..<3 { rounds.tick(loop: loop, round: 4) }
        #expect(rounds.begin() == true)
        rounds.tick(loop: 9, round: 5)  // no such loop: ignored
    }
}
