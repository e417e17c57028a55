/// An unordered set of subscribers stored contiguously, so a fan-out walks an array, with O(1) insert and remove.
///
/// Most sets are tiny (one account's connections on one channel: usually 1 to 3), so up to `smallLimit` members
/// are found by a linear scan of the array and no position map exists: an idle subscribed connection costs one
/// array slot here, not a hash table. Past that (a broadcast channel with thousands of subscribers) positions
/// are tracked by object identity and removal is a swap-remove.
///
/// Loop-bound: only the loop that owns the subscribers touches it.
public struct SubscriberSet<Element: AnyObject> {
    public private(set) var elements: [Element] = []
    private var positions: [ObjectIdentifier: Int]? = nil
    static var smallLimit: Int { 16 }

    public init() {}

    public var count: Int { elements.count }
    public var isEmpty: Bool { elements.isEmpty }

    private func index(of element: Element) -> Int? {
        if let positions { return positions[ObjectIdentifier(element)] }
        return elements.firstIndex { $0 === element }
    }

    public func contains(_ element: Element) -> Bool { index(of: element) != nil }

    /// Returns false when the element was already present.
    @discardableResult
    public mutating func insert(_ element: Element) -> Bool {
        guard index(of: element) == nil else { return false }
        positions?[ObjectIdentifier(element)] = elements.count
        elements.append(element)
        if positions == nil && elements.count > Self.smallLimit {
            var map: [ObjectIdentifier: Int] = [:]
            map.reserveCapacity(elements.count * 2)
            for (i, e) in elements.enumerated() { map[ObjectIdentifier(e)] = i }
            positions = map
        }
        return true
    }

    /// Returns false when the element was not present.
    @discardableResult
    public mutating func remove(_ element: Element) -> Bool {
        guard let index = index(of: element) else { return false }
        positions?[ObjectIdentifier(element)] = nil
        let last = elements.count - 1
        if index != last {
            let moved = elements[last]
            elements[index] = moved
            positions?[ObjectIdentifier(moved)] = index
        }
        elements.removeLast()
        if elements.isEmpty { positions = nil }
        return true
    }
}
