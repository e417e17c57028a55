/// An ordered list that holds a lone element inline and makes an array only from the second one on; back to none
/// when emptied (unless asked to keep the array's buffer). For per-connection lists that usually hold one element
/// (an idle connection's outbound chunks, its subscribed channels): one element costs no allocation.
struct InlineList<Element>: RandomAccessCollection {
    private var single: Element?
    /// Holds every element (and `single` is nil) once a second one was appended; empty otherwise.
    private var spill: [Element] = []

    init() {}

    var startIndex: Int { 0 }
    var endIndex: Int { spill.isEmpty ? (single == nil ? 0 : 1) : spill.count }
    /// The array's capacity (0 while nothing spilled).
    var spillCapacity: Int { spill.capacity }

    subscript(i: Int) -> Element {
        if spill.isEmpty, i == 0, let single { return single }
        return spill[i]
    }

    mutating func append(_ element: Element) {
        if spill.isEmpty {
            guard let first = single else { single = element; return }
            single = nil
            spill.append(first)
        }
        spill.append(element)
    }

    mutating func removeAll(keepingCapacity: Bool = false) {
        single = nil
        spill.removeAll(keepingCapacity: keepingCapacity)
    }

    /// Drops the first `n` elements.
    mutating func removeFirst(_ n: Int) {
        if spill.isEmpty {
            if n > 0 { single = nil }
        } else {
            spill.removeFirst(n)
            collapse()
        }
    }

    mutating func remove(at i: Int) {
        if spill.isEmpty {
            precondition(i == 0 && single != nil, "InlineList index \(i) out of range")
            single = nil
        } else {
            spill.remove(at: i)
            collapse()
        }
    }

    mutating func removeAll(where shouldRemove: (Element) -> Bool) {
        if spill.isEmpty {
            if let element = single, shouldRemove(element) { single = nil }
        } else {
            spill.removeAll(where: shouldRemove)
            collapse()
        }
    }

    /// Back inline when one element is left in the array, and the array freed (also when none is left).
    private mutating func collapse() {
        switch spill.count {
        case 0: spill = []
        case 1: single = spill[0]; spill = []
        default: break
        }
    }
}
