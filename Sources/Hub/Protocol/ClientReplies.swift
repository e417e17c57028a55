import HubJSON

/// Encoders for the hub's replies to clients (docs/PROTOCOL.md sections 1.2 and 1.3). Each writes one complete
/// JSON object into the writer (after `reset()` by the caller when reusing it); field order follows the doc.
public enum ClientReplies {
    /// A channel's epoch as the app sees it: `<hub epoch>.<account stream epoch>.<broadcast stream epoch>` (the
    /// local broker's stream epochs are generation numbers; the Redis broker's are the streams' epochs in Redis).
    /// Opaque to the app; it changes when either stream's numbering may have restarted. Kept as its parts: the
    /// reply writes them joined without building the text.
    public struct ChannelEpoch: Sendable, Equatable {
        public var hub: String
        public var account: String
        public var broadcast: String
        public init(hub: String, account: String, broadcast: String) {
            self.hub = hub
            self.account = account
            self.broadcast = broadcast
        }
        /// The epoch as the app sees it (and sends back in `since`).
        public var text: String { "\(hub).\(account).\(broadcast)" }
        func write(into w: inout JSONWriter) { w.string(joining: hub, account, broadcast, separator: ".") }
    }

    /// A channel's position in a `subscribed` reply.
    public struct ChannelPosition: Sendable, Equatable {
        public var channel: String
        public var epoch: ChannelEpoch
        /// The last seq of the account's stream and of the channel's broadcast stream when the subscription took
        /// effect: every later event arrives live.
        public var seq: UInt64
        public var broadcastSeq: UInt64
        /// Only for channels named in `since`: nil, or whether every missed event was replayed (and if not, why).
        public var recovered: Bool?
        public var reason: String?

        public init(channel: String, epoch: ChannelEpoch, seq: UInt64, broadcastSeq: UInt64, recovered: Bool? = nil, reason: String? = nil) {
            self.channel = channel
            self.epoch = epoch
            self.seq = seq
            self.broadcastSeq = broadcastSeq
            self.recovered = recovered
            self.reason = reason
        }
    }

    /// `{"type":"subscribed","channels":[...],"positions":{"c":{"epoch":…,"seq":…,"broadcastSeq":…}},"id":...}`
    /// (`recovered`, and `reason` when false, for the channels the subscribe named in `since`).
    public static func subscribed(channels: [String], positions: [ChannelPosition] = [], id: RawJSON?, into w: inout JSONWriter) {
        w.beginObject()
        w.field("type", "subscribed")
        w.key("channels")
        w.beginArray()
        for c in channels { w.string(c) }
        w.endArray()
        if !positions.isEmpty {
            w.key("positions")
            w.beginObject()
            for p in positions {
                w.key(p.channel)
                w.beginObject()
                w.key("epoch")
                p.epoch.write(into: &w)
                w.field("seq", p.seq)
                w.field("broadcastSeq", p.broadcastSeq)
                if let recovered = p.recovered { w.field("recovered", recovered) }
                if let reason = p.reason { w.field("reason", reason) }
                w.endObject()
            }
            w.endObject()
        }
        writeID(id, into: &w)
        w.endObject()
    }

    /// `{"type":"unsubscribed","channels":[...],"id":...}`
    public static func unsubscribed(channels: [String], id: RawJSON?, into w: inout JSONWriter) {
        channelsReply("unsubscribed", channels: channels, id: id, into: &w)
    }

    /// `{"type":"authenticated","expiresAt":N,"id":...}` (`expiresAt` in Unix seconds)
    public static func authenticated(expiresAt: Int64, id: RawJSON?, into w: inout JSONWriter) {
        w.beginObject()
        w.field("type", "authenticated")
        w.field("expiresAt", expiresAt)
        writeID(id, into: &w)
        w.endObject()
    }

    /// `{"type":"pong","id":...}`
    public static func pong(id: RawJSON?, into w: inout JSONWriter) {
        w.beginObject()
        w.field("type", "pong")
        writeID(id, into: &w)
        w.endObject()
    }

    /// `{"type":"token_expiring","expiresIn":N}` (seconds)
    public static func tokenExpiring(expiresIn: Int64, into w: inout JSONWriter) {
        w.beginObject()
        w.field("type", "token_expiring")
        w.field("expiresIn", expiresIn)
        w.endObject()
    }

    /// `{"type":"error","id":...,"error":{"code":...,"message":...,"details":{...}}}`
    public static func error(code: String, message: String, details: ClientErrorDetails? = nil, id: RawJSON?,
                             into w: inout JSONWriter) {
        w.beginObject()
        w.field("type", "error")
        writeID(id, into: &w)
        w.key("error")
        w.beginObject()
        w.field("code", code)
        w.field("message", message)
        if let details {
            w.key("details")
            w.beginObject()
            switch details {
            case .unknownChannels(let names):
                w.key("unknownChannels")
                w.beginArray()
                for n in names { w.string(n) }
                w.endArray()
            case .retryAfter(let seconds):
                w.field("retryAfter", seconds)
            }
            w.endObject()
        }
        w.endObject()
        w.endObject()
    }

    public static func error(_ e: ClientProtocolError, into w: inout JSONWriter) {
        error(code: e.code, message: e.message, details: e.details, id: e.id, into: &w)
    }

    static func channelsReply(_ type: StaticString, channels: [String], id: RawJSON?, into w: inout JSONWriter) {
        w.beginObject()
        w.field("type", type)
        w.key("channels")
        w.beginArray()
        for c in channels { w.string(c) }
        w.endArray()
        writeID(id, into: &w)
        w.endObject()
    }

    @inline(__always)
    static func writeID(_ id: RawJSON?, into w: inout JSONWriter) {
        if let id {
            w.key("id")
            w.raw(id.text)
        }
    }
}
