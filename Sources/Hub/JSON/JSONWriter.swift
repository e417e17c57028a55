/// An append-only JSON writer into a reusable `[UInt8]`.
///
/// Commas are automatic: after `beginObject`/`beginArray` nothing needs one, after a key nothing needs one,
/// after any value (including a closed container) the next key or value gets one. The writer does not check
/// that calls are well nested; callers write well-formed sequences (the tests parse the output back).
///
/// Keep one writer per thread or connection and call `reset()`: the buffer keeps its capacity, so writing a
/// reply allocates nothing once the buffer has grown to the size of the largest reply.
public struct JSONWriter: Sendable {
    public var bytes: [UInt8]
    @usableFromInline var needsComma = false

    public init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// Writes into `buffer` (emptied, capacity kept). Take it back with `bytes` when done.
    public init(reusing buffer: [UInt8]) {
        bytes = buffer
        bytes.removeAll(keepingCapacity: true)
    }

    /// Empties the buffer, keeping its capacity.
    @inlinable public mutating func reset() {
        bytes.removeAll(keepingCapacity: true)
        needsComma = false
    }

    @inlinable public var count: Int { bytes.count }

    @inlinable @inline(__always)
    mutating func comma() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
    }

    // MARK: Structure

    @inlinable public mutating func beginObject() {
        comma()
        bytes.append(UInt8(ascii: "{"))
        needsComma = false
    }

    @inlinable public mutating func endObject() {
        bytes.append(UInt8(ascii: "}"))
        needsComma = true
    }

    @inlinable public mutating func beginArray() {
        comma()
        bytes.append(UInt8(ascii: "["))
        needsComma = false
    }

    @inlinable public mutating func endArray() {
        bytes.append(UInt8(ascii: "]"))
        needsComma = true
    }

    /// Writes `"key":` for a key known to need no escaping (the protocol's own ASCII field names).
    @inlinable public mutating func key(_ key: StaticString) {
        comma()
        bytes.append(UInt8(ascii: "\""))
        appendStatic(key)
        bytes.append(UInt8(ascii: "\""))
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    /// Writes `"key":` escaping the key.
    public mutating func key(_ key: String) {
        string(key)
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    /// Appends a newline (for newline-delimited replies); resets the comma state.
    @inlinable public mutating func newline() {
        bytes.append(0x0A)
        needsComma = false
    }

    // MARK: Values

    @inlinable public mutating func null() {
        comma()
        appendStatic("null")
        needsComma = true
    }

    @inlinable public mutating func bool(_ value: Bool) {
        comma()
        if value { appendStatic("true") } else { appendStatic("false") }
        needsComma = true
    }

    /// A string literal known to need no escaping.
    @inlinable public mutating func string(_ value: StaticString) {
        comma()
        bytes.append(UInt8(ascii: "\""))
        appendStatic(value)
        bytes.append(UInt8(ascii: "\""))
        needsComma = true
    }

    public mutating func string(_ value: String) {
        var value = value
        value.withUTF8 { string(utf8: UnsafeRawBufferPointer($0)) }
    }

    /// A string given as valid UTF-8 bytes; escaped per RFC 8259 (`"`, `\`, control characters; `\u00XX` for
    /// controls without a short form). Non-ASCII is kept as is.
    public mutating func string(utf8: UnsafeRawBufferPointer) {
        comma()
        bytes.append(UInt8(ascii: "\""))
        appendEscaped(utf8)
        bytes.append(UInt8(ascii: "\""))
        needsComma = true
    }

    /// Writes pre-validated JSON (a whole value) as is.
    public mutating func raw(_ json: UnsafeRawBufferPointer) {
        comma()
        bytes.append(contentsOf: json)
        needsComma = true
    }

    public mutating func raw(_ json: [UInt8]) {
        comma()
        bytes.append(contentsOf: json)
        needsComma = true
    }

    public mutating func int(_ value: Int) { int(Int64(value)) }

    public mutating func int(_ value: Int64) {
        comma()
        if value < 0 {
            bytes.append(UInt8(ascii: "-"))
            appendDecimal(value.magnitude)
        } else {
            appendDecimal(UInt64(value))
        }
        needsComma = true
    }

    public mutating func uint(_ value: UInt64) {
        comma()
        appendDecimal(value)
        needsComma = true
    }

    /// A finite double in Swift's shortest round-trip form (valid JSON); non-finite values are written as
    /// `null`. For times and rates.
    public mutating func double(_ value: Double) {
        guard value.isFinite else { null(); return }
        comma()
        if value == value.rounded(), value.magnitude < 1e15 {
            // Integral: "12.0" rather than "12.0" via description (same), but without allocating.
            int64Digits(Int64(value))
            bytes.append(UInt8(ascii: "."))
            bytes.append(UInt8(ascii: "0"))
        } else {
            var s = value.description
            s.withUTF8 { bytes.append(contentsOf: $0) }
        }
        needsComma = true
    }

    // MARK: Field conveniences

    @inlinable public mutating func field(_ k: StaticString, _ v: StaticString) { key(k); string(v) }
    public mutating func field(_ k: StaticString, _ v: String) { key(k); string(v) }
    public mutating func field(_ k: StaticString, _ v: Int) { key(k); int(v) }
    public mutating func field(_ k: StaticString, _ v: Int64) { key(k); int(v) }
    public mutating func field(_ k: StaticString, _ v: UInt64) { key(k); uint(v) }
    public mutating func field(_ k: StaticString, _ v: Double) { key(k); double(v) }
    public mutating func field(_ k: StaticString, _ v: Bool) { key(k); bool(v) }

    // MARK: Internals

    @inlinable @inline(__always)
    mutating func appendStatic(_ s: StaticString) {
        bytes.append(contentsOf: UnsafeRawBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

    mutating func int64Digits(_ value: Int64) {
        if value < 0 { bytes.append(UInt8(ascii: "-")) }
        appendDecimal(value.magnitude)
    }

    /// Fast itoa: digits written in place, two at a time.
    mutating func appendDecimal(_ value: UInt64) {
        var digits = 1
        var t = value
        while t >= 10 { t /= 10; digits += 1 }
        let start = bytes.count
        bytes.append(contentsOf: repeatElement(UInt8(ascii: "0"), count: digits))
        bytes.withUnsafeMutableBufferPointer { buf in
            var i = start + digits
            var v = value
            while v >= 100 {
                let r = Int(v % 100)
                v /= 100
                i -= 2
                buf[i] = JSONWriter.digitPairs[r * 2]
                buf[i + 1] = JSONWriter.digitPairs[r * 2 + 1]
            }
            if v >= 10 {
                let r = Int(v)
                i -= 2
                buf[i] = JSONWriter.digitPairs[r * 2]
                buf[i + 1] = JSONWriter.digitPairs[r * 2 + 1]
            } else {
                i -= 1
                buf[i] = UInt8(truncatingIfNeeded: v) &+ 0x30
            }
        }
    }

    static let digitPairs: [UInt8] = {
        var t: [UInt8] = []
        t.reserveCapacity(200)
        for i in 0..<100 {
            t.append(UInt8(0x30 + i / 10))
            t.append(UInt8(0x30 + i % 10))
        }
        return t
    }()

    static let hexDigits: StaticString = "0123456789abcdef"

    mutating func appendEscaped(_ s: UnsafeRawBufferPointer) {
        var runStart = 0
        var i = 0
        let n = s.count
        while i < n {
            let b = s[i]
            if b >= 0x20 && b != UInt8(ascii: "\"") && b != UInt8(ascii: "\\") { i &+= 1; continue }
            if runStart < i { bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: s[runStart..<i])) }
            bytes.append(UInt8(ascii: "\\"))
            switch b {
            case UInt8(ascii: "\""): bytes.append(UInt8(ascii: "\""))
            case UInt8(ascii: "\\"): bytes.append(UInt8(ascii: "\\"))
            case 0x08: bytes.append(UInt8(ascii: "b"))
            case 0x0C: bytes.append(UInt8(ascii: "f"))
            case 0x0A: bytes.append(UInt8(ascii: "n"))
            case 0x0D: bytes.append(UInt8(ascii: "r"))
            case 0x09: bytes.append(UInt8(ascii: "t"))
            default:
                let hex = JSONWriter.hexDigits.utf8Start
                bytes.append(UInt8(ascii: "u"))
                bytes.append(UInt8(ascii: "0"))
                bytes.append(UInt8(ascii: "0"))
                bytes.append(hex[Int(b >> 4)])
                bytes.append(hex[Int(b & 0xF)])
            }
            i &+= 1
            runStart = i
        }
        if runStart < n { bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: s[runStart..<n])) }
    }
}
