import Foundation
import Testing

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
    static func startClient(_ hub: HubProcess, account: String = "acc_1", path: String = "/ws", auth: String = "header",
                            extra: [String] = [], count: Int) throws -> InteropProcess {
        let client = try PythonPeer.run("client.py", [
            "--url", "ws://127.0.0.1:\(hub.port)\(path)", "--token", try hub.token(account), "--auth", auth,
            "--subscribe", "wallet_updates", "--count", String(count), "--timeout", "10",
        ] + extra)
        guard client.waitForStdoutLines(1, timeout: 10) else { throw HubTestError("client.py did not subscribe:\n\(client.summary)") }
        #expect(client.stdoutLines.first == #"{"type":"subscribed","channels":["wallet_updates"],"id":"py"}"#, "\(client.summary)")
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
    static func runEcho(skip: String, expecting checks: [String]) throws {
        try PythonPeer.requireAvailable()
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
        try Self.runEcho(skip: "raw", expecting: ["deflate-negotiated"]
            + sizes.flatMap { ["echo-text-\($0)", "echo-binary-\($0)"] }
            + ["fragmented-text", "fragmented-binary", "ping-pong-websockets", "close-1000-websockets"])
    }

    /// Frames a library will not send, from a raw Python socket: exact ping/pong payloads, a ping between the
    /// fragments of a message, close codes echoed (1000 and an application code, then TCP closed), invalid UTF-8
    /// (plain, an encoded surrogate, and split across fragments) closed with 1007.
    @Test(.enabled(if: PythonPeer.enabled, PythonPeer.skipReason))
    func echoConformanceFromARawSocket() throws {
        try Self.runEcho(skip: "websockets", expecting: [
            "ping-pong-raw", "ping-between-fragments-raw", "close-1000-raw", "close-4321-raw",
            "invalid-utf8-raw", "invalid-utf8-surrogate-raw", "invalid-utf8-fragmented-raw",
        ])
    }
}
