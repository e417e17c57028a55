import Foundation
import Glibc
import Testing
@testable import Hub

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

    @Test func subscriptionLimit() throws {
        let hub = try HubProcess(["--channels", "a,b,c", "--max-subscriptions", "2"])
        let ws = try hub.client("acc_1", channels: ["a", "b"])
        try ws.send(text: #"{"type":"subscribe","channels":["c"],"id":"s"}"#)
        let reply = try parseObject(try ws.nextText())
        #expect((reply["error"] as? [String: Any])?["code"] as? String == "VALIDATION_ERROR" && reply["id"] as? String == "s", "\(reply)")
        #expect(try hub.publish(channel: "c", account: "acc_1")["delivered"] as? Int == 0)
        // Re-subscribing to what it has is fine; after an unsubscribe there is room.
        try ws.send(text: #"{"type":"subscribe","channels":["a","b"]}"#)
        #expect(try ws.nextText() == #"{"type":"subscribed","channels":["a","b"]}"#)
        try ws.send(text: #"{"type":"unsubscribe","channels":["a"]}"#)
        #expect(try ws.nextText() == #"{"type":"unsubscribed","channels":["a"]}"#)
        try ws.send(text: #"{"type":"subscribe","channels":["c"]}"#)
        #expect(try ws.nextText() == #"{"type":"subscribed","channels":["c"]}"#)
        #expect(try hub.publish(channel: "c", account: "acc_1")["delivered"] as? Int == 1)
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
