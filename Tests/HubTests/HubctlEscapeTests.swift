import Foundation
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// Control characters in client- and backend-supplied strings are made visible in hubctl's human output
/// (docs/HUBCTL.md, "Control characters"); `--json` stays byte-exact.
@Suite struct HubctlEscapeTests {
    // MARK: The function

    @Test(arguments: [
        ("plain acc_1", "plain acc_1"),
        ("\u{1B}[2J", "\\x1b[2J"),
        ("\u{9B}31mred", "\\x9b31mred"),
        ("a\u{7F}b", "a\\x7fb"),
        ("\t\n\r\0", "\\x09\\x0a\\x0d\\x00"),
        ("\u{80}\u{9F}", "\\x80\\x9f"),
        ("\u{1B}]0;title\u{07}", "\\x1b]0;title\\x07"),
        ("café ☃ 😀 \u{A0}", "café ☃ 😀 \u{A0}"),  // U+00A0, the first code point after C1, is kept
        ("back\\slash \\x1b", "back\\slash \\x1b"),  // a backslash is not escaped: --json tells them apart
        ("", ""),
    ])
    func escapes(input: String, expected: String) {
        #expect(TerminalText.escape(input) == expected)
    }

    @Test func noControlCharacterSurvivesAndEscapingIsIdempotent() {
        let all = String(String.UnicodeScalarView((0...0x2FF).compactMap(Unicode.Scalar.init)))
        let escaped = TerminalText.escape(all)
        #expect(!escaped.unicodeScalars.contains(where: TerminalText.isControl))
        #expect(TerminalText.escape(escaped) == escaped)
        // Exactly the 65 C0 + DEL + C1 code points changed, each to four characters.
        #expect(escaped.unicodeScalars.count == all.unicodeScalars.count + 65 * 3)
    }

    // MARK: Every human view, against hostile replies

    static let hostile = "evil\u{1B}[2J\u{1B}]0;pwned\u{07}\u{9B}31m\u{7F}\tx"
    static let hostileEscaped = "evil\\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\\x7f\\x09x"
    static var hostileJSON: String { jsonString(hostile) }

    /// No C0 but the line breaks, no DEL, no C1 (hubctl's own colour is off: stdout is not a terminal).
    static func expectClean(_ run: HubctlRun, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(run.code == 0, "\(what): \(run.stderr)", sourceLocation: sourceLocation)
        let bad = run.stdout.unicodeScalars.filter { TerminalText.isControl($0) && $0 != "\n" }
        #expect(bad.isEmpty, "\(what) printed \(bad.map { String($0.value, radix: 16) })", sourceLocation: sourceLocation)
        #expect(run.stdout.contains(hostileEscaped), "\(what): \(run.stdout)", sourceLocation: sourceLocation)
    }

    static var connectionsReply: String {
        let h = hostileJSON
        return #"{"ok":true,"total":1,"connections":[{"id":\#(h),"account":\#(h),"remote":\#(h),"platform":\#(h),"appVersion":\#(h),"channels":[\#(h)],"connectedAt":1,"queuedBytes":5,"messagesIn":1,"messagesOut":2}]}"#
    }
    static var channelsReply: String {
        #"{"ok":true,"channels":[{"name":\#(hostileJSON),"subscribers":1,"accounts":1,"published":1,"publishedPerSecond":0,"delivered":1,"lastEventAt":null}]}"#
    }
    static var statsReply: String {
        let h = hostileJSON
        return #"{"ok":true,"stats":{"version":\#(h),"uptimeSeconds":1,"listen":\#(h),"socket":\#(h),"auth":\#(h),"connections":{"open":1,"handshaking":0,"limit":10},"authFailures":{}}}"#
    }
    static var channelReply: String {
        let h = hostileJSON
        return #"{"ok":true,"channel":{"name":\#(h),"subscribers":1,"accounts":1,"published":1,"delivered":1,"lastEventAt":null,"topAccounts":[{"account":\#(h),"subscribers":1}],"recentEvents":[{"type":\#(h),"account":\#(h),"broadcast":false,"seq":1,"size":2,"delivered":1,"at":1}]}}"#
    }

    @Test func everyHumanViewEscapes() throws {
        let hub = FakeHub(replies: ["connections": Self.connectionsReply, "channels": Self.channelsReply,
                                    "stats": Self.statsReply, "channel": Self.channelReply])
        defer { hub.stop() }
        Self.expectClean(try HubctlRun.run(["connections"], socket: hub.path), "connections")
        Self.expectClean(try HubctlRun.run(["channels"], socket: hub.path), "channels")
        Self.expectClean(try HubctlRun.run(["status"], socket: hub.path), "status")
        Self.expectClean(try HubctlRun.run(["channel", "c"], socket: hub.path), "channel")
        Self.expectClean(try HubctlRun.run(["top", "--once"], socket: hub.path), "top")
    }

    @Test func tailEscapesTypeAccountAndData() throws {
        let h = Self.hostileJSON
        // Raw DEL and C1 inside the data: JSON does not require them escaped, and the hub passes data through.
        let event = #"{"event":{"channel":"c","type":\#(h),"account":\#(h),"broadcast":false,"seq":1,"delivered":1,"at":1,"data":{"k":"\#(Self.hostile.replacingOccurrences(of: "\u{1B}", with: "\\u001b").replacingOccurrences(of: "\u{07}", with: "\\u0007").replacingOccurrences(of: "\t", with: "\\t"))"}}}"#
        let hub = FakeHub { _ in .linesThenClose([#"{"ok":true,"tailing":"c"}"#, event]) }
        defer { hub.stop() }
        let run = try HubctlRun.run(["tail", "c"], socket: hub.path)
        Self.expectClean(run, "tail")
        #expect(run.stdout.contains("\\x7f") && run.stdout.contains("\\x9b"), "\(run.stdout)")
        // --json: the line exactly as the hub sent it.
        let json = try HubctlRun.run(["tail", "c", "--json"], socket: hub.path)
        #expect(json.stdout == event + "\n")
    }

    @Test func errorMessagesFromTheHubAreEscapedToo() throws {
        let reply = #"{"ok":false,"error":{"code":"NOT_FOUND","message":\#(Self.hostileJSON)}}"#
        let hub = FakeHub(replies: ["disconnect": reply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["disconnect", "--conn", "0-1"], socket: hub.path)
        #expect(run.code == 1)
        #expect(run.stderr.contains("error: NOT_FOUND: " + Self.hostileEscaped), "\(run.stderr)")
        #expect(!run.stderr.unicodeScalars.contains { TerminalText.isControl($0) && $0 != "\n" })
        // --json prints the error reply as received.
        let json = try HubctlRun.run(["disconnect", "--conn", "0-1", "--json"], socket: hub.path)
        #expect(json.stdout == reply + "\n")
    }

    @Test func jsonOutputStaysExact() throws {
        let hub = FakeHub(replies: ["connections": Self.connectionsReply, "channel": Self.channelReply])
        defer { hub.stop() }
        #expect(try HubctlRun.run(["connections", "--json"], socket: hub.path).stdout == Self.connectionsReply + "\n")
        #expect(try HubctlRun.run(["channel", "c", "--json"], socket: hub.path).stdout == Self.channelReply + "\n")
    }

    // MARK: Live

    /// A real client puts ESC and C1 into its token's `sub` and C1 and a tab into its headers (the HTTP parser
    /// allows obs-text and HTAB in field values); `hubctl connections`, `channel` and `top` show them escaped.
    @Test func liveHostileClientIsShownEscaped() throws {
        let hub = try HubProcess()
        let account = "acc\u{1B}[2J\u{9B}31m"
        let platform = "i\u{9B}31mOS"
        let appVersion = "1.0\t\u{85}"
        let ws = try hub.client(account, channels: ["wallet_updates"],
                                headers: [("X-Platform", platform), ("X-App-Version", appVersion)])
        #expect(try hub.publish(channel: "wallet_updates", account: account, type: "t\u{1B}[1m")["delivered"] as? Int == 1)
        _ = try ws.nextText()

        let human = try HubctlRun.run(["connections"], socket: hub.socketPath)
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stdout.contains("acc\\x1b[2J\\x9b31m"), "\(human.stdout)")
        #expect(human.stdout.contains("i\\x9b31mOS") && human.stdout.contains("1.0\\x09\\x85"), "\(human.stdout)")
        for run in [human, try HubctlRun.run(["channel", "wallet_updates"], socket: hub.socketPath),
                    try HubctlRun.run(["top", "--once"], socket: hub.socketPath)] {
            #expect(run.code == 0, "\(run.stderr)")
            #expect(!run.stdout.unicodeScalars.contains { TerminalText.isControl($0) && $0 != "\n" }, "\(run.stdout)")
        }

        let json = try HubctlRun.run(["connections", "--json"], socket: hub.socketPath)
        let object = try parseObject(json.stdout)
        let row = try #require((object["connections"] as? [[String: Any]])?.first)
        // Exact, compared as Unicode scalars (Swift's String == would also accept canonical equivalents).
        #expect((row["account"] as? String).map { Array($0.unicodeScalars) } == Array(account.unicodeScalars))
        #expect((row["platform"] as? String).map { Array($0.unicodeScalars) } == Array(platform.unicodeScalars))
        #expect((row["appVersion"] as? String).map { Array($0.unicodeScalars) } == Array(appVersion.unicodeScalars))
    }
}
