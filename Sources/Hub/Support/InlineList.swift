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

/// A connection's subscribed channels (indices into the configured list) in subscribe order, each with the
/// connection's position in that channel's broadcast list in the loop's registry (`ChannelMember`, which lets the
/// registry drop a leaving connection from a channel of thousands without a lookup). Like an
/// `InlineList`, a lone entry is held inline and an array made from the second one on, but the empty inline slot is
/// a sentinel rather than an optional, so the list stays 16 bytes (an idle connection's memory; the connection
/// object must fit its malloc block, `EngineTCPTests`). The configured list is far shorter than Int32.max, and a
/// loop holds far fewer connections, so both numbers always fit.
struct ChannelList: RandomAccessCollection {
    private struct Entry {
        var channel: Int32
        var position: Int32
        static let none = Entry(channel: -1, position: -1)
    }
    /// The lone entry (`none` when there is none, or when `spill` holds them all).
    private var single = Entry.none
    /// Every entry, once a second one was added; empty otherwise.
    private var spill: [Entry] = []

    init() {}

    var startIndex: Int { 0 }
    var endIndex: Int { spill.isEmpty ? (single.channel < 0 ? 0 : 1) : spill.count }
    subscript(i: Int) -> Int { Int(entry(i).channel) }

    private func entry(_ i: Int) -> Entry {
        if spill.isEmpty {
            precondition(i == 0 && single.channel >= 0, "ChannelList index \(i) out of range")
            return single
        }
        return spill[i]
    }

    private func index(of channel: Int32) -> Int? {
        if spill.isEmpty { return single.channel == channel && channel >= 0 ? 0 : nil }
        return spill.firstIndex { $0.channel == channel }
    }

    /// The registry position recorded for `channel`; nil when the channel is not in the list.
    func position(of channel: Int) -> Int? {
        index(of: Int32(truncatingIfNeeded: channel)).map { Int(entry($0).position) }
    }

    /// Records `channel` at `position` (appended when new, updated when there), or removes it (nil).
    mutating func setPosition(_ position: Int?, of channel: Int) {
        let key = Int32(truncatingIfNeeded: channel)
        let found = index(of: key)
        guard let position else {
            guard let found else { return }
            if spill.isEmpty {
                single = .none
            } else {
                spill.remove(at: found)
                if spill.count == 1 { single = spill[0]; spill = [] }  // back inline: the array is freed
            }
            return
        }
        let entry = Entry(channel: key, position: Int32(truncatingIfNeeded: position))
        switch (found, spill.isEmpty) {
        case (let i?, false): spill[i] = entry
        case (_?, true): single = entry
        case (nil, true) where single.channel < 0: single = entry
        case (nil, true): spill = [single, entry]; single = .none
        case (nil, false): spill.append(entry)
        }
    }

}
