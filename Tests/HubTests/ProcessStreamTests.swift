import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The real `hub` started with its stderr closed (`2>&-`) or as a pipe whose reader the test closes, so there is no
/// log file to read the startup line from: the port comes from `{"op":"stats"}` on the socket instead.
final class BareHub: @unchecked Sendable {
    enum Stderr {
        /// `exec hub 2>&-` through /bin/sh.
        case closed
        /// The write end of a pipe the test owns (the child gets it as fd 2; the test closes its copy).
        case pipe(writeFD: Int32)
    }

    let process = Process()
    let directory: String
    let socketPath: String
    let stateDirectory: String
    private(set) var port = 0

    init(stderr: Stderr, arguments: [String] = []) throws {
        directory = NSTemporaryDirectory() + "hubtest-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        socketPath = directory + "/hub.sock"
        stateDirectory = directory + "/state"
        let hubArguments = ["--listen", "127.0.0.1:0", "--socket", socketPath, "--state-dir", stateDirectory,
                            "--threads", "2"] + arguments
        switch stderr {
        case .closed:
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", #"exec "$0" "$@" 2>&-"#, HubProcess.executablePath] + hubArguments
        case .pipe(let writeFD):
            process.executableURL = URL(fileURLWithPath: HubProcess.executablePath)
            process.arguments = hubArguments
            process.standardError = FileHandle(fileDescriptor: writeFD, closeOnDealloc: false)
        }
        process.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("HUB_") }
        process.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline && process.isRunning {
            if let stats = try? stats(), let listen = stats["listen"] as? String,
               let port = listen.split(separator: ":").last.flatMap({ Int($0) }) {
                self.port = port
                return
            }
            usleep(20_000)
        }
        let status = process.isRunning ? "still running" : "exited \(process.terminationStatus) (\(process.terminationReason == .exit ? "exit" : "signal"))"
        stop()
        throw HubTestError("hub did not answer on its socket: \(status)")
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    func stats() throws -> [String: Any] {
        let reply = try AdminClient(socketPath: socketPath, readTimeout: 2).request(#"{"op":"stats"}"#)
        return try parseObject(reply)["stats"] as? [String: Any] ?? [:]
    }

    func publish(account: String) throws -> [String: Any] {
        let line = #"{"op":"publish","channel":"wallet_updates","account":\#(jsonString(account)),"type":"t","data":{"n":1}}"#
        return try parseObject(try AdminClient(socketPath: socketPath, readTimeout: 2).request(line))
    }

    func client(_ account: String) throws -> TestWebSocket {
        let secret = try SecretFile.read(path: stateDirectory + "/jwt-secret").secret
        let now = Int64(time(nil))
        let token = try JWTSigner(key: .hmacSecret(secret)).sign(JWTClaims(sub: account, exp: now + 900, iat: now))
        let ws = try TestWebSocket.connect(port: port, headers: [("Authorization", "Bearer \(token)")])
        try ws.send(json: ["type": "subscribe", "channels": ["wallet_updates"], "id": "sub"])
        let reply = try ws.nextJSON()
        guard reply["type"] as? String == "subscribed" else { throw HubTestError("subscribe failed: \(reply)") }
        return ws
    }

    /// (status, exited normally) once the process ended within `timeout`; nil if it had to be killed.
    func waitForExit(timeout: Double) -> (status: Int32, exited: Bool)? {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { return nil }
        return (process.terminationStatus, process.terminationReason == .exit)
    }

    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        if waitForExit(timeout: 5) == nil {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}

/// Runs `script` with /bin/sh (`$0`, `$@` = `arguments`), bounded: the exit status (nil when killed by a signal or
/// after the timeout) and what it wrote to stderr.
func runShell(_ script: String, _ arguments: [String], timeout: Double = 10) throws -> (status: Int32?, stderr: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/sh")
    process.arguments = ["-c", script] + arguments
    var env = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("HUB_") }
    env["NO_COLOR"] = nil
    process.environment = env
    let errPath = NSTemporaryDirectory() + "hubtest-sh-" + UUID().uuidString.prefix(8) + ".err"
    _ = FileManager.default.createFile(atPath: errPath, contents: nil)
    defer { try? FileManager.default.removeItem(atPath: errPath) }
    process.standardError = FileHandle(forWritingAtPath: errPath)
    process.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
    process.standardInput = FileHandle(forReadingAtPath: "/dev/null")
    try process.run()
    let deadline = Date().addingTimeInterval(timeout)
    while process.isRunning && Date() < deadline { usleep(10_000) }
    if process.isRunning {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        return (nil, "killed after \(timeout)s")
    }
    let stderr = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
    return (process.terminationReason == .exit ? process.terminationStatus : nil, stderr)
}

/// A pipe (read end, write end) whose ends are close-on-exec from the start, so that no process another test
/// starts meanwhile inherits the read end and keeps the pipe readable. (`pipe2` is not in the Glibc module: a
/// FIFO opened with O_CLOEXEC is the same kernel object.)
func closeOnExecPipe() throws -> (Int32, Int32) {
    let path = NSTemporaryDirectory() + "hubtest-fifo-" + UUID().uuidString.prefix(8)
    guard mkfifo(path, 0o600) == 0 else { throw HubTestError("mkfifo: \(errno)") }
    defer { unlink(path) }
    let readFD = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
    guard readFD >= 0 else { throw HubTestError("open fifo: \(errno)") }
    let writeFD = open(path, O_WRONLY | O_CLOEXEC)
    guard writeFD >= 0 else { close(readFD); throw HubTestError("open fifo: \(errno)") }
    _ = fcntl(readFD, F_SETFL, fcntl(readFD, F_GETFL) & ~O_NONBLOCK)
    return (readFD, writeFD)
}

/// Runs `binary ARGS` with descriptor `fd` (stdout or stderr) a pipe whose read end is already closed, the other
/// one /dev/null; its exit status, nil when a signal ended it (or it had to be killed after `timeout`).
func runWithDeadPipe(_ binary: String, _ arguments: [String], as fd: Int32, timeout: Double = 10) throws -> Int32? {
    let fds = try closeOnExecPipe()
    close(fds.0)
    defer { close(fds.1) }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: binary)
    process.arguments = arguments
    process.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("HUB_") }
    let dead = FileHandle(fileDescriptor: fds.1, closeOnDealloc: false)
    let null = FileHandle(forWritingAtPath: "/dev/null")
    process.standardOutput = fd == STDOUT_FILENO ? dead : null
    process.standardError = fd == STDERR_FILENO ? dead : null
    process.standardInput = FileHandle(forReadingAtPath: "/dev/null")
    try process.run()
    let deadline = Date().addingTimeInterval(timeout)
    while process.isRunning && Date() < deadline { usleep(10_000) }
    if process.isRunning {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        return nil
    }
    return process.terminationReason == .exit ? process.terminationStatus : nil
}

/// Breaks 4 and 5 of issue 14: a log line must never kill the hub or hubctl, whatever became of stderr.
@Suite struct ProcessStreamTests {
    /// The witness keeps receiving events, and SIGTERM still shuts down gracefully: 1001, exit 0, socket removed.
    static func expectServingThenGracefulShutdown(_ hub: BareHub, witness: TestWebSocket) throws {
        let reply = try hub.publish(account: "acc_w")
        #expect(reply["delivered"] as? Int == 1, "\(reply)")
        #expect(try witness.nextText().contains(#""type":"t""#))
        kill(hub.process.processIdentifier, SIGTERM)
        let close = try witness.expectClose(timeout: 5)
        #expect(close.code == 1001)
        try witness.sendClose(code: 1001)
        let exit = hub.waitForExit(timeout: 8)
        #expect(exit?.exited == true && exit?.status == 0, "exit: \(String(describing: exit))")
        #expect(access(hub.socketPath, F_OK) != 0, "the socket file is still there")
    }

    /// A refused client makes the hub log "at the connection limit" (`--max-connections 1`, the witness holds the slot).
    static func provokeLogLine(port: Int) throws {
        let response = try rawHTTP(port: port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(response.status == 503, "\(response)")
    }

    @Test func hubWithStderrClosedServesAndShutsDownGracefully() throws {
        // Before the fix the hub died (SIGILL, exit 132) on its first log line, the startup line.
        let hub = try BareHub(stderr: .closed, arguments: ["--max-connections", "1"])
        // The closed descriptor was reopened on /dev/null: no socket or file can become fd 2 and receive log lines.
        let target = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(hub.process.processIdentifier)/fd/2")
        #expect(target == "/dev/null")
        let witness = try hub.client("acc_w")
        try Self.provokeLogLine(port: hub.port)
        try Self.expectServingThenGracefulShutdown(hub, witness: witness)
    }

    @Test func hubKeepsServingAfterItsLogReaderWentAway() throws {
        let (readFD, writeFD) = try closeOnExecPipe()
        let hub: BareHub
        do {
            defer { close(writeFD) }  // the child has its own copy as fd 2
            hub = try BareHub(stderr: .pipe(writeFD: writeFD), arguments: ["--max-connections", "1"])
        }
        // Read the startup line, as `hub 2>&1 | tee` would, then the reader goes away.
        var seen = ""
        let deadline = Date().addingTimeInterval(10)
        while !seen.contains("listening on"), Date() < deadline {
            var pfd = pollfd(fd: readFD, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 100) > 0 else { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = chunk.withUnsafeMutableBytes { read(readFD, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            seen += String(decoding: chunk[0..<n], as: UTF8.self)
        }
        #expect(seen.contains("listening on"), "\(seen)")
        close(readFD)

        let witness = try hub.client("acc_w")
        // The next log lines now meet EPIPE: the refusal's, then SIGTERM's. Before the fix either was fatal.
        try Self.provokeLogLine(port: hub.port)
        try Self.expectServingThenGracefulShutdown(hub, witness: witness)
    }

    @Test func hubctlWithStderrClosedStillExitsThreeWhenTheHubIsUnreachable() throws {
        let missing = NSTemporaryDirectory() + "hubtest-none-" + UUID().uuidString.prefix(8) + ".sock"
        let arguments = ["--socket", missing, "status"]
        let closed = try runShell(#"exec "$0" "$@" 2>&-"#, [HubProcess.hubctlPath] + arguments)
        #expect(closed.status == 3, "\(closed)")
        // The same with a stderr pipe whose reader is gone (EPIPE).
        let gone = try runWithDeadPipe(HubProcess.hubctlPath, arguments, as: STDERR_FILENO)
        #expect(gone == 3)
        // Reference: with stderr open the message is there and the code is the same.
        let open = try runShell(#"exec "$0" "$@""#, [HubProcess.hubctlPath] + arguments)
        #expect(open.status == 3 && open.stderr.contains("error:"), "\(open)")
    }

    @Test func closedStdoutNeverTraps() throws {
        for (binary, arguments) in [(HubProcess.executablePath, ["--help"]), (HubProcess.executablePath, ["--version"]),
                                    (HubProcess.hubctlPath, ["--help"]), (HubProcess.hubctlPath, ["status", "--help"]),
                                    (HubProcess.hubctlPath, ["--version"])] {
            let closed = try runShell(#"exec "$0" "$@" >&-"#, [binary] + arguments)
            #expect(closed.status == 0, "\(binary) \(arguments): \(closed)")
            // A stdout pipe whose reader is gone: SIGPIPE is ignored, the write fails, the exit is still clean.
            #expect(try runWithDeadPipe(binary, arguments, as: STDOUT_FILENO) == 0, "\(binary) \(arguments)")
        }
    }

    @Test func hubctlPublishFromAnUnreadableStdinIsALocalInputError() throws {
        let missing = NSTemporaryDirectory() + "hubtest-none-" + UUID().uuidString.prefix(8) + ".sock"
        let args = [HubProcess.hubctlPath, "--socket", missing, "publish", "wallet_updates", "--broadcast", "--type", "t", "-"]
        // FileHandle.readDataToEndOfFile is a try! too: a closed stdin or a directory used to trap (exit 132).
        let closed = try runShell(#"exec "$0" "$@" <&-"#, args)
        #expect(closed.status == 4 && closed.stderr.contains("invalid JSON in stdin: it is empty"), "\(closed)")
        let directory = try runShell(#"exec "$0" "$@" < /"#, args)
        #expect(directory.status == 4 && directory.stderr.contains("cannot read stdin: Is a directory"), "\(directory)")
    }
}

/// The shared writer itself.
@Suite struct StandardStreamTests {
    @Test func aClosedDescriptorIsAFailedWriteNotATrap() {
        // Not a descriptor this test closed: another test's socket may get that number at once. -1 is EBADF too.
        let bytes = Array("line\n".utf8)
        #expect(bytes.withUnsafeBytes { StandardStream.writeAll(-1, $0) } == false)
    }

    @Test func aPipeWithoutReaderIsAFailedWriteNotASignal() throws {
        // SIGPIPE is ignored by both programs; the test process ignores it too for this check (and leaves it so:
        // restoring it could hand another test, running in parallel, a default-action SIGPIPE).
        signal(SIGPIPE, SIG_IGN)
        let fds = try closeOnExecPipe()
        close(fds.0)
        defer { close(fds.1) }
        let bytes = Array("line\n".utf8)
        #expect(bytes.withUnsafeBytes { StandardStream.writeAll(fds.1, $0) } == false)
    }

    @Test func shortWritesAndANonBlockingDescriptorStillDeliverEveryByte() throws {
        let (readFD, writeFD) = try closeOnExecPipe()
        _ = fcntl(writeFD, F_SETFL, fcntl(writeFD, F_GETFL) | O_NONBLOCK)
        defer { close(readFD) }
        // 1 MiB into a 64 KiB pipe: the kernel takes it in pieces, with EAGAIN in between.
        let payload = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let received = ReceivedBytes()
        let reader = Thread {
            var pfd = pollfd(fd: readFD, events: Int16(POLLIN), revents: 0)
            var chunk = [UInt8](repeating: 0, count: 7919)  // an odd size: reads do not line up with writes
            while true {
                _ = poll(&pfd, 1, 5000)
                let n = chunk.withUnsafeMutableBytes { read(readFD, $0.baseAddress, $0.count) }
                if n == 0 { break }
                if n < 0 { if errno == EAGAIN || errno == EINTR { continue } else { break } }
                received.append(chunk[0..<n])
                usleep(200)
            }
            received.finish()
        }
        reader.start()
        let ok = payload.withUnsafeBytes { StandardStream.writeAll(writeFD, $0) }
        close(writeFD)
        #expect(ok)
        #expect(received.wait(timeout: 20) == payload)
    }

    @Test func readInputReadsEverything() throws {
        // readInput reads fd 0; run it in hubctl instead of swapping the test runner's stdin.
        let missing = NSTemporaryDirectory() + "hubtest-none-" + UUID().uuidString.prefix(8) + ".sock"
        let r = try runShell(#"printf '{"a":\n1}' | "$0" "$@""#,
                             [HubProcess.hubctlPath, "--socket", missing, "publish", "c", "--broadcast", "--type", "t", "-"])
        // Valid JSON read in full (across the line break): the only failure left is the missing hub.
        #expect(r.status == 3, "\(r)")
    }
}

/// Bytes collected by a reader thread.
final class ReceivedBytes: @unchecked Sendable {
    private let condition = NSCondition()
    private var bytes: [UInt8] = []
    private var finished = false

    func append(_ chunk: ArraySlice<UInt8>) {
        condition.lock()
        bytes += chunk
        condition.unlock()
    }

    func finish() {
        condition.lock()
        finished = true
        condition.broadcast()
        condition.unlock()
    }

    func wait(timeout: Double) -> [UInt8] {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date().addingTimeInterval(timeout)
        while !finished && condition.wait(until: deadline) {}
        return bytes
    }
}
