import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The real binary's log: JSON by default when stderr is not a terminal, greppable for the same text, and debug
/// lines about connections carrying their fields.
@Suite struct IntegrationLogTests {
    /// Every line of `log` as a JSON object (a line that does not parse fails the test).
    static func jsonLines(_ log: String) throws -> [[String: Any]] {
        try log.split(separator: "\n").map { try parseObject(String($0)) }
    }

    @Test func stderrThatIsNotATerminalGetsJSONWithTheSameText() throws {
        let hub = try HubProcess(textLogs: false)
        let lines = try Self.jsonLines(hub.log)
        #expect(!lines.isEmpty)
        for line in lines {
            #expect(LogFormatTests.isRFC3339Milliseconds(line["ts"] as? String ?? ""), "\(line)")
            #expect(line["level"] as? String == "info", "\(line)")
        }
        // What scripts grep for still matches the raw line.
        #expect(hub.log.contains("listening on ws://127.0.0.1:\(hub.port)/ws"), "\(hub.log)")
        #expect(hub.stop() == 0)
        let last = try #require(try Self.jsonLines(hub.log).last)
        #expect(last["msg"] as? String == "hub stopped", "\(hub.log)")
    }

    @Test(arguments: [("omit", nil), ("hash", "4ab49c7c564e822b"), ("plain", "log_acct")] as [(String, String?)])
    func connectionLinesAtDebugCarryTheirFields(mode: String, account: String?) throws {
        let hub = try HubProcess(["--log-format", "json", "--log-level", "debug", "--log-accounts", mode])
        let ws = try hub.client("log_acct")
        #expect(try ws.completeClose(code: 1000))
        func line(_ message: String) -> [String: Any]? { try? Self.jsonLines(hub.log).first { $0["msg"] as? String == message } }
        #expect(eventually { line("connection closed") != nil }, "\(hub.log)")
        // The echo of the client's close carries the code; the teardown line does not repeat it.
        for (message, code) in [("close frame sent", 1000 as Int?), ("connection closed", nil)] {
            let fields = try #require(line(message), "\(hub.log)")
            #expect(fields["level"] as? String == "debug")
            #expect((fields["conn"] as? String)?.wholeMatch(of: #/\d+-\d+/#) != nil, "\(fields)")
            #expect((fields["remote"] as? String)?.hasPrefix("127.0.0.1:") == true, "\(fields)")
            #expect(fields["code"] as? Int == code, "\(fields)")
            #expect(fields["account"] as? String == account, "\(fields)")
        }
        if mode != "plain" { #expect(!hub.log.contains("log_acct"), "the account id in the log with --log-accounts \(mode)") }
    }

    @Test func infoLevelWritesNoConnectionLines() throws {
        let hub = try HubProcess(["--log-format", "json"])
        let ws = try hub.client("quiet_acct")
        #expect(try ws.completeClose(code: 1000))
        usleep(200_000)
        #expect(!hub.log.contains("connection closed") && !hub.log.contains("quiet_acct"), "\(hub.log)")
        #expect(try Self.jsonLines(hub.log).allSatisfy { ($0["level"] as? String) != "debug" })
    }
}
