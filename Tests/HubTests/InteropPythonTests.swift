import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The real `hub` binary against an independent WebSocket implementation: Python's `websockets`, driven by
/// `Tests/python/client.py` (an app-like client) and `Tests/python/echo.py` (conformance-style checks on /echo).
/// Gating: see `PythonPeer` (required under scripts/test; skipped, never passed, without the package otherwise).
@Suite struct InteropPythonTests {
    /// Events whose `data` must reach the client byte for byte: odd spacing, number spellings, escapes, scalars.
    static let events: [(type: String, data: String)] = [
        ("wallet_balance_changed", #"{"balance":"1.5"}"#),
        ("spacing_and_numbers", #"{ "b" : [1, 2.50, 1e2, -0.0, 1E-7] ,"z":{}}"#),
        ("escapes", #"{"s":"\u00e9 é 🙂 \"q\" \\ \/ \n"}"#),
        ("null_data", "null"),
        ("string_data", #""just a string""#),
    ]

    /// The frame the hub sends for an account event (docs/PROTOCOL.md 1.3), exactly.
    static func frame(_ type: String, seq: Int, data: String, channel: String = "wallet_updates") -> String {
        #"{"type":"\#(type)","channel":"\#(channel)","seq":\#(seq),"data":\#(data)}"#
    }

    /// Starts client.py for `account` subscribed to wallet_updates and waits for its `subscribed` line.
    static func startClient(_ hub: HubProcess, account: String = "acc_1", token: String? = nil, path: String = "/ws",
                            auth: String = "header", extra: [String] = [], count: Int,
                            subscribedFirst: Bool = true) throws -> InteropProcess {
        let client = try PythonPeer.run("client.py", [
            "--url", "ws://127.0.0.1:\(hub.port)\(path)", "--token", try token ?? hub.token(account), "--auth", auth,
            "--subscribe", "wallet_updates", "--count", String(count), "--timeout", "10",
        ] + extra)
        guard client.waitForStdoutLines(1, timeout: 10) else { throw HubTestError("client.py did not subscribe:\n\(client.summary)") }
        guard subscribedFirst else { return client }
        #expect(client.stdoutLines.first.map(withoutPositions) == #"{"type":"subscribed","channels":["wallet_updates"],"id":"py"}"#, "\(client.summary)")
        return client
    }

    /// Publishes `events` to acc_1 on wallet_updates, each preceded by events the client must NOT get (another
    /// account; a channel it did not subscribe to; the broadcast stream of a channel it did not subscribe to), and
    /// returns the frames it must get, in order.
    static func publishInterleaved(_ hub: HubProcess, _ events: [(type: String, data: String)]) throws -> [String] {
        var expected: [String] = []
        for (i, event) in events.enumerated() {
            _ = try hub.publish(channel: "wallet_updates", account: "acc_2", type: "not_yours", data: #"{"i":\#(i)}"#)
            _ = try hub.publish(channel: "profile_updates", account: "acc_1", type: "not_subscribed", data: "{}")
            _ = try hub.publish(channel: "profile_updates", account: nil, type: "not_subscribed_broadcast", data: "{}")
            let reply = try hub.publish(channel: "wallet_updates", account: "acc_1", type: event.type, data: event.data)
            #expect(reply["ok"] as? Bool == true, "\(reply)")
            #expect(reply["seq"] as? Int == i + 1, "\(reply)")
            #expect(reply["delivered"] as? Int == 1, "\(reply)")
            expected.append(frame(event.type, seq: i + 1, data: event.data))
        }
        return expected
    }

    /// The client's `handshake {...}` stderr line, parsed.
    static func handshake(_ client: InteropProcess) -> [String: Any] {
        guard let line = client.stderrLines.first(where: { $0.hasPrefix("handshake ") }),
              let object = try? JSONSerialization.jsonObject(with: Data(line.dropFirst("handshake ".count).utf8)) as? [String: Any]
        else { return [:] }
        return object
    }

    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func appClientWithBearerHeaderGetsExactlyItsEventsByteForByte() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess()
        let client = try Self.startClient(hub, extra: ["--platform", "iOS", "--app-version", "1.0.0"],
                                          count: 1 + Self.events.count)

        // The admin view records what the app said about itself at the handshake.
        let reply = try hub.request(#"{"op":"connections","account":"acc_1"}"#)
        let rows = reply["connections"] as? [[String: Any]] ?? []
        #expect(reply["total"] as? Int == 1, "\(reply)")
        #expect(rows.first?["platform"] as? String == "iOS", "\(reply)")
        #expect(rows.first?["appVersion"] as? String == "1.0.0", "\(reply)")
        #expect(rows.first?["channels"] as? [String] == ["wallet_updates"], "\(reply)")
        #expect((rows.first?["remote"] as? String)?.hasPrefix("127.0.0.1:") == true, "\(reply)")
        #expect(rows.first?["messagesIn"] as? Int == 1 && rows.first?["messagesOut"] as? Int == 1, "subscribe and its reply: \(reply)")

        let expected = try Self.publishInterleaved(hub, Self.events)
        #expect(client.wait(timeout: 10) == 0, "\(client.summary)")
        #expect(Array(client.stdoutLines.dropFirst()) == expected, "\(client.summary)")
    }

    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func browserStyleAccessTokenQueryParameterWorks() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess()
        let events = Array(Self.events.prefix(2))
        let client = try Self.startClient(hub, auth: "query", count: 1 + events.count)
        let reply = try hub.request(#"{"op":"connections","account":"acc_1"}"#)
        #expect(reply["total"] as? Int == 1, "\(reply)")
        let expected = try Self.publishInterleaved(hub, events)
        #expect(client.wait(timeout: 10) == 0, "\(client.summary)")
        #expect(Array(client.stdoutLines.dropFirst()) == expected, "\(client.summary)")
    }

    /// /ws declines permessage-deflate by omission (docs/PROTOCOL.md 1.1): websockets offers it, sees no
    /// extension in the 101, and everything flows uncompressed (websockets would fail the connection on an RSV1
    /// frame it did not negotiate).
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func deflateOfferOnWsIsDeclinedAndTheConnectionWorksUncompressed() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess()
        let events = Array(Self.events.prefix(3))
        let client = try Self.startClient(hub, extra: ["--compression", "deflate"], count: 1 + events.count)
        let handshake = Self.handshake(client)
        #expect(handshake["status"] as? Int == 101, "\(client.summary)")
        #expect(handshake["extensions"] as? [String] == [], "\(client.summary)")
        #expect(handshake["extensionsHeader"] is NSNull, "\(client.summary)")
        let expected = try Self.publishInterleaved(hub, events)
        #expect(client.wait(timeout: 10) == 0, "\(client.summary)")
        #expect(Array(client.stdoutLines.dropFirst()) == expected, "\(client.summary)")
    }

    /// Runs echo.py against a hub started with --echo and checks that every check it must report is there and ok.
    static func runEcho(only group: String, expecting checks: [String]) throws {
        try PythonPeer.requireAvailable()
        let skip = ["websockets", "deflate-offers", "raw"].filter { $0 != group }.joined(separator: ",")
        let hub = try HubProcess(["--echo"])
        let echo = try PythonPeer.run("echo.py", ["--url", "ws://127.0.0.1:\(hub.port)/echo", "--timeout", "10", "--skip", skip])
        let status = echo.wait(timeout: 30)
        var seen: [String: (ok: Bool, detail: String)] = [:]
        for line in echo.stdoutLines {
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                  let check = object["check"] as? String else { Issue.record("not a check line: \(line)"); continue }
            seen[check] = (object["ok"] as? Bool ?? false, object["detail"] as? String ?? "")
        }
        for check in checks {
            guard let result = seen[check] else { Issue.record("echo.py did not report \(check)\n\(echo.summary)"); continue }
            #expect(result.ok, "\(check): \(result.detail)")
        }
        #expect(Set(seen.keys) == Set(checks), "\(echo.summary)")
        #expect(status == 0, "\(echo.summary)\n--- hub log\n\(hub.log)")
    }

    /// websockets with permessage-deflate on /echo: negotiated; text (mixed-width UTF-8) and binary (random) of
    /// 0 B, 1 KiB, 1 MiB, 4 MiB echoed equal; fragmented messages (an iterable to `send`) reassembled; a ping
    /// with a payload answered by a pong with that payload; close 1000 with a reason echoed as 1000.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func echoWithPermessageDeflateFromWebsockets() throws {
        let sizes = [0, 1024, 1 << 20, 4 << 20]
        try Self.runEcho(only: "websockets", expecting: ["deflate-negotiated"]
            + sizes.flatMap { ["echo-text-\($0)", "echo-binary-\($0)"] }
            + ["fragmented-text", "fragmented-binary", "ping-pong-websockets", "close-1000-websockets"])
    }

    /// Every permessage-deflate parameter (RFC 7692 section 7) offered by websockets: no-context-takeover either
    /// way, max window bits either way, all at once. websockets checks the hub's answer strictly (a parameter
    /// it did not offer, or a window larger than asked, fails the handshake); messages round-trip under each.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func echoNegotiatesEachDeflateParameter() throws {
        try Self.runEcho(only: "deflate-offers", expecting: [
            "no-params", "server-no-context-takeover", "client-no-context-takeover", "server-max-window-bits-9",
            "server-max-window-bits-12", "client-max-window-bits-9", "all",
        ].map { "deflate-offer-\($0)" })
    }

    /// Frames a library will not send, from a raw Python socket: exact ping/pong payloads, a ping between the
    /// fragments of a message, close codes echoed (1000 and an application code, then TCP closed), invalid UTF-8
    /// (plain, an encoded surrogate, and split across fragments) closed with 1007.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func echoConformanceFromARawSocket() throws {
        try Self.runEcho(only: "raw", expecting: [
            "ping-pong-raw", "ping-between-fragments-raw", "close-1000-raw", "close-4321-raw",
            "invalid-utf8-raw", "invalid-utf8-surrogate-raw", "invalid-utf8-fragmented-raw",
        ])
    }

    // MARK: More of what an app sees

    /// Runs client.py to completion (for the refusal checks) and returns it.
    static func runClient(_ hub: HubProcess, _ arguments: [String]) throws -> InteropProcess {
        let client = try PythonPeer.run("client.py", ["--url", "ws://127.0.0.1:\(hub.port)/ws", "--timeout", "5"] + arguments)
        _ = client.wait(timeout: 10)
        return client
    }

    static func stderrJSON(_ client: InteropProcess, _ tag: String) -> [String: Any] {
        guard let line = client.stderrLines.first(where: { $0.hasPrefix(tag + " ") }) else { return [:] }
        return (try? JSONSerialization.jsonObject(with: Data(line.dropFirst(tag.count + 1).utf8))) as? [String: Any] ?? [:]
    }

    /// What websockets sees of refused handshakes: the status and the backend-style JSON body the app branches
    /// on (refresh the token on ErrAccessTokenExpired, log out on UNAUTHORIZED); and the header winning over
    /// the query parameter when both are present.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func refusalsAndTokenPrecedenceAsWebsocketsSeesThem() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess()
        let good = try hub.token("acc_1")
        let expired = try hub.token("acc_1", ttl: -120)
        // The same claims with one signature character changed.
        let signatureStart = good.index(after: good.lastIndex(of: ".")!)
        let forged = String(good[..<signatureStart]) + (good[signatureStart] == "A" ? "B" : "A") + String(good[good.index(after: signatureStart)...])

        func refusal(_ arguments: [String]) throws -> (status: Int?, code: String?) {
            let client = try Self.runClient(hub, arguments)
            #expect(client.process.terminationStatus == 4, "\(client.summary)")
            let refused = Self.stderrJSON(client, "refused")
            let body = (refused["body"] as? String).flatMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) } as? [String: Any]
            return (refused["status"] as? Int, (body?["error"] as? [String: Any])?["code"] as? String)
        }
        #expect(try refusal(["--token", expired]) == (401, "ErrAccessTokenExpired"))
        #expect(try refusal(["--token", forged]) == (401, "UNAUTHORIZED"))
        #expect(try refusal(["--token", expired, "--auth", "query"]) == (401, "ErrAccessTokenExpired"))
        // Both given: the header decides, whichever way round.
        #expect(try refusal(["--token", forged, "--auth", "both", "--query-token", good]) == (401, "UNAUTHORIZED"))
        let accepted = try Self.runClient(hub, ["--token", good, "--auth", "both", "--query-token", forged,
                                                "--subscribe", "wallet_updates", "--count", "1"])
        #expect(accepted.process.terminationStatus == 0, "\(accepted.summary)")
        #expect(accepted.stdoutLines.map(withoutPositions) == [#"{"type":"subscribed","channels":["wallet_updates"],"id":"py"}"#], "\(accepted.summary)")
    }

    /// Events whose frames need each WebSocket length encoding (7-bit, 16-bit, 64-bit; at the boundaries 125,
    /// 126, 65535, 65536) and one near the default 256 KiB event limit, read by websockets byte for byte.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func eventsAtFrameLengthBoundariesArriveIntact() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess()
        let payloadSizes = [125, 126, 65535, 65536, 250_000]
        let client = try Self.startClient(hub, count: 1 + payloadSizes.count)
        var expected: [String] = []
        for (i, size) in payloadSizes.enumerated() {
            let empty = Self.frame("big", seq: i + 1, data: #"{"s":""}"#).utf8.count
            let data = #"{"s":"\#(String(repeating: "y", count: size - empty))"}"#
            let reply = try hub.publish(channel: "wallet_updates", account: "acc_1", type: "big", data: data)
            #expect(reply["delivered"] as? Int == 1, "\(reply)")
            expected.append(Self.frame("big", seq: i + 1, data: data))
            #expect(expected.last?.utf8.count == size)
        }
        #expect(client.wait(timeout: 10) == 0, "\(client.summary.prefix(2000))")
        let got = Array(client.stdoutLines.dropFirst())
        #expect(got.map(\.utf8.count) == payloadSizes)
        #expect(got == expected)
    }

    /// The hub's heartbeat pings (every second here) are answered by websockets, so the connection outlives
    /// several pong timeouts; then the token's expiry: `token_expiring`, and close 4001 ErrAccessTokenExpired.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func heartbeatsAnsweredThenTokenExpiryCloses4001() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess(["--ping-interval", "1s", "--pong-timeout", "1s", "--token-warning", "2s", "--jwt-leeway", "0"])
        let started = Date()
        let client = try PythonPeer.run("client.py", [
            "--url", "ws://127.0.0.1:\(hub.port)/ws", "--token", try hub.token("acc_1", ttl: 5),
            "--subscribe", "wallet_updates", "--count", "10", "--timeout", "10",
        ])
        #expect(client.wait(timeout: 12) == 3, "closed by the hub: \(client.summary)")
        let lifetime = Date().timeIntervalSince(started)
        // Two lines: the subscribe reply and the warning. On a loaded machine the client can take over 3 s to
        // start, and then the token is inside its warning window at the upgrade and the warning comes first.
        #expect(client.stdoutLines.count == 2, "\(client.summary)")
        #expect(client.stdoutLines.filter { $0.hasPrefix(#"{"type":"subscribed","#) }.count == 1, "\(client.summary)")
        #expect(client.stdoutLines.filter { $0.hasPrefix(#"{"type":"token_expiring","expiresIn":"#) }.count == 1, "\(client.summary)")
        let closed = Self.stderrJSON(client, "closed")
        #expect(closed["code"] as? Int == 4001, "\(client.summary)")
        #expect(closed["reason"] as? String == "ErrAccessTokenExpired", "\(client.summary)")
        #expect(lifetime > 3, "outlived three ping intervals (\(lifetime) s)")
    }

    /// Hub-initiated closes as websockets receives them: an operator's disconnect with an application code and
    /// a UTF-8 reason of the maximum 123 bytes, and SIGTERM's 1001 (after which the hub exits 0).
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func operatorDisconnectAndShutdownCloseCodes() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess()
        let reason = String(repeating: "\u{E9}", count: 61) + "!"  // 123 bytes
        #expect(reason.utf8.count == 123)
        let first = try Self.startClient(hub, count: 10)
        let run = try LiveHub.hubctl(["--socket", hub.socketPath, "disconnect", "--account", "acc_1", "--code", "4321", "--reason", reason])
        #expect(run.status == 0, "\(run.summary)")
        #expect(first.wait(timeout: 10) == 3, "\(first.summary)")
        #expect(Self.stderrJSON(first, "closed")["code"] as? Int == 4321, "\(first.summary)")
        #expect(Self.stderrJSON(first, "closed")["reason"] as? String == reason, "\(first.summary)")

        let second = try Self.startClient(hub, account: "acc_2", count: 10)
        #expect(hub.stop() == 0, "\(hub.log)")
        #expect(second.wait(timeout: 10) == 3, "\(second.summary)")
        #expect(Self.stderrJSON(second, "closed")["code"] as? Int == 1001, "\(second.summary)")
    }

    /// X-Platform and X-App-Version are "truncated to 64 bytes" (docs/PROTOCOL.md 1.1). websockets sends header
    /// values as UTF-8; a cut inside a character must drop the whole character: at most 64 bytes, a prefix of
    /// what the app sent, no U+FFFD.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func longNonASCIIClientHeadersAreCutOnACharacterBoundary() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess()
        let platform = "a" + String(repeating: "\u{E9}", count: 40)      // 81 bytes; byte 64 is inside an é
        let appVersion = String(repeating: "\u{20AC}", count: 30)        // 90 bytes; byte 64 is inside a €
        let client = try Self.startClient(hub, extra: ["--platform", platform, "--app-version", appVersion], count: 10)
        let row = (try hub.request(#"{"op":"connections","account":"acc_1"}"#)["connections"] as? [[String: Any]])?.first ?? [:]
        #expect(row["platform"] as? String == "a" + String(repeating: "\u{E9}", count: 31), "\(row)")
        #expect(row["appVersion"] as? String == String(repeating: "\u{20AC}", count: 21), "\(row)")
        client.kill()
    }

    /// Fan-out to many websockets connections spread over the hub's event loops: 40 connections of 10 accounts
    /// (4 each). A broadcast reaches all 40, each account's event exactly its 4, in publish order, byte for
    /// byte, and `delivered` counts them exactly.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func fanOutToManyConnectionsAcrossLoops() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess(threads: 2)
        let accounts = (0..<10).map { "acc_\($0)" }
        let owners = (0..<40).map { accounts[$0 % accounts.count] }
        let tokens = hub.directory + "/tokens.txt"
        try Data(try owners.map { "\($0) \(try hub.token($0))\n" }.joined().utf8).write(to: URL(fileURLWithPath: tokens))
        let fanout = try PythonPeer.run("fanout.py", ["--url", "ws://127.0.0.1:\(hub.port)/ws", "--tokens", tokens,
                                                      "--expect", "2", "--timeout", "10"])
        guard fanout.waitForStdoutLines(1, timeout: 15) else { throw HubTestError("fanout.py not ready:\n\(fanout.summary)") }
        #expect(fanout.stdoutLines.first == #"{"ready": 40}"#, "\(fanout.summary)")
        let stats = try hub.request(#"{"op":"stats"}"#)["stats"] as? [String: Any] ?? [:]
        let threads = stats["threads"] as? [[String: Any]] ?? []
        #expect(threads.count == 2 && threads.allSatisfy { ($0["connections"] as? Int ?? 0) > 0 },
                "connections on both loops: \(threads)")

        let broadcast = try hub.publish(channel: "wallet_updates", account: nil, type: "maintenance", data: #"{"in":"5m"}"#)
        #expect(broadcast["delivered"] as? Int == 40, "\(broadcast)")
        for account in accounts {
            let reply = try hub.publish(channel: "wallet_updates", account: account, type: "mine", data: #"{"for":"\#(account)"}"#)
            #expect(reply["delivered"] as? Int == 4, "\(reply)")
        }
        #expect(fanout.wait(timeout: 15) == 0, "\(fanout.summary.prefix(3000))")
        let rows = fanout.stdoutLines.dropFirst().compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        #expect(rows.count == 40)
        for (row, owner) in zip(rows, owners) {
            #expect(row["account"] as? String == owner)
            #expect(row["messages"] as? [String] == [
                #"{"type":"maintenance","channel":"wallet_updates","seq":1,"broadcast":true,"data":{"in":"5m"}}"#,
                Self.frame("mine", seq: 1, data: #"{"for":"\#(owner)"}"#),
            ], "\(owner)")
        }
    }

    /// What the app does with `token_expiring`: an in-band `auth` with a fresh token. The hub answers
    /// `authenticated` with the new expiry and keeps the connection (and its subscriptions) past the old token's
    /// expiry: an event published after it still arrives, and no 4001 comes.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func inBandRefreshOnTokenExpiringKeepsTheConnection() throws {
        try PythonPeer.requireAvailable()
        let hub = try HubProcess(["--token-warning", "2s", "--jwt-leeway", "0"])
        let now = Int64(time(nil))
        let short = try hub.token("acc_1", ttl: 5, now: now)
        let fresh = try hub.token("acc_1", ttl: 900, now: now)
        let client = try Self.startClient(hub, token: short, extra: ["--refresh-token", fresh], count: 4,
                                       subscribedFirst: false)
        #expect(client.waitForStdoutLines(3, timeout: 10), "\(client.summary)")
        // The subscribe reply and the warning in either order: a client slow to start (a loaded machine) reaches
        // the hub inside the warning window, and then the warning comes first.
        let firstTwo = client.stdoutLines.prefix(2)
        #expect(firstTwo.filter { $0.hasPrefix(#"{"type":"subscribed","#) }.count == 1, "\(client.summary)")
        #expect(firstTwo.filter { $0.hasPrefix(#"{"type":"token_expiring","expiresIn":"#) }.count == 1, "\(client.summary)")
        #expect(client.stdoutLines.dropFirst(2).first == #"{"type":"authenticated","expiresAt":\#(now + 900),"id":"refresh"}"#,
                "\(client.summary)")
        // Past the first token's expiry, plus the expiry timer's slack (1 s ticks, whole-second clock).
        while Int64(time(nil)) < now + 5 + 2 { usleep(100_000) }
        #expect(client.process.isRunning, "\(client.summary)")
        let reply = try hub.publish(channel: "wallet_updates", account: "acc_1", type: "after_refresh", data: "{}")
        #expect(reply["delivered"] as? Int == 1, "\(reply)")
        #expect(client.wait(timeout: 10) == 0, "\(client.summary)")
        #expect(client.stdoutLines.last == Self.frame("after_refresh", seq: 1, data: "{}"), "\(client.summary)")
    }
}
