import Foundation
import HubSupport
import Synchronization
import WSProtocol

/// Sums per-shard delivery counts, records idempotency outcomes, waits for the duplicates of in-flight publishes,
/// and completes the batch once, when all of that is done. Its state is reached only under its `Mutex` (stored
/// inline: one allocation per batch).
final class DeliveryCollector: Sendable {
    private let broker: LocalBroker
    private let completion: @Sendable (PublishOutcome) -> Void
    private let state = Mutex(State())

    struct State {
        var events: [PublishedEvent] = []
        var delivered: [Int] = []
        var replies: [PublishReply] = []
        /// Per draft: the index of its event, or -1 for a duplicate; empty when the batch has no duplicate (draft i
        /// is then event i).
        var eventOfDraft: [Int] = []
        /// Idempotency entries this batch created, by event index.
        var owned: [(event: Int, entry: IdempotencyEntry)] = []
        var remainingShards = 0
        var waitingDuplicates = 0
        var fannedOut = false
        var completed = false
    }

    init(broker: LocalBroker, completion: @escaping @Sendable (PublishOutcome) -> Void) {
        self.broker = broker
        self.completion = completion
    }

    private func withLock<Result>(_ body: (inout State) -> Result) -> Result {
        state.withLock { body(&$0) }
    }

    /// Called under the broker's lock, before any shard can report.
    func prepare(events: [PublishedEvent], replies: [PublishReply], eventOfDraft: [Int],
                 owned: [(event: Int, entry: IdempotencyEntry)], waiting: Int, shards: Int) {
        withLock { s in
            s.events = events
            // The first shard's counts become `delivered` (see `report`): no array of zeros per batch.
            s.replies = replies
            s.eventOfDraft = eventOfDraft
            s.owned = owned
            // Nothing resolves a waiter before the broker's lock is released, so no count-down has happened yet.
            s.waitingDuplicates = waiting
            s.remainingShards = shards
        }
    }

    func report(_ counts: [Int]) {
        let done = withLock { s -> Bool in
            if s.delivered.isEmpty && counts.count == s.events.count {
                s.delivered = counts
            } else {
                if s.delivered.isEmpty { s.delivered = Array(filledWith: 0, count: s.events.count) }
                for i in counts.indices where i < s.delivered.count { s.delivered[i] += counts[i] }
            }
            s.remainingShards -= 1
            return s.remainingShards == 0
        }
        if done { fannedOut() }
    }

    /// Every shard has reported (or there was nothing to fan out). Without idempotency entries to resolve, the batch
    /// completes under the same lock.
    func fannedOut() {
        let (owned, outcome) = withLock { s -> ([(entry: IdempotencyEntry, delivered: Int)], PublishOutcome?) in
            if s.delivered.count != s.events.count { s.delivered = Array(filledWith: 0, count: s.events.count) }  // no shard had followers
            if s.eventOfDraft.isEmpty {
                for i in s.replies.indices where i < s.delivered.count { s.replies[i].delivered = s.delivered[i] }
            } else {
                for (i, e) in s.eventOfDraft.enumerated() where e >= 0 { s.replies[i].delivered = s.delivered[e] }
            }
            s.fannedOut = true
            guard s.owned.isEmpty else { return (s.owned.map { ($0.entry, s.delivered[$0.event]) }, nil) }
            return ([], Self.complete(&s))
        }
        guard !owned.isEmpty else {
            // Completion was decided under that lock: now, or else by the last awaited duplicate's `duplicateResolved`
            // (which sees `fannedOut`).
            if let outcome { finish(outcome) }
            return
        }
        for waiter in broker.resolve(owned) { waiter.collector.duplicateResolved(waiter.index, delivered: waiter.delivered) }
        finishIfDone()
    }

    /// The first publish of a key one of our drafts repeated has completed.
    func duplicateResolved(_ index: Int, delivered: Int) {
        withLock { s in
            if index < s.replies.count { s.replies[index].delivered = delivered }
            s.waitingDuplicates -= 1
        }
        finishIfDone()
    }

    private func finishIfDone() {
        if let outcome = withLock({ Self.complete(&$0) }) { finish(outcome) }
    }

    /// The outcome, once and only once everything is in (under the lock).
    private static func complete(_ s: inout State) -> PublishOutcome? {
        guard s.fannedOut, s.waitingDuplicates <= 0, !s.completed else { return nil }
        s.completed = true
        return PublishOutcome(events: s.events, delivered: s.delivered, replies: s.replies)
    }

    private func finish(_ outcome: PublishOutcome) {
        completion(outcome)
    }
}
