import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A real hub in a known state, for running the built `hubctl` against it:
///
/// - acc_1: two connections, `ios` (iOS 1.0.0, wallet_updates) and `android` (Android 2.1.0, wallet_updates and
///   profile_updates); acc_2: one connection `other` (wallet_updates).
/// - published on wallet_updates: acc_1 seq 1 (delivered 2), acc_2 seq 1 (delivered 1), acc_1 seq 2 (delivered 2),
///   each read by its recipients.
final class LiveHub {
    let hub: HubProcess
    let ios: TestWebSocket
    let android: TestWebSocket
    let other: TestWebSocket

    /// (type, account, seq, delivered, data) of the setup's events, oldest first.
    static let published: [(type: String, account: String, seq: Int, delivered: Int, data: String)] = [
        ("wallet_balance_changed", "acc_1", 1, 2, #"{"balance":"1.5"}"#),
        ("wallet_locked", "acc_2", 1, 1, #"{"locked":true}"#),
        ("wallet_balance_changed", "acc_1", 2, 2, #"{"balance":"2"}"#),
    ]

    init() throws {
        hub = try HubProcess()
        ios = try hub.client("acc_1", channels: ["wallet_updates"], headers: [("X-Platform", "iOS"), ("X-App-Version", "1.0.0")])
        android = try hub.client("acc_1", channels: ["wallet_updates", "profile_updates"],
                                 headers: [("X-Platform", "Android"), ("X-App-Version", "2.1.0")])
        other = try hub.client("acc_2", channels: ["wallet_updates"])
        for event in Self.published {
            let reply = try hub.publish(channel: "wallet_updates", account: event.account, type: event.type, data: event.data)
            guard reply["seq"] as? Int == event.seq, reply["delivered"] as? Int == event.delivered else {
                throw HubTestError("setup publish: \(reply)")
            }
            let frame = Self.frame(event.type, seq: event.seq, data: event.data)
            for ws in event.account == "acc_1" ? [ios, android] : [other] {
                let text = try ws.nextText()
                guard text == frame else { throw HubTestError("setup delivery: \(text), expected \(frame)") }
            }
        }
    }

    /// Drops the clients' TCP connections before the hub stops, so its graceful shutdown does not wait for their
    /// close replies (the tests' clients are not reading by then).
    deinit { stopHub() }

    /// Stops the hub (SIGTERM) after dropping the clients; returns its exit status.
    @discardableResult
    func stopHub() -> Int32? {
        for ws in [ios, android, other] { shutdown(ws.fd, Int32(SHUT_RDWR)) }
        return hub.stop()
    }

    static func frame(_ type: String, seq: Int, data: String, channel: String = "wallet_updates") -> String {
        #"{"type":"\#(type)","channel":"\#(channel)","seq":\#(seq),"data":\#(data)}"#
    }

    /// Runs `hubctl --socket <this hub's socket> ARGS` to completion (bounded).
    func hubctl(_ arguments: [String], timeout: Double = 10) throws -> HubctlResult {
        try LiveHub.hubctl(["--socket", hub.socketPath] + arguments, timeout: timeout)
    }

    static func hubctl(_ arguments: [String], timeout: Double = 10) throws -> HubctlResult {
        let process = try InteropProcess(HubProcess.hubctlPath, arguments)
        let status = process.wait(timeout: timeout)
        return HubctlResult(status: status, stdout: process.stdout, stderr: process.stderr, summary: process.summary)
    }
}

struct HubctlResult {
    /// nil: killed after the timeout.
    let status: Int32?
    let stdout: String
    let stderr: String
    let summary: String

    var lines: [String] { stdout.split(separator: "\n").map(String.init) }
    var json: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(stdout.utf8))) as? [String: Any] ?? [:] }

    /// The whitespace-separated cells of the first table row whose first cell is `key`.
    func row(_ key: String, after marker: String? = nil) -> [String]? {
        var rows = lines[...]
        if let marker, let start = rows.firstIndex(where: { $0.contains(marker) }) { rows = rows[(start + 1)...] }
        return rows.map { $0.split(separator: " ").map(String.init) }.first { $0.first == key }
    }
}

/// `hubctl` (the built binary, as a subprocess) against the real hub: each command's human and `--json`
/// output checked against a known state, the side effects checked on real client connections.
@Suite struct HubctlLiveTests {
    @Test func statusCountsTheOpenConnections() throws {
        let live = try LiveHub()
        let human = try live.hubctl(["status"])
        #expect(human.status == 0, "\(human.summary)")
        let connections = human.lines.first { $0.hasPrefix("connections") } ?? ""
        #expect(connections.contains(" 3 open, 0 handshaking"), "\(human.summary)")
        #expect(human.row("subscriptions")?.last == "4", "\(human.summary)")
        #expect(human.stdout.contains("socket \(live.hub.socketPath)"), "\(human.summary)")

        let json = try live.hubctl(["status", "--json"])
        #expect(json.status == 0, "\(json.summary)")
        #expect(json.lines.count == 1, "\(json.summary)")
        let stats = json.json["stats"] as? [String: Any] ?? [:]
        #expect((stats["connections"] as? [String: Any])?["open"] as? Int == 3, "\(json.summary)")
        #expect(stats["subscriptions"] as? Int == 4, "\(json.summary)")
        #expect((stats["publishes"] as? [String: Any])?["total"] as? Int == 3, "\(json.summary)")
        #expect((stats["publishes"] as? [String: Any])?["delivered"] as? Int == 5, "\(json.summary)")
        #expect(stats["pid"] as? Int == Int(live.hub.process.processIdentifier), "\(json.summary)")
    }

    @Test func channelsRows() throws {
        let live = try LiveHub()
        let human = try live.hubctl(["channels"])
        #expect(human.status == 0, "\(human.summary)")
        // CHANNEL SUBSCRIBERS ACCOUNTS PUBLISHED /S DELIVERED LAST EVENT
        let wallet = human.row("wallet_updates") ?? []
        #expect(wallet.count >= 7, "\(human.summary)")
        if wallet.count >= 7 {
            #expect([wallet[1], wallet[2], wallet[3], wallet[5]] == ["3", "2", "3", "5"], "\(human.summary)")
            #expect(wallet[6] != "never", "\(human.summary)")
        }
        #expect(human.row("profile_updates") == ["profile_updates", "1", "1", "0", "0", "0", "never"], "\(human.summary)")

        let json = try live.hubctl(["channels", "--json"])
        let rows = json.json["channels"] as? [[String: Any]] ?? []
        let byName = Dictionary(uniqueKeysWithValues: rows.compactMap { row in (row["name"] as? String).map { ($0, row) } })
        let w = byName["wallet_updates"] ?? [:]
        #expect([w["subscribers"], w["accounts"], w["published"], w["delivered"]].map { $0 as? Int } == [3, 2, 3, 5], "\(json.summary)")
        #expect(w["lastEventAt"] is Double, "\(json.summary)")
        #expect(byName["profile_updates"]?["lastEventAt"] is NSNull, "\(json.summary)")
    }

    @Test func channelShowsRecentEventsNewestFirst() throws {
        let live = try LiveHub()
        let human = try live.hubctl(["channel", "wallet_updates"])
        #expect(human.status == 0, "\(human.summary)")
        #expect(human.row("subscribers")?.last == "3", "\(human.summary)")
        #expect(human.row("accounts")?.last == "2", "\(human.summary)")
        #expect(human.row("published")?.last == "3", "\(human.summary)")
        #expect(human.row("acc_1", after: "top accounts") == ["acc_1", "2"], "\(human.summary)")
        #expect(human.row("acc_2", after: "top accounts") == ["acc_2", "1"], "\(human.summary)")
        // TYPE ACCOUNT SEQ SIZE DELIVERED WHEN, newest first
        let events = human.lines.drop { !$0.contains("recent events") }.dropFirst(2)
            .map { $0.split(separator: " ").map(String.init) }
        let expected = LiveHub.published.reversed().map { [$0.type, $0.account, String($0.seq)] }
        #expect(events.map { Array($0.prefix(3)) } == expected, "\(human.summary)")
        #expect(events.map { $0.count > 5 ? $0[5] : "" } == LiveHub.published.reversed().map { String($0.delivered) }, "\(human.summary)")

        let json = try live.hubctl(["channel", "wallet_updates", "--json"])
        let channel = json.json["channel"] as? [String: Any] ?? [:]
        let recent = channel["recentEvents"] as? [[String: Any]] ?? []
        #expect(recent.map { $0["type"] as? String } == LiveHub.published.reversed().map { $0.type }, "\(json.summary)")
        #expect(recent.map { $0["seq"] as? Int } == LiveHub.published.reversed().map { $0.seq }, "\(json.summary)")
        #expect(recent.map { $0["account"] as? String } == LiveHub.published.reversed().map { $0.account }, "\(json.summary)")
        #expect(recent.map { $0["delivered"] as? Int } == LiveHub.published.reversed().map { $0.delivered }, "\(json.summary)")
        // size: the event's whole WebSocket frame as written to the clients (a 2-byte header before these payloads)
        #expect(recent.map { $0["size"] as? Int }
                == LiveHub.published.reversed().map { LiveHub.frame($0.type, seq: $0.seq, data: $0.data).utf8.count + 2 }, "\(json.summary)")

        let one = try live.hubctl(["channel", "wallet_updates", "--account", "acc_2", "--json"])
        let restricted = (one.json["channel"] as? [String: Any])?["recentEvents"] as? [[String: Any]] ?? []
        #expect(restricted.map { $0["type"] as? String } == ["wallet_locked"], "\(one.summary)")
    }

    @Test func connectionsFilteredByAccount() throws {
        let live = try LiveHub()
        let human = try live.hubctl(["connections", "--account", "acc_1"])
        #expect(human.status == 0, "\(human.summary)")
        let rows = human.lines.dropFirst().map { $0.split(separator: " ").map(String.init) }
        #expect(rows.count == 2, "\(human.summary)")
        #expect(rows.allSatisfy { $0.count > 1 && $0[1] == "acc_1" }, "\(human.summary)")
        #expect(Set(rows.compactMap { $0.count > 4 ? $0[3] + " " + $0[4] : nil }) == ["iOS 1.0.0", "Android 2.1.0"], "\(human.summary)")
        #expect(!human.stdout.contains("acc_2"), "\(human.summary)")

        let json = try live.hubctl(["connections", "--account", "acc_1", "--json"])
        let connections = json.json["connections"] as? [[String: Any]] ?? []
        #expect(json.json["total"] as? Int == 2, "\(json.summary)")
        #expect(connections.map { $0["account"] as? String } == ["acc_1", "acc_1"], "\(json.summary)")
        #expect(Set(connections.compactMap { $0["platform"] as? String }) == ["iOS", "Android"], "\(json.summary)")
    }

    @Test func publishPrintsSeqAndDeliveredAndClientsGetTheDataByteForByte() throws {
        let live = try LiveHub()
        let run = try live.hubctl(["publish", "wallet_updates", "--account", "acc_1", "--type", "t", #"{"x":1}"#])
        #expect(run.status == 0, "\(run.summary)")
        #expect(run.stdout == "published seq 3, delivered to 2 connections\n", "\(run.summary)")
        for ws in [live.ios, live.android] {
            #expect(try ws.nextText() == LiveHub.frame("t", seq: 3, data: #"{"x":1}"#))
        }

        // As typed: spacing, key order and number spelling survive; the trimmed outer whitespace does not.
        let typed = #"{ "z" : 1.50, "a":[1e2 ,-0.0], "s":"\u00e9 é🙂" }"#
        let json = try live.hubctl(["publish", "wallet_updates", "--account", "acc_1", "--type", "typed", "--json", "  \(typed)\n"])
        #expect(json.stdout == #"{"ok":true,"seq":4,"delivered":2}"# + "\n", "\(json.summary)")
        for ws in [live.ios, live.android] {
            #expect(try ws.nextText() == LiveHub.frame("typed", seq: 4, data: typed))
        }
        #expect(try live.other.isQuiet(for: 0.2))
    }

    @Test func tailJSONStreamsEventsAndEndsCleanlyOnSIGINT() throws {
        let live = try LiveHub()
        let tail = try InteropProcess(HubProcess.hubctlPath, ["--socket", live.hub.socketPath, "tail", "wallet_updates", "--json"])
        // hubctl --json does not print the hub's acknowledgement, so publish until the first event shows up.
        var n = 0
        let arrived = eventually(timeout: 5) {
            n += 1
            _ = try? live.hub.publish(channel: "wallet_updates", account: "acc_1", type: "tailed", data: #"{"n":\#(n)}"#)
            return tail.waitForStdoutLines(1, timeout: 0.2)
        }
        #expect(arrived, "\(tail.summary)")
        let first = try #require(tail.stdoutLines.first)
        let event = try #require((try JSONSerialization.jsonObject(with: Data(first.utf8)) as? [String: Any])?["event"] as? [String: Any],
                                 "\(tail.summary)")
        let k = try #require((event["data"] as? [String: Any])?["n"] as? Int)
        #expect(event["type"] as? String == "tailed")
        #expect(event["channel"] as? String == "wallet_updates")
        #expect(event["account"] as? String == "acc_1")
        #expect(event["broadcast"] as? Bool == false)
        #expect(event["seq"] as? Int == 2 + k)
        #expect(event["delivered"] as? Int == 2)
        #expect(first.hasSuffix(#","data":{"n":\#(k)}}}"#), "the hub's line as sent: \(first)")

        // One more, after the tail is known to be live: it must arrive, exactly once, in order.
        let lines = tail.stdoutLines.count
        let reply = try live.hub.publish(channel: "wallet_updates", account: "acc_2", type: "tailed_last", data: #"{"last" : true}"#)
        #expect(tail.waitForStdoutLines(lines + 1, timeout: 5), "\(tail.summary)")
        let last = tail.stdoutLines.last ?? ""
        #expect(last.hasPrefix(#"{"event":{"type":"tailed_last","channel":"wallet_updates","account":"acc_2","broadcast":false,"seq":\#(reply["seq"] as? Int ?? -1),"#), "\(tail.summary)")
        #expect(last.hasSuffix(#","data":{"last" : true}}}"#), "\(tail.summary)")

        tail.signal(SIGINT)
        #expect(tail.wait(timeout: 5) == 0, "\(tail.summary)")
        #expect(tail.process.terminationReason == .exit, "\(tail.summary)")
    }

    @Test func disconnectAnAccountWithCodeAndReason() throws {
        let live = try LiveHub()
        let run = try live.hubctl(["disconnect", "--account", "acc_2", "--code", "4000", "--reason", "bye"])
        #expect(run.status == 0, "\(run.summary)")
        #expect(run.stdout == "disconnected 1 connection\n", "\(run.summary)")
        let close = try live.other.expectClose()
        #expect(close.code == 4000)
        #expect(close.reason == "bye")
        try live.other.sendClose(code: 4000)
        #expect(try live.other.waitForEOF())

        // acc_1 untouched: still open, still subscribed, still counted.
        for ws in [live.ios, live.android] { #expect(try ws.isQuiet(for: 0.2)) }
        let reply = try live.hub.publish(channel: "wallet_updates", account: "acc_1", type: "after", data: "{}")
        #expect(reply["delivered"] as? Int == 2, "\(reply)")
        for ws in [live.ios, live.android] {
            #expect(try ws.nextText() == LiveHub.frame("after", seq: 3, data: "{}"))
        }
        #expect(eventually { (try? live.hub.request(#"{"op":"connections"}"#))?["total"] as? Int == 2 })
    }

    @Test func tokenFromTheSecretFileConnects() throws {
        let live = try LiveHub()
        let run = try LiveHub.hubctl(["token", "acc_9", "--secret-file", live.hub.stateDirectory + "/jwt-secret"])
        #expect(run.status == 0, "\(run.summary)")
        let token = run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(token.split(separator: ".").count == 3, "\(run.summary)")
        let ws = try TestWebSocket.connect(port: live.hub.port, headers: [("Authorization", "Bearer \(token)")])
        try ws.send(text: #"{"type":"subscribe","channels":["wallet_updates"],"id":1}"#)
        #expect(withoutPositions(try ws.nextText()) == #"{"type":"subscribed","channels":["wallet_updates"],"id":1}"#)
        let reply = try live.hub.publish(channel: "wallet_updates", account: "acc_9", type: "hello", data: "[9]")
        #expect(reply["delivered"] as? Int == 1, "\(reply)")
        #expect(try ws.nextText() == LiveHub.frame("hello", seq: 1, data: "[9]"))

        // The state dir instead of the file; --json names the account and expiry; the token is accepted too.
        let json = try LiveHub.hubctl(["token", "acc_8", "--state-dir", live.hub.stateDirectory, "--ttl", "90s", "--json"])
        #expect(json.status == 0, "\(json.summary)")
        #expect(json.json["account"] as? String == "acc_8", "\(json.summary)")
        let expiresAt = json.json["expiresAt"] as? Int ?? 0
        #expect(abs(expiresAt - Int(time(nil)) - 90) <= 2, "\(json.summary)")
        let other = try TestWebSocket.connect(port: live.hub.port, headers: [("Authorization", "Bearer \(json.json["token"] as? String ?? "")")])
        try other.send(text: #"{"type":"ping","id":2}"#)
        #expect(try other.nextText() == #"{"type":"pong","id":2}"#)
    }

    @Test func topOnceRendersOneFrame() throws {
        let live = try LiveHub()
        let run = try live.hubctl(["top", "--once"])
        #expect(run.status == 0, "\(run.summary)")
        #expect(!run.stdout.contains("\u{1B}["), "no terminal control with --once: \(run.summary)")
        #expect(run.stdout.contains("connections 3 open"), "\(run.summary)")
        #expect(run.stdout.contains("busiest channels") && run.stdout.contains("busiest connections"), "\(run.summary)")
        let wallet = run.row("wallet_updates", after: "busiest channels") ?? []
        #expect(wallet.count > 1 && wallet[1] == "3", "\(run.summary)")
        let accounts = run.lines.drop { !$0.contains("busiest connections") }.dropFirst(2)
            .compactMap { $0.split(separator: " ").dropFirst().first.map(String.init) }
        #expect(accounts.sorted() == ["acc_1", "acc_1", "acc_2"], "\(run.summary)")

        let json = try live.hubctl(["top", "--once", "--json"])
        #expect(json.status == 0, "\(json.summary)")
        #expect(((json.json["stats"] as? [String: Any])?["stats"] as? [String: Any]).map { ($0["connections"] as? [String: Any])?["open"] as? Int } == 3,
                "\(json.summary)")
        #expect((json.json["connections"] as? [String: Any])?["total"] as? Int == 3, "\(json.summary)")

        // Without --once but with stdout not a terminal (a pipe here): one frame, no terminal control, exit 0.
        // The socket from $HUB_SOCKET this time.
        let piped = try InteropProcess(HubProcess.hubctlPath, ["top"], environment: ["HUB_SOCKET": live.hub.socketPath])
        #expect(piped.wait(timeout: 5) == 0, "\(piped.summary)")
        #expect(piped.stdout.contains("connections 3 open") && !piped.stdout.contains("\u{1B}["), "\(piped.summary)")
    }

    @Test func unknownChannelIsExit1WithTheHubsCode() throws {
        let live = try LiveHub()
        let human = try live.hubctl(["channel", "nope"])
        #expect(human.status == 1, "\(human.summary)")
        #expect(human.stderr.contains("UNKNOWN_CHANNEL"), "\(human.summary)")
        #expect(human.stdout.isEmpty, "\(human.summary)")

        let json = try live.hubctl(["channel", "nope", "--json"])
        #expect(json.status == 1, "\(json.summary)")
        #expect((json.json["error"] as? [String: Any])?["code"] as? String == "UNKNOWN_CHANNEL", "\(json.summary)")

        let publish = try live.hubctl(["publish", "nope", "--account", "acc_1", "--type", "t", "{}"])
        #expect(publish.status == 1, "\(publish.summary)")
        #expect(publish.stderr.contains("UNKNOWN_CHANNEL"), "\(publish.summary)")
    }

    @Test func noHubAtTheSocketPathIsExit3NamingThePath() throws {
        let live = try LiveHub()
        // A path next to the live hub's socket where nothing listens, and a socket file whose hub has gone.
        let missing = live.hub.directory + "/no-hub-here.sock"
        let run = try LiveHub.hubctl(["--socket", missing, "status"])
        #expect(run.status == 3, "\(run.summary)")
        #expect(run.stderr.contains(missing), "\(run.summary)")
        #expect(run.stdout.isEmpty, "\(run.summary)")

        #expect(live.stopHub() == 0)
        let gone = try live.hubctl(["channels"])
        #expect(gone.status == 3, "\(gone.summary)")
        #expect(gone.stderr.contains(live.hub.socketPath), "\(gone.summary)")
    }

    // MARK: More commands and the counts after connections go away

    @Test func publishDataFromStdinAndFileAndBroadcast() throws {
        let live = try LiveHub()
        // stdin: line breaks become spaces, surrounding whitespace is trimmed, the rest is as typed.
        let stdin = try InteropProcess(HubProcess.hubctlPath, ["--socket", live.hub.socketPath, "publish", "wallet_updates",
                                                                 "--account", "acc_2", "--type", "from_stdin", "-"],
                                       stdin: "\n  {\n  \"a\" : [1,\n 2]\n}\n\n")
        #expect(stdin.wait() == 0, "\(stdin.summary)")
        #expect(stdin.stdout == "published seq 2, delivered to 1 connection\n", "\(stdin.summary)")
        #expect(try live.other.nextText() == LiveHub.frame("from_stdin", seq: 2, data: #"{   "a" : [1,  2] }"#))

        let file = live.hub.directory + "/event.json"
        try Data(#"{"from":"file","n":1.0}"#.utf8).write(to: URL(fileURLWithPath: file))
        let fromFile = try live.hubctl(["publish", "profile_updates", "--account", "acc_1", "--type", "from_file", "--data-file", file])
        #expect(fromFile.status == 0, "\(fromFile.summary)")
        #expect(fromFile.stdout == "published seq 1, delivered to 1 connection\n", "\(fromFile.summary)")
        #expect(try live.android.nextText() == LiveHub.frame("from_file", seq: 1, data: #"{"from":"file","n":1.0}"#, channel: "profile_updates"))
        #expect(try live.ios.isQuiet(for: 0.2))

        let broadcast = try live.hubctl(["publish", "wallet_updates", "--broadcast", "--type", "maintenance", "--json", "{}"])
        #expect(broadcast.stdout == #"{"ok":true,"seq":1,"delivered":3}"# + "\n", "\(broadcast.summary)")
        for ws in [live.ios, live.android, live.other] {
            #expect(try ws.nextText() == #"{"type":"maintenance","channel":"wallet_updates","seq":1,"broadcast":true,"data":{}}"#)
        }

        let nobody = try live.hubctl(["publish", "wallet_updates", "--account", "acc_9", "--type", "t", "{}"])
        #expect(nobody.status == 0, "\(nobody.summary)")
        #expect(nobody.stdout.hasPrefix("published seq 1, delivered to 0 connections\n"), "\(nobody.summary)")
        #expect(nobody.stdout.contains("acc_9"), "the push fallback hint: \(nobody.summary)")

        let invalid = try live.hubctl(["publish", "wallet_updates", "--account", "acc_1", "--type", "t", #"{"a":}"#])
        #expect(invalid.status == 4, "\(invalid.summary)")
        #expect(try live.ios.isQuiet(for: 0.1))
    }

    @Test func disconnectOneConnectionById() throws {
        let live = try LiveHub()
        let listed = try live.hubctl(["connections", "--channel", "profile_updates", "--json"])
        let rows = listed.json["connections"] as? [[String: Any]] ?? []
        #expect(rows.count == 1 && rows.first?["platform"] as? String == "Android", "\(listed.summary)")
        let id = try #require(rows.first?["id"] as? String)

        let run = try live.hubctl(["disconnect", "--conn", id])
        #expect(run.status == 0, "\(run.summary)")
        #expect(run.stdout == "disconnected 1 connection\n", "\(run.summary)")
        let close = try live.android.expectClose()
        #expect(close.code == 1000 && close.reason == "disconnected by operator")
        #expect(try live.ios.isQuiet(for: 0.1) && live.other.isQuiet(for: 0.1))

        let again = try live.hubctl(["disconnect", "--conn", id])
        #expect(again.status == 1, "\(again.summary)")
        #expect(again.stderr.contains("NOT_FOUND"), "\(again.summary)")

        let tooLong = try live.hubctl(["disconnect", "--account", "acc_1", "--reason", String(repeating: "x", count: 124)])
        #expect(tooLong.status == 2, "\(tooLong.summary)")
        #expect(try live.ios.isQuiet(for: 0.1))
    }

    /// The views must forget connections that are gone, however they went: closed by the operator, closed
    /// cleanly by the client, or dropped without a close frame.
    @Test func countsFollowConnectionsThatGoAway() throws {
        let live = try LiveHub()
        func wallet() throws -> [String: Any] {
            let rows = try live.hubctl(["channels", "--json"]).json["channels"] as? [[String: Any]] ?? []
            return rows.first { $0["name"] as? String == "wallet_updates" } ?? [:]
        }
        func stats() throws -> [String: Any] { try live.hubctl(["status", "--json"]).json["stats"] as? [String: Any] ?? [:] }
        func open() throws -> Int? { (try stats()["connections"] as? [String: Any])?["open"] as? Int }

        _ = try live.hubctl(["disconnect", "--account", "acc_2"])
        // Each close handshake ends the way a real client ends it: on the hub's EOF, close the socket too (the hub
        // half-closes and lingers up to 2 s for the client's FIN, counting the connection as open meanwhile).
        _ = try live.other.expectClose()
        try live.other.sendClose()
        #expect(try live.other.waitForEOF())
        shutdown(live.other.fd, Int32(SHUT_RDWR))
        #expect(eventually { (try? open()) == 2 })
        #expect(try wallet()["subscribers"] as? Int == 2)
        #expect(try wallet()["accounts"] as? Int == 1)
        #expect(try stats()["subscriptions"] as? Int == 3)

        try live.android.sendClose(code: 1000, reason: "app backgrounded")
        #expect(try live.android.expectClose().code == 1000)
        #expect(try live.android.waitForEOF())
        shutdown(live.android.fd, Int32(SHUT_RDWR))
        #expect(eventually { (try? open()) == 1 })
        #expect(try wallet()["subscribers"] as? Int == 1)
        #expect(try stats()["subscriptions"] as? Int == 1)

        // No close frame: the TCP connection just goes (app killed, network lost).
        shutdown(live.ios.fd, Int32(SHUT_RDWR))
        #expect(eventually { (try? open()) == 0 })
        #expect(try wallet()["subscribers"] as? Int == 0)
        #expect(try wallet()["accounts"] as? Int == 0)
        #expect(try stats()["subscriptions"] as? Int == 0)
        let after = try live.hubctl(["publish", "wallet_updates", "--account", "acc_1", "--type", "t", "--json", "{}"])
        #expect(after.stdout == #"{"ok":true,"seq":3,"delivered":0}"# + "\n", "\(after.summary)")
        let connections = try live.hubctl(["connections", "--json"])
        #expect(connections.json["total"] as? Int == 0, "\(connections.summary)")
    }

    @Test func tailForOneAccountAndTailEndsWhenTheHubStops() throws {
        let live = try LiveHub()
        let tail = try InteropProcess(HubProcess.hubctlPath, ["--socket", live.hub.socketPath, "tail", "wallet_updates",
                                                               "--account", "acc_2"])
        var n = 0
        let arrived = eventually(timeout: 5) {
            n += 1
            _ = try? live.hub.publish(channel: "wallet_updates", account: "acc_1", type: "not_acc_2", data: "{}")
            _ = try? live.hub.publish(channel: "wallet_updates", account: "acc_2", type: "for_acc_2", data: #"{"n":\#(n),"b":2,"a":1}"#)
            return tail.waitForStdoutLines(1, timeout: 0.2)
        }
        #expect(arrived, "\(tail.summary)")
        #expect(!tail.stdout.contains("not_acc_2"), "\(tail.summary)")
        // Human line: time, type, account, seq, delivered, data with keys sorted.
        // Which of the publishes it was: the k-th acc_2 event has seq 1 + k (the setup published seq 1).
        let line = tail.stdoutLines.first ?? ""
        let k = line.split(separator: "\"n\":").last.flatMap { Int($0.prefix { $0.isNumber }) } ?? -1
        #expect(line.hasSuffix("  for_acc_2  acc_2  seq \(1 + k)  delivered 1  {\"a\":1,\"b\":2,\"n\":\(k)}"), "\(tail.summary)")

        #expect(live.stopHub() == 0)
        #expect(tail.wait(timeout: 5) == 0, "\(tail.summary)")
        #expect(tail.stderr.contains("tail ended"), "\(tail.summary)")
    }
}
