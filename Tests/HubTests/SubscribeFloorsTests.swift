import Testing
@testable import Hub
@testable import HubEngine
@testable import HubRouting

/// The subscribe rule alone (`SubscribeFloors`): which live events a connection writes while its subscribes are
/// answered. The same rule through real sockets and brokers: IntegrationRecoveryTests, ClusterTests.
@Suite struct SubscribeFloorsTests {
    typealias Floor = SubscribeFloors.Floor

    static func event(channel: Int = 0, broadcast: Bool = false, seq: UInt64, bytes: Int = 10) -> PublishedEvent {
        let frame = SharedBytes(count: bytes) { $0.initializeMemory(as: UInt8.self, repeating: 0x20) }
        return PublishedEvent(channel: channel, account: broadcast ? nil : AccountID("acc"), type: "t", seq: seq,
                              frame: frame, dataRange: 0..<0, acceptedAt: 0, wallTime: 0)
    }

    @Test func eventsAtOrBelowAFloorAreSkippedAndTheFirstAboveRetiresIt() {
        var f = SubscribeFloors()
        f.add([Floor(channel: 0, broadcast: false, seq: 5, token: 1), Floor(channel: 0, broadcast: true, seq: 2, token: 1)])
        do { let d = f.decide(channel: 0, broadcast: false, seq: 3); #expect(d == .skip) }
        do { let d = f.decide(channel: 0, broadcast: false, seq: 5); #expect(d == .skip) }
        do { let d = f.decide(channel: 0, broadcast: true, seq: 2); #expect(d == .skip) }
        do { let d = f.decide(channel: 1, broadcast: false, seq: 1); #expect(d == .pass, "another channel has no floor") }
        do { let d = f.decide(channel: 0, broadcast: false, seq: 6); #expect(d == .pass) }
        #expect(f.floors == [Floor(channel: 0, broadcast: true, seq: 2, token: 1)], "only the account stream's floor went")
        do { let d = f.decide(channel: 0, broadcast: true, seq: 3); #expect(d == .pass) }
        #expect(f.isEmpty)
        #expect(f.floors.capacity == 0, "the last floor gone frees the array's buffer")
    }

    @Test func aStreamWithSeveralFloorsGoesByTheHighest() {
        var f = SubscribeFloors()
        f.add([Floor(channel: 0, broadcast: false, seq: 3, token: 1)])
        f.add([Floor(channel: 0, broadcast: false, seq: 7, token: 2)])
        do { let d = f.decide(channel: 0, broadcast: false, seq: 5); #expect(d == .skip) }
        do { let d = f.decide(channel: 0, broadcast: false, seq: 8); #expect(d == .pass) }
        #expect(f.floors.isEmpty, "an event above both retires both")
    }

    @Test func heldEventsWaitForTheAnswerAndOnlyThoseItDoesNotCoverAreWritten() {
        var f = SubscribeFloors()
        f.hold(channels: [0], token: 4)
        do { let d = f.decide(channel: 0, broadcast: false, seq: 9); #expect(d == .hold) }
        do { let d = f.decide(channel: 0, broadcast: true, seq: 9); #expect(d == .hold) }
        do { let d = f.decide(channel: 1, broadcast: false, seq: 9); #expect(d == .pass, "a channel not being subscribed is not held") }
        let arrivals = [Self.event(seq: 4), Self.event(broadcast: true, seq: 1), Self.event(seq: 5), Self.event(seq: 6)]
        for e in arrivals { let kept = f.keep(e, cap: 1_000); #expect(kept) }
        #expect(f.heldBytes == 40)
        let held = f.answered(token: 4)
        #expect(held.map(\.seq) == [4, 1, 5, 6], "handed back in arrival order")
        #expect(f.floors.isEmpty && f.held.isEmpty && f.heldBytes == 0, "the holding floors went with the answer")
        // The answer read the account stream at 5 and the broadcast stream at 0.
        f.add([Floor(channel: 0, broadcast: false, seq: 5, token: 4), Floor(channel: 0, broadcast: true, seq: 0, token: 4)])
        let written = held.filter { !f.covers($0) }.map { ($0.account == nil, $0.seq) }
        #expect(written.map(\.1) == [1, 6] && written.map(\.0) == [true, false])
    }

    @Test func heldBytesPastTheCapAreRefused() {
        var f = SubscribeFloors()
        f.hold(channels: [0], token: 1)
        let first = f.keep(Self.event(seq: 1, bytes: 60), cap: 100)
        let second = f.keep(Self.event(seq: 2, bytes: 60), cap: 100)
        #expect(first)
        #expect(!second, "120 bytes held would pass the 100-byte cap")
        #expect(f.held.map(\.seq) == [1])
    }

    @Test func retiringByTokenKeepsLaterSubscribesAndByChannelBothStreams() {
        var f = SubscribeFloors()
        f.add([Floor(channel: 0, broadcast: false, seq: 1, token: 1), Floor(channel: 1, broadcast: false, seq: 1, token: 2),
               Floor(channel: 1, broadcast: true, seq: 1, token: 2), Floor(channel: 2, broadcast: false, seq: 1, token: 3)])
        f.retire(upTo: 2)
        #expect(f.floors.map(\.token) == [3])
        f.add([Floor(channel: 1, broadcast: false, seq: 1, token: 4), Floor(channel: 1, broadcast: true, seq: 1, token: 4)])
        f.retire(channel: 1)
        #expect(f.floors.map(\.channel) == [2])
    }

    /// One stream, events 1...n published while a subscribe reads its position: deliveries of events numbered before
    /// the read can still be on their way (in the loop's inbox, or on Redis's pub/sub connection), and a broker that
    /// answers later makes the connection hold the live events meanwhile. Whatever the interleaving, the client gets
    /// the replay (1...p) and then every later event, each once and in order. Seeded and replayable.
    @Test(arguments: [false, true])
    func aSubscribeMeetsTheLiveStreamWithNoGapAndNoDuplicate(answeredLater: Bool) {
        for seed in UInt64(1)...300 {
            var rng = SplitMix64(seed: seed)
            let n = UInt64.random(in: 1...40, using: &rng)
            let p = UInt64.random(in: 0...n, using: &rng)  // the position the read sees
            // Events at or below p may still arrive after the read: up to `late` of them.
            let late = UInt64.random(in: 0...p, using: &rng)
            var f = SubscribeFloors()
            var got: [UInt64] = Array(0...p).dropFirst().map { $0 }  // the replay: 1...p
            var next = p - late + 1  // the first event still on its way when the read happens
            func arrive(_ seq: UInt64) {
                switch f.decide(channel: 0, broadcast: false, seq: seq) {
                case .pass: got.append(seq)
                case .skip: break
                case .hold:
                    let kept = f.keep(Self.event(seq: seq), cap: .max)
                    #expect(kept)
                }
            }
            if answeredLater {
                f.hold(channels: [0], token: 1)
                let beforeAnswer = UInt64.random(in: 0...(n + 1 - next), using: &rng)
                for _ in 0..<beforeAnswer { arrive(next); next += 1 }
                let held = f.answered(token: 1)
                f.add([Floor(channel: 0, broadcast: false, seq: p, token: 1)])
                got += held.filter { !f.covers($0) }.map(\.seq)
            } else {
                f.add([Floor(channel: 0, broadcast: false, seq: p, token: 1)])
            }
            while next <= n { arrive(next); next += 1 }
            #expect(got == Array(1...n), "seed \(seed): n \(n), p \(p), late \(late): \(got)")
        }
    }
}
