import Foundation
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A child process for the interop and live-hubctl tests (a Python peer, `hubctl`), with its stdout and stderr
/// collected in the background so a test can wait for lines while it runs. Bounded everywhere: `wait(timeout:)`
/// kills it (by its pid) when it overstays, and so does dropping it.
final class InteropProcess: @unchecked Sendable {
    let process = Process()
    let commandLine: String
    private let out = InteropOutput()
    private let err = InteropOutput()

    init(_ executable: String, _ arguments: [String], environment: [String: String] = [:], stdin: String? = nil) throws {
        commandLine = ([executable] + arguments).joined(separator: " ")
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        // hubctl must see only what the test gives it.
        for key in ["HUB_SOCKET", "HUB_STATE_DIR", "HUB_JWT_SECRET_FILE"] { env[key] = nil }
        env["NO_COLOR"] = "1"
        env.merge(environment) { $1 }
        process.environment = env
        let stdoutPipe = Pipe(), stderrPipe = Pipe(), stdinPipe = Pipe()
        process.standardOutput = stdoutPipe
        process.standardError = stderrPipe
        process.standardInput = stdinPipe
        try process.run()
        out.drain(stdoutPipe.fileHandleForReading)
        err.drain(stderrPipe.fileHandleForReading)
        if let stdin { stdinPipe.fileHandleForWriting.write(Data(stdin.utf8)) }
        try? stdinPipe.fileHandleForWriting.close()
    }

    deinit { kill() }

    var pid: Int32 { process.processIdentifier }
    var stdout: String { out.text }
    var stderr: String { err.text }
    var stdoutLines: [String] { out.text.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init) }
    var stderrLines: [String] { err.text.split(separator: "\n").map(String.init) }

    /// Waits until stdout has at least `count` complete lines.
    func waitForStdoutLines(_ count: Int, timeout: Double = 10) -> Bool {
        eventually(timeout: timeout) { stdoutLines.count >= count || (!process.isRunning && out.ended) }
            && stdoutLines.count >= count
    }

    /// Waits for the exit (and the end of its output); nil when it had to be killed after `timeout`.
    func wait(timeout: Double = 10) -> Int32? {
        let exited = eventually(timeout: timeout) { !process.isRunning }
        if !exited {
            kill()
            _ = eventually(timeout: 2) { out.ended && err.ended }
            return nil
        }
        _ = eventually(timeout: 2) { out.ended && err.ended }
        return process.terminationStatus
    }

    /// Note: a child started from a test thread can inherit a signal mask that blocks SIGTERM/SIGINT (seen here:
    /// python3 ignored SIGTERM); hubctl and hub unblock what they handle. `kill()` always works.
    func signal(_ signal: Int32) { Glibc.kill(process.processIdentifier, signal) }

    /// SIGKILL and wait.
    func kill() {
        guard process.isRunning else { return }
        Glibc.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// For failure messages.
    var summary: String { "\(commandLine)\n--- stdout\n\(stdout)--- stderr\n\(stderr)" }
}

/// Bytes read from one pipe by a background thread.
final class InteropOutput: Sendable {
    private let bytes = Mutex<[UInt8]>([])
    private let finished = Mutex<Bool>(false)

    var text: String { String(decoding: bytes.withLock { $0 }, as: UTF8.self) }
    var ended: Bool { finished.withLock { $0 } }

    func drain(_ handle: FileHandle) {
        let thread = Thread { [self] in
            while true {
                let data = handle.availableData
                if data.isEmpty { break }
                bytes.withLock { $0 += data }
            }
            finished.withLock { $0 = true }
        }
        thread.start()
    }
}

/// The outside peer Python's `websockets`. `scripts/test` installs it into the project's venv `.build/venv`, puts
/// that venv first on PATH (so `/usr/bin/env python3` is the venv's) and sets `HUB_TEST_REQUIRE_PEERS=1`:
/// then a missing peer FAILS the tests that need it. Without that variable (a plain `swift test` on a machine
/// without the package) those tests are disabled, which Swift Testing reports as skipped, never as passed.
enum PythonPeer {
    static let required = ProcessInfo.processInfo.environment["HUB_TEST_REQUIRE_PEERS"] == "1"

    /// nil when `python3 -c "import websockets"` works; else why not.
    static let importProblem: String? = {
        do {
            let probe = try InteropProcess("/usr/bin/env", ["python3", "-c", "import websockets"])
            guard let status = probe.wait(timeout: 20) else { return "python3 -c 'import websockets' did not finish in 20 s" }
            return status == 0 ? nil : "python3 -c 'import websockets' failed (exit \(status)): \(probe.stderr)"
        } catch {
            return "could not run python3: \(error)"
        }
    }()

    /// The tests run when the peer is there, or when it is required (and then fail in `requireAvailable`).
    static let enabled = required || importProblem == nil
    static let skipReason: Comment = "Python's websockets is not installed (scripts/test installs it into the venv .build/venv and sets HUB_TEST_REQUIRE_PEERS=1, which makes its absence a failure)"

    static func requireAvailable() throws {
        if let importProblem {
            throw HubTestError("""
                HUB_TEST_REQUIRE_PEERS=1 but the interop peer Python websockets is missing: \(importProblem)
                scripts/test makes the venv .build/venv with it (scripts/requirements-test.txt) and puts it first on PATH;
                by hand: python3 -m venv .build/venv && .build/venv/bin/pip install -r scripts/requirements-test.txt
                && export PATH="$PWD/.build/venv/bin:$PATH" (never pip-install into the system Python)
                """)
        }
    }

    /// `Tests/python/NAME`.
    static func script(_ name: String) -> String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("python").appendingPathComponent(name).path
    }

    static func run(_ script: String, _ arguments: [String]) throws -> InteropProcess {
        try InteropProcess("/usr/bin/env", ["python3", "-u", Self.script(script)] + arguments)
    }
}
