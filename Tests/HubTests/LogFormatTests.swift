import Foundation
import Glibc
import Synchronization
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// The logger on its own: both formats, levels, fields, and the log options' parsing.
@Suite struct LogFormatTests {
    /// A logger writing into an array.
    static func capture(_ format: LogFormat, _ level: LogLevel = .info, accounts: AccountLogging = .omit)
        -> (HubLogger, @Sendable () -> [String]) {
        let lines = Mutex<[String]>([])
        let logger = HubLogger(format: format, level: level, accounts: accounts) { line in lines.withLock { $0.append(line) } }
        return (logger, { lines.withLock { $0 } })
    }

    /// `2026-11-29T00:47:13.123Z`: RFC 3339, UTC, milliseconds.
    static func isRFC3339Milliseconds(_ s: String) -> Bool {
        s.wholeMatch(of: #/\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z/#) != nil
    }

    @Test func jsonLinesAreOneObjectWithTimeLevelMessageAndFields() throws {
        let (logger, lines) = Self.capture(.json, .debug)
        logger.info("hub 1.0 listening on ws://127.0.0.1:8080/ws (2 threads)")
        logger.warn("a \"quoted\" path\\with\nnewline", [.conn("0-7"), .remote("10.0.0.1:5555"), .code(1001)])
        logger.debug("connection closed", [.conn("1-2")])
        let out = lines()
        #expect(out.count == 3)
        // Greps for a message's text still match: `/` is not escaped.
        #expect(out[0].contains("\"msg\":\"hub 1.0 listening on ws://127.0.0.1:8080/ws (2 threads)\""), "\(out[0])")
        for line in out { #expect(!line.contains("\n")) }
        let first = try parseObject(out[0])
        #expect(first["level"] as? String == "info")
        let ts = try #require(first["ts"] as? String)
        #expect(Self.isRFC3339Milliseconds(ts), "\(ts)")
        let second = try parseObject(out[1])
        #expect(second["level"] as? String == "warn")
        #expect(second["msg"] as? String == "a \"quoted\" path\\with\nnewline")
        #expect(second["conn"] as? String == "0-7" && second["remote"] as? String == "10.0.0.1:5555" && second["code"] as? Int == 1001)
        #expect(Set(second.keys) == ["ts", "level", "msg", "conn", "remote", "code"])
        #expect(try parseObject(out[2])["level"] as? String == "debug")
    }

    @Test func textLinesKeepTheHubsFormatWithFieldsAppended() {
        let (logger, lines) = Self.capture(.text)
        logger.info("state: loop=0 clients=1")
        logger.warn("out of file descriptors", [.conn("0-1"), .reason("two words"), .code(4008)])
        let out = lines()
        #expect(out.count == 2)
        #expect(out[0].wholeMatch(of: #/\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z hub: state: loop=0 clients=1/#) != nil, "\(out[0])")
        #expect(out[1].hasSuffix(" hub: warn: out of file descriptors conn=0-1 reason=\"two words\" code=4008"), "\(out[1])")
    }

    @Test func linesBelowTheLevelAreDroppedAndTheLevelCanChange() {
        let (logger, lines) = Self.capture(.json, .warn)
        logger.debug("d")
        logger.info("i")
        logger.warn("w")
        logger.error("e")
        #expect(lines().count == 2)
        #expect(!logger.enabled(.info))
        logger.setLevel(.debug)
        logger.debug("d2")
        #expect(lines().count == 3 && lines()[2].contains("\"msg\":\"d2\""))
    }

    @Test func accountsAreOmittedHashedOrPlain() {
        #expect(Self.capture(.json, accounts: .omit).0.accountField("alice") == nil)
        #expect(Self.capture(.json, accounts: .plain).0.accountField("alice") == .text("account", "alice"))
        // SHA-256("alice") = 2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90
        #expect(Self.capture(.json, accounts: .hash).0.accountField("alice") == .text("account", "2bd806c97f0e00af"))
    }

    @Test func logOptionsParseAndRefuseBadValues() throws {
        guard case .run(let c) = try HubConfiguration.parse(arguments: ["--log-format", "json", "--log-level=debug", "--log-accounts", "hash"],
                                                           environment: [:]) else { Issue.record("not run"); return }
        #expect(c.logFormat == .json && c.logLevel == .debug && c.logAccounts == .hash)
        guard case .run(let d) = try HubConfiguration.parse(arguments: [], environment: ["HUB_LOG_FORMAT": "text", "HUB_LOG_LEVEL": "warn"]) else {
            Issue.record("not run"); return
        }
        #expect(d.logFormat == .text && d.logLevel == .warn && d.logAccounts == .omit)
        guard case .run(let e) = try HubConfiguration.parse(arguments: [], environment: [:]) else { Issue.record("not run"); return }
        #expect(e.logFormat == nil && e.logLevel == .info)
        #expect(LogFormat.automatic(stderrIsTerminal: true) == .text && LogFormat.automatic(stderrIsTerminal: false) == .json)
        let bad: [([String], String)] = [
            (["--log-format", "xml"], "--log-format: expected text or json, got 'xml'"),
            (["--log-level", "verbose"], "--log-level: expected debug, info, warn or error, got 'verbose'"),
            (["--log-accounts", "yes"], "--log-accounts: expected omit, hash or plain, got 'yes'"),
        ]
        for (arguments, message) in bad {
            #expect(throws: HubConfiguration.ConfigurationError(message: message)) {
                try HubConfiguration.parse(arguments: arguments, environment: [:])
            }
        }
    }
}
