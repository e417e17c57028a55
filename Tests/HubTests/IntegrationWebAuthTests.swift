import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
import WSProtocol

/// What a web app needs (issue 16), against the real binary: first-message auth (the upgrade carries no token; the
/// first message is `auth`), close codes a browser can read when it is refused, the `hub.v1` subprotocol, and no
/// token ever written to the log.
@Suite struct IntegrationWebAuthTests {
    /// The `connections` admin view's entry for `account`, if any.
    static func connection(_ hub: HubProcess, _ account: String) throws -> [String: Any]? {
        let list = try hub.request(#"{"op":"connections"}"#)["connections"] as? [[String: Any]] ?? []
        return list.first { $0["account"] as? String == account }
    }

    @Test func firstMessageAuthOpensAFullSession() throws {
        let hub = try HubProcess()
        let ws = try TestWebSocket.connect(port: hub.port, subprotocols: ["hub.v1"])
        #expect(ws.response.headers[first: "Sec-WebSocket-Protocol"] == "hub.v1")
        // Before auth: counted as handshaking, listed nowhere.
        let before = try hub.stats()["connections"] as? [String: Any] ?? [:]
        #expect(before["handshaking"] as? Int == 1 && before["open"] as? Int == 0, "\(before)")
        #expect(try Self.connection(hub, "web_1") == nil)

        let token = try hub.token("web_1")
        try ws.send(json: ["type": "auth", "token": token, "platform": "web", "appVersion": "3.1.0", "id": "a0"])
        let reply = try ws.nextJSON()
        #expect(reply["type"] as? String == "authenticated" && reply["id"] as? String == "a0", "\(reply)")
        #expect((reply["expiresAt"] as? Int ?? 0) > Int(time(nil)), "\(reply)")
        try ws.send(json: ["type": "subscribe", "channels": ["wallet_updates"], "id": "s"])
        #expect(try ws.nextJSON()["type"] as? String == "subscribed")
        _ = try hub.publish(channel: "wallet_updates", account: "web_1", type: "wallet_balance_changed", data: #"{"balance":"7"}"#)
        #expect(try ws.nextJSON()["type"] as? String == "wallet_balance_changed")
        let after = try hub.stats()["connections"] as? [String: Any] ?? [:]
        #expect(after["handshaking"] as? Int == 0 && after["open"] as? Int == 1, "\(after)")
        let entry = try #require(try Self.connection(hub, "web_1"))
        #expect(entry["platform"] as? String == "web" && entry["appVersion"] as? String == "3.1.0", "\(entry)")
        // In-band refresh works as for any session; another account's token does not.
        try ws.send(json: ["type": "auth", "token": try hub.token("web_1", ttl: 1800), "id": "r"])
        #expect(try ws.nextJSON()["type"] as? String == "authenticated")
        try ws.send(json: ["type": "auth", "token": try hub.token("web_2"), "id": "x"])
        #expect(((try ws.nextJSON()["error"]) as? [String: Any])?["code"] as? String == "FORBIDDEN")
    }

    /// Each refusal of the first message: an error reply with the details, then a close whose code and reason a
    /// browser's `CloseEvent` shows.
    @Test func refusedFirstMessagesCloseWithReadableCodes() throws {
        let hub = try HubProcess(["--max-connections-per-account", "1"])
        func refusal(_ first: [String: Any]?) throws -> (error: String?, code: UInt16?, reason: String) {
            let ws = try TestWebSocket.connect(port: hub.port)
            if let first { try ws.send(json: first) } else { try ws.send(text: "not json") }
            let error = ((try ws.nextJSON()["error"]) as? [String: Any])?["code"] as? String
            let (code, reason) = try ws.expectClose()
            return (error, code, reason)
        }
        let expired = try hub.token("web_1", exp: Int64(time(nil)) - 120)
        var r = try refusal(["type": "auth", "token": expired])
        #expect(r.error == "ErrAccessTokenExpired" && r.code == 4001 && r.reason == "ErrAccessTokenExpired", "\(r)")
        r = try refusal(["type": "auth", "token": String(try hub.token("web_1").dropLast(3)) + "AAA"])
        #expect(r.error == "UNAUTHORIZED" && r.code == 4003 && r.reason == "UNAUTHORIZED", "\(r)")
        r = try refusal(["type": "subscribe", "channels": ["wallet_updates"]])
        #expect(r.error == "UNAUTHORIZED" && r.code == 4003, "\(r)")
        r = try refusal(nil)
        #expect(r.error == "VALIDATION_ERROR" && r.code == 4003, "\(r)")
        // A token over 8 KiB (the header limit; PROTOCOL 1.1) is refused here too, though the message may be 64 KiB.
        let long = try hub.token("web_1", extra: ["pad": .string(String(repeating: "p", count: JWTVerifier.maximumTokenBytes))])
        #expect(long.utf8.count > JWTVerifier.maximumTokenBytes)
        r = try refusal(["type": "auth", "token": long])
        #expect(r.error == "UNAUTHORIZED" && r.code == 4003, "\(r)")
        // The account's connection limit applies to first-message auth too.
        let held = try hub.client("web_1")
        r = try refusal(["type": "auth", "token": try hub.token("web_1")])
        #expect(r.error == "RATE_LIMITED" && r.code == 4029 && r.reason == "RATE_LIMITED", "\(r)")
        _ = held
        let failures = try hub.stats()["authFailures"] as? [String: Any] ?? [:]
        #expect(failures["expired"] as? Int == 1 && failures["bad_signature"] as? Int == 1 && failures["token_too_large"] as? Int == 1,
                "\(failures)")
    }

    /// A connection that never authenticates is closed at the handshake timeout with 4408.
    @Test func noAuthWithinTheHandshakeTimeoutCloses4408() throws {
        let hub = try HubProcess(["--handshake-timeout", "1"])
        let ws = try TestWebSocket.connect(port: hub.port)
        let started = Date()
        let (code, reason) = try ws.expectClose(timeout: 5)
        #expect(code == 4408 && reason == "AUTH_TIMEOUT")
        #expect(Date().timeIntervalSince(started) < 3)
        #expect(try ws.completeClose(code: 4408))
    }

    /// `hub.v1` is answered when offered (wherever it stands in the list); anything else is declined by leaving the
    /// header out, and the upgrade succeeds (RFC 6455 §4.2.2). /echo speaks no subprotocol.
    @Test func subprotocolAnsweredOrDeclinedByOmission() throws {
        let hub = try HubProcess(["--echo"])
        let bearer = [("Authorization", "Bearer \(try hub.token("acc_1"))")]
        for offer in [["hub.v1"], ["mqtt", "hub.v1"], ["hub.v1", "graphql-ws"]] {
            let ws = try TestWebSocket.connect(port: hub.port, headers: bearer, subprotocols: offer)
            #expect(ws.response.headers.values("Sec-WebSocket-Protocol") == ["hub.v1"], "\(offer)")
        }
        for offer in [["mqtt"], ["HUB.V1"], ["hub.v2"], []] {
            let ws = try TestWebSocket.connect(port: hub.port, headers: bearer, subprotocols: offer)
            #expect(ws.response.headers.values("Sec-WebSocket-Protocol").isEmpty, "\(offer)")
            try ws.send(json: ["type": "ping", "id": 1])
            #expect(try ws.nextJSON()["type"] as? String == "pong")
        }
        let echo = try TestWebSocket.connect(port: hub.port, path: "/echo", subprotocols: ["hub.v1"])
        #expect(echo.response.headers.values("Sec-WebSocket-Protocol").isEmpty)
    }

    /// Tokens reach the hub every way a client can send one, valid and not: none of them (nor its signature) is
    /// ever written to the log, in either format, not even at debug level (a line per refused token) or in the
    /// SIGQUIT state dump. A JSON log is also parsed line by line and its decoded strings checked.
    @Test(arguments: ["text", "json"]) func noTokenIsEverLogged(format: String) throws {
        let hub = try HubProcess(["--log-format", format, "--log-level", "debug"])
        let valid = try hub.token("logged_1")
        let badSignature = String(try hub.token("logged_2").dropLast(4)) + "AAAA"
        let expired = try hub.token("logged_3", exp: Int64(time(nil)) - 120)
        let refresh = try hub.token("logged_1", ttl: 1200)
        let tokens = [valid, badSignature, expired, refresh]
        var open: [TestWebSocket] = []
        open.append(try TestWebSocket.connect(port: hub.port, path: "/ws?access_token=\(valid)"))
        for bad in [badSignature, expired] {
            _ = try? rawHTTP(port: hub.port, IntegrationRefusalTests.upgradeRequest(path: "/ws?access_token=\(bad)"))
            _ = try? rawHTTP(port: hub.port, IntegrationRefusalTests.upgradeRequest(extra: "Authorization: Bearer \(bad)\r\n"))
            _ = try? rawHTTP(port: hub.port, IntegrationRefusalTests.upgradeRequest(
                extra: "Authorization: Bearer \(bad)\r\nAuthorization: Bearer \(valid)\r\n"))
            let ws = try TestWebSocket.connect(port: hub.port)
            try ws.send(json: ["type": "auth", "token": bad])
            _ = try? ws.expectClose()
        }
        let web = try TestWebSocket.connect(port: hub.port)
        try web.send(json: ["type": "auth", "token": valid, "platform": "web"])
        _ = try web.nextJSON()
        try web.send(json: ["type": "auth", "token": refresh])
        _ = try web.nextJSON()
        try web.send(json: ["type": "auth", "token": badSignature])
        _ = try web.nextJSON()
        open.append(web)
        hub.send(signal: SIGQUIT)
        #expect(eventually { !hub.logLines(containing: "state dump ends").isEmpty }, "\(hub.log)")
        hub.send(signal: SIGTERM)
        _ = hub.waitForExit(timeout: 10)
        let log = hub.log
        // The hub saw the refused tokens (the dump counts them), so the log had every chance to mention them.
        #expect(log.contains("bad_signature") && log.contains("expired"), "\(log)")
        #expect(log.split(separator: "\n").filter { $0.contains("token refused") && $0.contains("bad_signature") }.count >= 4, "\(log)")
        var texts = [log]
        if format == "json" {
            for line in log.split(separator: "\n") {
                let object = try parseObject(String(line))
                #expect(object["ts"] is String && object["level"] is String && object["msg"] is String, "\(line)")
                texts += object.values.compactMap { $0 as? String }
            }
        }
        for token in tokens {
            let signature = String(token.split(separator: ".").last ?? "")
            #expect(!texts.contains { $0.contains(token) }, "a token in the log")
            #expect(!texts.contains { $0.contains(signature) }, "a token's signature in the log")
        }
        _ = open
    }
}
