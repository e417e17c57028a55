import Foundation
import Synchronization
import WSProtocol

/// One publish, validated at intake, before it has a sequence number.
public struct EventDraft {
    public let channel: Int
    /// nil: a broadcast to every subscriber of the channel.
    public let account: AccountID?
    public let type: String
    /// The raw JSON of `data`, exactly as the backend sent it. Only valid during `Broker.publish`.
    public let data: UnsafeRawBufferPointer

    public init(channel: Int, account: AccountID?, type: String, data: UnsafeRawBufferPointer) {
        self.channel = channel
        self.account = account
        self.type = type
        self.data = data
    }
}

/// An event with its number, framed once as a WebSocket text frame; the same bytes go to every recipient.
public final class PublishedEvent: Sendable {
    public let channel: Int
    public let account: AccountID?
    public let type: String
    public let seq: UInt64
    /// The complete server frame (header + JSON payload), shared by every recipient.
    public let frame: SharedBytes
    /// Where the backend's `data` sits inside `frame` (for `tail`).
    public let dataRange: Range<Int>
    /// Monotonic nanoseconds when the broker accepted it (publish-to-write latency).
    public let acceptedAt: UInt64
    /// Wall-clock seconds when the broker accepted it (admin views).
    public let wallTime: Double

    init(channel: Int, account: AccountID?, type: String, seq: UInt64, frame: SharedBytes, dataRange: Range<Int>,
         acceptedAt: UInt64, wallTime: Double) {
        self.channel = channel
        self.account = account
        self.type = type
        self.seq = seq
        self.frame = frame
        self.dataRange = dataRange
        self.acceptedAt = acceptedAt
        self.wallTime = wallTime
    }

    public var data: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: frame.bytes[dataRange]) }
}

/// The boundary between publish intake and fan-out. Intake (the Unix socket) hands a batch of drafts to a
/// broker; the broker numbers them and gets them to every subscriber it serves. `LocalBroker` serves this
/// process's loops; a cluster broker (Redis) would number and share events between hubs behind the same call.
public protocol Broker: Sendable {
    /// Numbers each draft in its stream, frames it once, fans it out, and then calls `completion` once with the
    /// events and, for each, the exact number of connections it was handed to (same order as `drafts`).
    /// Encoding happens before `publish` returns, so `drafts` may point into a transient read buffer.
    /// `completion` runs on an arbitrary loop thread.
    func publish(_ drafts: [EventDraft], completion: @escaping @Sendable (_ events: [PublishedEvent], _ delivered: [Int]) -> Void)
}

/// One loop's part of fan-out: delivers a batch to that loop's subscribers, on that loop's thread.
public protocol FanoutShard: Sendable {
    /// Must hop to the shard's own thread, deliver, then call `done` (from that thread) with per-event counts.
    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void)
}

/// A batch of numbered events handed to every shard.
public final class EventBatch: Sendable {
    public let events: [PublishedEvent]
    init(events: [PublishedEvent]) { self.events = events }
}

/// Broker for a single hub process: numbering under one lock, then one hand-off per loop per batch.
///
/// Why the lock also covers the hand-off: two intake connections publishing to the same stream must not have
/// their events overtake each other on the way to a loop, or a client would see seq 18 before seq 17. Taking
/// the numbers and enqueuing on every loop inside the same critical section makes the loops' inboxes agree
/// with the numbering. The critical section encodes each event once (~100 ns for a small event) and appends
/// one closure per loop per batch.
public final class LocalBroker: Broker {
    private let channelNames: [String]
    private let shards: [any FanoutShard]
    /// Sequence numbers, and the writer events are encoded with, both used only under this lock.
    private let state = Mutex<(sequences: SequenceTable, writer: JSONWriter)>((SequenceTable(), JSONWriter(capacity: 4096)))

    public init(channelNames: [String], shards: [any FanoutShard]) {
        self.channelNames = channelNames
        self.shards = shards
    }

    public func publish(_ drafts: [EventDraft], completion: @escaping @Sendable ([PublishedEvent], [Int]) -> Void) {
        guard !drafts.isEmpty else { completion([], []); return }
        let now = monotonicNanos()
        let wall = wallClockSeconds()
        state.withLock { state in
            var events: [PublishedEvent] = []
            events.reserveCapacity(drafts.count)
            for draft in drafts {
                let seq = state.sequences.advance(StreamKey(channel: draft.channel, account: draft.account))
                events.append(Self.frame(draft, channelName: channelNames[draft.channel], seq: seq, now: now, wall: wall,
                                         writer: &state.writer))
            }
            let batch = EventBatch(events: events)
            let collector = DeliveryCollector(events: events.count, shards: shards.count, completion: completion, batch: batch)
            for shard in shards {
                shard.deliver(batch) { counts in collector.report(counts) }
            }
        }
    }

    /// Frames one event: the JSON is written once with `writer`, then copied behind its WebSocket header into the
    /// one buffer every recipient shares.
    static func frame(_ draft: EventDraft, channelName: String, seq: UInt64, now: UInt64, wall: Double,
                      writer w: inout JSONWriter) -> PublishedEvent {
        let broadcast = draft.account == nil
        w.reset()
        w.beginObject()
        w.field("type", draft.type)
        w.field("channel", channelName)
        w.field("seq", seq)
        if broadcast { w.field("broadcast", true) }
        w.key("data")
        w.raw(draft.data)
        w.endObject()
        let payloadCount = w.count
        let headerCount = FrameEncoder.headerSize(payloadLength: payloadCount, masked: false)
        let frame = w.withBytes { payload in
            SharedBytes(count: headerCount + payloadCount) { buffer in
                _ = FrameEncoder.writeHeader(into: buffer, endingAt: headerCount, opcode: .text, fin: true, rsv1: false,
                                             payloadLength: payloadCount, maskKey: nil)
                // Both are non-empty (a header, and a JSON object of at least `{}`): their base addresses exist.
                (buffer.baseAddress! + headerCount).copyMemory(from: payload.baseAddress!, byteCount: payloadCount)
            }
        }
        // `data` is the last member: it ends right before the closing brace.
        let dataEnd = headerCount + payloadCount - 1
        return PublishedEvent(channel: draft.channel, account: draft.account, type: draft.type, seq: seq, frame: frame,
                              dataRange: (dataEnd - draft.data.count)..<dataEnd, acceptedAt: now, wallTime: wall)
    }
}

/// Sums per-shard delivery counts and completes the batch when the last shard has reported.
final class DeliveryCollector: Sendable {
    private struct State {
        var delivered: [Int]
        var remaining: Int
    }
    private let state: Mutex<State>
    private let completion: @Sendable ([PublishedEvent], [Int]) -> Void
    private let batch: EventBatch

    init(events: Int, shards: Int, completion: @escaping @Sendable ([PublishedEvent], [Int]) -> Void, batch: EventBatch) {
        state = Mutex(State(delivered: Array(repeating: 0, count: events), remaining: shards))
        self.completion = completion
        self.batch = batch
    }

    func report(_ counts: [Int]) {
        let finished: [Int]? = state.withLock { s in
            for i in counts.indices { s.delivered[i] += counts[i] }
            s.remaining -= 1
            return s.remaining == 0 ? s.delivered : nil
        }
        if let finished { completion(batch.events, finished) }
    }
}

/// Seconds since the Unix epoch, with sub-second precision.
func wallClockSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
