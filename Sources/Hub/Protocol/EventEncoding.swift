import HubJSON

/// The size of an event's frame before it is numbered (the publish intake refuses one past the frame limit). The
/// event itself is framed by `LocalBroker.frame` (docs/PROTOCOL.md 1.3):
///
///     {"type":T,"channel":C,"seq":N,"data":<raw>}
///     {"type":T,"channel":C,"seq":N,"broadcast":true,"data":<raw>}
public enum EventEncoding {
    /// The exact payload size (the JSON above). `type` and `channel` are the unescaped strings.
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

    static func decimalDigits(_ v: UInt64) -> Int {
        var d = 1
        var t = v
        while t >= 10 { t /= 10; d += 1 }
        return d
    }

    /// Bytes `JSONWriter.string` writes between the quotes.
    static func escapedCount(_ s: String) -> Int { JSONWriter.escapedLength(s) }
}
