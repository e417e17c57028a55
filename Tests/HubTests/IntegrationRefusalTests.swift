import Foundation
import Glibc
import Testing
import WSProtocol
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// A subscribed client that must keep receiving while other clients misbehave: after every bad input the test
/// publishes to it and expects exactly the next event of its stream (so a stray event would also fail).
final class Witness {
    let hub: HubProcess
    let ws: TestWebSocket
    private var seq = 0

    init(_ hub: HubProcess) throws {
        self.hub = hub
        ws = try hub.client("witness", channels: ["wallet_updates"])
    }

    func check(_ after: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        seq += 1
        let reply = try hub.publish(channel: "wallet_updates", account: "witness", type: "alive", data: "{\"n\":\(seq)}")
        #expect(reply["seq"] as? Int == seq && reply["delivered"] as? Int == 1, "after \(after): \(reply)", sourceLocation: sourceLocation)
        let text = try ws.nextText(timeout: 5)
        #expect(text == "{\"type\":\"alive\",\"channel\":\"wallet_updates\",\"seq\":\(seq),\"data\":{\"n\":\(seq)}}",
                "after \(after)", sourceLocation: sourceLocation)
    }
}

@Suite struct IntegrationRefusalTests {
    static func upgradeRequest(path: String = "/ws", method: String = "GET", extra: String = "", key: String = "dGhlIHNhbXBsZSBub25jZQ==",
                               version: String = "13", upgrade: Bool = true) -> String {
        var r = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if upgrade { r += "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: \(version)\r\n" }
        return r + extra + "\r\n"
    }

    static func noneToken(_ account: String) -> String {
        let header = Base64URL.encode(Array(#"{"alg":"none","typ":"JWT"}"#.utf8))
        let payload = Base64URL.encode(Array("{\"sub\":\"\(account)\",\"exp\":\(Int64(time(nil)) + 900)}".utf8))
        return header + "." + payload + "."
    }

    @Test func httpRefusalsHaveExactStatusAndCode() throws {
        let hub = try HubProcess()
        let witness = try Witness(hub)
        let port = hub.port

        func refused(_ headers: [(String, String)], path: String = "/ws") throws -> TestWebSocket.Refused {
            do {
                _ = try TestWebSocket.connect(port: port, path: path, headers: headers)
            } catch let refused as TestWebSocket.Refused {
                return refused
            }
            throw HubTestError("the upgrade was accepted")
        }

        // An Authorization header without a token (no header at all is first-message auth: IntegrationWebAuthTests).
        var r = try refused([("Authorization", "Bearer ")])
        #expect(r.status == 401 && r.errorCode == "UNAUTHORIZED", "\(r)")
        #expect(r.headers[first: "WWW-Authenticate"]?.hasPrefix("Bearer") == true)
        try witness.check("empty bearer token")
        r = try refused([], path: "/ws?access_token=")
        #expect(r.status == 401 && r.errorCode == "UNAUTHORIZED", "\(r)")

        let wrongSecret = try JWTSigner(key: .hmacSecret(Array(repeating: 7, count: 32))).sign(JWTClaims(sub: "acc_1", exp: Int64(time(nil)) + 900))
        r = try refused([("Authorization", "Bearer \(wrongSecret)")])
        #expect(r.status == 401 && r.errorCode == "UNAUTHORIZED", "\(r)")
        try witness.check("bad signature")

        r = try refused([("Authorization", "Bearer \(Self.noneToken("acc_1"))")])
        #expect(r.status == 401 && r.errorCode == "UNAUTHORIZED", "\(r)")
        try witness.check("alg none")

        r = try refused([("Authorization", "Bearer not.a.jwt")])
        #expect(r.status == 401 && r.errorCode == "UNAUTHORIZED", "\(r)")

        let expired = try hub.token("acc_1", exp: Int64(time(nil)) - 60)  // beyond the 30 s leeway
        r = try refused([("Authorization", "Bearer \(expired)")])
        #expect(r.status == 401 && r.errorCode == "ErrAccessTokenExpired", "\(r)")
        try witness.check("expired token")
        // Within the leeway it is still accepted.
        _ = try hub.client("acc_1", token: try hub.token("acc_1", exp: Int64(time(nil)) - 5))

        // ?access_token= works (browsers), and receives.
        let viaQuery = try TestWebSocket.connect(port: port, path: "/ws?access_token=\(try hub.token("acc_q"))")
        try viaQuery.send(text: #"{"type":"subscribe","channels":["profile_updates"]}"#)
        #expect(withoutPositions(try viaQuery.nextText()) == #"{"type":"subscribed","channels":["profile_updates"]}"#)
        #expect(try hub.publish(channel: "profile_updates", account: "acc_q")["delivered"] as? Int == 1)
        #expect(try viaQuery.nextText() == #"{"type":"test_event","channel":"profile_updates","seq":1,"data":{}}"#)
        // The header wins over the query.
        r = try refused([("Authorization", "Bearer \(expired)")], path: "/ws?access_token=\(try hub.token("acc_q"))")
        #expect(r.status == 401 && r.errorCode == "ErrAccessTokenExpired")

        var h = try rawHTTP(port: port, Self.upgradeRequest(path: "/nope"))
        #expect(h.status == 404 && h.errorCode == "NOT_FOUND" && h.closed, "\(h)")
        try witness.check("404")

        h = try rawHTTP(port: port, Self.upgradeRequest(method: "POST", extra: "Content-Length: 0\r\n"))
        #expect(h.status == 405 && h.errorCode == "METHOD_NOT_ALLOWED" && h.headers["allow"] == "GET" && h.closed, "\(h)")
        try witness.check("405")

        h = try rawHTTP(port: port, Self.upgradeRequest(upgrade: false))
        #expect(h.status == 426 && h.errorCode == "UPGRADE_REQUIRED" && h.headers["upgrade"] == "websocket" && h.closed, "\(h)")
        try witness.check("426 no upgrade")

        h = try rawHTTP(port: port, Self.upgradeRequest(version: "8"))
        #expect(h.status == 426 && h.errorCode == "UNSUPPORTED_WEBSOCKET_VERSION" && h.headers["sec-websocket-version"] == "13" && h.closed, "\(h)")
        try witness.check("426 version 8")

        h = try rawHTTP(port: port, Self.upgradeRequest(key: "not-a-key"))
        #expect(h.status == 400 && h.errorCode == "BAD_REQUEST" && h.closed, "\(h)")
        try witness.check("400 bad key")

        h = try rawHTTP(port: port, Self.upgradeRequest(extra: "X-Big: \(String(repeating: "a", count: 9000))\r\n"))
        #expect(h.status == 431 && h.errorCode == "HEADER_TOO_LARGE" && h.closed, "\(h)")
        try witness.check("431")

        h = try rawHTTP(port: port, Self.upgradeRequest().replacingOccurrences(of: "HTTP/1.1", with: "HTTP/1.0"))
        #expect(h.status == 505 && h.errorCode == "VERSION_NOT_SUPPORTED", "\(h)")
        h = try rawHTTP(port: port, "GET /ws HTTP/2.0\r\nHost: x\r\n\r\n")
        #expect(h.status == 505 && h.errorCode == "VERSION_NOT_SUPPORTED", "\(h)")

        h = try rawHTTP(port: port, "GET /\(String(repeating: "u", count: 9000)) HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(h.status == 414 && h.errorCode == "URI_TOO_LONG", "\(h)")
        try witness.check("414")

        #expect(hub.process.isRunning)
    }

    @Test func webSocketViolationsCloseWithExactCodes() throws {
        let hub = try HubProcess(["--max-message-bytes", "1024"])
        let witness = try Witness(hub)

        // Exactly at the limit is fine.
        let exact = try hub.client("ok")
        let padding = 1024 - #"{"type":"ping","pad":""}"#.utf8.count
        try exact.send(text: "{\"type\":\"ping\",\"pad\":\"" + String(repeating: "x", count: padding) + "\"}")
        #expect(try exact.nextText() == #"{"type":"pong"}"#)

        var ws = try hub.client("bad")
        try ws.sendFrame(.binary, [1, 2, 3])
        #expect(try ws.expectClose().code == 1003)
        try ws.sendClose(code: 1003)  // our close reply completes the handshake: the hub closes TCP at once
        #expect(try ws.waitForEOF(timeout: 1))
        try witness.check("binary frame")

        ws = try hub.client("bad")
        try ws.send(text: "{\"type\":\"ping\",\"pad\":\"" + String(repeating: "x", count: padding + 1) + "\"}")
        #expect(try ws.expectClose().code == 1009)
        try witness.check("message over the limit")

        // Over the limit in fragments: the message size counts, not the frame size.
        ws = try hub.client("bad")
        try ws.sendFrame(.text, Array(repeating: 0x20, count: 600), fin: false)
        try ws.sendFrame(.continuation, Array(repeating: 0x20, count: 600), fin: true)
        #expect(try ws.expectClose().code == 1009)
        try witness.check("fragmented message over the limit")

        ws = try hub.client("bad")
        try ws.sendFrame(.text, [0x22, 0xC3, 0x28, 0x22])
        #expect(try ws.expectClose().code == 1007)
        try witness.check("invalid UTF-8")

        ws = try hub.client("bad")
        try ws.sendRaw(FrameEncoder.frame(opcode: .text, payload: Array(#"{"type":"ping"}"#.utf8)))  // unmasked
        #expect(try ws.expectClose().code == 1002)
        try witness.check("unmasked frame")

        ws = try hub.client("bad")
        try ws.sendRaw([0x83, 0x80, 1, 2, 3, 4])  // FIN + reserved opcode 0x3, masked, empty
        #expect(try ws.expectClose().code == 1002)
        try witness.check("reserved opcode")

        ws = try hub.client("bad")
        try ws.sendRaw([0xC1, 0x80, 1, 2, 3, 4])  // RSV1 without an extension
        #expect(try ws.expectClose().code == 1002)
        try witness.check("RSV1")

        // Bad close frames: a code that may not be sent, a 1-byte body, a reason that is not UTF-8.
        for (payload, code) in [([UInt8]([0x03, 0xE7]), UInt16(1002)), ([0x03, 0xED], 1002), ([0x03], 1002), ([0x03, 0xE8, 0xC3, 0x28], 1007)] {
            ws = try hub.client("bad")
            try ws.sendFrame(.close, payload)
            #expect(try ws.expectClose().code == code, "close payload \(payload)")
        }
        try witness.check("bad close frames")

        // A client's close is echoed with its code.
        ws = try hub.client("bad")
        try ws.sendClose(code: 4321, reason: "done")
        #expect(try ws.expectClose().code == 4321)
        #expect(try ws.waitForEOF())
        try witness.check("client close")

        // An empty close is answered with an empty close (the echo: no code).
        ws = try hub.client("bad")
        try ws.sendFrame(.close, [])
        let emptyEcho = try ws.expectClose()
        #expect(emptyEcho.code == nil && emptyEcho.reason.isEmpty, "\(emptyEcho)")
        #expect(try ws.waitForEOF(timeout: 1))

        // A client's ping gets a pong with the same payload.
        ws = try hub.client("bad")
        try ws.sendFrame(.ping, [9, 8, 7])
        #expect(try ws.receive() == .pong([9, 8, 7]))

        let stats = try hub.stats()
        #expect((stats["drops"] as? [String: Any])?["protocolErrors"] as? Int == 10, "\(stats)")
    }

    @Test func clientMessageErrorsKeepTheConnectionOpen() throws {
        let hub = try HubProcess()
        let witness = try Witness(hub)
        let ws = try hub.client("acc_x")

        try ws.send(text: #"{"type":"subscribe","channels":["wallet_updates""#)
        var reply = try parseObject(try ws.nextText())
        #expect(reply["type"] as? String == "error")
        #expect((reply["error"] as? [String: Any])?["code"] as? String == "VALIDATION_ERROR", "\(reply)")
        try witness.check("malformed JSON")
        try ws.send(text: #"{"type":"ping","id":7}"#)
        #expect(try ws.nextText() == #"{"type":"pong","id":7}"#)

        for bad in ["[1,2]", #"{"type":"dance","id":"d"}"#, #"{"channels":["wallet_updates"]}"#, #"{"type":"subscribe","channels":"wallet_updates"}"#] {
            try ws.send(text: bad)
            reply = try parseObject(try ws.nextText())
            #expect((reply["error"] as? [String: Any])?["code"] as? String == "VALIDATION_ERROR", "\(bad) → \(reply)")
        }
        try witness.check("bad messages")

        try ws.send(text: #"{"type":"subscribe","channels":["wallet_updates","nope","nada"],"id":"s1"}"#)
        reply = try parseObject(try ws.nextText())
        #expect(reply["type"] as? String == "error" && reply["id"] as? String == "s1", "\(reply)")
        let error = reply["error"] as? [String: Any] ?? [:]
        #expect(error["code"] as? String == "VALIDATION_ERROR")
        #expect((error["details"] as? [String: Any])?["unknownChannels"] as? [String] == ["nope", "nada"], "\(reply)")
        // All or nothing: wallet_updates was not subscribed either.
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_x")["delivered"] as? Int == 0)
        try witness.check("unknown channel")
        try ws.send(text: #"{"type":"ping","id":"still"}"#)
        #expect(try ws.nextText() == #"{"type":"pong","id":"still"}"#)
    }

    @Test func rateLimitRepliesThenClosesWith1008() throws {
        let hub = try HubProcess(["--rate-limit", "5"])
        let witness = try Witness(hub)  // its subscribe is its first message: 4 left for it, its own bucket
        let ws = try hub.client("acc_r")
        for i in 1...5 {
            try ws.send(text: "{\"type\":\"ping\",\"id\":\(i)}")
            #expect(try ws.nextText() == "{\"type\":\"pong\",\"id\":\(i)}")
        }
        for i in 6...10 {
            try ws.send(text: "{\"type\":\"ping\",\"id\":\(i)}")
            let reply = try parseObject(try ws.nextText())
            let error = reply["error"] as? [String: Any] ?? [:]
            #expect(reply["type"] as? String == "error" && reply["id"] as? Int == i && error["code"] as? String == "RATE_LIMITED", "\(reply)")
            let retryAfter = (error["details"] as? [String: Any])?["retryAfter"] as? Int
            #expect(retryAfter.map { (1...12).contains($0) } == true, "\(reply)")
        }
        try witness.check("rate limited")
        // The sixth rejection within the minute: more than twice the limit.
        try ws.send(text: #"{"type":"ping","id":11}"#)
        #expect(try ws.expectClose().code == 1008)
        try witness.check("1008")
        let stats = try hub.stats()
        #expect((stats["drops"] as? [String: Any])?["rateLimited"] as? Int == 6, "\(stats)")
    }

    @Test func socketErrorsHaveExactCodesAndNeverBroadcast() throws {
        let hub = try HubProcess(["--max-line-bytes", "2048"])
        let witness = try Witness(hub)
        let bystander = try hub.client("other", channels: ["wallet_updates", "profile_updates"])
        let admin = try hub.admin()

        func code(_ line: String) throws -> String? {
            let reply = try parseObject(try admin.request(line))
            #expect(reply["ok"] as? Bool == false, "\(line) → \(reply)")
            #expect((reply["error"] as? [String: Any])?["message"] is String)
            return (reply["error"] as? [String: Any])?["code"] as? String
        }

        #expect(try code(#"{"op":"publish","channel":"#) == "INVALID_JSON")
        try witness.check("INVALID_JSON")
        #expect(try code("[1]") == "INVALID_JSON")
        #expect(try code(#"{"op":"publish","channel":"wallet_updates","account":"witness","data":{}}"#) == "INVALID_REQUEST")  // no type
        #expect(try code(#"{"op":"publish","account":"witness","type":"t"}"#) == "INVALID_REQUEST")  // no channel
        try witness.check("missing field")
        #expect(try code(#"{"op":"publish","channel":"wallet_updates","type":"t","data":{}}"#) == "INVALID_REQUEST")
        #expect(try code(#"{"op":"publish","channel":"wallet_updates","account":"witness","broadcast":true,"type":"t"}"#) == "INVALID_REQUEST")
        #expect(try code(#"{"op":"publish","channel":"wallet_updates","broadcast":false,"type":"t"}"#) == "INVALID_REQUEST")
        try witness.check("neither account nor broadcast")  // exactly the next event: nothing was broadcast
        #expect(try code(#"{"op":"publish","channel":"nope","account":"witness","type":"t"}"#) == "UNKNOWN_CHANNEL")
        try witness.check("UNKNOWN_CHANNEL")
        for reserved in ["subscribed", "unsubscribed", "authenticated", "pong", "error", "token_expiring"] {
            #expect(try code("{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"account\":\"witness\",\"type\":\"\(reserved)\"}") == "RESERVED_TYPE")
        }
        try witness.check("RESERVED_TYPE")
        #expect(try code(#"{"op":"frobnicate"}"#) == "UNKNOWN_OP")
        #expect(try code(#"{"channel":"wallet_updates"}"#) == "UNKNOWN_OP")
        try witness.check("UNKNOWN_OP")

        // Over-long line, then the next line on the same connection works.
        let long = "{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"account\":\"witness\",\"type\":\"t\",\"data\":\"" + String(repeating: "y", count: 3000) + "\"}"
        let replies = try admin.requests([long, #"{"op":"publish","channel":"profile_updates","account":"other","type":"ok","data":1,"id":"after"}"#])
        #expect((try parseObject(replies[0])["error"] as? [String: Any])?["code"] as? String == "LINE_TOO_LONG", "\(String(decoding: replies[0], as: UTF8.self))")
        #expect(String(decoding: replies[1], as: UTF8.self) == #"{"ok":true,"seq":1,"delivered":1,"id":"after"}"#)
        #expect(try bystander.nextText() == #"{"type":"ok","channel":"profile_updates","seq":1,"data":1}"#)
        try witness.check("LINE_TOO_LONG")

        // Pipelined publishes and admin requests: replies in request order, ids echoed.
        let lines = [
            #"{"op":"publish","channel":"wallet_updates","account":"other","type":"p","data":1,"id":1}"#,
            #"{"op":"stats","id":2}"#,
            #"{"op":"publish","channel":"wallet_updates","account":"other","type":"p","data":2,"id":3}"#,
            #"{"op":"channels","id":"four"}"#,
            #"{"op":"nope","id":5}"#,
            #"{"op":"connections","id":6}"#,
            #"{"op":"publish","channel":"wallet_updates","account":"other","type":"p","data":3,"id":7}"#,
            #"{"op":"channel","channel":"wallet_updates","id":8}"#,
            #"{"op":"disconnect","conn":"9-9999","id":9}"#,
            #"{"op":"publish","channel":"wallet_updates","account":"other","type":"p","data":4,"id":10}"#,
        ]
        let pipelined = try admin.requests(lines).map { try parseObject($0) }
        let ids = pipelined.map { $0["id"].map { "\($0)" } ?? "nil" }
        #expect(ids == ["1", "2", "3", "four", "5", "6", "7", "8", "9", "10"])
        #expect(pipelined[0]["seq"] as? Int == 1 && pipelined[2]["seq"] as? Int == 2 && pipelined[6]["seq"] as? Int == 3 && pipelined[9]["seq"] as? Int == 4)
        #expect(pipelined[1]["stats"] != nil && pipelined[3]["channels"] != nil && pipelined[5]["connections"] != nil && pipelined[7]["channel"] != nil)
        #expect((pipelined[4]["error"] as? [String: Any])?["code"] as? String == "UNKNOWN_OP")
        #expect((pipelined[8]["error"] as? [String: Any])?["code"] as? String == "NOT_FOUND")
        #expect(try bystander.drainTexts(quiet: 0.2) == (1...4).map { "{\"type\":\"p\",\"channel\":\"wallet_updates\",\"seq\":\($0),\"data\":\($0)}" })
        try witness.check("pipelined")
    }
}
