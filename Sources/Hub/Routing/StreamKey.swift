/// One sequence stream: (channel, account) for account events, (channel, broadcast) for broadcasts.
/// `channel` is the index of the channel in the configured list, so keys hash a small integer and the account.
public struct StreamKey: Hashable, Sendable {
    public let channel: Int
    /// nil: the channel's broadcast stream.
    public let account: AccountID?

    @inlinable public init(channel: Int, account: AccountID?) {
        self.channel = channel
        self.account = account
    }
}

/// A subscription as a loop's registry files it: the account's own events on a channel.
/// Broadcasts are found through the channel alone.
public struct SubscriptionKey: Hashable, Sendable {
    public let channel: Int
    public let account: AccountID

    @inlinable public init(channel: Int, account: AccountID) {
        self.channel = channel
        self.account = account
    }
}
