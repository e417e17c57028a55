/// A FIFO queue in one circular buffer: O(1) amortised `append` and `removeFirst`, indexed access from the oldest.
///
/// Why not an array with `removeFirst()`: that is O(n). Why not an array plus a head index: a popped slot would
/// keep its element (a retained event's frame) alive until the next compaction, so the memory the history counts
/// as freed would not be. Here a popped slot is set to nil at once, and the buffer shrinks when it is mostly empty
/// (a stream that had a burst does not keep its peak capacity).
/// `@inlinable`: the cluster module queues its Redis commands in one, specialised there.
@usableFromInline package struct Ring<Element> {
    @usableFromInline var storage: [Element?] = []
    @usableFromInline var head = 0
    @usableFromInline package internal(set) var count = 0

    @inlinable package init() {}

    @inlinable package var isEmpty: Bool { count == 0 }
    @inlinable package var capacity: Int { storage.count }

    /// The oldest element.
    @inlinable package var first: Element? { count == 0 ? nil : storage[head] }

    /// The newest element.
    @inlinable package var last: Element? { count == 0 ? nil : storage[(head + count - 1) & (storage.count - 1)] }

    /// The element `offset` places after the oldest (0 is the oldest). `offset` must be in `0..<count`.
    @inlinable package subscript(offset: Int) -> Element {
        precondition(offset >= 0 && offset < count, "Ring index out of range")
        // Slots in 0..<count from head are always set.
        return storage[(head + offset) & (storage.count - 1)].unsafelyUnwrapped
    }

    @inlinable package mutating func append(_ element: Element) {
        if count == storage.count { resize(to: max(4, storage.count * 2)) }
        storage[(head + count) & (storage.count - 1)] = element
        count += 1
    }

    /// Removes and returns the oldest element (nil when empty).
    @discardableResult
    @inlinable package mutating func removeFirst() -> Element? {
        guard count > 0 else { return nil }
        let element = storage[head].take()  // moved out: no retain/release pair on a cold element
        head = (head + 1) & (storage.count - 1)
        count -= 1
        if count == 0 { head = 0 }
        if storage.count > 16 && count * 4 <= storage.count { resize(to: storage.count / 2) }
        return element
    }

    /// Replaces the oldest element (nothing when empty).
    @inlinable package mutating func replaceFirst(_ element: Element) {
        guard count > 0 else { return }
        storage[head] = element
    }

    @inlinable package mutating func removeAll() { self = Ring() }

    /// A power of two, at least `count`.
    @inlinable mutating func resize(to newCapacity: Int) {
        var size = 4
        while size < newCapacity { size *= 2 }
        var grown = [Element?](repeating: nil, count: size)
        for i in 0..<count { grown[i] = storage[(head + i) & (storage.count - 1)] }
        storage = grown
        head = 0
    }
}
