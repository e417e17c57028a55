import Foundation
import Glibc
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// Runs the real `hub` binary for an integration test: its own temp dir (socket, state dir), a free port,
/// the startup line parsed from stderr. Stopped (SIGKILL if need be) when the test drops it.
final class HubProcess: @unchecked Sendable {
    let process = Process()
    let directory: String
    let socketPath: String
    let stateDirectory: String
    let logPath: String
    private(set) var port = 0
    /// The `--tls-listen` port, when the hub has one.
    private(set) var tlsPort: Int? = nil
    private(set) var startupLine = ""

    /// The line a start writes last (`HubCore.logRecoveryStart`), one per broker mode.
    static let lastStartLines = ["recovery: new epoch", "recovery: resumed epoch", "recovery: numbering and history live in Redis"]

    /// True when the tests run against another build of the hub (`HUB_TEST_BINARY_DIR`: scripts/sanitize's
    /// sanitizer-built binary, whose RSS includes the sanitizer's shadow memory and quarantine).
    static var isExternalBinary: Bool {
        !(ProcessInfo.processInfo.environment["HUB_TEST_BINARY_DIR"] ?? "").isEmpty
    }

    /// The built `hub` executable next to the test bundle (`swift build --build-tests` builds it), or the one in
    /// `HUB_TEST_BINARY_DIR` (scripts/sanitize runs these tests against a sanitizer-built hub this way).
    static var executablePath: String {
        if let dir = ProcessInfo.processInfo.environment["HUB_TEST_BINARY_DIR"], !dir.isEmpty {
            return URL(fileURLWithPath: dir).appendingPathComponent("hub").path
        }
        let candidates = [
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("hub").path,
            URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent().appendingPathComponent(".build/debug/hub").path,
        ]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) } ?? candidates[0]
    }

    static var hubctlPath: String {
        URL(fileURLWithPath: executablePath).deletingLastPathComponent().appendingPathComponent("hubctl").path
    }

    /// `launcher`: a command that execs the hub in the same process (e.g. `prlimit --nofile=80:80`).
    /// `beforeStart`: called with the test's directory once it exists, before the hub starts (to prepare files in it).
    /// `textLogs`: the tests read the log as text lines (`hub: state: loop=…`), so the hub gets `HUB_LOG_FORMAT=text`
    /// (a `--log-format` argument or an `environment` entry still wins); false leaves the hub its own default (JSON,
    /// stderr being a file).
    init(_ arguments: [String] = [], environment: [String: String] = [:], threads: Int = 2, launcher: [String] = [],
         textLogs: Bool = true, beforeStart: (String) throws -> Void = { _ in }) throws {
        directory = NSTemporaryDirectory() + "hubtest-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try beforeStart(directory)
        socketPath = directory + "/hub.sock"
        stateDirectory = directory + "/state"
        logPath = directory + "/hub.log"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let hubArguments = ["--listen", "127.0.0.1:0", "--socket", socketPath, "--state-dir", stateDirectory,
                            "--threads", String(threads)] + arguments
        if let command = launcher.first {
            process.executableURL = URL(fileURLWithPath: command)
            process.arguments = Array(launcher.dropFirst()) + [Self.executablePath] + hubArguments
        } else {
            process.executableURL = URL(fileURLWithPath: Self.executablePath)
            process.arguments = hubArguments
        }
        var env = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("HUB_") }
        if textLogs { env["HUB_LOG_FORMAT"] = "text" }
        env.merge(environment) { $1 }
        process.environment = env
        process.standardError = FileHandle(forWritingAtPath: logPath)
        process.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            // The start is complete once the recovery line that follows "listening on" is written too (tests read
            // it right after the start; the two lines are separate writes).
            // A JSON line holds the message unescaped up to its end (`/` is not escaped), so the same parse works.
            let lines = log.split(separator: "\n")
            if let line = lines.first(where: { $0.contains("listening on ws") }),
               lines.contains(where: { l in Self.lastStartLines.contains { l.contains($0) } }) {
                startupLine = String(line)
                // "listening on ws://HOST:PORT/ws" or "wss://…", then " and wss://HOST:PORT/ws" with --tls-listen.
                let urls = line.split(separator: "listening on ", maxSplits: 1)[1].split(separator: " (", maxSplits: 1)[0]
                let ports = urls.split(separator: " and ").map { url in
                    Int(url.split(separator: "://", maxSplits: 1)[1].split(separator: "/", maxSplits: 1)[0].split(separator: ":").last!)!
                }
                port = ports[0]
                tlsPort = ports.count > 1 ? ports[1] : nil
                return
            }
            if !process.isRunning { break }
            usleep(20_000)
        }
        let output = log
        stop()
        throw HubTestError("hub did not start: \(output)")
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Everything the hub logged so far.
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Sends `signal` and waits (bounded) for the exit; returns the exit status, or nil if it had to be killed.
    @discardableResult
    func stop(signal: Int32 = SIGTERM, timeout: Double = 10) -> Int32? {
        guard process.isRunning else { return process.terminationStatus }
        kill(process.processIdentifier, signal)
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            return nil
        }
        return process.terminationStatus
    }

    /// The generated HS256 secret (the zero-configuration path).
    func secret() throws -> [UInt8] {
        try SecretFile.read(path: stateDirectory + "/jwt-secret").secret
    }

    /// An HS256 token for `account` signed with the hub's generated secret.
    func token(_ account: String, ttl: Int64 = 900, now: Int64 = Int64(time(nil))) throws -> String {
        try JWTSigner(key: .hmacSecret(secret())).sign(JWTClaims(sub: account, exp: now + ttl, iat: now))
    }

    /// A token with extra claims.
    func token(_ account: String, extra: [String: JWTClaimValue]) throws -> String {
        try JWTSigner(key: .hmacSecret(secret())).sign(JWTClaims(sub: account, exp: Int64(time(nil)) + 900, iat: Int64(time(nil)), extra: extra))
    }

    /// A token with an explicit `exp` (seconds since the epoch).
    func token(_ account: String, exp: Int64) throws -> String {
        try JWTSigner(key: .hmacSecret(secret())).sign(JWTClaims(sub: account, exp: exp, iat: Int64(time(nil))))
    }

    /// Opens a WebSocket to `/ws` authenticated as `account` and subscribed to `channels`.
    func client(_ account: String, channels: [String] = [], headers: [(String, String)] = [], token: String? = nil,
                receiveBuffer: Int32? = nil) throws -> TestWebSocket {
        let bearer = try token ?? self.token(account)
        let ws = try TestWebSocket.connect(port: port, headers: [("Authorization", "Bearer \(bearer)")] + headers,
                                           receiveBuffer: receiveBuffer)
        if !channels.isEmpty {
            try ws.send(json: ["type": "subscribe", "channels": channels, "id": "sub"])
            let reply = try ws.nextJSON()
            guard reply["type"] as? String == "subscribed" else { throw HubTestError("subscribe failed: \(reply)") }
        }
        return ws
    }

    /// A connection to the Unix socket.
    func admin() throws -> AdminClient { try AdminClient(socketPath: socketPath) }

    /// Publishes one event and returns the parsed reply.
    func publish(channel: String, account: String?, type: String = "test_event", data: String = "{}") throws -> [String: Any] {
        let target = account.map { "\"account\":\(jsonString($0))" } ?? "\"broadcast\":true"
        let line = "{\"op\":\"publish\",\"channel\":\(jsonString(channel)),\(target),\"type\":\(jsonString(type)),\"data\":\(data)}"
        return try request(line)
    }

    func request(_ line: String) throws -> [String: Any] {
        let client = try admin()
        let reply = try client.request(line)
        return try parseObject(reply)
    }

    /// `{"op":"stats"}` → its `stats` object.
    func stats() throws -> [String: Any] {
        try request(#"{"op":"stats"}"#)["stats"] as? [String: Any] ?? [:]
    }

    /// Sends `signal` without waiting.
    func send(signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits (bounded) for the process to exit; its exit status, or nil if it is still running.
    func waitForExit(timeout: Double) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        return process.isRunning ? nil : process.terminationStatus
    }

    /// Lines of the log containing `text`.
    func logLines(containing text: String) -> [Substring] {
        log.split(separator: "\n").filter { $0.contains(text) }
    }
}

struct HubTestError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func parseObject(_ bytes: [UInt8]) throws -> [String: Any] {
    guard let object = try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any] else {
        throw HubTestError("not a JSON object: \(String(decoding: bytes, as: UTF8.self))")
    }
    return object
}

func parseObject(_ text: String) throws -> [String: Any] { try parseObject(Array(text.utf8)) }

func jsonString(_ s: String) -> String {
    String(decoding: try! JSONSerialization.data(withJSONObject: s, options: .fragmentsAllowed), as: UTF8.self)
}

/// Waits until `condition` holds or `timeout` passes.
func eventually(timeout: Double = 5, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try condition() { return true }
        usleep(10_000)
    }
    return try condition()
}
