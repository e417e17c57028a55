import NIOCore
import Synchronization

/// Who is subscribed to what, and the sequence numbers of every stream, behind one Mutex.
///
/// Each connection is an `AsyncStream<ByteBuffer>` continuation; its WebSocket handler drains the stream into
/// the socket. A publish frames the event once, takes the lock, bumps the stream's `seq` and yields the same
/// buffer to every subscriber (yielding under the lock keeps each stream's events in `seq` order).
/// `delivered` counts the continuations that accepted the event, i.e. connections it was queued for.
final class Registry: Sendable {
    typealias Outbox = AsyncStream<ByteBuffer>.Continuation

    struct StreamKey: Hashable, Sendable {
        let channel: String
        let account: String
    }

    struct State {
        var nextID = 0
        var accountSubscribers: [StreamKey: [Int: Outbox]] = [:]
        var broadcastSubscribers: [String: [Int: Outbox]] = [:]
        var accountSeq: [StreamKey: Int] = [:]
        var broadcastSeq: [String: Int] = [:]
    }

    private let state = Mutex(State())

    func newConnectionID() -> Int {
        state.withLock { s in
            s.nextID += 1
            return s.nextID
        }
    }

    /// Subscribes and queues the reply in the same critical section, so that the reply precedes any event.
    func subscribe(id: Int, account: String, channels: [String], outbox: Outbox, reply: ByteBuffer) {
        state.withLock { s in
            for channel in channels {
                s.accountSubscribers[StreamKey(channel: channel, account: account), default: [:]][id] = outbox
                s.broadcastSubscribers[channel, default: [:]][id] = outbox
            }
            outbox.yield(reply)
        }
    }

    func unsubscribe(id: Int, account: String, channels: some Sequence<String>) {
        state.withLock { s in
            for channel in channels {
                let key = StreamKey(channel: channel, account: account)
                s.accountSubscribers[key]?[id] = nil
                if s.accountSubscribers[key]?.isEmpty == true { s.accountSubscribers[key] = nil }
                s.broadcastSubscribers[channel]?[id] = nil
                if s.broadcastSubscribers[channel]?.isEmpty == true { s.broadcastSubscribers[channel] = nil }
            }
        }
    }

    /// Publishes one event. `head` is the frame up to `"seq":`, `tail` the rest after the number.
    /// Returns (seq, delivered).
    func publish(channel: String, account: String?, head: String, tail: String) -> (Int, Int) {
        state.withLock { s in
            let seq: Int
            let subscribers: [Int: Outbox]?
            if let account {
                let key = StreamKey(channel: channel, account: account)
                seq = s.accountSeq[key, default: 0] + 1
                s.accountSeq[key] = seq
                subscribers = s.accountSubscribers[key]
            } else {
                seq = (s.broadcastSeq[channel] ?? 0) + 1
                s.broadcastSeq[channel] = seq
                subscribers = s.broadcastSubscribers[channel]
            }
            guard let subscribers, !subscribers.isEmpty else { return (seq, 0) }
            var frame = ByteBuffer()
            frame.reserveCapacity(head.utf8.count + 20 + tail.utf8.count)
            frame.writeString(head)
            frame.writeString(String(seq))
            frame.writeString(tail)
            var delivered = 0
            for outbox in subscribers.values {
                if case .enqueued = outbox.yield(frame) { delivered += 1 }
            }
            return (seq, delivered)
        }
    }
}
