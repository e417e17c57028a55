import Foundation
import COpenSSL
import Synchronization
import Testing
@testable import Hub

/// The history store, the idempotency table, the state file and the local broker's publish/attach paths, without
/// sockets (the process-level behaviour is in IntegrationRecoveryTests).
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

// MARK: - The state file

@Suite struct StateFileTests {
    static let sample = SavedBrokerState(
        hubEpoch: "q1w2e3r4t5y", nextGeneration: 9, savedAt: 1_700_000_000.25, channelNames: ["wallet_updates", "profile_updates"],
        streams: [.init(channel: 0, account: "acc_1", generation: 3, lastSeq: 7), .init(channel: 1, account: nil, generation: 8, lastSeq: 2)],
        events: [.init(stream: 0, seq: 7, wallTime: 1_700_000_000, type: "t", payload: Array(#"{"type":"t","channel":"wallet_updates","seq":7,"data":{"x":"é"}}"#.utf8),
                       dataStart: 54, dataEnd: 64)],
        keys: [.init(channel: 0, account: "acc_1", key: "k-1", seq: 7, delivered: 2, wallTime: 1_700_000_000)])

    @Test func roundTrips() throws {
        let bytes = StateFile.encode(Self.sample)
        #expect(Array(bytes.prefix(8)) == Array("HUBSTATE".utf8))
        #expect(try StateFile.decode(bytes) == Self.sample)
    }

    @Test func corruptTruncatedAndForeignFilesAreRefusedWithAReason() {
        let bytes = StateFile.encode(Self.sample)
        func reason(_ b: [UInt8]) -> String {
            do { _ = try StateFile.decode(b); return "accepted" } catch { return error.description }
        }
        var flipped = bytes
        flipped[bytes.count - 5] ^= 0x01
        #expect(reason(flipped).contains("checksum"))
        #expect(reason(Array(bytes.dropLast(3))).contains("truncated"))
        #expect(reason(Array("#!/bin/sh\necho hello\n".utf8) + Array(repeating: 0, count: 40)).contains("not a hub state file"))
        #expect(reason([]).contains("too short"))
        var version = bytes
        version[8] = 2
        #expect(reason(version).contains("version 2"))
    }

    /// Garbage with a valid header and checksum is refused (or decoded), never a crash or a huge allocation.
    @Test func randomPayloadsWithValidChecksumsNeverCrash() {
        var rng = SystemRandomNumberGenerator()
        let valid = StateFile.encode(Self.sample)
        for i in 0..<3000 {
            var payload: [UInt8]
            if i % 2 == 0 {
                payload = Array(valid[StateFile.headerSize...])
                for _ in 0..<Int.random(in: 1...6, using: &rng) {
                    payload[Int.random(in: 0..<payload.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
                }
            } else {
                payload = (0..<Int.random(in: 0..<200, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            }
            var w = ByteWriter()
            w.raw(StateFile.magic)
            w.u32(StateFile.version)
            w.u32(0)
            w.u64(UInt64(payload.count))
            w.u32(StateFile.crc32(payload))
            w.raw(payload)
            _ = try? StateFile.decode(w.bytes)
        }
    }
}

// MARK: - The local broker

/// A fan-out shard that holds deliveries until the test releases them (each counts one connection per event).
final class HeldShard: FanoutShard {
    private let held = Mutex<[(EventBatch, @Sendable ([Int]) -> Void)]>([])

    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void) {
        held.withLock { $0.append((batch, done)) }
    }

    func release() {
        let all = held.withLock { h in defer { h.removeAll() }; return h }
        for (batch, done) in all { done(batch.events.map { _ in 1 }) }
    }
}

/// A fan-out shard that counts the batches handed to it and reports a delivery for each event of an account (or a
/// broadcast, nil) it holds.
final class RecordingShard: FanoutShard {
    let batches = Mutex(0)
    let holds = Mutex<[String?]>([])
    /// The last batch's per-event loops (`EventBatch.loops`).
    let lastLoops = Mutex<[UInt64]>([])

    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void) {
        batches.withLock { $0 += 1 }
        lastLoops.withLock { $0 = batch.loops }
        let held = holds.withLock { $0 }
        done(batch.events.map { event in held.contains(event.account?.string) ? 1 : 0 })
    }
}

final class Outcomes: Sendable {
    private let all = Mutex<[PublishOutcome]>([])
    var list: [PublishOutcome] { all.withLock { $0 } }
    func record(_ o: PublishOutcome) { all.withLock { $0.append(o) } }
}

@Suite struct LocalBrokerTests {
    static let options = LocalBrokerOptions(history: HistoryLimits(size: 100, ttlNanos: 600 * 1_000_000_000, memoryBytes: 64 << 20),
                                            idempotencyWindowNanos: 300 * 1_000_000_000, idempotencyMaxKeys: 1000)

    static func publish(_ broker: LocalBroker, _ drafts: [(account: String?, key: String?)], into outcomes: Outcomes) {
        let data = Array("{}".utf8)
        data.withUnsafeBytes { raw in
            let list = drafts.map { EventDraft(channel: 0, account: $0.account.map { AccountID($0) }, type: "t", data: raw,
                                               idempotencyKey: $0.key.map { ExactString($0) }) }
            broker.publish(list) { outcomes.record($0) }
        }
    }

    @Test func aRepeatedKeyIsNotDeliveredAgainAndWaitsForTheFirst() {
        let shard = HeldShard()
        let broker = LocalBroker(channelNames: ["c"], shards: [shard], options: Self.options)
        // Connections of loop 0 follow both accounts: a loop is handed only the events of streams it follows.
        _ = broker.attach(["a", "b"].map { StreamRead(stream: StreamKey(channel: 0, account: AccountID($0)), follow: true,
                                                      resume: nil, limit: 0, loop: 0) })
        let first = Outcomes(), second = Outcomes(), third = Outcomes()
        // The same key twice in one batch, and again in a second batch while the first is in flight.
        Self.publish(broker, [("a", "k"), ("a", "k"), ("b", "k"), ("a", nil)], into: first)
        Self.publish(broker, [("a", "k")], into: second)
        #expect(first.list.isEmpty && second.list.isEmpty)
        shard.release()
        #expect(first.list.count == 1 && second.list.count == 1)
        #expect(first.list.first?.replies == [
            PublishReply(seq: 1, delivered: 1, duplicate: false), PublishReply(seq: 1, delivered: 1, duplicate: true),
            PublishReply(seq: 1, delivered: 1, duplicate: false), PublishReply(seq: 2, delivered: 1, duplicate: false),
        ])
        #expect(first.list.first?.events.map(\.seq) == [1, 1, 2])
        #expect(second.list.first?.replies == [PublishReply(seq: 1, delivered: 1, duplicate: true)])
        #expect(second.list.first?.events.isEmpty == true)
        // Once known, a repeat completes at once, without any fan-out.
        Self.publish(broker, [("a", "k")], into: third)
        #expect(third.list.first?.replies == [PublishReply(seq: 1, delivered: 1, duplicate: true)])
        #expect(broker.statistics().duplicates == 3)
    }

    @Test func attachReadsPositionsAndReplaysOnlyWithTheRightGeneration() throws {
        let shard = HeldShard()
        let broker = LocalBroker(channelNames: ["c"], shards: [shard], options: Self.options)
        let outcomes = Outcomes()
        let a = StreamKey(channel: 0, account: "a")
        let start = broker.attach([StreamRead(stream: a, follow: true, resume: nil, limit: 10)])
        #expect(start.first?.seq == 0)
        let epoch = try #require(start.first?.epoch)
        Self.publish(broker, [("a", nil), ("a", nil), ("a", nil)], into: outcomes)
        shard.release()
        let read = broker.attach([
            StreamRead(stream: a, follow: false, resume: ResumePoint(epoch: epoch, seq: 1), limit: 10),
            StreamRead(stream: a, follow: false, resume: ResumePoint(epoch: epoch + "0", seq: 1), limit: 10),
            StreamRead(stream: a, follow: false, resume: ResumePoint(epoch: epoch, seq: 0), limit: 2),
        ])
        #expect(read.map(\.seq) == [3, 3, 3])
        #expect(read[0].replay.map { $0 == .success(broker.history(a, after: 1)?.events ?? []) } == true)
        #expect(read[1].replay.map { $0 == .failure(.epochChanged) } == true)
        #expect(read[2].replay.map { $0 == .failure(.tooMany) } == true)
        broker.detach([a])
    }

    /// A batch reaches only the loops with followers of its streams (every loop for a follower whose loop is
    /// unknown); an event nobody follows reaches none and completes at once.
    @Test func aBatchIsHandedOnlyToTheLoopsThatFollowItsStreams() {
        let shards = (0..<6).map { _ in RecordingShard() }
        let broker = LocalBroker(channelNames: ["c"], shards: shards, options: Self.options)
        func key(_ account: String?) -> StreamKey { StreamKey(channel: 0, account: account.map { AccountID($0) }) }
        func follow(_ account: String?, loop: Int) {
            _ = broker.attach([StreamRead(stream: key(account), follow: true, resume: nil, limit: 0, loop: loop)])
            if loop >= 0 { shards[loop].holds.withLock { $0.append(account) } }
        }
        func handed(_ accounts: [String?]) -> (loops: [Int], delivered: [Int]) {
            for shard in shards { shard.batches.withLock { $0 = 0 } }
            let outcomes = Outcomes()
            Self.publish(broker, accounts.map { ($0, nil) }, into: outcomes)
            let loops = shards.indices.filter { shards[$0].batches.withLock { $0 } > 0 }
            return (loops, outcomes.list.first?.replies.map(\.delivered) ?? [])
        }
        follow("a", loop: 1)
        follow("b", loop: 5)
        follow("b", loop: 2)
        #expect(handed(["a"]) == ([1], [1]))
        #expect(handed(["b"]) == ([2, 5], [2]))
        #expect(handed(["z"]) == ([], [0]))  // nobody follows: no loop, completed at once
        #expect(handed(["a", "z", "b"]) == ([1, 2, 5], [1, 0, 2]))
        broker.detach([key("a")], loop: 1)
        #expect(handed(["a"]) == ([], [0]))
        broker.detach([key("b")], loop: 5)
        #expect(handed(["b"]) == ([2], [1]))
        broker.detach([key("b")], loop: 0)  // not a follower there: changes nothing
        #expect(handed(["b"]) == ([2], [1]))
        // A follower whose loop is not known: every loop.
        _ = broker.attach([StreamRead(stream: key(nil), follow: true, resume: nil, limit: 0)])
        #expect(handed([nil]).loops == [0, 1, 2, 3, 4, 5])
    }

    /// A batch whose events go to different loops says, per event, which loops follow its stream, and a loop skips
    /// the events it does not follow; a batch whose events all go to the same loops says nothing per event.
    @Test func aBatchSaysWhichLoopsFollowEachEvent() {
        let shards = (0..<3).map { _ in RecordingShard() }
        let broker = LocalBroker(channelNames: ["c"], shards: shards, options: Self.options)
        func key(_ account: String) -> StreamKey { StreamKey(channel: 0, account: AccountID(account)) }
        for (account, loop) in [("a", 0), ("b", 2), ("c", 0), ("c", 2)] {
            _ = broker.attach([StreamRead(stream: key(account), follow: true, resume: nil, limit: 0, loop: loop)])
        }
        func loops(_ accounts: [String]) -> [UInt64] {
            for shard in shards { shard.lastLoops.withLock { $0 = [99] } }
            Self.publish(broker, accounts.map { ($0, nil) }, into: Outcomes())
            return shards.lazy.map { $0.lastLoops.withLock { $0 } }.first { $0 != [99] } ?? [99]  // the one batch, as handed
        }
        #expect(loops(["a", "a"]) == [])
        #expect(loops(["c", "c"]) == [])
        #expect(loops(["a", "b", "z", "c"]) == [0b001, 0b100, 0, 0b101])
        #expect(loops(["b", "a"]) == [0b100, 0b001])
        let batch = EventBatch(events: [], loops: [0b001, 0b100, 0, 0b101])
        #expect([0, 1, 2, 3].map { batch.reaches($0, loop: 0) } == [true, false, false, true])
        #expect([0, 1, 2, 3].map { batch.reaches($0, loop: 2) } == [false, true, false, true])
        #expect(!batch.reaches(3, loop: 64))
        #expect(EventBatch(events: []).reaches(0, loop: 70), "no per-event loops: every loop it is handed")
    }

    /// Random follows and unfollows (some of them for a loop with no follower) on up to 8 loops against per-loop
    /// counts: the mask is exactly the loops with followers, and the total matches.
    @Test func loopFollowersNeverLeaveOutALoopWithFollowers() {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            let loops = Int.random(in: 1...8, using: &rng)
            var f = LoopFollowers()
            var model = [Int](repeating: 0, count: loops)
            for _ in 0..<200 {
                let loop = Int.random(in: 0..<loops, using: &rng)
                if Bool.random(using: &rng) {
                    f.add(loop: loop)
                    model[loop] += 1
                } else {
                    #expect(f.remove(loop: loop) == (model[loop] > 0))
                    if model[loop] > 0 { model[loop] -= 1 }
                }
                let mask = f.mask(loops: loops)
                for i in 0..<loops { #expect(mask >> UInt64(i) & 1 == (model[i] > 0 ? 1 : 0)) }
                #expect(mask >> UInt64(loops) == 0)
                #expect(f.total == model.reduce(0, +))
                #expect(f.isEmpty == model.allSatisfy { $0 == 0 })
                // Asked for fewer loops than the counts name: every one of them, never fewer.
                if loops > 1, model[loops - 1] > 0 { #expect(f.mask(loops: loops - 1) == (1 << UInt64(loops - 1)) - 1) }
            }
        }
    }

    /// 16 bytes inline (a stream per account and channel carries them); past 65 534 followers of one loop, or a
    /// loop from 4 up, or an unknown loop, the counts move aside and stay exact, and come back inline once empty.
    @Test func loopFollowersStayCompactAndExactPastTheInlineCounts() {
        #expect(MemoryLayout<LoopFollowers>.size == 16)
        var f = LoopFollowers()
        for _ in 0..<70_000 { f.add(loop: 0) }
        f.add(loop: 3)
        #expect(f.total == 70_001 && f.mask(loops: 4) == 0b1001)
        f.add(loop: -1)
        #expect(f.mask(loops: 4) == 0b1111)
        var removed = [f.remove(loop: -1), f.remove(loop: -1), f.remove(loop: 2)]
        #expect(removed == [true, false, false])
        var all = true
        for _ in 0..<70_000 { all = f.remove(loop: 0) && all }
        removed = [all, f.remove(loop: 0)]
        #expect(removed == [true, false] && f.mask(loops: 4) == 0b1000 && f.total == 1)
        removed = [f.remove(loop: 3)]
        #expect(removed == [true] && f.isEmpty && f.mask(loops: 4) == 0)
        f.add(loop: 1)
        #expect(f.mask(loops: 2) == 0b10 && f.total == 1)
        // A stream's object stays in glibc's 112-byte chunks (104 usable), as before the per-loop counts.
        let stream = StreamState(key: StreamKey(channel: 0, account: "acc_1"), generation: 1, now: 0)
        #expect(malloc_usable_size(Unmanaged.passUnretained(stream).toOpaque()) == 104)
    }

    @Test func stateRoundTripsThroughTheFile() throws {
        let shard = HeldShard()
        let broker = LocalBroker(channelNames: ["c", "d"], shards: [shard], options: Self.options)
        let outcomes = Outcomes()
        // A connection of loop 0 follows a's stream: its first publish is delivered once (the key remembers it).
        _ = broker.attach([StreamRead(stream: StreamKey(channel: 0, account: "a"), follow: true, resume: nil, limit: 0, loop: 0)])
        Self.publish(broker, [("a", "k1"), ("a", nil), (nil, nil), ("b", "k2")], into: outcomes)
        shard.release()
        let a = StreamKey(channel: 0, account: "a")
        let epoch = try #require(broker.attach([StreamRead(stream: a, follow: false, resume: nil, limit: 0)]).first?.epoch)
        let saved = try StateFile.decode(StateFile.encode(broker.exportState()))
        #expect(saved.hubEpoch == broker.epoch && saved.events.count == 4 && saved.keys.count == 2)

        // Restored with the channels in another order: matched by name.
        let restored = LocalBroker(channelNames: ["d", "c"], shards: [shard], options: Self.options, restoring: saved)
        #expect(restored.epoch == broker.epoch)
        let moved = StreamKey(channel: 1, account: "a")
        let read = restored.attach([StreamRead(stream: moved, follow: true, resume: ResumePoint(epoch: epoch, seq: 0), limit: 10)])
        #expect(read.first?.seq == 2)
        guard case .success(let events)? = read.first?.replay else { Issue.record("no replay: \(String(describing: read.first?.replay))"); return }
        #expect(events.map(\.seq) == [1, 2])
        #expect(String(decoding: events[0].payload, as: UTF8.self) == #"{"type":"t","channel":"c","seq":1,"data":{}}"#)
        #expect(String(decoding: events[0].data, as: UTF8.self) == "{}")
        let after = Outcomes()
        let data = Array("{}".utf8)
        data.withUnsafeBytes { raw in
            restored.publish([EventDraft(channel: 1, account: "a", type: "t", data: raw),
                              EventDraft(channel: 1, account: "a", type: "t", data: raw, idempotencyKey: "k1")]) { after.record($0) }
        }
        shard.release()
        #expect(after.list.first?.replies == [PublishReply(seq: 3, delivered: 1, duplicate: false),
                                             PublishReply(seq: 1, delivered: 1, duplicate: true)])
    }

    @Test func expiredEventsAreDroppedOnLoadButNumberingGoesOn() throws {
        var saved = StateFileTests.sample
        saved.channelNames = ["wallet_updates"]
        saved.streams = [saved.streams[0]]
        saved.events[0].wallTime = wallClockSeconds() - 3600
        saved.keys[0].wallTime = wallClockSeconds() - 3600
        let broker = LocalBroker(channelNames: ["wallet_updates"], shards: [HeldShard()], options: Self.options, restoring: saved)
        let stats = broker.statistics()
        #expect(stats.events == 0 && stats.idempotencyKeys == 0 && stats.streams == 1)
        let read = broker.attach([StreamRead(stream: StreamKey(channel: 0, account: "acc_1"), follow: false,
                                             resume: ResumePoint(epoch: "3", seq: 6), limit: 10)])
        #expect(read.first?.seq == 7)
        #expect(read.first?.replay.map { $0 == .failure(.tooOld) } == true)
    }
}
