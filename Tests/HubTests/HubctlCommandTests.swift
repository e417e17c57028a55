import Foundation
import Testing

/// Each command against the fake hub: the request it sends, its human output, and `--json`.
@Suite struct HubctlCommandTests {
    static let statsReply = #"{"ok":true,"stats":{"version":"0.1.0","uptimeSeconds":7985.5,"pid":4242,"listen":"127.0.0.1:8080","socket":"./hub.sock","auth":"HS256 (secret file .hub-state/jwt-secret)","threads":[{"index":0,"connections":10,"busy":0.03},{"index":1,"connections":1234,"busy":0.5}],"connections":{"open":10,"handshaking":1,"limit":19000},"subscriptions":18,"messages":{"in":100,"out":2000,"inPerSecond":1.0,"outPerSecond":20.0},"bytes":{"in":5000,"out":3565158,"inPerSecond":50.0,"outPerSecond":900.0},"publishes":{"total":300,"perSecond":3.0,"delivered":1900},"drops":{"slowConsumerCloses":4,"rateLimited":0,"rejectedConnections":0},"authFailures":{"expired":2,"bad_signature":1},"descriptors":{"open":25,"limit":20000}}}"#

    static var channelsReply: String {
        let now = Date().timeIntervalSince1970
        return #"{"ok":true,"channels":[{"name":"wallet_updates","subscribers":10,"accounts":7,"published":1200,"publishedPerSecond":0.5,"delivered":100,"lastEventAt":\#(now - 300)},{"name":"profile_updates","subscribers":12345,"accounts":3,"published":0,"publishedPerSecond":0,"delivered":0,"lastEventAt":null}]}"#
    }

    static var connectionsReply: String {
        let now = Date().timeIntervalSince1970
        return #"{"ok":true,"total":3,"connections":[{"id":"0-17","account":"acc_1","remote":"127.0.0.1:51234","platform":"iOS","appVersion":"1.0.0","channels":["wallet_updates","profile_updates"],"connectedAt":\#(now - 7980),"queuedBytes":0,"messagesIn":3,"messagesOut":40},{"id":"1-3","account":"acc_22","remote":"10.0.0.5:40000","platform":"Android","appVersion":"2.10.1","channels":[],"connectedAt":\#(now - 30),"queuedBytes":2048,"messagesIn":1,"messagesOut":12000}]}"#
    }

    @Test func statusHuman() throws {
        let hub = FakeHub(replies: ["stats": Self.statsReply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["status"], socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.lines[0] == "hub 0.1.0  pid 4242  up 2h13m")
        #expect(run.stdout.contains("connections    10 open, 1 handshaking, limit 19000 (0%)"))
        #expect(run.stdout.contains("subscriptions  18\n"))
        #expect(run.stdout.contains("messages       in 100 (1.0/s)  out 2.0k (20/s)"))
        #expect(run.stdout.contains("out 3.4 MiB (900 B/s)"))
        #expect(run.stdout.contains("publishes      300 (3.0/s), delivered 1.9k"))
        #expect(run.stdout.contains("slow-consumer closes 4"))
        #expect(run.stdout.contains("auth failures  bad_signature 1, expired 2"))
        #expect(run.stdout.contains("descriptors    25 / 20.0k (0%)"))
        // Thread table: numbers right-aligned under their headers.
        let lines = run.lines
        let header = try #require(lines.firstIndex { $0.hasPrefix("THREAD") })
        #expect(lines[header] == "THREAD  CONNECTIONS  BUSY")
        #expect(lines[header + 1] == "     0           10    3%")
        #expect(lines[header + 2] == "     1         1.2k   50%")
        #expect(!run.stdout.contains("\u{1B}["), "no colour when stdout is not a TTY")
    }

    @Test func statusJSONIsTheReply() throws {
        let hub = FakeHub(replies: ["stats": Self.statsReply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["--json", "status"], socket: hub.path)
        #expect(run.code == 0)
        #expect(run.stdout == Self.statsReply + "\n")
        #expect(try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) is [String: Any])
    }

    @Test func channelsHuman() throws {
        let hub = FakeHub(replies: ["channels": Self.channelsReply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["channels"], socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.lines[0] == "CHANNEL          SUBSCRIBERS  ACCOUNTS  PUBLISHED   /S  DELIVERED  LAST EVENT")
        #expect(run.lines[1] == "wallet_updates            10         7       1.2k  0.5        100  5m ago")
        #expect(run.lines[2] == "profile_updates        12.3k         3          0    0          0  never")
        #expect(hub.received == [#"{"op":"channels"}"#])
    }

    @Test func channelsJSON() throws {
        let reply = Self.channelsReply
        let hub = FakeHub(replies: ["channels": reply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["channels", "--json"], socket: hub.path)
        #expect(run.code == 0)
        #expect(run.stdout == reply + "\n")
    }

    @Test func channelDetail() throws {
        let now = Date().timeIntervalSince1970
        let reply = #"{"ok":true,"channel":{"name":"wallet_updates","subscribers":10,"accounts":7,"published":120,"delivered":100,"lastEventAt":\#(now - 120),"topAccounts":[{"account":"acc_1","subscribers":3}],"recentEvents":[{"type":"wallet_balance_changed","account":"acc_1","broadcast":false,"seq":17,"size":80,"delivered":2,"at":\#(now - 120)},{"type":"maintenance","broadcast":true,"seq":3,"size":2048,"delivered":10,"at":\#(now - 7200)}]}}"#
        let hub = FakeHub(replies: ["channel": reply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["channel", "wallet_updates", "--account", "acc_1"], socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        let request = try #require(hub.requests.first)
        #expect(request["channel"] as? String == "wallet_updates")
        #expect(request["account"] as? String == "acc_1")
        #expect(run.lines[0] == "channel wallet_updates")
        #expect(run.stdout.contains("last event   2m ago"))
        #expect(run.stdout.contains("  ACCOUNT  SUBSCRIBERS\n  acc_1              3\n"))
        #expect(run.stdout.contains("  TYPE                    ACCOUNT    SEQ     SIZE  DELIVERED  WHEN\n"))
        #expect(run.stdout.contains("  wallet_balance_changed  acc_1       17     80 B          2  2m ago\n"))
        #expect(run.stdout.contains("  maintenance             broadcast    3  2.0 KiB         10  2h0m ago"))

        let json = try HubctlRun.run(["channel", "wallet_updates", "--json"], socket: hub.path)
        #expect(json.code == 0, "\(json.stderr)")
        #expect(json.stdout == reply + "\n")
        #expect(hub.requests.last?["account"] == nil)
    }

    @Test func connectionsWithFilters() throws {
        let reply = Self.connectionsReply
        let hub = FakeHub(replies: ["connections": reply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["connections", "--account=acc_1", "--channel", "wallet_updates", "--limit", "2"],
                                    socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        let request = try #require(hub.requests.first)
        #expect(request["account"] as? String == "acc_1")
        #expect(request["channel"] as? String == "wallet_updates")
        #expect(request["limit"] as? Int == 2)
        #expect(run.lines[0].hasPrefix("ID    ACCOUNT  REMOTE           PLATFORM  APP     CHANNELS"))
        #expect(run.lines[1].hasPrefix("0-17  acc_1    127.0.0.1:51234  iOS       1.0.0   wallet_updates,profile_updates"))
        #expect(run.lines[1].hasSuffix("  2h13m      0 B   3     40"))
        #expect(run.lines[2].hasSuffix("  -                                 30s  2.0 KiB   1  12.0k"))
        #expect(run.lines[3] == "showing 2 of 3 connections (raise --limit to see more)")

        let json = try HubctlRun.run(["connections", "--json"], socket: hub.path)
        #expect(json.stdout == reply + "\n")
        #expect(hub.requests.last?.keys.sorted() == ["op"])
    }

    @Test func publishSendsDataByteForByte() throws {
        let hub = FakeHub(replies: ["publish": #"{"ok":true,"seq":17,"delivered":2}"#])
        defer { hub.stop() }
        let data = #"{"b":  "1.50", "a":1e2, "c":[1.0, "\u00e9"]}"#
        let run = try HubctlRun.run(["publish", "wallet_updates", "--account", "acc_1",
                                     "--type", "wallet_balance_changed", data], socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout == "published seq 17, delivered to 2 connections\n")
        let line = try #require(hub.received.first)
        #expect(line.hasSuffix(#","data":"# + data + "}"))
        let request = try #require(hub.requests.first)
        #expect(request["op"] as? String == "publish")
        #expect(request["channel"] as? String == "wallet_updates")
        #expect(request["account"] as? String == "acc_1")
        #expect(request["type"] as? String == "wallet_balance_changed")
        #expect(request["broadcast"] == nil)
    }

    @Test func publishZeroDeliveredHintsPush() throws {
        let hub = FakeHub(replies: ["publish": #"{"ok":true,"seq":1,"delivered":0}"#])
        defer { hub.stop() }
        let run = try HubctlRun.run(["publish", "wallet_updates", "--account", "acc_1", "--type", "t", "1"],
                                    socket: hub.path)
        #expect(run.code == 0)
        #expect(run.stdout == "published seq 1, delivered to 0 connections\nhint: no subscribed connection for acc_1: fall back to push\n")
    }

    @Test func publishBroadcastFromFileAndStdin() throws {
        let hub = FakeHub(replies: ["publish": #"{"ok":true,"seq":3,"delivered":1}"#])
        defer { hub.stop() }
        let file = hub.directory + "/event.json"
        try Data("{\n  \"x\": [1,\r\n 2]\n}\n".utf8).write(to: URL(fileURLWithPath: file))
        let run = try HubctlRun.run(["publish", "profile_updates", "--broadcast", "--type", "maintenance",
                                     "--data-file", file], socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout == "published seq 3, delivered to 1 connection\n")
        let line = try #require(hub.received.first)
        #expect(line == #"{"op":"publish","channel":"profile_updates","broadcast":true,"type":"maintenance","data":{   "x": [1,   2] }}"#)

        let stdin = try HubctlRun.run(["publish", "profile_updates", "--broadcast", "--type", "m", "-"],
                                      socket: hub.path, input: " [true, null] \n")
        #expect(stdin.code == 0, "\(stdin.stderr)")
        #expect(hub.received.last?.hasSuffix(#""data":[true, null]}"#) == true)

        let json = try HubctlRun.run(["publish", "p", "--broadcast", "--type", "m", "--json"], socket: hub.path)
        #expect(json.stdout == #"{"ok":true,"seq":3,"delivered":1}"# + "\n")
        #expect(hub.requests.last?["data"] == nil, "no DATA: no data field (the hub's null)")
    }

    @Test func tailPrintsEventsUntilTheHubCloses() throws {
        let event = #"{"event":{"type":"wallet_balance_changed","channel":"wallet_updates","account":"acc_1","broadcast":false,"seq":18,"delivered":2,"at":1700000001.2,"data":{"balance":"2"}}}"#
        let broadcast = #"{"event":{"type":"maintenance","channel":"wallet_updates","broadcast":true,"seq":4,"delivered":9,"at":1700000002.5,"data":null}}"#
        let hub = FakeHub { line in
            guard FakeHub.field("op", in: line) as? String == "tail" else { return .lines(["{}"]) }
            return .linesThenClose([#"{"ok":true,"tailing":"wallet_updates"}"#, event, broadcast])
        }
        defer { hub.stop() }
        let run = try HubctlRun.run(["tail", "wallet_updates", "--account", "acc_1"], socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.lines.count == 3)
        #expect(run.lines[0].hasSuffix("  wallet_balance_changed  acc_1  seq 18  delivered 2  {\"balance\":\"2\"}"))
        #expect(run.lines[1].hasSuffix("  maintenance  broadcast  seq 4  delivered 9  null"))
        #expect(run.stderr.contains("the hub closed the connection"))
        #expect(hub.received == [#"{"op":"tail","channel":"wallet_updates","account":"acc_1"}"#])

        let json = try HubctlRun.run(["tail", "wallet_updates", "--json"], socket: hub.path)
        #expect(json.code == 0, "\(json.stderr)")
        #expect(json.stdout == event + "\n" + broadcast + "\n")
    }

    /// Cluster mode: each event line names its node, and a node's `skipped` note is printed, not an error.
    @Test func tailShowsEachEventsNodeAndWhatANodeSkipped() throws {
        let event = #"{"event":{"type":"t","channel":"wallet_updates","account":"acc_1","broadcast":false,"seq":18,"delivered":2,"at":1700000001.2,"node":"n1","data":{}}}"#
        let skipped = #"{"skipped":{"node":"n2","channel":"wallet_updates","events":120,"perSecond":1000}}"#
        let hub = FakeHub { _ in .linesThenClose([#"{"ok":true,"tailing":"wallet_updates"}"#, event, skipped]) }
        defer { hub.stop() }
        let run = try HubctlRun.run(["tail", "wallet_updates"], socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.lines.count == 3, "\(run.lines)")
        #expect(run.lines[0].hasSuffix("  t  acc_1  seq 18  delivered 2  node n1  {}"), "\(run.lines[0])")
        #expect(run.lines[1] == "node n2 skipped 120 events (over 1000/s)")
    }

    @Test func tailExitsZeroOnSIGINT() throws {
        let hub = FakeHub { _ in .lines([#"{"ok":true,"tailing":"c"}"#]) }
        defer { hub.stop() }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: HubctlRun.binary)
        process.arguments = ["--socket", hub.path, "tail", "c"]
        process.standardOutput = Pipe()
        try process.run()
        let deadline = Date().addingTimeInterval(10)
        while hub.received.isEmpty && Date() < deadline { usleep(10_000) }
        usleep(200_000)
        kill(process.processIdentifier, SIGINT)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        #expect(process.terminationReason == .exit)
        #expect(process.terminationStatus == 0)
    }

    @Test func disconnectRequestFields() throws {
        let hub = FakeHub(replies: ["disconnect": #"{"ok":true,"disconnected":1}"#])
        defer { hub.stop() }
        let byConn = try HubctlRun.run(["disconnect", "--conn", "0-17", "--code", "4000", "--reason", "bye now"],
                                       socket: hub.path)
        #expect(byConn.code == 0, "\(byConn.stderr)")
        #expect(byConn.stdout == "disconnected 1 connection\n")
        let first = try #require(hub.requests.first)
        #expect(first["conn"] as? String == "0-17")
        #expect(first["code"] as? Int == 4000)
        #expect(first["reason"] as? String == "bye now")
        #expect(first["account"] == nil)

        let byAccount = try HubctlRun.run(["disconnect", "--account", "acc_1"], socket: hub.path)
        #expect(byAccount.code == 0)
        let second = try #require(hub.requests.last)
        #expect(second["account"] as? String == "acc_1")
        #expect(second["conn"] == nil && second["code"] == nil && second["reason"] == nil)

        let both = try HubctlRun.run(["disconnect", "--account", "a", "--conn", "1"], socket: hub.path)
        #expect(both.code == 2)
        let badCode = try HubctlRun.run(["disconnect", "--account", "a", "--code", "2000"], socket: hub.path)
        #expect(badCode.code == 2)
        #expect(badCode.stderr.contains("1000 or 3000-4999"))
        #expect(hub.received.count == 2, "usage errors never reach the hub")
    }

    /// Cluster mode: `--node` goes to the hub, and the printed count says where it was counted.
    @Test func disconnectAcrossTheCluster() throws {
        let hub = FakeHub { line in
            if FakeHub.field("node", in: line) != nil {
                return .lines([#"{"ok":true,"disconnected":1,"node":"n2"}"#])
            }
            return .lines([#"{"ok":true,"disconnected":3,"cluster":{"nodes":[{"node":"n2","reply":{"ok":true,"disconnected":2}}],"missing":["n3"]}}"#])
        }
        defer { hub.stop() }
        let one = try HubctlRun.run(["disconnect", "--conn", "0-17", "--node", "n2"], socket: hub.path)
        #expect(one.code == 0, "\(one.stderr)")
        #expect(one.stdout == "disconnected 1 connection on node n2\n")
        #expect(hub.requests.first?["node"] as? String == "n2" && hub.requests.first?["conn"] as? String == "0-17")
        let all = try HubctlRun.run(["disconnect", "--account", "acc_1"], socket: hub.path)
        #expect(all.code == 0, "\(all.stderr)")
        #expect(all.lines.first == "disconnected 3 connections on 2 nodes", "\(all.lines)")
        #expect(all.lines.count == 3 && all.lines[1].contains("no answer within 2 s from: n3"), "\(all.lines)")
        #expect(hub.requests.last?["node"] == nil)
    }

    @Test func topOnce() throws {
        let hub = FakeHub(replies: ["stats": Self.statsReply, "channels": Self.channelsReply,
                                    "connections": Self.connectionsReply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["top", "--once"], socket: hub.path)
        #expect(run.code == 0, "\(run.stderr)")
        #expect(!run.stdout.contains("\u{1B}"), "no terminal control with --once")
        #expect(run.lines[0].hasPrefix("hub 0.1.0  up 2h13m  connections 10 open, 1 handshaking, limit 19.0k"))
        let channels = try #require(run.lines.firstIndex(of: "busiest channels"))
        #expect(run.lines[channels + 2].hasPrefix("  wallet_updates"), "busiest (0.5/s) first")
        let connections = try #require(run.lines.firstIndex(of: "busiest connections"))
        #expect(run.lines[connections + 1] == "  ID    ACCOUNT   QUEUED    OUT  IN  SINCE  PLATFORM")
        #expect(run.lines[connections + 2] == "  1-3   acc_22   2.0 KiB  12.0k   1    30s  Android", "most queued bytes first")
        #expect(hub.requests.map { $0["op"] as? String } == ["stats", "channels", "connections"])

        let json = try HubctlRun.run(["top", "--once", "--json"], socket: hub.path)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect(Set(object.keys) == ["stats", "channels", "connections"])
    }

    @Test func socketFromEnvironment() throws {
        let hub = FakeHub(replies: ["stats": Self.statsReply])
        defer { hub.stop() }
        let run = try HubctlRun.run(["status", "--json"], environment: ["HUB_SOCKET": hub.path])
        #expect(run.code == 0, "\(run.stderr)")
    }

    @Test func helpAndVersion() throws {
        let version = try HubctlRun.run(["--version"])
        #expect(version.stdout == "hubctl 0.1.0\n")
        let help = try HubctlRun.run(["--help"])
        #expect(help.code == 0)
        for command in ["status", "channels", "channel", "connections", "publish", "tail", "disconnect", "token", "top"] {
            #expect(help.stdout.contains("\n  \(command) "), "tool help lists \(command)")
            let commandHelp = try HubctlRun.run([command, "--help"])
            #expect(commandHelp.code == 0)
            #expect(commandHelp.stdout.hasPrefix("usage: hubctl \(command)"))
            #expect(commandHelp.stdout.contains("examples:"))
        }
        #expect(help.stdout.contains("4  local input error"))
    }
}
