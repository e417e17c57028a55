import Foundation
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The publish ledger's side of cluster-wide tails, without sockets: which of this node's events are forwarded to
/// another node's tail, the per-second allowance and its `skipped` report, and leases that end unless renewed.
/// (Through real hubs and Redis: `ClusterTests.disconnectAndTailReachEveryNode`.)
@Suite struct ClusterTailLedgerTests {
    static let second: UInt64 = 1_000_000_000

    final class Sent: @unchecked Sendable {
        var announced: [TailMessage] = []
        var forwarded: [(node: String, message: TailMessage)] = []
        /// The forwarded lines, parsed, for `node`.
        func lines(to node: String) -> [[String: Any]] {
            forwarded.filter { $0.node == node }.compactMap {
                guard case .line(_, "me", let bytes) = $0.message else { return nil }
                return (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any]
            }
        }
    }

    static func ledger() -> (PublishLedger, Sent) {
        let ledger = PublishLedger(channelNames: ["profile_updates", "wallet_updates"])
        let sent = Sent()
        ledger.cluster = PublishLedger.TailLinks(nodeID: "me", announce: { sent.announced.append($0) },
                                                 forward: { sent.forwarded.append(($0, $1)) })
        return (ledger, sent)
    }

    static func event(channel: Int, account: String?, seq: UInt64) -> PublishedEvent {
        let data = Array(#"{"n":\#(seq)}"#.utf8)
        return PublishedEvent(channel: channel, account: account.map { AccountID($0) }, type: "t", seq: seq,
                              frame: SharedBytes(data), dataRange: 0..<data.count, acceptedAt: 0, wallTime: 1)
    }

    @Test func aRemoteTailGetsExactlyItsChannelAndAccount() throws {
        let (ledger, sent) = Self.ledger()
        ledger.received(.start(id: 7, from: "a", channel: "wallet_updates", account: "acc_1"), now: 0)
        ledger.received(.start(id: 8, from: "b", channel: "wallet_updates", account: nil), now: 0)
        ledger.received(.start(id: 9, from: "c", channel: "not_here", account: nil), now: 0)  // not configured here
        #expect(ledger.remoteTails.count == 2)
        ledger.record([Self.event(channel: 1, account: "acc_1", seq: 1), Self.event(channel: 1, account: "acc_2", seq: 2),
                       Self.event(channel: 0, account: "acc_1", seq: 3), Self.event(channel: 1, account: nil, seq: 4)],
                      delivered: [2, 0, 1, 5])
        let toA = sent.lines(to: "a").compactMap { $0["event"] as? [String: Any] }
        let toB = sent.lines(to: "b").compactMap { $0["event"] as? [String: Any] }
        #expect(toA.compactMap { $0["seq"] as? Int } == [1])
        #expect(toB.compactMap { $0["seq"] as? Int } == [1, 2, 4])
        #expect(sent.forwarded.allSatisfy { if case .line(let id, _, _) = $0.message { return id == ($0.node == "a" ? 7 : 8) } else { return false } })
        let first = try #require(toB.first)
        #expect(first["node"] as? String == "me" && first["channel"] as? String == "wallet_updates"
                && first["account"] as? String == "acc_1" && first["delivered"] as? Int == 2
                && (first["data"] as? [String: Any])?["n"] as? Int == 1)
        #expect(toB.last?["broadcast"] as? Bool == true && toB.last?["delivered"] as? Int == 5)
        #expect(sent.forwarded.allSatisfy { $0.node != "c" })
    }

    @Test func forwardingIsCappedPerSecondAndWhatWasSkippedIsReported() throws {
        let (ledger, sent) = Self.ledger()
        ledger.received(.start(id: 1, from: "a", channel: "wallet_updates", account: nil), now: 0)
        let over = 25
        let events = (1...(PublishLedger.forwardPerSecond + over)).map { Self.event(channel: 1, account: "acc", seq: UInt64($0)) }
        ledger.record(events, delivered: Array(repeating: 1, count: events.count))
        #expect(sent.lines(to: "a").count == PublishLedger.forwardPerSecond)
        ledger.sample(now: Self.second)
        let skipped = try #require(sent.lines(to: "a").last?["skipped"] as? [String: Any])
        #expect(skipped["events"] as? Int == over && skipped["node"] as? String == "me"
                && skipped["channel"] as? String == "wallet_updates" && skipped["perSecond"] as? Int == PublishLedger.forwardPerSecond)
        // A new second: forwarded again, and nothing more to report at the next tick.
        ledger.record([Self.event(channel: 1, account: "acc", seq: 9_999)], delivered: [1])
        #expect((sent.lines(to: "a").last?["event"] as? [String: Any])?["seq"] as? Int == 9_999)
        let count = sent.forwarded.count
        ledger.sample(now: 2 * Self.second)
        #expect(sent.forwarded.count == count)
    }

    @Test func aRemoteTailEndsWithItsStopOrWhenItsLeaseRunsOut() {
        let (ledger, _) = Self.ledger()
        ledger.received(.start(id: 1, from: "a", channel: "wallet_updates", account: nil), now: 0)
        ledger.received(.start(id: 2, from: "a", channel: "wallet_updates", account: nil), now: 0)
        ledger.received(.start(id: 1, from: "b", channel: "wallet_updates", account: nil), now: 0)
        #expect(ledger.remoteTails.count == 3)
        ledger.received(.stop(id: 2, from: "a"), now: Self.second)
        #expect(ledger.remoteTails.map { "\($0.node)\($0.id)" } == ["a1", "b1"])
        // a1 renews at 10 s (its node does every 5 s); b1 does not.
        ledger.received(.start(id: 1, from: "a", channel: "wallet_updates", account: nil), now: 10 * Self.second)
        ledger.sample(now: 14 * Self.second)
        #expect(ledger.remoteTails.count == 2)
        ledger.sample(now: PublishLedger.leaseNanos + Self.second)
        #expect(ledger.remoteTails.map { "\($0.node)\($0.id)" } == ["a1"])
        ledger.sample(now: 10 * Self.second + PublishLedger.leaseNanos)
        #expect(ledger.remoteTails.isEmpty)
    }

    @Test func aNodeKeepsABoundedNumberOfRemoteTails() {
        let (ledger, _) = Self.ledger()
        for id in 1...UInt64(PublishLedger.maxRemoteTails + 10) {
            ledger.received(.start(id: id, from: "a", channel: "wallet_updates", account: nil), now: 0)
        }
        #expect(ledger.remoteTails.count == PublishLedger.maxRemoteTails)
        // A known tail still renews at the cap.
        ledger.received(.start(id: 1, from: "a", channel: "wallet_updates", account: nil), now: 10 * Self.second)
        ledger.sample(now: PublishLedger.leaseNanos + Self.second)
        #expect(ledger.remoteTails.map(\.id) == [1])
    }
}
