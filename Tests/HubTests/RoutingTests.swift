import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

final class FakeSubscriber: ChannelMember {
    let name: String
    var positions: [Int: Int] = [:]
    init(_ name: String) { self.name = name }
    func channelPosition(_ channel: Int) -> Int? { positions[channel] }
    func setChannelPosition(_ position: Int?, _ channel: Int) { positions[channel] = position }
}

@Suite("Routing")
struct RoutingTests {
    @Test func accountEventsReachOnlyThatAccountsSubscribers() {
        var registry = LocalRegistry<FakeSubscriber>(channelCount: 2)
        let a1 = FakeSubscriber("a1"), a2 = FakeSubscriber("a2"), b1 = FakeSubscriber("b1")
        registry.subscribe(a1, account: "acc_a", channel: 0)
        registry.subscribe(a2, account: "acc_a", channel: 1)
        registry.subscribe(b1, account: "acc_b", channel: 0)
        #expect(registry.subscribers(channel: 0, account: "acc_a").map(\.name) == ["a1"])
        #expect(registry.subscribers(channel: 1, account: "acc_a").map(\.name) == ["a2"])
        #expect(registry.subscribers(channel: 0, account: "acc_b").map(\.name) == ["b1"])
        #expect(registry.subscribers(channel: 1, account: "acc_b").isEmpty)
        #expect(registry.subscribers(channel: 0, account: "acc_c").isEmpty)
        #expect(Set(registry.subscribers(channel: 0).map(\.name)) == ["a1", "b1"])
    }

    @Test func subscribeIsIdempotentAndUnsubscribeRemovesEverywhere() {
        var registry = LocalRegistry<FakeSubscriber>(channelCount: 1)
        let s = FakeSubscriber("s")
        let first = registry.subscribe(s, account: "x", channel: 0)
        let second = registry.subscribe(s, account: "x", channel: 0)
        #expect(first && !second)
        #expect(registry.totalSubscriptions == 1)
        let removed = registry.unsubscribe(s, account: "x", channel: 0)
        let removedAgain = registry.unsubscribe(s, account: "x", channel: 0)
        #expect(removed && !removedAgain)
        #expect(registry.subscribers(channel: 0, account: "x").isEmpty)
        #expect(registry.subscribers(channel: 0).isEmpty)
        #expect(registry.accountCounts(channel: 0).isEmpty)
    }

    /// One member inline, two or more in an array, back inline at one and empty at none: the members are right at
    /// every step, iterated or indexed.
    @Test func subscriberSetMovesBetweenInlineAndArray() {
        var set = SubscriberSet<FakeSubscriber>()
        let a = FakeSubscriber("a"), b = FakeSubscriber("b"), c = FakeSubscriber("c")
        #expect(set.isEmpty && Array(set).isEmpty)
        set.insert(a)
        #expect(set.map(\.name) == ["a"] && set[0] === a && set.contains(a) && !set.contains(b))
        let again = set.insert(a)
        #expect(!again)
        set.insert(b); set.insert(c)
        #expect(set.map(\.name) == ["a", "b", "c"] && set.count == 3)
        set.remove(a)
        #expect(Set(set.map(\.name)) == ["b", "c"])
        set.remove(c)
        #expect(set.map(\.name) == ["b"] && set.count == 1 && set[0] === b)
        let gone = set.remove(c)
        #expect(!gone)
        set.remove(b)
        #expect(set.isEmpty && set.count == 0 && Array(set).isEmpty)
        set.insert(c)
        #expect(set.map(\.name) == ["c"])
    }

    @Test(arguments: [2, 3, 16, 17, 100])
    func subscriberSetSwapRemoveKeepsEveryOtherElement(size: Int) {
        var set = SubscriberSet<FakeSubscriber>()
        let items = (0..<size).map { FakeSubscriber("\($0)") }
        for item in items { set.insert(item) }
        var expected = Set(items.map(\.name))
        var rng = SystemRandomNumberGenerator()
        for item in items.shuffled(using: &rng).prefix(size * 6 / 10) {
            let removed = set.remove(item)
            #expect(removed)
            let again = set.remove(item)
            #expect(!again)
            expected.remove(item.name)
            #expect(Set(set.elements.map(\.name)) == expected)
            #expect(items.allSatisfy { set.contains($0) == expected.contains($0.name) })
        }
        #expect(set.count == size - size * 6 / 10)
        for item in items { set.insert(item) }
        #expect(set.count == size)
    }

    /// A channel's broadcast list: each subscriber keeps its own position in it (`ChannelMember`), so leaving takes
    /// no lookup. 20 000 random subscribes and unsubscribes of 300 subscribers of 12 accounts on 3 channels, checked
    /// against a model after each: every channel's list, every account's set, and every recorded position is the
    /// subscriber's place in its channel's list (a stale one would unsubscribe someone else or leave a closed
    /// connection in a channel).
    @Test func channelListsAndRecordedPositionsStayRightUnderChurn() {
        var registry = LocalRegistry<FakeSubscriber>(channelCount: 3)
        let subscribers = (0..<300).map { FakeSubscriber("s\($0)") }
        let accountOf = { (s: FakeSubscriber) in AccountID("acc_\(Int(s.name.dropFirst())! % 12)") }
        var model: [Set<ObjectIdentifier>] = Array(repeating: [], count: 3)
        var rng = SystemRandomNumberGenerator()
        for step in 0..<20_000 {
            let s = subscribers.randomElement(using: &rng)!
            let channel = Int.random(in: 0..<3, using: &rng)
            let isMember = model[channel].contains(ObjectIdentifier(s))
            if Bool.random(using: &rng) {
                #expect(registry.subscribe(s, account: accountOf(s), channel: channel) == !isMember)
                model[channel].insert(ObjectIdentifier(s))
            } else {
                #expect(registry.unsubscribe(s, account: accountOf(s), channel: channel) == isMember)
                model[channel].remove(ObjectIdentifier(s))
            }
            guard step % 97 == 0 || step == 19_999 else { continue }
            for c in 0..<3 {
                let list = registry.subscribers(channel: c)
                #expect(Set(list.map(ObjectIdentifier.init)) == model[c] && list.count == model[c].count)
                for (i, member) in list.enumerated() { #expect(member.channelPosition(c) == i, "channel \(c), \(member.name)") }
                for t in subscribers where !model[c].contains(ObjectIdentifier(t)) { #expect(t.channelPosition(c) == nil) }
                for a in 0..<12 {
                    let expected = Set(subscribers.filter { model[c].contains(ObjectIdentifier($0)) && accountOf($0) == AccountID("acc_\(a)") }.map(\.name))
                    #expect(Set(registry.subscribers(channel: c, account: AccountID("acc_\(a)")).map(\.name)) == expected)
                }
            }
            #expect(registry.totalSubscriptions == model.reduce(0) { $0 + $1.count })
        }
    }

    /// `append` and `remove(at:)`: positions as an array's, the last member moved into a removed one's place.
    @Test func subscriberSetAppendAndRemoveAtReportMoves() {
        var set = SubscriberSet<FakeSubscriber>()
        let a = FakeSubscriber("a"), b = FakeSubscriber("b"), c = FakeSubscriber("c")
        #expect(set.append(a) == 0 && set.append(b) == 1 && set.append(c) == 2)
        #expect(set.remove(at: 0) === c)  // c moves to 0
        #expect(set.map(\.name) == ["c", "b"])
        #expect(set.remove(at: 1) == nil)  // the last one: nothing moves
        #expect(set.map(\.name) == ["c"] && set[0] === c)
        #expect(set.remove(at: 0) == nil && set.isEmpty)
    }
}

@Suite("RateLimiter")
struct RateLimiterTests {
    let second: UInt64 = 1_000_000_000

    @Test func allowsTheLimitThenRejectsWithRetryAfter() {
        let rule = RateLimit(limit: 100, periodSeconds: 60)
        var limiter = RateLimiter(rule, now: 0)
        var allowed = 0
        for _ in 0..<100 where limiter.consume(now: 0, rule) == .allowed { allowed += 1 }
        #expect(allowed == 100)
        // One token refills every 0.6 s: retry after 1 s.
        let rejected = limiter.consume(now: 0, rule)
        #expect(rejected == .limited(retryAfter: 1))
        let later = limiter.consume(now: 700_000_000, rule)
        #expect(later == .allowed)
    }

    @Test func refillsOverThePeriod() {
        let rule = RateLimit(limit: 10, periodSeconds: 60)
        var limiter = RateLimiter(rule, now: 0)
        for _ in 0..<10 { _ = limiter.consume(now: 0, rule) }
        let rejected = limiter.consume(now: 1, rule)
        #expect(rejected == .limited(retryAfter: 6))
        var allowed = 0
        for _ in 0..<20 where limiter.consume(now: 61 * second, rule) == .allowed { allowed += 1 }
        #expect(allowed == 10)
    }

    @Test func moreThanTwiceTheLimitIsAbusive() {
        let rule = RateLimit(limit: 5, periodSeconds: 60)
        var limiter = RateLimiter(rule, now: 0)
        var decisions: [RateLimiter.Decision] = []
        for _ in 0..<11 { decisions.append(limiter.consume(now: 0, rule)) }
        #expect(decisions.prefix(5).allSatisfy { $0 == .allowed })
        #expect(decisions[5..<10].allSatisfy { if case .limited = $0 { true } else { false } })
        #expect(decisions[10] == .abusive)
    }
}

@Suite("LatencyHistogram")
struct LatencyHistogramTests {
    @Test func quantilesAreWithinBucketError() {
        var h = LatencyHistogram()
        for v in 1...1000 { h.record(UInt64(v) * 10_000) }  // 10 µs ... 10 ms
        #expect(h.total == 1000)
        let p50 = Double(h.quantile(0.5)), p99 = Double(h.quantile(0.99))
        #expect(abs(p50 - 5_000_000) / 5_000_000 < 0.26)
        #expect(abs(p99 - 9_900_000) / 9_900_000 < 0.26)
        #expect(h.quantile(1.0) == 10_000_000)
    }

    @Test func bucketsAreMonotonicAndCoverTheirValues() {
        var previous = -1
        var v: UInt64 = 1
        while v < 60_000_000_000 {
            let b = LatencyHistogram.bucket(for: v)
            #expect(b >= previous)
            #expect(v < LatencyHistogram.upperBound(ofBucket: b) || b == LatencyHistogram.octaves * LatencyHistogram.subBucketsPerOctave)
            previous = b
            v = v + v / 7 + 1
        }
    }

    @Test func mergeAddsCounts() {
        var a = LatencyHistogram(), b = LatencyHistogram()
        a.record(5_000); b.record(50_000); b.record(500_000)
        a.merge(b)
        #expect(a.total == 3)
        #expect(a.maxNanoseconds == 500_000)
    }
}

@Suite("HubConfiguration")
struct HubConfigurationTests {
    @Test func defaultsNeedNoConfiguration() throws {
        let outcome = try HubConfiguration.parse(arguments: [], environment: [:])
        #expect(outcome == .run(HubConfiguration()))
        #expect(HubConfiguration().channels == ["profile_updates", "wallet_updates"])
    }

    @Test func flagsOverrideEnvironment() throws {
        let outcome = try HubConfiguration.parse(
            arguments: ["--listen", "127.0.0.1:0", "--channels=a,b", "--echo", "--ping-interval", "2m"],
            environment: ["HUB_LISTEN": "0.0.0.0:9000", "HUB_THREADS": "3", "HUB_JWT_SECRET": "  s3cret \n"])
        guard case .run(let c) = outcome else { Issue.record("expected run"); return }
        #expect(c.listen == "127.0.0.1:0")
        #expect(c.channels == ["a", "b"])
        #expect(c.echo)
        #expect(c.pingIntervalSeconds == 120)
        #expect(c.threads == 3)
        #expect(c.jwtSecret == "s3cret")
    }

    @Test(arguments: [
        (["--nope"], "unknown option --nope"),
        (["--threads", "0"], "--threads: expected a whole number"),
        (["--listen", "8080"], "--listen: expected HOST:PORT"),
        (["--channels", "ok,bad name"], "invalid channel name 'bad name'"),
        (["--ping-interval", "5x"], "expected a duration"),
        (["--socket"], "--socket needs a value"),
        (["stray"], "unexpected argument 'stray'"),
    ])
    func badInputsSayWhatIsWrong(arguments: [String], message: String) {
        #expect {
            _ = try HubConfiguration.parse(arguments: arguments, environment: [:])
        } throws: { error in
            (error as? HubConfiguration.ConfigurationError)?.message.contains(message) == true
        }
    }

    @Test func publicKeyAndSecretAreExclusive() {
        #expect(throws: HubConfiguration.ConfigurationError.self) {
            _ = try HubConfiguration.parse(arguments: ["--jwt-public-key", "k.pem"], environment: ["HUB_JWT_SECRET": "x"])
        }
    }

    @Test func helpListsEveryOptionWithItsVariable() {
        let help = HubConfiguration.helpText()
        for option in HubConfiguration.options {
            #expect(help.contains("--\(option.name)"))
            #expect(help.contains(option.environmentName))
        }
    }
}
