import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// Publish → receive through the real binary: exact frames, sequence numbers, delivered counts, isolation.
@Suite struct IntegrationDeliveryTests {
    /// Odd but valid JSON: whitespace (tabs, spaces) between tokens, escapes, unicode escapes, nested arrays.
    static let oddData = #"{ "a" :\#t[1, [2, [ "x\u00e9\ud83d\ude00" , [] ]],{ }] ,"b":  "\"q\"\n\\" , "n": -1.5e+3,"t":true , "z":null }"#

    static func event(_ type: String, _ channel: String, seq: Int, broadcast: Bool = false, data: String) -> String {
        "{\"type\":\"\(type)\",\"channel\":\"\(channel)\",\"seq\":\(seq)\(broadcast ? ",\"broadcast\":true" : ""),\"data\":\(data)}"
    }

    /// Opens extra subscribers of `account` until connections exist on every loop; returns them.
    static func coverEveryLoop(_ hub: HubProcess, account: String, channels: [String], loops: Int = 2) throws -> [TestWebSocket] {
        var extra: [TestWebSocket] = []
        for _ in 0..<40 {
            let reply = try hub.request(#"{"op":"connections"}"#)
            let ids = (reply["connections"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
            if Set(ids.map { $0.split(separator: "-")[0] }).count >= loops { return extra }
            extra.append(try hub.client(account, channels: channels))
        }
        throw HubTestError("connections never spread over \(loops) loops")
    }

    @Test func publishedEventsArriveByteForByteWithExactSeqAndDelivered() throws {
        let hub = try HubProcess()
        let a1 = try hub.client("acc_1", channels: ["wallet_updates"])
        let a2 = try hub.client("acc_1", channels: ["wallet_updates", "profile_updates"])
        let b = try hub.client("acc_2", channels: ["wallet_updates"])
        var extras = try Self.coverEveryLoop(hub, account: "acc_9", channels: ["wallet_updates"])
        extras.append(try hub.client("acc_9"))  // connected, subscribed to nothing: receives nothing

        func publish(_ channel: String, _ account: String?, type: String = "wallet_balance_changed", data: String = IntegrationDeliveryTests.oddData) throws -> (Int?, Int?) {
            let reply = try hub.publish(channel: channel, account: account, type: type, data: data)
            #expect(reply["ok"] as? Bool == true, "\(reply)")
            return (reply["seq"] as? Int, reply["delivered"] as? Int)
        }

        // Nobody of acc_3 is connected.
        #expect(try publish("wallet_updates", "acc_3") == (1, 0))
        // Two connections of acc_1 on the channel.
        #expect(try publish("wallet_updates", "acc_1") == (1, 2))
        #expect(try publish("wallet_updates", "acc_1", data: "[1,2]") == (2, 2))
        #expect(try publish("wallet_updates", "acc_2", data: "\"s\"") == (1, 1))
        #expect(try publish("profile_updates", "acc_1", type: "profile_changed", data: "null") == (1, 1))
        #expect(try publish("wallet_updates", "acc_1", data: "3") == (3, 2))
        // Broadcasts: every subscriber of the channel on every loop, in their own stream.
        let walletSubscribers = 3 + extras.count - 1
        #expect(try publish("wallet_updates", nil, type: "maintenance", data: "{}") == (1, walletSubscribers))
        #expect(try publish("wallet_updates", nil, type: "maintenance", data: Self.oddData) == (2, walletSubscribers))
        #expect(try publish("profile_updates", nil, type: "maintenance", data: "[]") == (1, 1))
        #expect(try publish("wallet_updates", "acc_1", data: "4") == (4, 2))

        let w = "wallet_updates", p = "profile_updates", t = "wallet_balance_changed"
        let acc1Wallet = [
            Self.event(t, w, seq: 1, data: Self.oddData), Self.event(t, w, seq: 2, data: "[1,2]"), Self.event(t, w, seq: 3, data: "3"),
            Self.event("maintenance", w, seq: 1, broadcast: true, data: "{}"),
            Self.event("maintenance", w, seq: 2, broadcast: true, data: Self.oddData),
            Self.event(t, w, seq: 4, data: "4"),
        ]
        #expect(try a1.drainTexts() == acc1Wallet)
        var both = acc1Wallet
        both.insert(Self.event("profile_changed", p, seq: 1, data: "null"), at: 2)
        both.insert(Self.event("maintenance", p, seq: 1, broadcast: true, data: "[]"), at: 6)
        #expect(try a2.drainTexts() == both)
        #expect(try b.drainTexts() == [
            Self.event(t, w, seq: 1, data: "\"s\""),
            Self.event("maintenance", w, seq: 1, broadcast: true, data: "{}"),
            Self.event("maintenance", w, seq: 2, broadcast: true, data: Self.oddData),
        ])
        for (i, ws) in extras.enumerated() {
            let texts = try ws.drainTexts(quiet: 0.1)
            if i == extras.count - 1 {
                #expect(texts.isEmpty)
            } else {
                #expect(texts == [Self.event("maintenance", w, seq: 1, broadcast: true, data: "{}"),
                                  Self.event("maintenance", w, seq: 2, broadcast: true, data: Self.oddData)])
            }
        }
    }

    @Test func unsubscribeStopsDeliveryAndCountsFollow() throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates", "profile_updates"])
        try ws.send(text: #"{"type":"unsubscribe","channels":["wallet_updates"],"id":"u1"}"#)
        #expect(try ws.nextText() == #"{"type":"unsubscribed","channels":["wallet_updates"],"id":"u1"}"#)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1")["delivered"] as? Int == 0)
        #expect(try hub.publish(channel: "profile_updates", account: "acc_1")["delivered"] as? Int == 1)
        #expect(try ws.drainTexts(quiet: 0.2) == [Self.event("test_event", "profile_updates", seq: 1, data: "{}")])
        // Subscribing twice is not an error and does not double delivery.
        try ws.send(text: #"{"type":"subscribe","channels":["profile_updates","profile_updates"],"id":7}"#)
        let twice = try ws.nextText()
        #expect(withoutPositions(twice) == #"{"type":"subscribed","channels":["profile_updates"],"id":7}"#, "\(twice)")  // names deduplicated
        #expect(try hub.publish(channel: "profile_updates", account: "acc_1")["delivered"] as? Int == 1)
        try ws.send(text: #"{"type":"unsubscribe","channels":["profile_updates","profile_updates"]}"#)
        let drained = try ws.drainTexts(quiet: 0.2)
        #expect(drained.last == #"{"type":"unsubscribed","channels":["profile_updates"]}"#, "\(drained)")
        #expect(try hub.publish(channel: "profile_updates", account: "acc_1")["delivered"] as? Int == 0)
    }

    /// ~30 accounts × 1-3 connections, random subscriptions, ~500 random publishes pipelined on one socket
    /// connection: every connection gets exactly its account's events on its channels (+ broadcasts there), in
    /// order, with consecutive seqs, and every `delivered` is the number of connections that really got it.
    @Test func isolationUnderRandomizedPipelinedLoad() throws {
        let channels = ["c0", "c1", "c2", "c3"]
        let hub = try HubProcess(["--channels", channels.joined(separator: ",")])
        var rng = SplitMix64(seed: 0x5EED_1234)

        struct Subscriber { let account: String; let channels: Set<String>; let ws: TestWebSocket }
        var subscribers: [Subscriber] = []
        for a in 0..<30 {
            let account = "acc_\(a)"
            for _ in 0..<(1 + Int(rng.next() % 3)) {
                var chosen = channels.filter { _ in rng.next() % 2 == 0 }
                if rng.next() % 8 == 0 { chosen = [] }  // some connections subscribe to nothing
                subscribers.append(Subscriber(account: account, channels: Set(chosen), ws: try hub.client(account, channels: chosen)))
            }
        }

        // Accounts 30...33 have no connection at all.
        var lines: [String] = []
        var expectedDelivered: [Int] = []
        var expectedSeq: [Int] = []
        var streams: [String: Int] = [:]
        var expectedTexts = Array(repeating: [String](), count: subscribers.count)
        for i in 0..<500 {
            let channel = channels[Int(rng.next() % 4)]
            let broadcast = rng.next() % 20 == 0
            let account: String? = broadcast ? nil : "acc_\(rng.next() % 34)"
            let data = "{\"i\":\(i),\"to\":\(account.map(jsonString) ?? "null")}"
            let target = account.map { "\"account\":\(jsonString($0))" } ?? "\"broadcast\":true"
            lines.append("{\"op\":\"publish\",\"id\":\(i),\"channel\":\"\(channel)\",\(target),\"type\":\"e\",\"data\":\(data)}")
            let key = channel + "/" + (account ?? "*")
            let seq = streams[key, default: 0] + 1
            streams[key] = seq
            expectedSeq.append(seq)
            let text = Self.event("e", channel, seq: seq, broadcast: broadcast, data: data)
            var n = 0
            for (s, sub) in subscribers.enumerated() where sub.channels.contains(channel) && (account == nil || sub.account == account) {
                expectedTexts[s].append(text)
                n += 1
            }
            expectedDelivered.append(n)
        }
        // Fence: a broadcast on every channel, so each connection knows when it has everything.
        for channel in channels {
            lines.append("{\"op\":\"publish\",\"channel\":\"\(channel)\",\"broadcast\":true,\"type\":\"fence\",\"data\":null}")
        }

        let admin = try hub.admin()
        let replies = try admin.requests(lines).map { try parseObject($0) }
        #expect(replies.count == lines.count)
        var mismatches = 0
        for i in 0..<500 {
            let r = replies[i]
            if r["ok"] as? Bool != true || r["id"] as? Int != i || r["seq"] as? Int != expectedSeq[i] || r["delivered"] as? Int != expectedDelivered[i] {
                mismatches += 1
                if mismatches < 5 { Issue.record("publish \(i): \(r), expected seq \(expectedSeq[i]) delivered \(expectedDelivered[i])") }
            }
        }
        #expect(mismatches == 0)

        for (s, sub) in subscribers.enumerated() {
            var got: [String] = []
            var fences = 0
            while fences < sub.channels.count {
                let text = try sub.ws.nextText(timeout: 5)
                if text.contains("\"type\":\"fence\"") { fences += 1 } else { got.append(text) }
            }
            if !sub.channels.isEmpty { #expect(got == expectedTexts[s], "connection \(s) of \(sub.account) on \(sub.channels.sorted())") }
            #expect(expectedTexts[s].allSatisfy { $0.contains("\"to\":\"\(sub.account)\"") || $0.contains("\"to\":null") })
        }
        // Connections subscribed to nothing received nothing (checked last: the fences above prove delivery is done).
        for sub in subscribers where sub.channels.isEmpty {
            #expect(try sub.ws.isQuiet(for: 0.05))
        }
        #expect(subscribers.count >= 30 && expectedDelivered.filter { $0 == 0 }.count > 0 && expectedDelivered.contains { $0 > 1 })
    }
}
