/// Limits and role for a ``MessageReader``.
///
/// Defaults suit an event hub whose clients send small messages: 1 MiB per frame and per message
/// (after decompression). A single frame is never larger than a message, so the effective frame
/// limit is `min(maxFrameSize, maxMessageSize)`.
public struct MessageReaderConfiguration: Sendable, Hashable {
    /// `.server` when this end is the server (incoming frames must be masked).
    public var role: Role
    /// Largest accepted frame payload in bytes (1009 above it). Default 1 MiB.
    public var maxFrameSize: Int
    /// Largest accepted message in bytes, counted before appending each fragment, and the limit
    /// handed to the decompressor for inflated output (1009 above it). Default 1 MiB.
    public var maxMessageSize: Int

    public static let defaultMaxFrameSize = 1 << 20
    public static let defaultMaxMessageSize = 1 << 20

    public init(role: Role, maxFrameSize: Int = defaultMaxFrameSize, maxMessageSize: Int = defaultMaxMessageSize) {
        precondition(maxFrameSize >= 125 && maxMessageSize >= 0, "limits too small")
        self.role = role
        self.maxFrameSize = maxFrameSize
        self.maxMessageSize = maxMessageSize
    }
}
