/// An unordered set of subscribers stored contiguously, so a fan-out walks an array, with O(1) insert and remove
/// (swap-remove, positions tracked by object identity).
///
/// Loop-bound: only the loop that owns the subscribers touches it.
public struct SubscriberSet<Element: AnyObject> {
    public private(set) var elements: [Element] = []
    private var positions: [ObjectIdentifier: Int] = [:]

    public init() {}

    public var count: Int { elements.count }
    public var isEmpty: Bool { elements.isEmpty }

    public func contains(_ element: Element) -> Bool { positions[ObjectIdentifier(element)] != nil }

    /// Returns false when the element was already present.
    @discardableResult
    public mutating func insert(_ element: Element) -> Bool {
        let id = ObjectIdentifier(element)
        guard positions[id] == nil else { return false }
        positions[id] = elements.count
        elements.append(element)
        return true
    }

    /// Returns false when the element was not present.
    @discardableResult
    public mutating func remove(_ element: Element) -> Bool {
        guard let index = positions.removeValue(forKey: ObjectIdentifier(element)) else { return false }
        let last = elements.count - 1
        if index != last {
            let moved = elements[last]
            elements[index] = moved
            positions[ObjectIdentifier(moved)] = index
        }
        elements.removeLast()
        return true
    }
}
