import HubJSON

/// Builds an event's WebSocket-ready payload once, to be shared by all its recipients (docs/PROTOCOL.md 1.3):
///
///     {"type":T,"channel":C,"seq":N,"data":<raw>}
///     {"type":T,"channel":C,"seq":N,"broadcast":true,"data":<raw>}
///
/// The buffer starts with `headroom` spare bytes so the server can write the frame header in place just before
/// the payload (a server frame header is at most 10 bytes: no mask).
public enum EventEncoding {
    /// The largest server-to-client frame header (2 + 8 bytes of extended length, no mask).
    public static let defaultHeadroom = 10

    /// The exact payload size (without headroom). `type` and `channel` are the unescaped strings.
    public static func payloadSize(type: String, channel: String, seq: UInt64, broadcast: Bool, dataCount: Int) -> Int {
        // {"type":  "  ","channel":  "  ,"seq":  ,"data":  }
        var n = 8 + 2 + 11 + 2 + 7 + 8 + 1
        n += escapedCount(type) + escapedCount(channel) + decimalDigits(seq) + dataCount
        if broadcast { n += 17 } // ,"broadcast":true
        return n
    }

    /// The size of the whole frame (header + payload) for a payload of `payloadCount` bytes.
    public static func framedSize(payloadCount: Int) -> Int {
        payloadCount + (payloadCount < 126 ? 2 : (payloadCount <= 0xFFFF ? 4 : 10))
    }

    /// Encodes the event into a new buffer of exactly `headroom + payload` bytes (one allocation) and returns it
    /// with the offset at which the payload starts (`headroom`). Bytes before it are zero.
    /// `data` is valid JSON passed through byte for byte; nil writes `null`.
    public static func encode(type: String, channel: String, seq: UInt64, broadcast: Bool,
                              data: UnsafeRawBufferPointer?, headroom: Int = defaultHeadroom)
        -> (buffer: [UInt8], payloadStart: Int) {
        let dataCount = data?.count ?? 4
        let size = headroom + payloadSize(type: type, channel: channel, seq: seq, broadcast: broadcast,
                                          dataCount: dataCount)
        var w = JSONWriter(capacity: size)
        w.write(upTo: headroom) { _ in headroom } // zeros
        w.beginObject()
        w.field("type", type)
        w.field("channel", channel)
        w.field("seq", seq)
        if broadcast { w.field("broadcast", true) }
        w.key("data" as StaticString)
        if let data { w.raw(data) } else { w.null() }
        w.endObject()
        let buffer = w.takeBytes()
        return (buffer, headroom)
    }

    public static func encode(type: String, channel: String, seq: UInt64, broadcast: Bool,
                              data: [UInt8], headroom: Int = defaultHeadroom) -> (buffer: [UInt8], payloadStart: Int) {
        data.withUnsafeBytes {
            encode(type: type, channel: channel, seq: seq, broadcast: broadcast, data: $0, headroom: headroom)
        }
    }

    static func decimalDigits(_ v: UInt64) -> Int {
        var d = 1
        var t = v
        while t >= 10 { t /= 10; d += 1 }
        return d
    }

    /// Bytes `JSONWriter.string` writes between the quotes.
    static func escapedCount(_ s: String) -> Int { JSONWriter.escapedLength(s) }
}
