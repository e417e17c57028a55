import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// Real EMFILE, not injected: the process's RLIMIT_NOFILE is lowered, which would break tests
/// running in parallel, so the parent test re-runs this test binary as a child process with only
/// `emfileChild` enabled, and the child does the work in its own process.
@Suite("Descriptor exhaustion (subprocess)")
struct EngineDescriptorLimitTests {
    static let childFlag = "HUB_ENGINE_EMFILE_CHILD"

    @Test func realEMFILEInChildProcess() throws {
        guard getenv(Self.childFlag) == nil else { return }
        let (completed, output) = try runChildTest(filter: "EngineDescriptorLimitTests", flag: Self.childFlag)
        #expect(completed, "child did not finish the EMFILE scenario:\n\(output.suffix(3000))")
    }

    /// Runs only in the child (HUB_ENGINE_EMFILE_CHILD set): exhausts descriptors for real.
    @Test(.enabled(if: getenv(EngineDescriptorLimitTests.childFlag) != nil,
                   "the child half of realEMFILEInChildProcess: runs only in the child process that test starts"))
    func emfileChild() throws {
        let marker = String(cString: getenv(Self.childFlag)!)
        let loop = try EventLoop(configuration: testLoopConfiguration())
        defer { loop.stop(); loop.join() }
        let delegate = LoopBox<TestDelegate?>(nil)
        let listener = try TCPListener.bind(SocketAddress(parsing: "127.0.0.1:0"), on: [loop]) { _ in
            let d = TestDelegate { FramedEchoHandler() }
            delegate.value = d
            return d
        }
        var saved = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &saved)
        var low = saved
        low.rlim_cur = rlim_t(openDescriptorCount() + 32)
        try #require(setrlimit(Int32(RLIMIT_NOFILE.rawValue), &low) == 0)
        var fillers: [Int32] = []
        while true {
            let f = open("/dev/null", O_RDONLY | O_CLOEXEC)
            if f < 0 { break }
            fillers.append(f)
        }
        #expect(errno == EMFILE)
        _ = close(fillers.removeLast())  // exactly one free slot: the client's socket takes it

        for _ in 0..<3 {
            let fd = TestClient.connect(port: listener.port)
            let answer = String(decoding: TestClient.readToEnd(fd), as: UTF8.self)
            #expect(answer.hasPrefix("HTTP/1.1 503"), "shed with the reserve descriptor")
            _ = close(fd)
        }
        var (exhausted, shed) = try loop.submitAndWait { (delegate.value!.exhaustedCount, delegate.value!.shedCount) }
        #expect(exhausted == 1, "reported once for the burst")
        #expect(shed == 3)

        // The reserve lost while still out of descriptors (another thread of the process took its descriptor in a
        // shed's window; here the test takes it), then one descriptor frees up: the listener takes it back as its
        // reserve before it accepts, so the next clients are still answered 503. (Before: the freed descriptor went
        // to the next client, and the one after it waited for an answer that never came.)
        listener.withListener(on: loop) { $0.dropReserveForTesting() }
        let thief = open("/dev/null", O_RDONLY | O_CLOEXEC)
        #expect(thief >= 0, "the test takes the reserve's descriptor")
        fillers.append(thief)
        _ = close(fillers.removeLast())  // exactly one free descriptor again
        for client in 0..<2 {
            let fd = TestClient.connect(port: listener.port)
            let answer = String(decoding: TestClient.readToEnd(fd), as: UTF8.self)
            #expect(answer.hasPrefix("HTTP/1.1 503"), "client \(client) after the reserve was lost: \(answer.prefix(40).debugDescription)")
            _ = close(fd)
        }
        let holdsReserve = LoopBox(false)
        listener.withListener(on: loop) { holdsReserve.value = $0.hasReserve }
        #expect(holdsReserve.value, "the listener holds its reserve again")
        (exhausted, shed) = try loop.submitAndWait { (delegate.value!.exhaustedCount, delegate.value!.shedCount) }
        #expect(exhausted == 1, "still the same burst")
        #expect(shed == 5)

        for _ in 0..<4 { _ = close(fillers.removeLast()) }  // descriptors come back
        let fd = TestClient.connect(port: listener.port)
        let frame: [UInt8] = [0, 0, 0, 2, 4, 2]
        #expect(TestClient.writeAll(fd, frame))
        #expect(TestClient.read(fd, count: frame.count) == frame, "served normally again")
        _ = close(fd)
        fillers.forEach { _ = close($0) }
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &saved)
        let m = loop.metricsSnapshot()
        #expect(m.descriptorExhaustions == 1 && m.shedConnections == 5 && (m.acceptFailures[EMFILE] ?? 0) >= 5)
        listener.close()
        if exhausted == 1 && shed == 5 { _ = close(open(marker, O_CREAT | O_WRONLY, 0o600)) }
    }
}

/// Re-runs this test binary with only the tests matching `filter`, `flag` set to a marker path in
/// the environment, stdout/stderr to a log; returns whether the child created the marker (its way
/// of saying the scenario ran to completion) and the log. Kills the child (by its pid) after 60 s.
func runChildTest(filter: String, flag: String) throws -> (completed: Bool, output: String) {
    let marker = "/tmp/hub-engine-child-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    let log = marker + ".log"
    defer { unlink(marker); unlink(log) }
    let exe = try #require(readLink("/proc/self/exe"))
    let args = [exe, "--testing-library", "swift-testing", "--filter", filter]
    var env = ProcessEnvironment.current
    env.append("\(flag)=\(marker)")
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    let cArgs = args.map { strdup($0) } + [nil]
    let cEnv = env.map { strdup($0) } + [nil]
    defer { (cArgs + cEnv).forEach { free($0) } }
    var pid: pid_t = 0
    try #require(posix_spawn(&pid, exe, &actions, nil, cArgs, cEnv) == 0)
    var status: Int32 = 0
    var exited = false
    for _ in 0..<1200 {  // at most 60 s
        if waitpid(pid, &status, WNOHANG) == pid { exited = true; break }
        usleep(50_000)
    }
    if !exited {
        kill(pid, SIGKILL)  // only the child we started
        waitpid(pid, &status, 0)
    }
    let output = String(decoding: readFile(log), as: UTF8.self) + (exited ? "" : "\n(timed out)") + "\nwait status \(status)"
    return (access(marker, F_OK) == 0, output)
}

private func openDescriptorCount() -> Int {
    guard let dir = opendir("/proc/self/fd") else { return 64 }
    defer { closedir(dir) }
    var n = 0
    while readdir(dir) != nil { n += 1 }
    return n
}

private func readLink(_ path: String) -> String? {
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink(path, &buffer, buffer.count - 1)
    guard n > 0 else { return nil }
    return String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

private func readFile(_ path: String) -> [UInt8] {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return [] }
    defer { _ = close(fd) }
    return TestClient.readToEnd(fd)
}

private enum ProcessEnvironment {
    static var current: [String] {
        var result: [String] = []
        var p = environ
        while let entry = p.pointee {
            result.append(String(cString: entry))
            p += 1
        }
        return result
    }
}
