import Foundation
import COpenSSL
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// The history store and the idempotency table, without sockets (the process-level behaviour is in
/// IntegrationRecoveryTests; the state file in StateFileTests.swift, the local broker in LocalBrokerTests.swift).
@Suite struct HistoryStoreTests {
    static let second: UInt64 = 1_000_000_000

    static func event(_ key: StreamKey, seq: UInt64, at: UInt64, bytes: Int = 100, wall: Double = 0) -> PublishedEvent {
        let frame = SharedBytes(count: bytes) { $0.initializeMemory(as: UInt8.self, repeating: 0x20) }
        return PublishedEvent(channel: key.channel, account: key.account, type: "t", seq: seq, frame: frame, dataRange: 0..<0,
                              acceptedAt: at, wallTime: wall)
    }

    @discardableResult
    static func publish(_ store: inout HistoryStore, _ key: StreamKey, at now: UInt64, bytes: Int = 100) -> UInt64 {
        let (stream, seq) = store.number(key, now: now)
        store.retain(event(key, seq: seq, at: now, bytes: bytes), in: stream, now: now)
        return seq
    }

    static func store(size: Int = 100, ttl: UInt64 = 600 * second, memory: Int = 64 << 20) -> HistoryStore {
        HistoryStore(limits: HistoryLimits(size: size, ttlNanos: ttl, memoryBytes: memory), hubEpoch: "E")
    }

    static func seqs(_ read: HistoryRead) -> [UInt64]? { read.seqs }

    let a = StreamKey(channel: 0, account: "a")
    let b = StreamKey(channel: 0, account: "b")
    let broadcast = StreamKey(channel: 0, account: nil)

    /// The history keeps a 32-byte `RetainedEvent`, not the `PublishedEvent`: what it derives from the frame (the
    /// type, the data, the payload behind a 2- or 4-byte header, the wall time) must match what was published.
    @Test func aRetainedEventDerivesTypeDataAndPayloadFromItsFrame() {
        var writer = JSONWriter(capacity: 256)
        for (type, data, account) in [("balance", #"{"x":1}"#, "acc_1"), (#"q"u\o"#, "[" + String(repeating: "7,", count: 100) + "0]", nil),
                                      ("é", "null", "acc_2")] {
            let draft = Array(data.utf8).withUnsafeBytes { raw in
                LocalBroker.frame(EventDraft(channel: 0, account: account.map { AccountID($0) }, type: type, data: raw),
                                  channelName: "wallet_updates", seq: 42, now: 5 * Self.second, wall: 1000, writer: &writer)
            }
            let retained = RetainedEvent(draft)
            #expect(retained.type == type && retained.seq == 42 && retained.acceptedAt == 5 * Self.second)
            #expect(Array(retained.data) == Array(data.utf8) && retained.dataRange == draft.dataRange, "\(type)")
            let json = try? JSONSerialization.jsonObject(with: Data(retained.payload)) as? [String: Any]
            #expect(json?["type"] as? String == type && json?["seq"] as? Int == 42 && (json?["broadcast"] as? Bool == true) == (account == nil))
            #expect(retained.cost == (draft.frame.count + HistoryLimits.perEventOverhead + 7) / 8 * 8)
            #expect(abs(retained.wallTime(wallNow: 2000, monotonicNow: 7 * Self.second) - 1998) < 1e-9)
        }
        #expect(MemoryLayout<RetainedEvent>.size == 32 && MemoryLayout<RetainedEvent?>.stride == 32)
    }

    @Test func sequenceNumbersArePerStream() {
        var store = Self.store()
        let otherChannel = StreamKey(channel: 1, account: "a")
        let numbers = [a, a, b, broadcast, otherChannel, a].map { Self.publish(&store, $0, at: 1) }
        #expect(numbers == [1, 2, 1, 1, 1, 3])
        // Byte-exact accounts: NFC and NFD "café" are two streams.
        #expect(Self.publish(&store, StreamKey(channel: 0, account: "caf\u{e9}"), at: 1) == 1)
        #expect(Self.publish(&store, StreamKey(channel: 0, account: "cafe\u{301}"), at: 1) == 1)
    }

    @Test func readsEverythingAfterAPositionOrSaysWhyNot() throws {
        var store = Self.store(size: 5)
        for _ in 1...8 { Self.publish(&store, a, at: 1) }
        let stream = try #require(store.stream(a))
        #expect(store.firstRetainedSeq(stream) == 4)
        #expect(Self.seqs(store.read(stream, after: 8, limit: 100)) == [])
        #expect(Self.seqs(store.read(stream, after: 7, limit: 100)) == [8])
        #expect(Self.seqs(store.read(stream, after: 3, limit: 100)) == [4, 5, 6, 7, 8])
        #expect(store.read(stream, after: 2, limit: 100) == .tooOld)
        #expect(store.read(stream, after: 0, limit: 100) == .tooOld)
        #expect(store.read(stream, after: 9, limit: 100) == .ahead)
        #expect(store.read(stream, after: 3, limit: 4) == .tooMany)
        #expect(Self.seqs(store.read(stream, after: 3, limit: 5)) == [4, 5, 6, 7, 8])
        #expect(store.retained(stream, after: 6).map(\.seq) == [7, 8])
        // The three the stream dropped by its count stay in the ring (flagged) until the ring passes them.
        #expect(store.eventCount == 5 && store.bytes == 8 * HistoryLimits.entrySize(frameCount: 100))
    }

    @Test func theMemoryCapEvictsTheGloballyOldestFirst() throws {
        let cost = HistoryLimits.entrySize(frameCount: 100)
        var store = Self.store(memory: 10 * cost)
        var published: [(StreamKey, UInt64)] = []
        for i in 0..<30 {
            let key = [a, b, broadcast][i % 3]
            published.append((key, Self.publish(&store, key, at: UInt64(i))))
            #expect(store.bytes <= 10 * cost)
        }
        #expect(store.evictions == 20 && store.eventCount == 10)
        // What is left is exactly the last 10 published, each stream contiguous up to its top.
        for key in [a, b, broadcast] {
            let stream = try #require(store.stream(key))
            let expected = published.suffix(10).filter { $0.0 == key }.map(\.1)
            #expect(store.retained(stream, after: 0).map(\.seq) == expected)
            #expect(store.read(stream, after: 0, limit: 100) == .tooOld)
        }
    }

    @Test func eventsExpireAfterTheTTLAndIdleStreamsAreForgotten() throws {
        let ttl = 10 * Self.second
        var store = Self.store(ttl: ttl)
        Self.publish(&store, a, at: 0)
        Self.publish(&store, a, at: 0)
        let generation = try #require(store.stream(a)).generation
        store.maintain(now: 5 * Self.second)
        #expect(store.eventCount == 2)
        store.maintain(now: ttl)
        #expect(store.eventCount == 0 && store.expirations == 2)
        // No event left and nothing published for a TTL: forgotten. It starts again at 1, in a new generation.
        #expect(store.stream(a) == nil && store.streamCount == 0)
        #expect(Self.publish(&store, a, at: ttl) == 1)
        #expect(try #require(store.stream(a)).generation != generation)
    }

    @Test func aFollowedStreamIsKeptAndForgottenATTLAfterItsLastFollowerLeft() {
        let ttl = 10 * Self.second
        var store = Self.store(ttl: ttl)
        _ = store.follow(a, now: 0)
        _ = store.follow(a, now: 0)
        store.maintain(now: 100 * Self.second)
        #expect(store.stream(a) != nil)
        store.unfollow(a, now: 100 * Self.second)
        store.unfollow(a, now: 100 * Self.second)
        store.maintain(now: 105 * Self.second)
        #expect(store.stream(a) != nil)
        store.maintain(now: 110 * Self.second)
        #expect(store.stream(a) == nil)
        #expect(store.idleEntryCount == 0)
    }

    @Test func withHistoryOffStreamsAreNumberedAndStillForgotten() throws {
        let ttl = 10 * Self.second
        var store = Self.store(size: 0, ttl: ttl)
        #expect(Self.publish(&store, a, at: 0) == 1)
        #expect(Self.publish(&store, a, at: Self.second) == 2)
        let stream = try #require(store.stream(a))
        #expect(store.read(stream, after: 1, limit: 100) == .tooOld)
        #expect(Self.seqs(store.read(stream, after: 2, limit: 100)) == [])
        #expect(store.eventCount == 0 && store.bytes == 0)
        store.maintain(now: ttl)  // the idle entry was queued at 0; the last publish was at 1 s: look again later
        #expect(store.stream(a) != nil)
        store.maintain(now: 2 * ttl)
        #expect(store.stream(a) == nil)
    }

    /// A hot stream keeps its last `size` events (its index does not grow), and a quiet stream published to within
    /// the ring's span keeps its own.
    @Test func aHotStreamStaysAtItsSizeAndAQuietOneKeepsItsEvents() throws {
        var store = Self.store(size: 3)
        for i in 0..<100_000 {
            Self.publish(&store, a, at: UInt64(i))
            if i % 10_000 == 0 { Self.publish(&store, b, at: UInt64(i)) }
        }
        #expect(store.eventCount == 6)
        let hot = try #require(store.stream(a)), quiet = try #require(store.stream(b))
        #expect(store.retainedCount(hot) == 3 && hot.index.count <= 4, "\(hot.index.count)")
        #expect(store.retained(quiet, after: 0).map(\.seq) == [8, 9, 10])
        #expect(store.read(hot, after: 99_997, limit: 10).seqs == [99_998, 99_999, 100_000])
    }

    /// 100 000 streams, one event each, under a 1 MiB cap: the cap holds throughout, the oldest go first, and a TTL
    /// later every stream is forgotten (the table does not grow with the number of accounts ever seen).
    @Test func aHundredThousandStreamsStayUnderTheCapAndAreForgotten() {
        let ttl = 10 * Self.second
        let cap = 1 << 20
        var store = Self.store(ttl: ttl, memory: cap)
        var maxBytes = 0
        for i in 0..<100_000 {
            Self.publish(&store, StreamKey(channel: 0, account: AccountID("acc_\(i)")), at: UInt64(i), bytes: 200)
            maxBytes = max(maxBytes, store.bytes)
        }
        #expect(maxBytes <= cap)
        // The ring holds whole entries only (the rest of a lap is skipped), so at least cap - one entry is in use.
        let entry = HistoryLimits.entrySize(frameCount: 200)
        #expect(store.bytes > cap - entry && store.eventCount == store.bytes / entry, "\(store.bytes) \(store.eventCount)")
        #expect(store.evictions == 100_000 - store.eventCount)
        let newest = StreamKey(channel: 0, account: "acc_99999")
        #expect(store.stream(newest).map { store.firstRetainedSeq($0) } == 1)
        #expect(store.stream(StreamKey(channel: 0, account: "acc_0")).map { store.firstRetainedSeq($0) } == .some(nil))
        for round in 1...4 { store.maintain(now: UInt64(round) * ttl + 100_000) }
        #expect(store.streamCount == 0 && store.eventCount == 0 && store.bytes == 0)
        #expect(store.expirations == 100_000 - store.evictions && store.idleEntryCount == 0)
        // Emptied, the ring starts again (on pages given back): a new event is retained and read back.
        Self.publish(&store, newest, at: 5 * ttl)
        #expect(store.stream(newest).map { store.retained($0, after: 0).map(\.seq) } == [1])
    }

    /// Random streams, sizes and limits against a model of what must be kept: every stream's retained events are
    /// exactly its last k published, byte for byte, k never above `size`; every event with fewer than
    /// `cap - 2 * largest entry` bytes of entries published after it, and among its stream's last `size`, is still
    /// retained; the counters agree with what the streams hold.
    @Test func theRingKeepsTheNewestEventsOfEveryStreamByteForByte() throws {
        var rng = SystemRandomNumberGenerator()
        for round in 0..<40 {
            let size = [1, 3, 10, 100][round % 4]
            let maxFrame = [40, 300, 2000][round % 3]
            let cap = Int.random(in: (4 * maxFrame)...(40 * maxFrame), using: &rng)
            var store = Self.store(size: size, memory: cap)
            let keys = (0..<Int.random(in: 1...20, using: &rng)).map { StreamKey(channel: 0, account: AccountID("s\($0)")) }
            var published: [(key: StreamKey, seq: UInt64, frame: [UInt8])] = []
            for step in 0..<Int.random(in: 50...1500, using: &rng) {
                let key = keys[Int.random(in: 0..<keys.count, using: &rng)]
                let frame = (0..<Int.random(in: 1...maxFrame, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
                let (stream, seq) = store.number(key, now: UInt64(step))
                let event = PublishedEvent(channel: 0, account: key.account, type: "t", seq: seq, frame: SharedBytes(frame),
                                           dataRange: 0..<0, acceptedAt: UInt64(step), wallTime: 0)
                store.retain(event, in: stream, now: UInt64(step))
                published.append((key, seq, frame))
                #expect(store.bytes <= cap)
            }
            var live = 0
            let largest = HistoryLimits.entrySize(frameCount: maxFrame)
            for key in keys {
                guard let stream = store.stream(key) else { continue }
                let mine = published.filter { $0.key == key }
                let kept = store.retained(stream, after: 0)
                live += kept.count
                #expect(kept.count <= size)
                #expect(kept.map(\.seq) == mine.suffix(kept.count).map(\.seq), "round \(round)")
                #expect(zip(kept, mine.suffix(kept.count)).allSatisfy { Array($0.frame.bytes) == $1.frame }, "round \(round)")
                // Must be kept: among the stream's last `size`, and recent enough in the ring.
                var after = 0
                var mustKeep = 0
                for (i, p) in published.enumerated().reversed() {
                    after += HistoryLimits.entrySize(frameCount: p.frame.count)
                    if p.key == key, after <= cap - 2 * largest, stream.lastSeq - published[i].seq < UInt64(size) { mustKeep += 1 }
                }
                #expect(kept.count >= mustKeep, "round \(round): kept \(kept.count) of \(key), expected at least \(mustKeep)")
                #expect(store.read(stream, after: stream.lastSeq - UInt64(kept.count), limit: 1000).seqs == kept.map(\.seq))
            }
            #expect(store.eventCount == live, "round \(round)")
        }
    }

    /// An event larger than the whole ring is not kept, and takes its stream's older events with it (a replay
    /// from before it could not be complete).
    @Test func anEventLargerThanTheRingIsNotKeptNorAnythingBeforeIt() throws {
        var store = Self.store(memory: 4096)
        for _ in 1...3 { Self.publish(&store, a, at: 1, bytes: 100) }
        Self.publish(&store, a, at: 2, bytes: 5000)
        let stream = try #require(store.stream(a))
        #expect(store.firstRetainedSeq(stream) == nil && store.eventCount == 0)
        #expect(store.read(stream, after: 3, limit: 10) == .tooOld)
        Self.publish(&store, a, at: 3, bytes: 100)
        #expect(store.read(stream, after: 4, limit: 10).seqs == [5])
    }

    @Test func theRingMatchesAnArray() {
        var ring = Ring<Int>()
        var model: [Int] = []
        var rng = SystemRandomNumberGenerator()
        for i in 0..<20_000 {
            if Int.random(in: 0..<3, using: &rng) == 0 || model.isEmpty {
                for j in 0..<Int.random(in: 1...40, using: &rng) { ring.append(i * 100 + j); model.append(i * 100 + j) }
            } else {
                #expect(ring.removeFirst() == model.removeFirst())
            }
            if i % 997 == 0 {
                #expect((0..<ring.count).map { ring[$0] } == model)
                #expect(ring.capacity <= max(16, 4 * model.count + 4))
            }
        }
        #expect(ring.first == model.first && ring.last == model.last && ring.count == model.count)
    }

    @Test func idempotencyKeysLeaveAfterTheWindowOrBeyondTheCount() {
        var table = IdempotencyTable(windowNanos: 10 * Self.second, maxKeys: 3)
        table.insert(a, "k1", seq: 1, now: 0, wallTime: 0)
        #expect(table.lookup(a, "k1", now: Self.second)?.seq == 1)
        #expect(table.lookup(b, "k1", now: Self.second) == nil)  // scoped per stream
        #expect(table.lookup(a, "K1", now: Self.second) == nil)
        table.insert(a, "k2", seq: 2, now: Self.second, wallTime: 0)
        table.insert(a, "k3", seq: 3, now: Self.second, wallTime: 0)
        table.insert(a, "k4", seq: 4, now: Self.second, wallTime: 0)
        #expect(table.count == 3 && table.lookup(a, "k1", now: Self.second) == nil)
        #expect(table.lookup(a, "k2", now: 11 * Self.second - 1)?.seq == 2)
        #expect(table.lookup(a, "k2", now: 11 * Self.second) == nil && table.count == 0)
        var off = IdempotencyTable(windowNanos: 0, maxKeys: 3)
        #expect(off.insert(a, "k", seq: 1, now: 0, wallTime: 0) == nil && off.lookup(a, "k", now: 0) == nil)
    }

    @Test func channelEpochs() {
        let epoch = ClientReplies.ChannelEpoch(hub: "AbC-_9", account: "12", broadcast: "3").text
        #expect(epoch == "AbC-_9.12.3")
        #expect(Resume.streamEpochs(of: epoch, hubEpoch: "AbC-_9")! == ("12", "3"))
        // Stream epochs are opaque to this split (a local broker then finds no stream of that epoch).
        #expect(Resume.streamEpochs(of: "AbC-_9.x.-1", hubEpoch: "AbC-_9")! == ("x", "-1"))
        for bad in ["", "AbC-_9", "AbC-_9.12", "Other.12.3", "AbC-_9.12.3.4", ".12.3", "AbC-_9..3", "AbC-_9.12."] {
            #expect(Resume.streamEpochs(of: bad, hubEpoch: "AbC-_9") == nil, "\(bad)")
        }
        let x = (1...3).map { RetainedEvent(Self.event(a, seq: $0, at: [10, 20, 30][Int($0) - 1])) }
        let y = (1...2).map { RetainedEvent(Self.event(broadcast, seq: $0, at: [15, 30][Int($0) - 1])) }
        #expect(Resume.merge(x, y).map(\.acceptedAt) == [10, 15, 20, 30, 30])
        #expect(Resume.combine(.success(x), .failure(.tooMany)) == .failure(.tooMany))
        #expect(Resume.combine(.failure(.tooMany), .failure(.tooOld)) == .failure(.tooOld))
        #expect(Resume.combine(.failure(.tooOld), .failure(.epochChanged)) == .failure(.epochChanged))
    }
}

extension HistoryRead {
    var seqs: [UInt64]? {
        if case .events(let events) = self { return events.map(\.seq) }
        return nil
    }
}

extension Result where Success == [RetainedEvent], Failure == RecoveryFailure {
    static func == (l: Self, r: Self) -> Bool {
        switch (l, r) {
        case (.success(let x), .success(let y)): return x.map(\.seq) == y.map(\.seq)
        case (.failure(let x), .failure(let y)): return x == y
        default: return false
        }
    }
}
