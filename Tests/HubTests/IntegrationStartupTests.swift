import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The real `hub` binary: zero-config startup, HTTP endpoints, graceful shutdown.
@Suite struct IntegrationStartupTests {
    static func mode(_ path: String) throws -> (type: mode_t, permissions: mode_t) {
        var st = stat()
        guard lstat(path, &st) == 0 else { throw HubTestError("stat \(path): errno \(errno)") }
        return (st.st_mode & S_IFMT, st.st_mode & 0o7777)
    }

    @Test func zeroConfigStartupLineStateAndSocketModes() throws {
        let hub = try HubProcess()
        let line = hub.startupLine
        #expect(line.contains("listening on ws://127.0.0.1:\(hub.port)/ws"), "\(line)")
        #expect(hub.port > 0)
        #expect(line.contains("; socket \(hub.socketPath);"), "\(line)")
        #expect(line.contains("; channels profile_updates,wallet_updates;"), "\(line)")
        #expect(line.hasSuffix("; auth HS256 (secret file \(hub.stateDirectory)/jwt-secret)"), "\(line)")
        #expect(hub.log.contains("no JWT secret configured: generated a random one in \(hub.stateDirectory)/jwt-secret (mode 0600)"))
        // Every log line starts with its UTC time, `2026-11-26T05:04:21Z hub: ` (gmtime_r, not Foundation's formatter),
        // and that time is now.
        for logLine in hub.log.split(separator: "\n") {
            guard let m = logLine.prefixMatch(of: #/(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)Z hub: /#) else {
                Issue.record("log line without its UTC time: \(logLine)")
                continue
            }
            var t = tm()
            t.tm_year = Int32(m.1)! - 1900; t.tm_mon = Int32(m.2)! - 1; t.tm_mday = Int32(m.3)!
            t.tm_hour = Int32(m.4)!; t.tm_min = Int32(m.5)!; t.tm_sec = Int32(m.6)!
            #expect(abs(Int(timegm(&t)) - Int(time(nil))) < 120, "\(logLine)")
        }

        let dir = try Self.mode(hub.stateDirectory)
        #expect(dir.type == S_IFDIR && dir.permissions == 0o700)
        let secret = try Self.mode(hub.stateDirectory + "/jwt-secret")
        #expect(secret.type == S_IFREG && secret.permissions == 0o600)
        #expect(try hub.secret().count >= 32)
        let socket = try Self.mode(hub.socketPath)
        #expect(socket.type == S_IFSOCK && socket.permissions == 0o660)

        // A token minted with the generated secret connects and receives.
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let reply = try hub.publish(channel: "wallet_updates", account: "acc_1", type: "hello", data: #"{"x":1}"#)
        #expect(reply["ok"] as? Bool == true && reply["seq"] as? Int == 1 && reply["delivered"] as? Int == 1)
        #expect(try ws.nextText() == #"{"type":"hello","channel":"wallet_updates","seq":1,"data":{"x":1}}"#)
    }

    /// The modes do not depend on the umask the hub inherits: with umask 000 the socket is still 0660 (never
    /// world-writable), the state dir 0700 and the secret 0600.
    @Test func modesHoldUnderAPermissiveUmask() throws {
        let old = umask(0)
        let hub: HubProcess
        do {
            defer { umask(old) }
            hub = try HubProcess()
        }
        #expect(try Self.mode(hub.socketPath).permissions == 0o660)
        #expect(try Self.mode(hub.stateDirectory).permissions == 0o700)
        #expect(try Self.mode(hub.stateDirectory + "/jwt-secret").permissions == 0o600)
    }

    /// Options from HUB_ variables; a flag wins over its variable.
    @Test func environmentVariablesSetOptions() throws {
        let hub = try HubProcess(["--max-connections", "2"], environment: ["HUB_MAX_CONNECTIONS": "1", "HUB_CHANNELS": "alpha,beta"])
        #expect(hub.startupLine.contains("channels alpha,beta;") && hub.startupLine.contains("up to 2 connections"), "\(hub.startupLine)")
        let clients = try (0..<2).map { _ in try hub.client("acc", channels: ["beta"]) }
        #expect(throws: TestWebSocket.Refused.self) { _ = try hub.client("acc") }
        #expect(try hub.publish(channel: "beta", account: "acc")["delivered"] as? Int == 2)
        withExtendedLifetime(clients) {}
    }

    @Test func readableSecretFileIsWarnedAbout() throws {
        let hub = try HubProcess()
        let path = hub.directory + "/shared-secret"
        #expect(FileManager.default.createFile(atPath: path, contents: Data("  a-shared-secret-of-at-least-32-bytes-long \n".utf8),
                                               attributes: [.posixPermissions: 0o644]))
        let second = try HubProcess(["--jwt-secret-file", path])
        #expect(second.startupLine.contains("auth HS256 (secret file \(path))"), "\(second.startupLine)")
        #expect(second.logLines(containing: "\(path) is readable by other users").count == 1, "\(second.log)")
        // Surrounding whitespace is not part of the secret.
        let token = try JWTSigner(key: .hmacSecret(Array("a-shared-secret-of-at-least-32-bytes-long".utf8))).sign(JWTClaims(sub: "s", exp: Int64(time(nil)) + 60))
        _ = try second.client("s", token: token)
    }

    @Test func restartReusesTheGeneratedSecretWithoutSayingGenerated() throws {
        let hub = try HubProcess()
        let secret = try hub.secret()
        #expect(hub.stop() == 0)
        let again = try HubProcess(["--state-dir", hub.stateDirectory])
        #expect(try hub.secret() == secret)
        #expect(again.startupLine.contains("auth HS256 (secret file \(hub.stateDirectory)/jwt-secret)"), "\(again.startupLine)")
        _ = try again.client("acc_1", token: try hub.token("acc_1"))
    }

    @Test func healthzAndMetrics() throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        // A TCP connection still in its handshake is not a connection yet (and neither is the probe itself).
        let handshaking = try TestWebSocket.tcpConnect(port: hub.port)
        defer { close(handshaking) }
        #expect(eventually { ((try? hub.stats()["connections"] as? [String: Any])?["handshaking"] as? Int) == 1 })
        let health = try rawHTTP(port: hub.port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(health.status == 200)
        #expect(health.headers["content-type"]?.hasPrefix("application/json") == true)
        #expect(health.json["status"] as? String == "ok")
        #expect(health.json["version"] as? String == HubVersion.string)
        #expect(health.json["uptimeSeconds"] is Double || health.json["uptimeSeconds"] is Int)
        #expect(health.json["connections"] as? Int == 1)

        // HEAD: the same head, no body.
        let head = try rawHTTP(port: hub.port, "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(head.status == 200 && head.body.isEmpty && Int(head.headers["content-length"] ?? "") ?? 0 > 0, "\(head)")
        #expect(try rawHTTP(port: hub.port, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").status == 405)
        let metricsHead = try rawHTTP(port: hub.port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(metricsHead.status == 200 && metricsHead.body.isEmpty, "\(metricsHead)")

        for i in 1...3 {
            #expect(try hub.publish(channel: "wallet_updates", account: "acc_1", data: "\(i)")["delivered"] as? Int == 1)
        }
        #expect(try hub.publish(channel: "profile_updates", account: "acc_1")["delivered"] as? Int == 0)
        #expect(try ws.drainTexts(quiet: 0.2).count == 3)
        let expired = try hub.token("acc_1", exp: Int64(time(nil)) - 120)
        #expect(throws: TestWebSocket.Refused.self) { try TestWebSocket.connect(port: hub.port, headers: [("Authorization", "Bearer \(expired)")]) }

        let metrics = try rawHTTP(port: hub.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(metrics.status == 200)
        #expect(metrics.headers["content-type"]?.hasPrefix("text/plain; version=0.0.4") == true)
        let lines = Set(metrics.body.split(separator: "\n").map(String.init))
        for expected in [
            "hub_connections 1",
            "hub_connections_handshaking 1",  // the idle TCP connection above; not the scrape itself
            "# TYPE hub_connections gauge",
            "hub_events_published_total{channel=\"wallet_updates\"} 3",
            "hub_events_published_total{channel=\"profile_updates\"} 1",
            "hub_event_deliveries_total{channel=\"wallet_updates\"} 3",
            "hub_event_deliveries_total{channel=\"profile_updates\"} 0",
            "hub_subscriptions{channel=\"wallet_updates\"} 1",
            "hub_auth_failures_total{reason=\"expired\"} 1",
            "# TYPE hub_publish_to_write_seconds histogram",
            "hub_publish_to_write_seconds_bucket{le=\"+Inf\"} 3",
            "hub_publish_to_write_seconds_count 3",
        ] {
            #expect(lines.contains(expected), "missing \(expected) in:\n\(metrics.body)")
        }
        #expect(lines.contains { $0.hasPrefix("hub_publish_to_write_seconds_sum ") })
        #expect(lines.contains { $0.hasPrefix("hub_publish_to_write_seconds_bucket{le=\"0.001\"} ") })
        // Buckets are cumulative: non-decreasing, ending at the count.
        let buckets = metrics.body.split(separator: "\n").filter { $0.hasPrefix("hub_publish_to_write_seconds_bucket") }
            .compactMap { Int($0.split(separator: " ").last!) }
        #expect(buckets == buckets.sorted() && buckets.last == 3)
    }

    @Test func sigtermClosesEveryClientWith1001AndExitsZero() throws {
        let hub = try HubProcess(["--shutdown-timeout", "5s"])
        let clients = try (0..<4).map { try hub.client("acc_\($0 % 2)", channels: ["wallet_updates"]) }
        let started = Date()
        hub.send(signal: SIGTERM)
        for ws in clients {
            let close = try ws.expectClose(timeout: 5)
            #expect(close.code == 1001 && close.reason == "the hub is shutting down")
            try ws.sendClose(code: 1001)
        }
        // The hub closes TCP first once the handshake is complete; then each client closes its side.
        for ws in clients {
            #expect(try ws.waitForEOF(timeout: 2))
            ws.shutdownTCP()
        }
        let status = hub.waitForExit(timeout: 8)
        #expect(status == 0)
        // Every client completed its close: no waiting for timeouts.
        #expect(Date().timeIntervalSince(started) < 1.5, "\(Date().timeIntervalSince(started))")
        #expect(hub.logLines(containing: "did not finish the close handshake").isEmpty, "\(hub.log)")
        #expect(access(hub.socketPath, F_OK) != 0, "the socket file is still there")
        #expect(hub.log.contains("hub stopped"))
    }

    @Test func sigintWithSilentClientsStillExitsZeroWithinTheTimeout() throws {
        let hub = try HubProcess(["--shutdown-timeout", "1s"])
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        // A connection still in its HTTP phase is dropped, not waited for.
        let halfOpen = try TestWebSocket.tcpConnect(port: hub.port)
        defer { close(halfOpen) }
        try TestWebSocket.writeAll(halfOpen, Array("GET /ws HTTP/1.1\r\n".utf8))
        hub.send(signal: SIGINT)
        #expect(try ws.expectClose(timeout: 5).code == 1001)
        // This client never answers the close: the hub gives up after its timeouts and still exits 0.
        #expect(hub.waitForExit(timeout: 6) == 0)
        #expect(access(hub.socketPath, F_OK) != 0)
    }

    /// Runs `hub` to completion (it is expected to refuse to start); its exit status and stderr.
    static func runFailing(_ arguments: [String], in directory: String) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: HubProcess.executablePath)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("HUB_") }
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        let errPath = directory + "/fail-\(UUID().uuidString.prefix(6)).log"
        _ = FileManager.default.createFile(atPath: errPath, contents: nil)
        process.standardError = FileHandle(forWritingAtPath: errPath)
        process.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
        let deadline = Date().addingTimeInterval(10)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit(); throw HubTestError("hub kept running: \(arguments)") }
        return (process.terminationStatus, (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "")
    }

    @Test func refusesToStartWhenSomethingIsInTheWay() throws {
        let hub = try HubProcess()
        let dir = hub.directory
        // Another hub answers on the socket: exit 1, and the running hub's socket is left alone.
        var r = try Self.runFailing(["--listen", "127.0.0.1:0", "--socket", hub.socketPath, "--state-dir", dir + "/s2"], in: dir)
        #expect(r.status == 1, "\(r.output)")
        #expect(r.output.contains(hub.socketPath), "\(r.output)")
        #expect(try hub.publish(channel: "wallet_updates", account: "a")["ok"] as? Bool == true)
        // The port is taken: exit 1.
        r = try Self.runFailing(["--listen", "127.0.0.1:\(hub.port)", "--socket", dir + "/other.sock", "--state-dir", dir + "/s2"], in: dir)
        #expect(r.status == 1, "\(r.output)")
        #expect(r.output.contains("127.0.0.1:\(hub.port)"), "\(r.output)")
        #expect(access(dir + "/other.sock", F_OK) != 0, "a hub that could not start left its socket behind")
        // A path that is not a socket is never removed.
        let plain = dir + "/plain-file"
        #expect(FileManager.default.createFile(atPath: plain, contents: Data("keep".utf8)))
        r = try Self.runFailing(["--listen", "127.0.0.1:0", "--socket", plain, "--state-dir", dir + "/s2"], in: dir)
        #expect(r.status == 1, "\(r.output)")
        #expect((try? String(contentsOfFile: plain, encoding: .utf8)) == "keep")
        // Bad options: exit 2.
        r = try Self.runFailing(["--rate-limit", "zero"], in: dir)
        #expect(r.status == 2 && r.output.contains("--rate-limit"), "\(r.output)")
        r = try Self.runFailing(["--no-such-option"], in: dir)
        #expect(r.status == 2, "\(r.output)")
        // An unreadable secret file: exit 1.
        r = try Self.runFailing(["--listen", "127.0.0.1:0", "--socket", dir + "/o2.sock", "--jwt-secret-file", dir + "/missing"], in: dir)
        #expect(r.status == 1 && r.output.contains(dir + "/missing"), "\(r.output)")
    }

    @Test func staleSocketFileIsReplaced() throws {
        let first = try HubProcess()
        // A crashed hub leaves its socket file behind.
        #expect(first.stop(signal: SIGKILL) != 0)
        #expect(access(first.socketPath, F_OK) == 0)
        let second = try HubProcess(["--socket", first.socketPath])
        #expect(second.startupLine.contains("socket \(first.socketPath);"))
        // `first.publish` talks to first.socketPath, where the second hub now listens.
        #expect(try first.publish(channel: "wallet_updates", account: "a")["ok"] as? Bool == true)
        withExtendedLifetime(second) {}
    }
}
