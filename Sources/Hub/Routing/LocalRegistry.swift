/// Who is subscribed to what, for the connections of ONE event loop. Never shared between threads, so it needs
/// no locks: a publish reaches every loop and each loop looks up only its own connections.
///
/// Two indexes: by (channel, account) for account events, and by channel for broadcasts. Each subscriber also
/// keeps its own channel set, so a disconnect costs time in proportion to that connection's subscriptions only.
public struct LocalRegistry<Subscriber: AnyObject> {
    private var byAccount: [SubscriptionKey: SubscriberSet<Subscriber>] = [:]
    private var byChannel: [SubscriberSet<Subscriber>]

    public init(channelCount: Int) {
        byChannel = Array(repeating: SubscriberSet(), count: channelCount)
    }

    /// Subscribes; returns false when it was already subscribed.
    @discardableResult
    public mutating func subscribe(_ subscriber: Subscriber, account: AccountID, channel: Int) -> Bool {
        guard byChannel[channel].insert(subscriber) else { return false }
        byAccount[SubscriptionKey(channel: channel, account: account), default: SubscriberSet()].insert(subscriber)
        return true
    }

    /// Unsubscribes; returns false when it was not subscribed.
    @discardableResult
    public mutating func unsubscribe(_ subscriber: Subscriber, account: AccountID, channel: Int) -> Bool {
        guard byChannel[channel].remove(subscriber) else { return false }
        let key = SubscriptionKey(channel: channel, account: account)
        if var set = byAccount.removeValue(forKey: key) {
            set.remove(subscriber)
            if !set.isEmpty { byAccount[key] = set }
        }
        return true
    }

    /// The subscribers an event for `account` on `channel` goes to (empty when none): exactly that account's
    /// connections that subscribed to that channel, and no one else.
    public func subscribers(channel: Int, account: AccountID) -> SubscriberSet<Subscriber> {
        byAccount[SubscriptionKey(channel: channel, account: account)] ?? SubscriberSet()
    }

    /// Every subscriber of a channel, for broadcasts.
    public func subscribers(channel: Int) -> SubscriberSet<Subscriber> { byChannel[channel] }

    public func subscriberCount(channel: Int) -> Int { byChannel[channel].count }

    /// Subscriber counts per account on one channel (admin views; not a hot path).
    public func accountCounts(channel: Int) -> [AccountID: Int] {
        var result: [AccountID: Int] = [:]
        for (key, set) in byAccount where key.channel == channel { result[key.account] = set.count }
        return result
    }

    public var totalSubscriptions: Int { byChannel.reduce(0) { $0 + $1.count } }
}
