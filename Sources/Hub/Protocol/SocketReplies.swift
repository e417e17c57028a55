import HubJSON
import HubRouting

/// Reply lines of the Unix-socket protocol (docs/PROTOCOL.md section 2). Each function writes one JSON object
/// followed by `\n` into the writer (appending: several replies may be batched into one buffer for one write).
/// The echoed `id`, when given, is the last member.
public enum SocketReplies {
    /// `{"ok":true,"seq":N,"delivered":M,"id":...}\n`, with `"duplicate":true` after `delivered` for a repeated
    /// idempotency key.
    public static func published(seq: UInt64, delivered: Int, duplicate: Bool = false, id: RawJSON?, into w: inout JSONWriter) {
        w.beginObject()
        w.field("ok", true)
        w.field("seq", seq)
        w.field("delivered", delivered)
        if duplicate { w.field("duplicate", true) }
        writeID(id, into: &w)
        w.endObject()
        w.newline()
    }

    /// `{"ok":false,"error":{"code":...,"message":...},"id":...}\n`
    public static func error(code: SocketErrorCode, message: String, id: RawJSON?, into w: inout JSONWriter) {
        w.beginObject()
        w.field("ok", false)
        w.key("error")
        w.beginObject()
        w.field("code", code.rawValue)
        w.field("message", message)
        w.endObject()
        writeID(id, into: &w)
        w.endObject()
        w.newline()
    }

    public static func error(_ e: SocketRequestError, into w: inout JSONWriter) {
        error(code: e.code, message: e.message, id: e.id, into: &w)
    }

    /// The `LINE_TOO_LONG` reply (no `id`: the line was not read).
    public static func lineTooLong(maxLineBytes: Int, into w: inout JSONWriter) {
        error(code: .lineTooLong, message: "line longer than \(maxLineBytes) bytes", id: nil, into: &w)
    }

    /// `{"ok":true,"disconnected":N,"id":...}\n`
    public static func disconnected(_ count: Int, id: RawJSON?, into w: inout JSONWriter) {
        w.beginObject()
        w.field("ok", true)
        w.field("disconnected", count)
        writeID(id, into: &w)
        w.endObject()
        w.newline()
    }

    /// The tail acknowledgement `{"ok":true,"tailing":"wallet_updates","id":...}\n`
    public static func tailing(channel: String, id: RawJSON?, into w: inout JSONWriter) {
        w.beginObject()
        w.field("ok", true)
        w.field("tailing", channel)
        writeID(id, into: &w)
        w.endObject()
        w.newline()
    }

    /// One tail line:
    /// `{"event":{"type":T,"channel":C,"account":A,"broadcast":B,"seq":N,"delivered":M,"at":S,"data":<raw>}}\n`
    /// (`account` is `null` for a broadcast; `data` is passed through byte for byte). In cluster mode `"node":ID`
    /// (the node the event was published on) comes before `data`.
    public static func tailEvent(type: String, channel: String, account: String?, seq: UInt64, delivered: Int,
                                 at: Double, node: String? = nil, data: UnsafeRawBufferPointer, into w: inout JSONWriter) {
        w.beginObject()
        w.key("event")
        w.beginObject()
        w.field("type", type)
        w.field("channel", channel)
        w.key("account")
        if let account { w.string(account) } else { w.null() }
        w.field("broadcast", account == nil)
        w.field("seq", seq)
        w.field("delivered", delivered)
        w.field("at", at)
        if let node { w.field("node", node) }
        w.key("data")
        w.raw(data)
        w.endObject()
        w.endObject()
        w.newline()
    }

    /// A cluster tail's note that a node did not forward some events (over its per-second allowance):
    /// `{"skipped":{"node":ID,"channel":C,"events":N,"perSecond":L}}\n`.
    public static func tailSkipped(node: String, channel: String, events: Int, perSecond: Int, into w: inout JSONWriter) {
        w.beginObject()
        w.key("skipped")
        w.beginObject()
        w.field("node", node)
        w.field("channel", channel)
        w.field("events", events)
        w.field("perSecond", perSecond)
        w.endObject()
        w.endObject()
        w.newline()
    }

    /// Starts an `{"ok":true,...` admin reply; write the fields, then call `finishOK`.
    public static func beginOK(into w: inout JSONWriter) {
        w.beginObject()
        w.field("ok", true)
    }

    /// Ends an admin reply begun with `beginOK`, echoing `id`.
    public static func finishOK(id: RawJSON?, into w: inout JSONWriter) {
        writeID(id, into: &w)
        w.endObject()
        w.newline()
    }

    @inline(__always)
    static func writeID(_ id: RawJSON?, into w: inout JSONWriter) {
        if let id {
            w.key("id")
            w.raw(id.text)
        }
    }
}
