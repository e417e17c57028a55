import Foundation
import HubEngine
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
    /// A publish repeating a key already seen in the same stream within the window is not delivered again.
    public let idempotencyKey: ExactString?

    public init(channel: Int, account: AccountID?, type: String, data: UnsafeRawBufferPointer, idempotencyKey: ExactString? = nil) {
        self.channel = channel
        self.account = account
        self.type = type
        self.data = data
        self.idempotencyKey = idempotencyKey
    }

    package var stream: StreamKey { StreamKey(channel: channel, account: account) }
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

    var stream: StreamKey { StreamKey(channel: channel, account: account) }
}

/// What the backend is told about one publish line.
public struct PublishReply: Sendable, Equatable {
    /// Set when the event could not be numbered (cluster mode: Redis unreachable). Nothing was published; the
    /// backend retries, with its idempotency key. `seq`, `delivered` and `duplicate` are then meaningless.
    public var failure: BrokerFailure? = nil
    public var seq: UInt64
    /// Connections the event was handed to (for a duplicate: the first publish's count).
    public var delivered: Int
    /// The idempotency key was seen before in this stream: nothing was delivered again.
    public var duplicate: Bool

    public init(seq: UInt64, delivered: Int, duplicate: Bool) {
        self.seq = seq
        self.delivered = delivered
        self.duplicate = duplicate
    }
}

/// The result of one `Broker.publish` call.
public struct PublishOutcome: Sendable {
    /// The events this call numbered (duplicates are not among them), and for each its delivery count.
    public let events: [PublishedEvent]
    public let delivered: [Int]
    /// One reply per draft, in the order of the drafts.
    public let replies: [PublishReply]

    package init(events: [PublishedEvent], delivered: [Int], replies: [PublishReply]) {
        self.events = events
        self.delivered = delivered
        self.replies = replies
    }
}

/// Why a resume could not be honoured. The app then refetches its state through the REST API.
public enum RecoveryFailure: String, Error, Sendable, CaseIterable {
    /// The stream's numbering is not the one the position came from (fresh hub start, stream forgotten, or a
    /// position ahead of the stream).
    case epochChanged = "epoch_changed"
    /// Some event after the position is no longer in the history (evicted, expired, or history is off).
    case tooOld = "too_old"
    /// More events after the position than `--recovery-max`, or more bytes than the connection may queue.
    case tooMany = "too_many"
}

/// Why a broker could not number, read or publish (cluster mode: Redis is unreachable). The code is what clients
/// and the backend see (`BROKER_UNAVAILABLE`); they retry.
public struct BrokerFailure: Error, Sendable, Equatable {
    public var code: String
    public var message: String

    public init(code: String = "BROKER_UNAVAILABLE", message: String) {
        self.code = code
        self.message = message
    }
}

/// A position in a stream to resume after.
public struct ResumePoint: Sendable, Equatable {
    /// The stream's own epoch, as the broker gave it out (`StreamPosition.epoch`).
    public var epoch: String
    public var seq: UInt64

    public init(epoch: String, seq: UInt64) {
        self.epoch = epoch
        self.seq = seq
    }
}

/// One stream a subscribe asks the broker about.
public struct StreamRead: Sendable {
    public var stream: StreamKey
    /// The connection starts following this stream (a new subscription): the broker keeps the stream's numbering
    /// while anyone follows it. Balanced by `Broker.detach`.
    public var follow: Bool
    /// Read the history after this position.
    public var resume: ResumePoint?
    /// At most this many events are replayed.
    public var limit: Int
    /// The index of the loop the connection lives on (-1: unknown), so a broker can send a stream's events only to
    /// the loops that have followers of it.
    public var loop: Int

    public init(stream: StreamKey, follow: Bool, resume: ResumePoint?, limit: Int, loop: Int = -1) {
        self.stream = stream
        self.follow = follow
        self.resume = resume
        self.limit = limit
        self.loop = loop
    }
}

/// A stream's position when it was read, and what the history had after the requested one.
public struct StreamPosition: Sendable {
    /// The stream's own epoch: opaque, without a "." (the local broker: its generation; Redis: the stream's epoch).
    public var epoch: String
    /// The stream's last seq at the moment of the read: every later event reaches the connection live.
    public var seq: UInt64
    /// nil when no resume was asked; else every event after the position (oldest first), or why not.
    public var replay: Result<[RetainedEvent], RecoveryFailure>?

    package init(epoch: String, seq: UInt64, replay: Result<[RetainedEvent], RecoveryFailure>?) {
        self.epoch = epoch
        self.seq = seq
        self.replay = replay
    }
}

/// A stream's retained events, for admin views.
public struct StreamHistory: Sendable {
    public var epoch: String
    public var seq: UInt64
    public var events: [RetainedEvent]

    package init(epoch: String, seq: UInt64, events: [RetainedEvent]) {
        self.epoch = epoch
        self.seq = seq
        self.events = events
    }
}

/// Counters and gauges of the broker's history and idempotency keys (`stats`, `/metrics`).
public struct BrokerStatistics: Sendable {
    public var epoch: String
    public var historyBytes = 0
    public var historyLimitBytes = 0
    public var events = 0
    public var streams = 0
    public var evictions = 0
    public var expirations = 0
    public var forgottenStreams = 0
    public var duplicates = 0
    public var idempotencyKeys = 0
    /// Cluster mode only: the Redis side.
    public var cluster: ClusterStatistics? = nil

    package init(epoch: String) { self.epoch = epoch }
}

/// Counters of the cluster broker (loop thread writes, any thread reads).
public struct ClusterStatistics: Sendable {
    public var nodeID = ""
    /// The command connection is up (HELLO done).
    public var connected = false
    /// The subscriber connection is up and subscribed (to the followed streams' channels, or every shard channel).
    public var subscribed = false
    public var lastError: String? = nil
    public var published = 0
    public var publishFailures = 0
    /// Fan-out messages received from Redis, and those for streams no connection of this node follows.
    public var received = 0
    public var ignored = 0
    /// Messages at or below what the node already delivered (a gap fill overlapping live messages).
    public var duplicates = 0
    /// Gaps seen in a stream's numbering, filled from the stream history, and events replayed by those fills.
    public var gaps = 0
    public var filledEvents = 0
    /// Events a gap fill could not find any more (trimmed from the history): lost to this node's clients.
    public var unfillable = 0
    /// Streams whose epoch changed while followed (their keys expired or Redis lost them).
    public var epochChanges = 0
    /// Events of followed streams this node could not decode (written by a node of another version, or damaged).
    public var undecodable = 0
    public var reconnects = 0
    /// Publish script calls sent (each numbers a batch of events: `published / publishScriptCalls` per call).
    public var publishScriptCalls = 0
    /// Publish requests answered through Redis: count, summed nanoseconds from queued to the last reply, the largest.
    public var publishRoundTrips = 0
    public var publishNanos: UInt64 = 0
    public var publishMaxNanos: UInt64 = 0
    public var followedStreams = 0

    /// Both connections are up: publishes and subscribes work, and events arrive.
    public var healthy: Bool { connected && subscribed }

    package init() {}
}

/// The boundary between publish intake and fan-out, and the read side of numbering and history. Intake (the Unix
/// socket) hands a batch of drafts to a broker; the broker numbers them, retains them and gets them to every
/// subscriber it serves. `LocalBroker` serves this process's loops; a cluster broker (Redis Streams) would number,
/// retain and share events between hubs behind the same calls.
///
/// The read side is synchronous for the local broker: a subscribe registers the connection, reads positions and
/// history, writes the replay and sets its floor in one go on its loop. A broker backed by a remote store
/// (`RedisBroker`) answers later: the connection holds the live events of those streams meanwhile and sorts them
/// against the read when it comes (see `ClientConnection.subscribe`).
public protocol Broker: Sendable {
    /// Numbers each draft in its stream, frames it once, retains it in the stream's history, fans it out, and then
    /// calls `completion` once (on an arbitrary loop thread) with the new events, their exact delivery counts, and
    /// one reply per draft. A draft whose idempotency key was seen in its stream within the window is not numbered
    /// again: its reply carries the first publish's seq and delivered, with `duplicate` set (if the first is still
    /// in flight, the reply waits for it). Encoding happens before `publish` returns, so `drafts` may point into a
    /// transient read buffer.
    func publish(_ drafts: [EventDraft], completion: @escaping @Sendable (PublishOutcome) -> Void)

    /// Random per fresh start of the numbering (kept across a graceful restart).
    var epoch: String { get }

    /// Reads the position of each stream and, where asked, the history after a position, atomically with respect
    /// to numbering: every event numbered after the read reaches the loops' inboxes after it, in seq order per
    /// stream. A broker that can answer at once (the local one) returns the positions; one backed by a remote store
    /// returns nil and does nothing, and the caller then asks `attach(_:completion:)`. (Two calls rather than one
    /// with an optional result: the caller builds the completion, three allocations per subscribe, only when it
    /// is needed.) Every `follow: true` read is balanced by a `detach`, whether the read succeeded or not.
    func attachNow(_ reads: [StreamRead]) -> [StreamPosition]?

    /// `attachNow`'s read for a broker that answers later: calls `completion` from any thread, exactly once.
    func attach(_ reads: [StreamRead], completion: @escaping @Sendable (Result<[StreamPosition], BrokerFailure>) -> Void)

    /// Connections on loop `loop` stopped following these streams (one call per `follow: true` read).
    func detach(_ streams: [StreamKey], loop: Int)

    /// The retained events of a stream with seq > `after` (nil when the broker has no such stream).
    func history(_ stream: StreamKey, after: UInt64) -> StreamHistory?

    /// Periodic housekeeping: expires old events, forgets idle streams and old idempotency keys.
    func maintain()

    func statistics() -> BrokerStatistics
}

/// One loop's part of fan-out: delivers a batch to that loop's subscribers, on that loop's thread.
public protocol FanoutShard: Sendable {
    /// Must hop to the shard's own thread, deliver, then call `done` (from that thread) with per-event counts.
    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void)

    /// The stream's numbering restarted under its subscribers (cluster mode: Redis lost it): close every connection
    /// subscribed to it (1012), so the app reconnects, is told `epoch_changed` and refetches.
    func numberingRestarted(_ stream: StreamKey)
}

extension Broker {
    public func attachNow(_ reads: [StreamRead]) -> [StreamPosition]? { nil }
}

extension FanoutShard {
    public func numberingRestarted(_ stream: StreamKey) {}
}

/// A batch of numbered events handed to every shard.
public final class EventBatch: Sendable {
    public let events: [PublishedEvent]
    /// Per event, the loops (bit i: loop i) with followers of its stream when it was numbered; empty when every loop
    /// the batch is handed to follows every event of it (one loop, or the same loops for all). A loop skips the
    /// events it does not follow instead of looking each one up in its registry to find nobody there.
    @usableFromInline let loops: [UInt64]
    package init(events: [PublishedEvent], loops: [UInt64] = []) {
        self.events = events
        self.loops = loops
    }

    /// Whether loop `loop` may have subscribers of event `i`.
    @inlinable package func reaches(_ i: Int, loop: Int) -> Bool {
        loops.isEmpty || (loop < 64 && loops[i] & (1 << UInt64(loop)) != 0)
    }
}
