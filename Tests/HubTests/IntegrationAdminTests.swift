import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The admin requests on the Unix socket against known state.
@Suite struct IntegrationAdminTests {
    @Test func statsChannelsChannelConnectionsWithExactCounts() throws {
        let hub = try HubProcess()
        let a1 = try hub.client("acc_a", channels: ["wallet_updates", "profile_updates"])
        let a2 = try hub.client("acc_a", channels: ["wallet_updates"])
        let b = try hub.client("acc_b", channels: ["wallet_updates"], headers: [("X-Platform", "iOS"), ("X-App-Version", "1.0.0")])
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_a", data: "1")["delivered"] as? Int == 2)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_a", data: "2")["delivered"] as? Int == 2)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_b", data: "3")["delivered"] as? Int == 1)
        #expect(try hub.publish(channel: "profile_updates", account: nil, type: "m")["delivered"] as? Int == 1)
        #expect(try a1.drainTexts(quiet: 0.1).count == 3)
        #expect(try a2.drainTexts(quiet: 0.1).count == 2)
        #expect(try b.drainTexts(quiet: 0.1).count == 1)

        let stats = try hub.stats()
        #expect(stats["version"] as? String == HubVersion.string)
        #expect(stats["pid"] as? Int == Int(hub.process.processIdentifier))
        #expect(stats["listen"] as? String == "127.0.0.1:\(hub.port)")
        #expect(stats["socket"] as? String == hub.socketPath)
        let connections = stats["connections"] as? [String: Any] ?? [:]
        #expect(connections["open"] as? Int == 3 && connections["handshaking"] as? Int == 0, "\(stats)")
        #expect(stats["subscriptions"] as? Int == 4)
        #expect((stats["threads"] as? [[String: Any]])?.compactMap { $0["connections"] as? Int }.reduce(0, +) == 3)
        let messages = stats["messages"] as? [String: Any] ?? [:]
        #expect(messages["in"] as? Int == 3 && messages["out"] as? Int == 3 + 6, "\(stats)")
        let publishes = stats["publishes"] as? [String: Any] ?? [:]
        #expect(publishes["total"] as? Int == 4 && publishes["delivered"] as? Int == 6, "\(stats)")
        let drops = stats["drops"] as? [String: Any] ?? [:]
        #expect(drops["slowConsumerCloses"] as? Int == 0 && drops["rateLimited"] as? Int == 0 && drops["rejectedConnections"] as? Int == 0)

        let channels = try hub.request(#"{"op":"channels"}"#)["channels"] as? [[String: Any]] ?? []
        #expect(channels.map { $0["name"] as? String } == ["profile_updates", "wallet_updates"])
        let profile = channels[0], wallet = channels[1]
        #expect(profile["subscribers"] as? Int == 1 && profile["accounts"] as? Int == 1 && profile["published"] as? Int == 1 && profile["delivered"] as? Int == 1)
        #expect(wallet["subscribers"] as? Int == 3 && wallet["accounts"] as? Int == 2 && wallet["published"] as? Int == 3 && wallet["delivered"] as? Int == 5)
        #expect(wallet["lastEventAt"] is Double)

        let channel = try hub.request(#"{"op":"channel","channel":"wallet_updates"}"#)["channel"] as? [String: Any] ?? [:]
        #expect(channel["name"] as? String == "wallet_updates" && channel["subscribers"] as? Int == 3 && channel["published"] as? Int == 3)
        let top = (channel["topAccounts"] as? [[String: Any]] ?? []).map { "\($0["account"] ?? "")=\($0["subscribers"] ?? "")" }
        #expect(top == ["acc_a=2", "acc_b=1"])
        let recent = (channel["recentEvents"] as? [[String: Any]] ?? []).map { "\($0["account"] ?? "")#\($0["seq"] ?? "") \($0["delivered"] ?? "")" }
        #expect(recent == ["acc_b#1 1", "acc_a#2 2", "acc_a#1 2"], "\(channel)")
        let filtered = try hub.request(#"{"op":"channel","channel":"wallet_updates","account":"acc_b"}"#)["channel"] as? [String: Any] ?? [:]
        #expect((filtered["topAccounts"] as? [[String: Any]])?.count == 1 && (filtered["recentEvents"] as? [[String: Any]])?.count == 1)
        let emptyChannel = try hub.request(#"{"op":"channel","channel":"profile_updates","account":"acc_b"}"#)["channel"] as? [String: Any] ?? [:]
        #expect((emptyChannel["recentEvents"] as? [Any])?.isEmpty == true)
        #expect((try hub.request(#"{"op":"channel","channel":"nope"}"#)["error"] as? [String: Any])?["code"] as? String == "UNKNOWN_CHANNEL")

        let all = try hub.request(#"{"op":"connections"}"#)
        #expect(all["total"] as? Int == 3 && (all["connections"] as? [Any])?.count == 3)
        let ofA = try hub.request(#"{"op":"connections","account":"acc_a"}"#)
        #expect(ofA["total"] as? Int == 2)
        let onProfile = try hub.request(#"{"op":"connections","channel":"profile_updates"}"#)
        #expect(onProfile["total"] as? Int == 1)
        let limited = try hub.request(#"{"op":"connections","limit":1}"#)
        #expect(limited["total"] as? Int == 3 && (limited["connections"] as? [Any])?.count == 1)
        let bInfo = (try hub.request(#"{"op":"connections","account":"acc_b"}"#)["connections"] as? [[String: Any]])?.first ?? [:]
        #expect(bInfo["platform"] as? String == "iOS" && bInfo["appVersion"] as? String == "1.0.0", "\(bInfo)")
        #expect(bInfo["channels"] as? [String] == ["wallet_updates"] && bInfo["messagesIn"] as? Int == 1 && bInfo["messagesOut"] as? Int == 2)
        #expect((bInfo["remote"] as? String)?.hasPrefix("127.0.0.1:") == true)
        let a1Info = (ofA["connections"] as? [[String: Any]])?.first ?? [:]
        #expect(a1Info["channels"] as? [String] == ["wallet_updates", "profile_updates"], "\(a1Info)")
    }

    @Test func disconnectByAccountAndByConnection() throws {
        let hub = try HubProcess()
        let a1 = try hub.client("acc_a", channels: ["wallet_updates"])
        let a2 = try hub.client("acc_a", channels: ["profile_updates"])
        let b1 = try hub.client("acc_b", channels: ["wallet_updates"])
        let b2 = try hub.client("acc_b", channels: ["wallet_updates"])

        #expect(String(decoding: try hub.admin().request(#"{"op":"disconnect","account":"acc_a","code":4000,"reason":"bye"}"#), as: UTF8.self)
                == #"{"ok":true,"disconnected":2}"#)
        for ws in [a1, a2] {
            let close = try ws.expectClose()
            #expect(close.code == 4000 && close.reason == "bye")
            #expect(try ws.completeClose(code: 4000))
        }
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_b")["delivered"] as? Int == 2)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_a")["delivered"] as? Int == 0)

        let ids = (try hub.request(#"{"op":"connections","account":"acc_b"}"#)["connections"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        #expect(ids.count == 2)
        // The oldest first: b1.
        let reply = try hub.request("{\"op\":\"disconnect\",\"conn\":\"\(ids[0])\",\"id\":1}")
        #expect(reply["ok"] as? Bool == true && reply["disconnected"] as? Int == 1 && reply["id"] as? Int == 1)
        let close = try b1.expectClose()
        #expect(close.code == 1000 && close.reason == "disconnected by operator")
        #expect(try b1.completeClose())
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_b")["delivered"] as? Int == 1)
        #expect(try b2.drainTexts(quiet: 0.2).count == 2)

        let missing = try hub.request(#"{"op":"disconnect","conn":"0-424242"}"#)
        #expect(missing["ok"] as? Bool == false && (missing["error"] as? [String: Any])?["code"] as? String == "NOT_FOUND")
        #expect(try hub.request(#"{"op":"disconnect","account":"nobody"}"#)["disconnected"] as? Int == 0)
        let badCode = try hub.request(#"{"op":"disconnect","account":"acc_b","code":1006}"#)
        #expect(badCode["ok"] as? Bool == false && (badCode["error"] as? [String: Any])?["code"] as? String == "INVALID_REQUEST", "\(badCode)")
        let longReason = try hub.request("{\"op\":\"disconnect\",\"account\":\"acc_b\",\"reason\":\"\(String(repeating: "r", count: 124))\"}")
        #expect((longReason["error"] as? [String: Any])?["code"] as? String == "INVALID_REQUEST", "\(longReason)")
        let both = try hub.request(#"{"op":"disconnect","account":"acc_b","conn":"0-1"}"#)
        #expect((both["error"] as? [String: Any])?["code"] as? String == "INVALID_REQUEST", "\(both)")
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_b")["delivered"] as? Int == 1)

        // When everyone is gone, nothing is left behind: no connections, no subscriptions.
        try b2.sendClose()
        _ = try b2.expectClose()  // the hub echoes our close
        b2.shutdownTCP()
        #expect(eventually {
            guard let stats = try? hub.stats() else { return false }
            return (stats["connections"] as? [String: Any])?["open"] as? Int == 0 && stats["subscriptions"] as? Int == 0
        })
        let channels = try hub.request(#"{"op":"channels"}"#)["channels"] as? [[String: Any]] ?? []
        #expect(channels.allSatisfy { $0["subscribers"] as? Int == 0 && $0["accounts"] as? Int == 0 }, "\(channels)")
    }

    @Test func tailStreamsPublishedEventsWithDataByteForByte() throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let tail = try hub.admin()
        #expect(String(decoding: try tail.request(#"{"op":"tail","channel":"wallet_updates","account":"acc_1"}"#), as: UTF8.self)
                == #"{"ok":true,"tailing":"wallet_updates"}"#)
        let all = try hub.admin()
        _ = try all.request(#"{"op":"tail","channel":"wallet_updates"}"#)

        let data = IntegrationDeliveryTests.oddData
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_2", data: "0")["delivered"] as? Int == 0)
        #expect(try hub.publish(channel: "profile_updates", account: "acc_1", data: "0")["delivered"] as? Int == 0)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1", type: "wallet_balance_changed", data: data)["delivered"] as? Int == 1)
        #expect(try hub.publish(channel: "wallet_updates", account: nil, type: "b", data: "[]")["delivered"] as? Int == 1)

        let line = String(decoding: try #require(try tail.readLine()), as: UTF8.self)
        #expect(line.hasPrefix(#"{"event":{"type":"wallet_balance_changed","channel":"wallet_updates","account":"acc_1","broadcast":false,"seq":1,"delivered":1,"at":"#), "\(line)")
        #expect(line.hasSuffix(",\"data\":\(data)}}"), "\(line)")
        // The account tail leaves the broadcast out: its next line is the next acc_1 event.
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1", type: "next", data: "5")["seq"] as? Int == 2)
        let next = String(decoding: try #require(try tail.readLine()), as: UTF8.self)
        #expect(next.hasPrefix(#"{"event":{"type":"next","channel":"wallet_updates","account":"acc_1","broadcast":false,"seq":2,"delivered":1,"#), "\(next)")
        let lines = try (0..<3).map { _ in try parseObject(try #require(try all.readLine())) }
        let events = lines.map { $0["event"] as? [String: Any] ?? [:] }
        #expect(events.map { $0["account"] as? String } == ["acc_2", "acc_1", nil])
        #expect(events.map { $0["broadcast"] as? Bool } == [false, false, true])
        #expect(events.map { $0["delivered"] as? Int } == [0, 1, 1])
        #expect(try ws.drainTexts(quiet: 0.2).count == 3)
    }

    /// A tail pipelined behind other requests: their replies come first, then `tailing`, then events; a publish
    /// sent before the tail request (same write) is not tailed.
    @Test func tailPipelinedBehindRequestsKeepsReplyOrder() throws {
        let hub = try HubProcess()
        let tail = try hub.admin()
        let first = #"{"op":"publish","channel":"wallet_updates","account":"acc_1","type":"before","data":1}"#
        let stats = #"{"op":"stats","id":"s"}"#
        let start = #"{"op":"tail","channel":"wallet_updates"}"#
        try tail.send(Array((first + "\n" + stats + "\n" + start + "\n").utf8))
        let line1 = String(decoding: try #require(try tail.readLine()), as: UTF8.self)
        #expect(line1 == #"{"ok":true,"seq":1,"delivered":0}"#)
        let line2 = try parseObject(try #require(try tail.readLine()))
        #expect(line2["id"] as? String == "s" && line2["stats"] != nil, "\(line2)")
        let line3 = String(decoding: try #require(try tail.readLine()), as: UTF8.self)
        #expect(line3 == #"{"ok":true,"tailing":"wallet_updates"}"#)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1", type: "after", data: "2")["seq"] as? Int == 2)
        let line4 = String(decoding: try #require(try tail.readLine()), as: UTF8.self)
        #expect(line4.hasPrefix(#"{"event":{"type":"after","#), "\(line4)")
    }

    /// Events published by others while a tail's earlier replies are still being gathered wait behind them.
    @Test func tailEventsNeverOvertakeEarlierReplies() throws {
        let hub = try HubProcess()
        let publisher = try hub.admin()
        for round in 0..<20 {
            let tail = try hub.admin()
            try tail.send(Array(("{\"op\":\"stats\"}\n{\"op\":\"channels\"}\n{\"op\":\"tail\",\"channel\":\"wallet_updates\"}\n").utf8))
            _ = try publisher.request("{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"broadcast\":true,\"type\":\"r\",\"data\":\(round)}")
            let lines = try (0..<3).map { _ in String(decoding: try #require(try tail.readLine()), as: UTF8.self) }
            #expect(lines[0].hasPrefix(#"{"ok":true,"stats":"#), "round \(round): \(lines)")
            #expect(lines[1].hasPrefix(#"{"ok":true,"channels":"#), "round \(round): \(lines)")
            #expect(lines[2] == #"{"ok":true,"tailing":"wallet_updates"}"#, "round \(round): \(lines)")
            if lines[2] != #"{"ok":true,"tailing":"wallet_updates"}"# { break }
        }
    }

    /// A tail that does not read is closed once more than 1 MiB is queued for it; publishing goes on.
    @Test func tailThatCannotKeepUpIsClosed() throws {
        let hub = try HubProcess()
        let tail = try hub.admin()
        #expect(String(decoding: try tail.request(#"{"op":"tail","channel":"wallet_updates"}"#), as: UTF8.self)
                == #"{"ok":true,"tailing":"wallet_updates"}"#)
        let admin = try hub.admin()
        let line = "{\"op\":\"publish\",\"channel\":\"wallet_updates\",\"account\":\"a\",\"type\":\"big\",\"data\":\"" + String(repeating: "q", count: 8192) + "\"}"
        let total = 400  // 3.2 MiB of tail lines
        for _ in 0..<(total / 20) {
            let replies = try admin.requests(Array(repeating: line, count: 20)).map { try parseObject($0) }
            #expect(replies.allSatisfy { $0["ok"] as? Bool == true })
        }
        var received = 0
        tail.readTimeout = 5
        do {
            while try tail.readLine() != nil { received += 1 }
        } catch {
            // A reset instead of a clean end is fine too.
        }
        #expect(received > 0 && received < total, "\(received)")
        #expect(try hub.publish(channel: "wallet_updates", account: "a")["seq"] as? Int == total + 1)
    }
}
