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

/// Edges of the contract: concurrent publishers, absent data, CRLF lines, size and subscription limits,
/// publishing while the hub shuts down.
@Suite struct IntegrationEdgeTests {
    /// Two socket connections publishing to the same stream at the same time: the client still sees seq
    /// 1, 2, 3, ... in order, and the replies' seqs are exactly 1...N between them.
    @Test func concurrentPublishersKeepEachStreamInOrder() throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let perPublisher = 150
        final class Results: @unchecked Sendable {
            let lock = NSLock()
            var seqs: [Int] = []
            var errors: [String] = []
        }
        let results = Results()
        let group = DispatchGroup()
        for publisher in 0..<2 {
            group.enter()
            let socketPath = hub.socketPath
            Thread {
                defer { group.leave() }
                do {
                    let admin = try AdminClient(socketPath: socketPath)
                    // Small pipelined batches, so the two connections interleave.
                    for batch in 0..<(perPublisher / 5) {
                        let lines = (0..<5).map { i in
                            "{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"account\":\"acc_1\",\"type\":\"p\",\"data\":[\(publisher),\(batch * 5 + i)]}"
                        }
                        let replies = try admin.requests(lines).map { try parseObject($0) }
                        results.lock.withLock { results.seqs += replies.compactMap { $0["seq"] as? Int } }
                    }
                } catch {
                    results.lock.withLock { results.errors.append("\(error)") }
                }
            }.start()
        }
        #expect(group.wait(timeout: .now() + 20) == .success)
        #expect(results.errors.isEmpty, "\(results.errors)")
        #expect(results.seqs.sorted() == Array(1...(2 * perPublisher)))
        var lastOf = [-1, -1]
        for expected in 1...(2 * perPublisher) {
            let event = try parseObject(try ws.nextText())
            #expect(event["seq"] as? Int == expected)
            // Each publisher's own events arrive in the order it sent them.
            let data = event["data"] as? [Int] ?? [0, -2]
            #expect(data[1] == lastOf[data[0]] + 1, "\(event)")
            lastOf[data[0]] = data[1]
        }
    }

    @Test func socketLineDetails() throws {
        let hub = try HubProcess(["--max-event-bytes", "1024"])
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let admin = try hub.admin()
        // No data: null. CRLF line endings. Blank lines are not requests.
        try admin.send(Array("\n\r\n{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"account\":\"acc_1\",\"type\":\"t\"}\r\n".utf8))
        #expect(String(decoding: try #require(try admin.readLine()), as: UTF8.self) == #"{"ok":true,"seq":1,"delivered":1}"#)
        #expect(try ws.nextText() == #"{"type":"t","channel":"wallet_updates","seq":1,"data":null}"#)
        let big = "\"" + String(repeating: "b", count: 1100) + "\""
        let tooLarge = try parseObject(try admin.request("{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"account\":\"acc_1\",\"type\":\"t\",\"data\":\(big)}"))
        #expect((tooLarge["error"] as? [String: Any])?["code"] as? String == "EVENT_TOO_LARGE", "\(tooLarge)")
        let type129 = String(repeating: "t", count: 129)
        let longType = try parseObject(try admin.request("{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"account\":\"acc_1\",\"type\":\"\(type129)\"}"))
        #expect((longType["error"] as? [String: Any])?["code"] as? String == "INVALID_REQUEST", "\(longType)")
        // Nothing of that reached the client, and the stream continues at 2.
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1", data: "2")["seq"] as? Int == 2)
        #expect(try ws.nextText() == #"{"type":"test_event","channel":"wallet_updates","seq":2,"data":2}"#)
    }

    /// `--max-event-bytes` bounds the framed event counted with the widest seq (20 digits), so the limit holds
    /// for every seq the stream can reach: exactly at it is accepted, one byte more is refused.
    @Test func eventSizeLimitBoundary() throws {
        let hub = try HubProcess(["--max-event-bytes", "1024"])
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let fixed = #"{"type":"t","channel":"wallet_updates","seq":"#.utf8.count + 20 + #","data":}"#.utf8.count
        let dataCount = 1024 - 4 - fixed  // 4: the frame header for 126...65535 payload bytes
        func publish(_ count: Int) throws -> [String: Any] {
            let data = "\"" + String(repeating: "d", count: count - 2) + "\""
            return try hub.publish(channel: "wallet_updates", account: "acc_1", type: "t", data: data)
        }
        let atLimit = try publish(dataCount)
        #expect(atLimit["ok"] as? Bool == true && atLimit["delivered"] as? Int == 1, "\(atLimit)")
        #expect(try ws.nextText().utf8.count == 1024 - 4 - 19)  // seq 1 is 19 digits shorter than the bound
        let over = try publish(dataCount + 1)
        #expect((over["error"] as? [String: Any])?["code"] as? String == "EVENT_TOO_LARGE", "\(over)")
    }

    @Test func subscriptionLimit() throws {
        let hub = try HubProcess(["--channels", "a,b,c", "--max-subscriptions", "2"])
        let ws = try hub.client("acc_1", channels: ["a", "b"])
        try ws.send(text: #"{"type":"subscribe","channels":["c"],"id":"s"}"#)
        let reply = try parseObject(try ws.nextText())
        #expect((reply["error"] as? [String: Any])?["code"] as? String == "VALIDATION_ERROR" && reply["id"] as? String == "s", "\(reply)")
        #expect(try hub.publish(channel: "c", account: "acc_1")["delivered"] as? Int == 0)
        // Re-subscribing to what it has is fine; after an unsubscribe there is room.
        try ws.send(text: #"{"type":"subscribe","channels":["a","b"]}"#)
        #expect(withoutPositions(try ws.nextText()) == #"{"type":"subscribed","channels":["a","b"]}"#)
        try ws.send(text: #"{"type":"unsubscribe","channels":["a"]}"#)
        #expect(try ws.nextText() == #"{"type":"unsubscribed","channels":["a"]}"#)
        try ws.send(text: #"{"type":"subscribe","channels":["c"]}"#)
        #expect(withoutPositions(try ws.nextText()) == #"{"type":"subscribed","channels":["c"]}"#)
        #expect(try hub.publish(channel: "c", account: "acc_1")["delivered"] as? Int == 1)
    }

    /// Sends `payload` on a fresh Unix-socket connection, half-closes it (`shutdown(SHUT_WR)`, as `nc -N` and
    /// `nc -q1` do after their input), then reads until the hub closes: the reply lines, and whether EOF came
    /// within `timeout` seconds.
    static func sendAndHalfClose(_ socketPath: String, _ payload: String, timeout: Double = 10) throws -> (lines: [String], eof: Bool) {
        let fd = try SocketBoundsTests.unixConnect(socketPath)
        defer { close(fd) }
        let bytes = Array(payload.utf8)
        var sent = 0
        let deadline = Date().addingTimeInterval(timeout)
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            if n > 0 { sent += n; continue }
            guard n < 0, errno == EAGAIN, Date() < deadline else { throw HubTestError("send: errno \(errno)") }
            var p = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            _ = poll(&p, 1, 100)
        }
        guard shutdown(fd, Int32(SHUT_WR)) == 0 else { throw HubTestError("shutdown: errno \(errno)") }
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        var eof = false
        while !eof, Date() < deadline {
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&p, 1, 100)
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            if n > 0 { received += buffer[0..<n] } else if n == 0 { eof = true } else if errno != EAGAIN { break }
        }
        let lines = String(decoding: received, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        return (lines.last == "" ? Array(lines.dropLast()) : lines, eof)
    }

    /// A backend that half-closes after its requests (`printf '…\n' | nc -U -N ./hub.sock`, or `-q1`) gets every
    /// reply, in order, then EOF: the hub answers what it was sent before closing (it used to close at the
    /// peer's EOF and drop the replies still being produced, so nc printed nothing).
    @Test func halfClosedPeerGetsEveryReplyThenEOF() throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        // A publish (answered after fan-out), an admin view (gathered from every loop), a bad line, a history read.
        let (lines, eof) = try Self.sendAndHalfClose(hub.socketPath, [
            #"{"op":"publish","channel":"wallet_updates","account":"acc_1","type":"t","data":1}"#,
            #"{"op":"stats","id":"s"}"#,
            #"{"op":"nope","id":"x"}"#,
            #"{"op":"history","channel":"wallet_updates","account":"acc_1","id":"h"}"#,
        ].joined(separator: "\n") + "\n")
        #expect(eof, "the hub did not close the connection after its replies")
        #expect(lines.count == 4, "\(lines)")
        guard lines.count == 4 else { return }
        #expect(lines[0] == #"{"ok":true,"seq":1,"delivered":1}"#)
        let stats = try parseObject(Array(lines[1].utf8))
        #expect(stats["id"] as? String == "s" && stats["stats"] != nil, "\(lines[1])")
        let bad = try parseObject(Array(lines[2].utf8))
        #expect(bad["id"] as? String == "x" && bad["error"] != nil, "\(lines[2])")
        let history = try parseObject(Array(lines[3].utf8))
        #expect(history["id"] as? String == "h", "\(lines[3])")
        #expect(try ws.nextText() == #"{"type":"t","channel":"wallet_updates","seq":1,"data":1}"#)

        // Many pipelined publishes, then the half-close: all answered.
        let many = (0..<500).map { #"{"op":"publish","channel":"wallet_updates","account":"nobody","type":"t","data":"# + "\($0)}" }
        let (replies, eof2) = try Self.sendAndHalfClose(hub.socketPath, many.joined(separator: "\n") + "\n")
        #expect(eof2)
        #expect(replies.count == 500 && replies.last == #"{"ok":true,"seq":500,"delivered":0}"#, "\(replies.count) replies, last \(replies.last ?? "none")")

        // Nothing sent: the hub closes at once. The hub is still serving.
        let (none, eof3) = try Self.sendAndHalfClose(hub.socketPath, "", timeout: 5)
        #expect(none.isEmpty && eof3)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1", data: "2")["seq"] as? Int == 2)
    }

    /// After SIGTERM, while clients finish their close handshakes, an open socket connection's publishes are
    /// answered `SHUTTING_DOWN`, and new clients cannot connect.
    @Test func publishesDuringShutdownAreRefused() throws {
        let hub = try HubProcess(["--shutdown-timeout", "5s"])
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let admin = try hub.admin()
        #expect(String(decoding: try admin.request(#"{"op":"publish","channel":"wallet_updates","account":"acc_1","type":"t"}"#), as: UTF8.self)
                == #"{"ok":true,"seq":1,"delivered":1}"#)
        hub.send(signal: SIGTERM)
        #expect(try ws.expectClose().code == 1001)  // the client does not answer yet: the hub waits for it
        let reply = try parseObject(try admin.request(#"{"op":"publish","channel":"wallet_updates","account":"acc_1","type":"t","id":"late"}"#))
        #expect((reply["error"] as? [String: Any])?["code"] as? String == "SHUTTING_DOWN" && reply["id"] as? String == "late", "\(reply)")
        #expect(throws: (any Error).self) { _ = try hub.client("acc_2") }
        try ws.sendClose(code: 1001)
        #expect(hub.waitForExit(timeout: 8) == 0)
    }
}

@Suite struct IntegrationEdgeClientTests {
    /// Accounts are compared as decoded strings: a token `sub` with quotes, slashes and non-ASCII receives the
    /// events published to the same account however the backend escapes it, and nobody else does.
    @Test func accountNamesWithEscapesMatchDecoded() throws {
        let hub = try HubProcess()
        let odd = "acc/ü\"x\\y"
        let ws = try hub.client(odd, channels: ["wallet_updates"])
        let near = try hub.client("acc/ü\"x", channels: ["wallet_updates"])
        let escaped = #"{"op":"publish","channel":"wallet_updates","account":"acc\/\u00fc\"x\\y","type":"t","data":1}"#
        let plain = "{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"account\":\(jsonString(odd)),\"type\":\"t\",\"data\":2}"
        let replies = try hub.admin().requests([escaped, plain]).map { try parseObject($0) }
        #expect(replies.map { $0["seq"] as? Int } == [1, 2] && replies.map { $0["delivered"] as? Int } == [1, 1], "\(replies)")
        #expect(try ws.drainTexts(quiet: 0.2) == [#"{"type":"t","channel":"wallet_updates","seq":1,"data":1}"#,
                                                 #"{"type":"t","channel":"wallet_updates","seq":2,"data":2}"#])
        #expect(try near.isQuiet(for: 0.1))
        let conns = try hub.request("{\"op\":\"connections\",\"account\":\(jsonString(odd))}")
        #expect(conns["total"] as? Int == 1 && (conns["connections"] as? [[String: Any]])?.first?["account"] as? String == odd)
        #expect(try hub.request("{\"op\":\"disconnect\",\"account\":\(jsonString(odd))}")["disconnected"] as? Int == 1)
        #expect(try ws.expectClose().code == 1000)
        #expect(try near.isQuiet(for: 0.1))
    }

    /// A subscribe sent in the same write as the upgrade request is handled, not lost.
    @Test func framesBehindTheRequestAreRead() throws {
        let hub = try HubProcess()
        let subscribe = FrameEncoder.clientFrame(opcode: .text, payload: Array(#"{"type":"subscribe","channels":["wallet_updates"],"id":1}"#.utf8))
        let ws = try TestWebSocket.connect(port: hub.port, headers: [("Authorization", "Bearer \(try hub.token("acc_1"))")],
                                           behindRequest: subscribe)
        #expect(withoutPositions(try ws.nextText()) == #"{"type":"subscribed","channels":["wallet_updates"],"id":1}"#)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1")["delivered"] as? Int == 1)
    }

    /// `/ws` declines permessage-deflate by omission; the scheme of the Authorization header is case-insensitive.
    @Test func deflateDeclinedAndBearerCaseInsensitive() throws {
        let hub = try HubProcess()
        let ws = try TestWebSocket.connect(port: hub.port, headers: [("Authorization", "bearer \(try hub.token("acc_1"))")],
                                           deflate: PerMessageDeflateConfiguration())
        #expect(ws.response.headers[first: "Sec-WebSocket-Extensions"] == nil)
        try ws.send(text: #"{"type":"subscribe","channels":["wallet_updates"]}"#)
        #expect(withoutPositions(try ws.nextText()) == #"{"type":"subscribed","channels":["wallet_updates"]}"#)
        let data = "[" + String(repeating: "1,", count: 200) + "1]"  // compressible, and still sent as is
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1", data: data)["delivered"] as? Int == 1)
        #expect(try ws.nextText() == "{\"type\":\"test_event\",\"channel\":\"wallet_updates\",\"seq\":1,\"data\":\(data)}")
        let upper = try TestWebSocket.connect(port: hub.port, headers: [("Authorization", "BEARER \(try hub.token("acc_1"))")])
        withExtendedLifetime(upper) {}
    }

    @Test func headersAreRecordedAndClipped() throws {
        let hub = try HubProcess()
        let long = String(repeating: "é", count: 40)  // 80 bytes: clipped to at most 64
        let ws = try hub.client("acc_1", headers: [("X-Platform", "Android"), ("X-App-Version", long)])
        defer { withExtendedLifetime(ws) {} }
        let info = (try hub.request(#"{"op":"connections"}"#)["connections"] as? [[String: Any]])?.first ?? [:]
        #expect(info["platform"] as? String == "Android")
        let version = info["appVersion"] as? String ?? ""
        #expect(version.utf8.count <= 64 && long.hasPrefix(version) && version.count == 32, "\(version)")
    }

    @Test func echoEndpointOnlyWhenEnabled() throws {
        let off = try HubProcess()
        #expect(try rawHTTP(port: off.port, IntegrationRefusalTests.upgradeRequest(path: "/echo")).status == 404)

        let hub = try HubProcess(["--echo"])
        #expect(hub.startupLine.contains("/echo enabled"))
        let ws = try TestWebSocket.connect(port: hub.port, path: "/echo", deflate: PerMessageDeflateConfiguration())
        #expect(ws.response.headers[first: "Sec-WebSocket-Extensions"]?.hasPrefix("permessage-deflate") == true)
        try ws.send(text: "héllo")
        #expect(try ws.receive() == .text("héllo"))
        let big = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }  // over /ws's 64 KiB, under /echo's 16 MiB
        try ws.sendFrame(.binary, big)
        let echoed = try ws.receive(timeout: 10)
        if case .binary(let bytes) = echoed {
            #expect(bytes == big)
        } else {
            Issue.record("expected the binary echo, got \(String(describing: echoed).prefix(300))")
        }
        // /ws refuses a bad token, /echo never asks for one.
        #expect(try rawHTTP(port: hub.port, IntegrationRefusalTests.upgradeRequest(extra: "Authorization: Bearer x.y.z\r\n")).status == 401)
    }
}

@Suite struct IntegrationPublisherFlowTests {
    final class Box: @unchecked Sendable {
        let admin: AdminClient
        let lock = NSLock()
        var sent = 0
        var error: String?
        init(_ admin: AdminClient) { self.admin = admin }
    }

    /// A publisher that pipelines far more than the hub lets pile up (1 MiB of replies owed, publishes counting
    /// their lines until answered) while reading replies on another thread: the hub pauses and resumes reading,
    /// and every request gets its reply, in order.
    @Test func deepPipelineIsThrottledNotLost() throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let total = 70_000
        let box = Box(try hub.admin())
        box.admin.readTimeout = 20
        // Every 1000th to a connected account, the rest to nobody (account "n": one stream).
        let writer = Thread {
            var chunk: [UInt8] = []
            chunk.reserveCapacity(70_000)
            for i in 0..<total {
                chunk.append(contentsOf: #"{"op":"publish","channel":"wallet_updates","account":""#.utf8)
                chunk.append(contentsOf: (i % 1000 == 0 ? "acc_1" : "n").utf8)
                chunk.append(contentsOf: #"","type":"t","data":"#.utf8)
                chunk.append(contentsOf: String(i).utf8)
                chunk.append(contentsOf: "}\n".utf8)
                if chunk.count > 60_000 || i == total - 1 {
                    do { try box.admin.send(chunk) } catch { box.lock.withLock { box.error = "\(error)" }; return }
                    chunk.removeAll(keepingCapacity: true)
                }
            }
        }
        writer.start()
        var badReplies = 0
        for i in 0..<total {
            let reply = try #require(try box.admin.readLine(), "reply \(i) missing")
            let seq = i % 1000 == 0 ? i / 1000 + 1 : i - i / 1000
            let expected = "{\"ok\":true,\"seq\":\(seq),\"delivered\":\(i % 1000 == 0 ? 1 : 0)}"
            if !reply.elementsEqual(expected.utf8) {
                badReplies += 1
                if badReplies < 3 { Issue.record("reply \(i): \(String(decoding: reply, as: UTF8.self)), expected \(expected)") }
            }
        }
        #expect(badReplies == 0)
        #expect(box.lock.withLock { box.error } == nil)
        let texts = try ws.drainTexts(quiet: 0.3)
        #expect(texts.count == total / 1000)
        #expect(texts.first == #"{"type":"t","channel":"wallet_updates","seq":1,"data":0}"#)
        #expect(texts.last == "{\"type\":\"t\",\"channel\":\"wallet_updates\",\"seq\":\(total / 1000),\"data\":\(total - 1000)}")
    }
}
