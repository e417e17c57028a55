import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The configuration file: keys and types, precedence (flags > environment > file > defaults), clear errors,
/// `check-config`, `default-config`, and what SIGHUP reloads.
@Suite struct ConfigFileTests {
    /// Writes `json` to a fresh file; its path.
    static func file(_ json: String) throws -> String {
        let path = NSTemporaryDirectory() + "hubtest-config-" + UUID().uuidString.prefix(8) + ".json"
        try json.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    static func run(_ arguments: [String], _ environment: [String: String] = [:]) throws -> HubConfiguration {
        guard case .run(let c) = try HubConfiguration.parse(arguments: arguments, environment: environment) else {
            throw HubTestError("not a run")
        }
        return c
    }

    @Test func flagsWinOverEnvironmentWhichWinsOverTheFile() throws {
        let path = try Self.file(#"{"listen": "127.0.0.1:1111", "rate-limit": 7, "threads": 3, "//": "a comment", "//threads": "another"}"#)
        defer { unlink(path) }
        let fileOnly = try Self.run(["--config", path])
        #expect(fileOnly.listen == "127.0.0.1:1111" && fileOnly.rateLimitPerMinute == 7 && fileOnly.threads == 3)
        #expect(fileOnly.configFile == path && fileOnly.maxSubscriptions == HubConfiguration().maxSubscriptions)
        let environment = try Self.run(["--config=\(path)"], ["HUB_LISTEN": "127.0.0.1:2222"])
        #expect(environment.listen == "127.0.0.1:2222" && environment.rateLimitPerMinute == 7)
        let flag = try Self.run(["--listen", "127.0.0.1:3333"], ["HUB_LISTEN": "127.0.0.1:2222", "HUB_CONFIG": path])
        #expect(flag.listen == "127.0.0.1:3333" && flag.rateLimitPerMinute == 7 && flag.configFile == path)
        #expect(try Self.run([]).configFile == nil)
    }

    @Test func everyKindOfValue() throws {
        let path = try Self.file("""
            {"channels": ["a", "b.c"], "allowed-origins": "https://x.example, https://*.y.example", "echo": true,
             "history-ttl": 90, "ping-interval": "2m", "history-memory": "8m", "max-queued-bytes": 65536,
             "broker": "local", "log-level": "debug", "drain-duration": "auto", "jwt-issuer": "caf\\u00e9"}
            """)
        defer { unlink(path) }
        let c = try Self.run(["--config", path])
        #expect(c.channels == ["a", "b.c"] && c.allowedOrigins.entries == ["https://x.example", "https://*.y.example"])
        #expect(c.echo && c.historyTTLSeconds == 90 && c.pingIntervalSeconds == 120 && c.historyMemoryBytes == 8 << 20)
        #expect(c.maxQueuedBytes == 65536 && c.broker == nil && c.logLevel == .debug && c.drainDurationSeconds == nil)
        #expect(c.jwtIssuer == "café")
    }

    @Test func badFilesAreRefusedWithTheFileTheKeyAndTheReason() throws {
        let cases: [(String, String)] = [
            (#"{"lisen": "x"}"#, #"unknown key "lisen"; the keys are the options of hub --help without --"#),
            (#"{"--listen": "x"}"#, #"unknown key "--listen" (write it without --); the keys are the options of hub --help without --"#),
            (#"{"config": "other.json"}"#, #"unknown key "config" (a config file cannot name another); the keys are the options of hub --help without --"#),
            (#"{"listen": 8080}"#, #""listen": expected a string, got a number"#),
            (#"{"threads": "many"}"#, #""threads": expected a whole number in 1...1024, got 'many'"#),
            (#"{"threads": 2.5}"#, #""threads": expected a whole number"#),
            (#"{"threads": [2]}"#, #""threads": expected a whole number or a string, got an array"#),
            (#"{"echo": "yes"}"#, #""echo": expected true or false, got a string"#),
            (#"{"channels": [1, 2]}"#, #""channels": expected an array of strings"#),
            (#"{"channels": {"a": 1}}"#, #""channels": expected an array of strings or a comma-separated string, got an object"#),
            (#"{"listen": "a:1", "listen": "b:2"}"#, #""listen" is given twice"#),
            (#"["listen"]"#, #"the file must hold one JSON object ({"listen": "0.0.0.0:8080", ...})"#),
            (#"{"listen": "#, "invalid JSON at byte 11: unexpected end of input"),
            (#"{"log-level": "loud"}"#, #""log-level": expected debug, info, warn or error, got 'loud'"#),
        ]
        for (json, reason) in cases {
            let path = try Self.file(json)
            defer { unlink(path) }
            #expect(throws: HubConfiguration.ConfigurationError(message: "\(path): \(reason)"), "\(json)") {
                try HubConfiguration.parse(arguments: ["--config", path], environment: [:])
            }
        }
        #expect(throws: HubConfiguration.ConfigurationError(message: "cannot read the config file /nonexistent/hub.json: No such file or directory")) {
            try HubConfiguration.parse(arguments: [], environment: ["HUB_CONFIG": "/nonexistent/hub.json"])
        }
        #expect(throws: HubConfiguration.ConfigurationError(message: "cannot read the config file /tmp: not a regular file")) {
            try HubConfiguration.parse(arguments: ["--config", "/tmp"], environment: [:])
        }
        #expect(throws: HubConfiguration.ConfigurationError(message: "--config needs a value")) {
            try HubConfiguration.parse(arguments: ["--config"], environment: [:])
        }
        // --help answers even when the file is broken.
        #expect(try HubConfiguration.parse(arguments: ["--config", "/nonexistent", "--help"], environment: [:]) != .version)
    }

    /// The real binary: `check-config` prints the effective configuration (no secret in it) and exits 0, or the
    /// reason and 1; `default-config` prints a file that `check-config` accepts as the defaults.
    @Test func checkConfigAndDefaultConfig() throws {
        let path = try Self.file(#"{"broker": "redis://:s3cret-pass@127.0.0.1:6379/2", "rate-limit": 12, "channels": "a,b"}"#)
        defer { unlink(path) }
        let check = try InteropProcess(HubProcess.executablePath, ["check-config", path, "--rate-limit", "13"],
                                       environment: ["HUB_JWT_SECRET": "jwt-s3cret-value"])
        #expect(check.wait() == 0, "\(check.stderr)")
        let printed = try parseObject(check.stdout)
        #expect(printed["rate-limit"] as? Int == 13 && printed["channels"] as? [String] == ["a", "b"], "\(check.stdout)")
        #expect(printed["//config"] as? String == path && printed["threads"] is NSNull, "\(check.stdout)")
        #expect((printed["broker"] as? String)?.contains("***") == true, "\(check.stdout)")
        #expect(!check.stdout.contains("s3cret"), "a secret in check-config's output")
        #expect(Set(printed.keys).isSuperset(of: HubConfiguration.options.map(\.name)))

        let broken = try Self.file(#"{"rate-limit": -1}"#)
        defer { unlink(broken) }
        let refused = try InteropProcess(HubProcess.executablePath, ["check-config", broken])
        #expect(refused.wait() == 1)
        #expect(refused.stderr == "hub: \(broken): \"rate-limit\": expected a whole number in 1...1000000, got '-1'\n", "\(refused.stderr)")

        let defaults = try InteropProcess(HubProcess.executablePath, ["default-config"])
        #expect(defaults.wait() == 0)
        let text = try parseObject(defaults.stdout)
        #expect(text["listen"] as? String == HubConfiguration().listen && text["//listen"] is String)
        let written = try Self.file(defaults.stdout)
        defer { unlink(written) }
        let effective = try Self.run(["--config", written])
        var expected = HubConfiguration()
        expected.configFile = written
        #expect(effective == expected)
    }

    /// SIGHUP applies what can change while running (origins, rate limit, log level), refuses the rest with a line,
    /// and keeps everything when the file turns invalid.
    @Test func sighupReloadsWhatCanChangeAndRefusesTheRest() throws {
        let path = try Self.file(#"{"allowed-origins": "https://a.example", "rate-limit": 100, "max-subscriptions": 10}"#)
        defer { unlink(path) }
        let hub = try HubProcess(["--config", path])
        func origin(_ value: String) throws -> Int {
            let token = try hub.token("reload_1")
            return try rawHTTP(port: hub.port, IntegrationRefusalTests.upgradeRequest(extra: "Authorization: Bearer \(token)\r\nOrigin: \(value)\r\n"), timeout: 0.5).status
        }
        #expect(try origin("https://a.example") == 101 && origin("https://b.example") == 403)

        try #"{"allowed-origins": ["https://b.example"], "rate-limit": 2, "max-subscriptions": 20, "log-level": "debug"}"#
            .write(toFile: path, atomically: true, encoding: .utf8)
        hub.send(signal: SIGHUP)
        #expect(eventually { !hub.logLines(containing: "received SIGHUP: reloaded the configuration from \(path): allowed-origins, rate-limit, log-level").isEmpty },
                "\(hub.log)")
        #expect(hub.logLines(containing: "received SIGHUP: max-subscriptions changed, which needs a restart; keeping the running value").count == 1, "\(hub.log)")
        #expect(try origin("https://b.example") == 101 && origin("https://a.example") == 403)
        let ws = try hub.client("reload_2")
        var limited = false
        for i in 0..<4 {
            try ws.send(json: ["type": "ping", "id": i])
            if (try ws.nextJSON()["error"] as? [String: Any])?["code"] as? String == "RATE_LIMITED" { limited = true }
        }
        #expect(limited, "the reloaded rate limit (2 a minute) was not applied")
        _ = try? rawHTTP(port: hub.port, IntegrationRefusalTests.upgradeRequest(extra: "Authorization: Bearer nonsense\r\n"))
        #expect(eventually { !hub.logLines(containing: "token refused").isEmpty }, "the reloaded log level (debug) was not applied")

        try #"{"rate-limit": "lots"}"#.write(toFile: path, atomically: true, encoding: .utf8)
        hub.send(signal: SIGHUP)
        #expect(eventually { !hub.logLines(containing: "received SIGHUP: the configuration is not valid, keeping the running one: \(path): \"rate-limit\"").isEmpty },
                "\(hub.log)")
        #expect(try origin("https://b.example") == 101)
    }
}

/// The files the Debian package ships: its config parses as the defaults plus the machine-wide paths.
@Suite struct PackagingFileTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test func thePackagedConfigIsValidAndPointsAtTheServicePaths() throws {
        let path = Self.root.appendingPathComponent("packaging/hub.json").path
        guard case .run(let c) = try HubConfiguration.parse(arguments: ["--config", path], environment: [:]) else {
            Issue.record("not a run"); return
        }
        #expect(c.socketPath == "/run/hub/hub.sock" && c.stateDirectory == "/var/lib/hub" && c.listen == "127.0.0.1:8080")
        #expect(c.drainDurationSeconds == nil && c.logAccounts == .omit)
        // The socket unit's Unix socket is the one hubctl is told about.
        let socketUnit = try String(contentsOfFile: Self.root.appendingPathComponent("packaging/hub.socket").path, encoding: .utf8)
        #expect(socketUnit.contains("ListenStream=/run/hub/hub.sock") && socketUnit.contains("ListenStream=127.0.0.1:8080"))
        let service = try String(contentsOfFile: Self.root.appendingPathComponent("packaging/hub.service").path, encoding: .utf8)
        for line in ["Type=notify", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                     "LimitNOFILE=1048576", "StateDirectory=hub", "RuntimeDirectory=hub", "ExecReload=/bin/kill -HUP $MAINPID"] {
            #expect(service.split(separator: "\n").contains { $0 == line }, "hub.service lacks \(line)")
        }
    }
}
