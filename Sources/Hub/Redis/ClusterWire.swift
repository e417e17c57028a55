/// The bytes one node hands another through Redis: an event as the history keeps it, and a fan-out message (an
/// event with its stream, epoch and seq). Every field but the last is length-prefixed, so no byte of an id (an
/// account may hold any character, a newline included) can end a field early or start another: the format has no
/// separator to forge.
///
/// - Event:   `TYPELEN ":" TYPE WALLMS ":" DATA`
/// - Message: `EPOCHLEN ":" EPOCH SEQ ":" IDLEN ":" ID EVENT`
///
/// Numbers are decimal without leading zeros (a canonical form: a decoded message re-encodes to the same bytes),
/// at most 19 digits. The publish script writes messages in Lua with the same layout (`RedisStreams.publishScript`).
/// A node reads only this format: every node of a cluster must run a version that writes it (docs/OPERATIONS.md).
enum ClusterWire {
    /// A decoded event: its parts are ranges of the bytes it was decoded from.
    struct Event: Equatable {
        var type: Range<Int>
        var wallMillis: UInt64
        var data: Range<Int>
    }

    /// A decoded fan-out message; `event` is an encoded event (decode it with `event(_:in:)`).
    struct Message: Equatable {
        var epoch: Range<Int>
        var seq: UInt64
        var streamID: Range<Int>
        var event: Range<Int>
    }

    // MARK: Encoding

    static func appendEvent(type: some Collection<UInt8>, wallMillis: UInt64, data: some Collection<UInt8>, to out: inout [UInt8]) {
        appendField(type, to: &out)
        appendNumber(wallMillis, to: &out)
        out.append(colon)
        out.append(contentsOf: data)
    }

    static func appendMessage(epoch: some Collection<UInt8>, seq: UInt64, streamID: some Collection<UInt8>,
                              event: some Collection<UInt8>, to out: inout [UInt8]) {
        appendField(epoch, to: &out)
        appendNumber(seq, to: &out)
        out.append(colon)
        appendField(streamID, to: &out)
        out.append(contentsOf: event)
    }

    private static let colon = UInt8(ascii: ":")

    private static func appendField(_ bytes: some Collection<UInt8>, to out: inout [UInt8]) {
        appendNumber(UInt64(bytes.count), to: &out)
        out.append(colon)
        out.append(contentsOf: bytes)
    }

    private static func appendNumber(_ n: UInt64, to out: inout [UInt8]) {
        out.append(contentsOf: String(n).utf8)
    }

    // MARK: Decoding

    /// The event in `bytes[range]`, or nil when it is not one.
    static func event(_ range: Range<Int>, in bytes: UnsafeRawBufferPointer) -> Event? {
        var at = range.lowerBound
        guard range.upperBound <= bytes.count,
              let type = field(&at, end: range.upperBound, in: bytes),
              let wall = number(&at, end: range.upperBound, in: bytes) else { return nil }
        return Event(type: type, wallMillis: wall, data: at..<range.upperBound)
    }

    /// The message in `bytes`, or nil when it is not one (its event is not checked: `event(_:in:)`).
    static func message(_ bytes: UnsafeRawBufferPointer) -> Message? {
        var at = 0
        let end = bytes.count
        guard let epoch = field(&at, end: end, in: bytes),
              let seq = number(&at, end: end, in: bytes),
              let id = field(&at, end: end, in: bytes) else { return nil }
        return Message(epoch: epoch, seq: seq, streamID: id, event: at..<end)
    }

    /// `LEN ":" BYTES`: the bytes' range.
    private static func field(_ at: inout Int, end: Int, in bytes: UnsafeRawBufferPointer) -> Range<Int>? {
        guard let length = number(&at, end: end, in: bytes), length <= UInt64(end - at) else { return nil }
        let start = at
        at += Int(length)
        return start..<at
    }

    /// `DIGITS ":"`, canonical: no leading zero (but "0"), at most 19 digits (below 10^19 < 2^64).
    private static func number(_ at: inout Int, end: Int, in bytes: UnsafeRawBufferPointer) -> UInt64? {
        var value: UInt64 = 0
        var digits = 0
        var i = at
        while i < end, digits <= 19 {
            let b = bytes[i]
            if b == colon {
                guard digits > 0, digits == 1 || bytes[at] != UInt8(ascii: "0") else { return nil }
                at = i + 1
                return value
            }
            guard b >= UInt8(ascii: "0"), b <= UInt8(ascii: "9"), digits < 19 else { return nil }
            value = value * 10 + UInt64(b - UInt8(ascii: "0"))
            digits += 1
            i += 1
        }
        return nil
    }
}
