import Foundation
import HubSupport
import Synchronization
import WSProtocol

/// Sums per-shard delivery counts, records idempotency outcomes, waits for the duplicates of in-flight publishes,
/// and completes the batch once, when all of that is done.
///
/// One allocation per batch: the state and its `pthread_mutex_t` are the header and the single element of one
/// `ManagedBuffer` (as a class with a `LockedValue`, the collector took three: itself, the lock and the mutex's
/// memory). Made by `make`; the state is reached only through its pointer, under the lock.
final class DeliveryCollector: ManagedBuffer<DeliveryCollector.Header, pthread_mutex_t> {
    /// The collector as a `@Sendable` closure captures it: `ManagedBuffer` is never `Sendable`, but every access to
    /// the collector's state is under its lock, and the rest of its header never changes.
    struct Reference: @unchecked Sendable {
        let collector: DeliveryCollector
    }

    struct Header {
        let broker: LocalBroker
        let completion: @Sendable (PublishOutcome) -> Void
        var state = State()
    }

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

    static func make(broker: LocalBroker, completion: @escaping @Sendable (PublishOutcome) -> Void) -> DeliveryCollector {
        let made = unsafeDowncast(create(minimumCapacity: 1) { _ in Header(broker: broker, completion: completion) },
                                  to: DeliveryCollector.self)
        made.withUnsafeMutablePointerToElements { mutex in
            mutex.initialize(to: pthread_mutex_t())
            pthread_mutex_init(mutex, nil)
        }
        return made
    }

    deinit {
        withUnsafeMutablePointerToElements { mutex in
            pthread_mutex_destroy(mutex)
            mutex.deinitialize(count: 1)
        }
    }

    private func withLock<Result>(_ body: (inout State) -> Result) -> Result {
        withUnsafeMutablePointers { header, mutex in
            pthread_mutex_lock(mutex)
            defer { pthread_mutex_unlock(mutex) }
            return body(&header.pointee.state)
        }
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
        let broker = withUnsafeMutablePointerToHeader { $0.pointee.broker }
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

    /// The completion is read through the header's pointer (`ManagedBuffer.header` is a stored `var` of a class:
    /// each access would cost a run-time exclusivity check); it never changes.
    private func finish(_ outcome: PublishOutcome) {
        let completion = withUnsafeMutablePointerToHeader { $0.pointee.completion }
        completion(outcome)
    }
}
