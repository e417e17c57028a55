import Synchronization

/// What `HubClient.subscribe` returns: the channels' elements, in order, for one consumer. Bounded: when it holds
/// `limit` elements the client waits (and stops reading from the hub) until the consumer takes one. Ending the
/// iteration (leaving the loop, or cancelling its task) unsubscribes; `stop()` and a logout end it.
public struct HubSubscription: AsyncSequence, Sendable {
    public typealias Element = HubSubscriptionElement
    let buffer: HubSubscriptionBuffer

    public func makeAsyncIterator() -> Iterator { Iterator(buffer: buffer, lease: Lease(buffer)) }

    public struct Iterator: AsyncIteratorProtocol {
        let buffer: HubSubscriptionBuffer
        /// Ends the subscription when the last copy of the iterator goes away (the consumer left its loop).
        let lease: Lease

        public mutating func next() async -> HubSubscriptionElement? {
            await withTaskCancellationHandler {
                await buffer.take()
            } onCancel: { [buffer] in
                buffer.terminate()
            }
        }
    }

    final class Lease: Sendable {
        let buffer: HubSubscriptionBuffer
        init(_ buffer: HubSubscriptionBuffer) { self.buffer = buffer }
        deinit { buffer.terminate() }
    }
}

/// The queue between the client (producer) and one consumer.
final class HubSubscriptionBuffer: Sendable {
    private struct State {
        var queue: [HubSubscriptionElement] = []
        var head = 0
        var finished = false
        var terminated = false
        var consumer: CheckedContinuation<HubSubscriptionElement?, Never>?
        var producers: [CheckedContinuation<Void, Never>] = []
        var count: Int { queue.count - head }
    }

    private let state = Mutex(State())
    let limit: Int
    /// Runs once when the consumer goes away or the buffer is finished (the client unsubscribes).
    private let onTermination: Mutex<(@Sendable () -> Void)?>

    init(limit: Int, onTermination: @escaping @Sendable () -> Void) {
        self.limit = max(1, limit)
        self.onTermination = Mutex(onTermination)
    }

    /// Queues `element`, waiting while the buffer is full. Returns at once when the consumer has gone.
    func send(_ element: HubSubscriptionElement) async {
        while true {
            let waiting: CheckedContinuation<HubSubscriptionElement?, Never>?? = state.withLock { s in
                if s.finished || s.terminated { return .some(nil) }
                guard s.count < limit else { return nil }
                if let consumer = s.consumer {
                    s.consumer = nil
                    return .some(consumer)
                }
                s.queue.append(element)
                return .some(nil)
            }
            if case .some(let consumer) = waiting {
                consumer?.resume(returning: element)
                return
            }
            await withCheckedContinuation { (space: CheckedContinuation<Void, Never>) in
                let now = state.withLock { s -> Bool in
                    if s.finished || s.terminated || s.count < limit { return true }
                    s.producers.append(space)
                    return false
                }
                if now { space.resume() }
            }
        }
    }

    /// Queues `element` even when full (one control element: a refusal, a recovery failure).
    func sendNow(_ element: HubSubscriptionElement) {
        let consumer = state.withLock { s -> CheckedContinuation<HubSubscriptionElement?, Never>? in
            if s.finished || s.terminated { return nil }
            if let consumer = s.consumer {
                s.consumer = nil
                return consumer
            }
            s.queue.append(element)
            return nil
        }
        consumer?.resume(returning: element)
    }

    /// The consumer's next element; nil once finished and drained, or terminated.
    func take() async -> HubSubscriptionElement? {
        let ready: (HubSubscriptionElement?, Bool, [CheckedContinuation<Void, Never>]) = state.withLock { s in
            if s.terminated { return (nil, true, []) }
            if s.count > 0 {
                let element = s.queue[s.head]
                s.head += 1
                if s.head > 64 && s.head * 2 > s.queue.count {
                    s.queue.removeFirst(s.head)
                    s.head = 0
                }
                let woken = s.producers
                s.producers.removeAll()
                return (element, true, woken)
            }
            return (nil, s.finished, [])
        }
        for producer in ready.2 { producer.resume() }
        if ready.1 { return ready.0 }
        return await withCheckedContinuation { (next: CheckedContinuation<HubSubscriptionElement?, Never>) in
            // Checked again under the lock: an element or the end may have come since the first look.
            let now: (element: HubSubscriptionElement?, woken: [CheckedContinuation<Void, Never>])? = state.withLock { s in
                if s.terminated { return (nil, []) }
                if s.count > 0 {
                    let element = s.queue[s.head]
                    s.head += 1
                    defer { s.producers.removeAll() }
                    return (element, s.producers)
                }
                if s.finished { return (nil, []) }
                s.consumer = next
                return nil
            }
            if let now {
                for producer in now.woken { producer.resume() }
                next.resume(returning: now.element)
            }
        }
    }

    /// No more elements: the consumer gets what is queued, then the end.
    func finish() {
        let (consumer, producers) = state.withLock { s -> (CheckedContinuation<HubSubscriptionElement?, Never>?, [CheckedContinuation<Void, Never>]) in
            s.finished = true
            let c = s.count == 0 ? s.consumer : nil
            if c != nil { s.consumer = nil }
            defer { s.producers.removeAll() }
            return (c, s.producers)
        }
        consumer?.resume(returning: nil)
        for p in producers { p.resume() }
        runTermination()
    }

    /// The consumer went away: drop everything, release a waiting producer, unsubscribe.
    func terminate() {
        let (consumer, producers) = state.withLock { s -> (CheckedContinuation<HubSubscriptionElement?, Never>?, [CheckedContinuation<Void, Never>]) in
            s.terminated = true
            s.queue.removeAll()
            s.head = 0
            let c = s.consumer
            s.consumer = nil
            defer { s.producers.removeAll() }
            return (c, s.producers)
        }
        consumer?.resume(returning: nil)
        for p in producers { p.resume() }
        runTermination()
    }

    var isEnded: Bool { state.withLock { $0.finished || $0.terminated } }
    var queued: Int { state.withLock { $0.count } }

    private func runTermination() {
        let action = onTermination.withLock { a -> (@Sendable () -> Void)? in
            defer { a = nil }
            return a
        }
        action?()
    }
}
