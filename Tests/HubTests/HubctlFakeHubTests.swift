import Foundation
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A stand-in for the hub's Unix socket: answers each request line with scripted reply lines, on a background
/// thread, and records what it received. One connection at a time, like hubctl uses it.
final class FakeHub: Sendable {
    enum Response: Sendable {
        /// Write these lines and keep reading requests.
        case lines([String])
        /// Write these lines (raw, so tests can send odd bytes) and close the connection.
        case linesThenClose([String])
        /// Say nothing and keep the connection open (for timeouts).
        case silence
    }

    let directory: String
    let path: String
    private let listener: Int32
    private let receivedLines = Mutex<[String]>([])
    private let done = Mutex<Bool>(false)
    private let handler: @Sendable (String) -> Response

    init(handler: @escaping @Sendable (String) -> Response) {
        var template = Array("/tmp/hubctl-test-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(made != nil, "mkdtemp failed")
        directory = String(cString: made!)
        path = directory + "/hub.sock"
        self.handler = handler
        listener = FakeHub.listen(at: path)
        let listener = self.listener
        // Weak, so dropping the hub runs deinit, which stops the listener and ends this thread. The thread, not
        // `stop()`, closes the listening descriptor, once it no longer calls `accept` on it: were `stop()` to close
        // it, the number could be reused at once by another test's socket (tests run in parallel), and this thread's
        // next `accept` would take that test's connections.
        let thread = Thread { [weak self] in
            defer { close(listener) }
            while true {
                let connection = accept(listener, nil, nil)
                if connection < 0 {
                    if errno == EINTR { continue }
                    return  // EINVAL after stop()'s shutdown
                }
                guard let hub = self else { close(connection); return }
                hub.serve(connection)
                close(connection)
            }
        }
        thread.start()
    }

    /// A hub that answers by `op`: `replies["stats"]` etc. Unknown ops get an UNKNOWN_OP error.
    convenience init(replies: [String: String]) {
        self.init { line in
            let op = FakeHub.field("op", in: line) as? String ?? ""
            if let reply = replies[op] { return .lines([reply]) }
            return .lines([#"{"ok":false,"error":{"code":"UNKNOWN_OP","message":"unknown op"}}"#])
        }
    }

    deinit { stop() }

    var received: [String] { receivedLines.withLock { $0 } }

    /// The request lines received, parsed.
    var requests: [[String: Any]] {
        received.compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    func stop() {
        let first = done.withLock { stopped in
            defer { stopped = true }
            return !stopped
        }
        guard first else { return }
        shutdown(listener, Int32(SHUT_RDWR))  // wakes the accept thread (EINVAL), which closes the descriptor
        try? FileManager.default.removeItem(atPath: directory)
    }

    static func field(_ name: String, in line: String) -> Any? {
        (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?[name]
    }

    private static func listen(at path: String) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        precondition(fd >= 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i] = b }
            raw[bytes.count] = 0
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        precondition(result == 0, "bind failed: \(errno)")
        precondition(Glibc.listen(fd, 16) == 0)
        return fd
    }

    private func serve(_ fd: Int32) {
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            while let newline = buffer.firstIndex(of: 0x0A) {
                var line = Array(buffer[..<newline])
                buffer.removeFirst(newline + 1)
                if line.last == 0x0D { line.removeLast() }
                let text = String(decoding: line, as: UTF8.self)
                receivedLines.withLock { $0.append(text) }
                switch handler(text) {
                case .lines(let replies):
                    write(replies, to: fd)
                case .linesThenClose(let replies):
                    write(replies, to: fd)
                    return
                case .silence:
                    break
                }
            }
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { return }
            buffer += chunk[0..<n]
        }
    }

    private func write(_ lines: [String], to fd: Int32) {
        let bytes = Array(lines.map { $0 + "\n" }.joined().utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            offset += n
        }
    }
}

/// Runs the built hubctl binary.
struct HubctlRun {
    var code: Int32
    var stdout: String
    var stderr: String

    var lines: [String] { stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) }

    static var binary: String {
        let candidates = [
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("hubctl").path,
            URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent().appendingPathComponent(".build/debug/hubctl").path,
        ]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) } ?? candidates[1]
    }

    /// `hubctl ARGS` with `--socket` prepended when `socket` is given, stdin from `input`, a clean environment.
    static func run(_ arguments: [String], socket: String? = nil, input: String? = nil,
                    environment: [String: String] = [:], prefix: [String] = []) throws -> HubctlRun {
        let process = Process()
        let executable = prefix.isEmpty ? binary : prefix[0]
        process.executableURL = URL(fileURLWithPath: executable)
        var args = prefix.isEmpty ? [] : Array(prefix.dropFirst()) + [binary]
        if let socket { args += ["--socket", socket] }
        process.arguments = args + arguments
        var env = ProcessInfo.processInfo.environment
        for key in ["HUB_SOCKET", "HUB_STATE_DIR", "HUB_JWT_SECRET_FILE", "NO_COLOR"] { env[key] = nil }
        env.merge(environment) { _, new in new }
        process.environment = env
        let out = Pipe(), err = Pipe(), inp = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = inp
        try process.run()
        if let input { inp.fileHandleForWriting.write(Data(input.utf8)) }
        try inp.fileHandleForWriting.close()
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return HubctlRun(code: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
                         stderr: String(decoding: stderr, as: UTF8.self))
    }
}

@Suite struct HubctlFakeHubTests {
    @Test func hubctlBinaryIsBuilt() {
        #expect(FileManager.default.isExecutableFile(atPath: HubctlRun.binary),
                "build it first: swift build --product hubctl")
    }

    @Test func fakeHubAnswersByOp() throws {
        let hub = FakeHub(replies: ["stats": #"{"ok":true,"stats":{}}"#])
        defer { hub.stop() }
        let run = try HubctlRun.run(["status", "--json"], socket: hub.path)
        #expect(run.stdout == #"{"ok":true,"stats":{}}"# + "\n")
        #expect(hub.received == [#"{"op":"stats"}"#])
    }
}
