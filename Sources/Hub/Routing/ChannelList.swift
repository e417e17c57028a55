/// A connection's subscribed channels (indices into the configured list) in subscribe order, each with the
/// connection's position in that channel's broadcast list in the loop's registry (`ChannelMember`, which lets the
/// registry drop a leaving connection from a channel of thousands without a lookup). Like an
/// `InlineList`, a lone entry is held inline and an array made from the second one on, but the empty inline slot is
/// a sentinel rather than an optional, so the list stays 16 bytes (an idle connection's memory; the connection
/// object must fit its malloc block, `EngineTCPTests`). The configured list is far shorter than Int32.max, and a
/// loop holds far fewer connections, so both numbers always fit.
@usableFromInline package struct ChannelList: RandomAccessCollection {
    @usableFromInline struct Entry: Sendable {
        @usableFromInline var channel: Int32
        @usableFromInline var position: Int32
        @usableFromInline static let none = Entry(channel: -1, position: -1)
        @inlinable init(channel: Int32, position: Int32) {
            self.channel = channel
            self.position = position
        }
    }
    /// The lone entry (`none` when there is none, or when `spill` holds them all).
    @usableFromInline var single = Entry.none
    /// Every entry, once a second one was added; empty otherwise.
    @usableFromInline var spill: [Entry] = []

    @inlinable package init() {}

    @inlinable package var startIndex: Int { 0 }
    @inlinable package var endIndex: Int { spill.isEmpty ? (single.channel < 0 ? 0 : 1) : spill.count }
    @inlinable package subscript(i: Int) -> Int { Int(entry(i).channel) }

    @inlinable func entry(_ i: Int) -> Entry {
        if spill.isEmpty {
            precondition(i == 0 && single.channel >= 0, "ChannelList index \(i) out of range")
            return single
        }
        return spill[i]
    }

    @inlinable func index(of channel: Int32) -> Int? {
        if spill.isEmpty { return single.channel == channel && channel >= 0 ? 0 : nil }
        return spill.firstIndex { $0.channel == channel }
    }

    /// The registry position recorded for `channel`; nil when the channel is not in the list.
    @inlinable package func position(of channel: Int) -> Int? {
        index(of: Int32(truncatingIfNeeded: channel)).map { Int(entry($0).position) }
    }

    /// Records `channel` at `position` (appended when new, updated when there), or removes it (nil).
    @inlinable mutating package func setPosition(_ position: Int?, of channel: Int) {
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
