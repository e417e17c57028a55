/// A subscriber that remembers where a `LocalRegistry` keeps it in each channel's broadcast list. Only the registry
/// sets the positions; a subscriber is in the registry for exactly the channels it has a position for.
public protocol ChannelMember: AnyObject {
    /// Its position in channel `channel`'s list; nil when it is not subscribed to the channel.
    func channelPosition(_ channel: Int) -> Int?
    /// Records its position in channel `channel`'s list, or (nil) that it left the channel.
    func setChannelPosition(_ position: Int?, _ channel: Int)
}

/// Who is subscribed to what, for the connections of ONE event loop. Never shared between threads, so it needs
/// no locks: a publish reaches every loop and each loop looks up only its own connections.
///
/// Two indexes: by (channel, account) for account events, and by channel for broadcasts. Each subscriber also
/// keeps its own channel set, so a disconnect costs time in proportion to that connection's subscriptions only.
public struct LocalRegistry<Subscriber: ChannelMember> {
    @usableFromInline var byAccount: [SubscriptionKey: SubscriberSet<Subscriber>] = [:]
    /// Per channel, every subscriber, each of which keeps its own position in the list (`ChannelMember`): no
    /// position map, whose probes into a table of every connection were the largest user-space item of a
    /// connection's set-up and close natively.
    @usableFromInline var byChannel: [SubscriberSet<Subscriber>]

    @inlinable public init(channelCount: Int) {
        byChannel = Array(repeating: SubscriberSet(), count: channelCount)
    }

    /// Subscribes; returns false when it was already subscribed.
    @discardableResult
    @inlinable public mutating func subscribe(_ subscriber: Subscriber, account: AccountID, channel: Int) -> Bool {
        guard subscriber.channelPosition(channel) == nil else { return false }
        subscriber.setChannelPosition(byChannel[channel].append(subscriber), channel)
        byAccount[SubscriptionKey(channel: channel, account: account), default: SubscriberSet()].insert(subscriber)
        return true
    }

    /// Unsubscribes; returns false when it was not subscribed.
    @discardableResult
    @inlinable public mutating func unsubscribe(_ subscriber: Subscriber, account: AccountID, channel: Int) -> Bool {
        guard let recorded = subscriber.channelPosition(channel) else { return false }
        let position = locate(subscriber, channel: channel, recorded: recorded)
        subscriber.setChannelPosition(nil, channel)
        guard let position else { return false }
        if let moved = byChannel[channel].remove(at: position) { moved.setChannelPosition(position, channel) }
        let key = SubscriptionKey(channel: channel, account: account)
        if var set = byAccount.removeValue(forKey: key) {
            set.remove(subscriber)
            if !set.isEmpty { byAccount[key] = set }
        }
        return true
    }

    /// Where `subscriber` is in channel `channel`'s list: its recorded position, which is the truth; a scan backs
    /// it up should it ever not be (a test build's assert says so). Not mutating: the list is not held across the
    /// removal that follows, which would make that copy the array.
    @inlinable func locate(_ subscriber: Subscriber, channel: Int, recorded: Int) -> Int? {
        let members = byChannel[channel]
        if recorded < members.count && members[recorded] === subscriber { return recorded }
        assertionFailure("channel \(channel): a subscriber's recorded position \(recorded) is stale")
        return members.firstIndex { $0 === subscriber }
    }

    /// The subscribers an event for `account` on `channel` goes to (empty when none): exactly that account's
    /// connections that subscribed to that channel, and no one else.
    @inlinable public func subscribers(channel: Int, account: AccountID) -> SubscriberSet<Subscriber> {
        byAccount[SubscriptionKey(channel: channel, account: account)] ?? SubscriberSet()
    }

    /// Every subscriber of a channel, for broadcasts.
    @inlinable public func subscribers(channel: Int) -> SubscriberSet<Subscriber> { byChannel[channel] }

    @inlinable public func subscriberCount(channel: Int) -> Int { byChannel[channel].count }

    /// Subscriber counts per account on one channel (admin views; not a hot path).
    @inlinable public func accountCounts(channel: Int) -> [AccountID: Int] {
        var result: [AccountID: Int] = [:]
        for (key, set) in byAccount where key.channel == channel { result[key.account] = set.count }
        return result
    }

    @inlinable public var totalSubscriptions: Int { byChannel.reduce(0) { $0 + $1.count } }
}
