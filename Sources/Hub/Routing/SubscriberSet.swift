/// An unordered set of subscribers stored contiguously, so a fan-out walks an array, with O(1) insert and remove.
///
/// Most sets are tiny (one account's connections on one channel: usually 1 to 3). A set of one holds its member
/// inline (no array: an idle subscribed connection costs its account's set no allocation), from two on an array;
/// up to `smallLimit` members are found by a linear scan and no position map exists. Past that (a broadcast channel
/// with thousands of subscribers) positions are tracked by object identity and removal is a swap-remove.
///
/// A `RandomAccessCollection` of its members (a fan-out iterates the set itself; nothing is copied out).
///
/// Loop-bound: only the loop that owns the subscribers touches it.
public struct SubscriberSet<Element: AnyObject>: RandomAccessCollection {
    @usableFromInline enum Storage {
        case none
        case one(Element)
        case many([Element])
    }
    @usableFromInline var storage = Storage.none
    @usableFromInline var positions: [ObjectIdentifier: Int]? = nil
    @inlinable static var smallLimit: Int { 16 }

    @inlinable public init() {}

    @inlinable public var startIndex: Int { 0 }
    @inlinable public var endIndex: Int {
        switch storage {
        case .none: return 0
        case .one: return 1
        case .many(let elements): return elements.count
        }
    }

    @inlinable public subscript(position: Int) -> Element {
        switch storage {
        case .one(let element) where position == 0: return element
        case .many(let elements): return elements[position]
        default: preconditionFailure("SubscriberSet index \(position) out of range")
        }
    }

    /// Walks the members with the array taken out of the enum once (a fan-out to thousands pays no per-member
    /// pattern match or retain of the array).
    public struct Iterator: IteratorProtocol {
        @usableFromInline var single: Element?
        @usableFromInline let array: [Element]
        @usableFromInline var position = 0

        @inlinable init(_ storage: Storage) {
            switch storage {
            case .none: single = nil; array = []
            case .one(let element): single = element; array = []
            case .many(let elements): single = nil; array = elements
            }
        }

        @inlinable public mutating func next() -> Element? {
            if let element = single {
                single = nil
                return element
            }
            guard position < array.count else { return nil }
            defer { position += 1 }
            return array[position]
        }
    }

    @inlinable public func makeIterator() -> Iterator { Iterator(storage) }

    /// The members, as an array (tests and admin views).
    @inlinable public var elements: [Element] { Array(self) }

    @inlinable func index(of element: Element) -> Int? {
        if let positions { return positions[ObjectIdentifier(element)] }
        return firstIndex { $0 === element }
    }

    @inlinable public func contains(_ element: Element) -> Bool { index(of: element) != nil }

    /// Returns false when the element was already present.
    @discardableResult
    @inlinable public mutating func insert(_ element: Element) -> Bool {
        guard index(of: element) == nil else { return false }
        switch storage {
        case .none:
            storage = .one(element)
        case .one(let first):
            storage = .many([first, element])
        case .many(var elements):
            storage = .none  // the array's only reference is `elements` now: appending does not copy it
            positions?[ObjectIdentifier(element)] = elements.count
            elements.append(element)
            if positions == nil && elements.count > Self.smallLimit {
                var map: [ObjectIdentifier: Int] = [:]
                map.reserveCapacity(elements.count * 2)
                for (i, e) in elements.enumerated() { map[ObjectIdentifier(e)] = i }
                positions = map
            }
            storage = .many(elements)
        }
        return true
    }

    /// Appends `element` and returns its position, without the duplicate check or a position map: for a set whose
    /// members keep their own positions (a channel's broadcast list, `LocalRegistry`), removed with `remove(at:)`.
    @inlinable public mutating func append(_ element: Element) -> Int {
        switch storage {
        case .none:
            storage = .one(element)
            return 0
        case .one(let first):
            storage = .many([first, element])
            return 1
        case .many(var elements):
            storage = .none  // the array's only reference is `elements` now: appending does not copy it
            elements.append(element)
            storage = .many(elements)
            return elements.count - 1
        }
    }

    /// Removes the member at `position` (of a set filled by `append`): the last member moves into its place and is
    /// returned, to be told its new position (nil when the last one was removed).
    @inlinable public mutating func remove(at position: Int) -> Element? {
        switch storage {
        case .none:
            preconditionFailure("SubscriberSet.remove(at: \(position)) on an empty set")
        case .one:
            precondition(position == 0, "SubscriberSet.remove(at: \(position)) out of range")
            storage = .none
            return nil
        case .many(var elements):
            storage = .none
            let last = elements.count - 1
            var moved: Element? = nil
            if position != last {
                elements[position] = elements[last]
                moved = elements[position]
            }
            elements.removeLast()
            if elements.count == 1 { storage = .one(elements[0]) } else { storage = .many(elements) }
            return moved
        }
    }

    /// Returns false when the element was not present.
    @discardableResult
    @inlinable public mutating func remove(_ element: Element) -> Bool {
        guard let index = index(of: element) else { return false }
        switch storage {
        case .none:
            return false
        case .one:
            storage = .none
        case .many(var elements):
            storage = .none
            positions?[ObjectIdentifier(element)] = nil
            let last = elements.count - 1
            if index != last {
                let moved = elements[last]
                elements[index] = moved
                positions?[ObjectIdentifier(moved)] = index
            }
            elements.removeLast()
            switch elements.count {
            case 0: positions = nil
            case 1: positions = nil; storage = .one(elements[0])  // back inline: the array is freed
            default: storage = .many(elements)
            }
        }
        return true
    }
}
