/// The only way numbered events reach the loops, for every broker (`LocalBroker` numbers them in this process,
/// `RedisBroker` receives them from Redis): a batch is handed once to each loop that follows one of its streams,
/// with each event's loops marked, so a loop skips the events it does not follow and a loop that follows none of
/// them is not woken.
package struct Fanout: Sendable {
    package let shards: [any FanoutShard]

    package init(shards: [any FanoutShard]) {
        self.shards = shards
    }

    /// Numbered events on their way to the loops, in order, each with its stream's loops (`LoopFollowers.mask`).
    package struct Batch {
        package private(set) var events: [PublishedEvent] = []
        /// Per event, its loops: made only once two events' loops differ (until then they are all `loops`).
        fileprivate private(set) var eventLoops: [UInt64] = []
        /// The loops that follow some event of the batch.
        fileprivate private(set) var loops: UInt64 = 0

        package init(capacity: Int = 0) {
            events.reserveCapacity(capacity)
        }

        package var isEmpty: Bool { events.isEmpty }

        /// `followers`: the loops (bit i: loop i) that follow the event's stream; 0 for an event that reaches no
        /// loop (it is still in `events`, for the publisher's reply and the ledger).
        package mutating func append(_ event: PublishedEvent, loops followers: UInt64) {
            if !eventLoops.isEmpty {
                eventLoops.append(followers)
            } else if !events.isEmpty && followers != loops {
                eventLoops.reserveCapacity(events.capacity)
                eventLoops.append(contentsOf: repeatElement(loops, count: events.count))
                eventLoops.append(followers)
            }
            loops |= followers
            events.append(event)
        }
    }

    /// The loops `dispatch` hands `batch` to (0: no loop follows any of its events).
    package func loopsHanded(_ batch: Batch) -> Int {
        batch.events.isEmpty ? 0 : (everyLoop ? shards.count : batch.loops.nonzeroBitCount)
    }

    /// Hands `batch` to its loops; each calls `done` from its own thread with per-event delivery counts.
    package func dispatch(_ batch: Batch, done: @escaping @Sendable ([Int]) -> Void) {
        guard !batch.events.isEmpty else { return }
        let handed = EventBatch(events: batch.events, loops: everyLoop ? [] : batch.eventLoops)
        for (i, shard) in shards.enumerated() where everyLoop || (batch.loops >> UInt64(i)) & 1 == 1 {
            shard.deliver(handed, done: done)
        }
    }

    /// A stream's numbering restarted (cluster mode: Redis lost it): every loop closes its subscribers (1012).
    package func numberingRestarted(_ stream: StreamKey) {
        for shard in shards { shard.numberingRestarted(stream) }
    }

    /// Past 64 loops a mask cannot say which: every loop is handed every batch and delivers all of it.
    private var everyLoop: Bool { shards.count > 64 }
}
