import HubSupport

/// An append-only JSON writer into a reusable `[UInt8]`.
///
/// Commas are automatic: after `beginObject`/`beginArray` nothing needs one, after a key nothing needs one,
/// after any value (including a closed container) the next key or value gets one. The writer does not check
/// that calls are well nested; callers write well-formed sequences (the tests parse the output back).
///
/// Keep one writer per thread or connection and call `reset()`: the buffer keeps its capacity, so writing a
/// reply allocates nothing once the buffer has grown to the size of the largest reply.
public struct JSONWriter: Sendable {
    /// Backing store; its whole length is usable capacity, the first `count` bytes are written.
    @usableFromInline var storage: [UInt8]
    /// Bytes written so far.
    @usableFromInline var _count: Int = 0
    public var count: Int { _count }
    @usableFromInline var needsComma = false

    public init(capacity: Int = 256) {
        storage = []
        storage.appendZeros(Swift.max(capacity, 16))
    }

    /// Writes into `buffer`'s storage (its contents are discarded, its capacity kept).
    public init(reusing buffer: [UInt8]) {
        storage = buffer
        let cap = Swift.max(storage.capacity, 16)
        storage.removeAll(keepingCapacity: true)
        storage.appendZeros(cap)
    }

    /// Empties the writer, keeping its capacity.
    @inlinable public mutating func reset() {
        _count = 0
        needsComma = false
    }

    /// How many bytes fit before the storage grows.
    public var capacity: Int { storage.count }

    /// A copy of the written bytes (tests, cold paths). Hot paths use `withBytes` or `takeBytes`.
    public var bytes: [UInt8] { Array(storage[..<count]) }

    /// The written bytes, without copying, for the duration of `body`.
    @inlinable
    public func withBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        var result: Result<R, E>?
        storage.withUnsafeBytes { all in
            do throws(E) { result = .success(try body(UnsafeRawBufferPointer(rebasing: all[..<count]))) } catch {
                result = .failure(error)
            }
        }
        // withUnsafeBytes ran the closure exactly once, so `result` is set.
        return try result!.get()
    }

    /// Hands over the written bytes as an array (no copy; the writer starts over with empty storage).
    public mutating func takeBytes() -> [UInt8] {
        var out: [UInt8] = []
        swap(&out, &storage)
        out.removeLast(out.count - count)
        _count = 0
        needsComma = false
        return out // `storage` is now empty: the next write grows it.
    }

    /// Makes room for `n` more bytes and runs `body` with a pointer to the first free byte; `body` returns how
    /// many bytes it wrote (at most `n`).
    @inlinable @inline(__always)
    package mutating func write(upTo n: Int, _ body: (UnsafeMutablePointer<UInt8>) -> Int) {
        if count &+ n > storage.count { grow(minimum: count &+ n) }
        let c = count
        let written = storage.withUnsafeMutableBufferPointer { body($0.baseAddress.unsafelyUnwrapped + c) }
        _count = c &+ written
    }

    @usableFromInline
    mutating func grow(minimum: Int) {
        let newSize = Swift.max(minimum, storage.count &* 2, 64)
        storage.appendZeros(newSize - storage.count)
    }

    @inlinable @inline(__always)
    mutating func put(_ b: UInt8) {
        write(upTo: 1) { $0.pointee = b; return 1 }
    }

    @inlinable @inline(__always)
    mutating func comma() {
        if needsComma { put(UInt8(ascii: ",")) }
    }

    @inlinable @inline(__always)
    mutating func put(_ src: UnsafeRawBufferPointer) {
        let n = src.count
        guard n > 0 else { return }
        write(upTo: n) { dst in
            UnsafeMutableRawPointer(dst).copyMemory(from: src.baseAddress.unsafelyUnwrapped, byteCount: n)
            return n
        }
    }

    // MARK: Structure

    @inlinable public mutating func beginObject() {
        comma()
        put(UInt8(ascii: "{"))
        needsComma = false
    }

    @inlinable public mutating func endObject() {
        put(UInt8(ascii: "}"))
        needsComma = true
    }

    @inlinable public mutating func beginArray() {
        comma()
        put(UInt8(ascii: "["))
        needsComma = false
    }

    @inlinable public mutating func endArray() {
        put(UInt8(ascii: "]"))
        needsComma = true
    }

    /// Writes `"key":` for a key known to need no escaping (the protocol's own ASCII field names).
    @inlinable public mutating func key(_ key: StaticString) {
        // One capacity check for the whole token (`,"key":`) rather than one per byte or part: the writer's
        // storage is an array, and each check asks whether it is uniquely referenced.
        let n = key.utf8CodeUnitCount
        let comma = needsComma
        write(upTo: n &+ 4) { d in
            var i = 0
            if comma { d[0] = UInt8(ascii: ","); i = 1 }
            d[i] = UInt8(ascii: "\"")
            (d + (i &+ 1)).update(from: key.utf8Start, count: n)
            d[i &+ n &+ 1] = UInt8(ascii: "\"")
            d[i &+ n &+ 2] = UInt8(ascii: ":")
            return i &+ n &+ 3
        }
        needsComma = false
    }

    /// Writes `"key":` escaping the key.
    public mutating func key(_ key: String) {
        string(key)
        put(UInt8(ascii: ":"))
        needsComma = false
    }

    /// Appends a newline (for newline-delimited replies); resets the comma state.
    @inlinable public mutating func newline() {
        put(0x0A)
        needsComma = false
    }

    // MARK: Values

    @inlinable public mutating func null() { token("null") }

    @inlinable public mutating func bool(_ value: Bool) { token(value ? "true" : "false") }

    /// A string literal known to need no escaping.
    @inlinable public mutating func string(_ value: StaticString) { token(value, quoted: true) }

    /// A value given as literal bytes known to need no escaping (`null`, `true`; quoted: a string), with its comma,
    /// in one write.
    @inlinable @inline(__always)
    mutating func token(_ s: StaticString, quoted: Bool = false) {
        let n = s.utf8CodeUnitCount
        let comma = needsComma
        write(upTo: n &+ 3) { d in
            var i = 0
            if comma { d[0] = UInt8(ascii: ","); i = 1 }
            if quoted { d[i] = UInt8(ascii: "\""); i &+= 1 }
            (d + i).update(from: s.utf8Start, count: n)
            i &+= n
            if quoted { d[i] = UInt8(ascii: "\""); i &+= 1 }
            return i
        }
        needsComma = true
    }

    public mutating func string(_ value: String) {
        var value = value
        value.withUTF8 { string(utf8: UnsafeRawBufferPointer($0)) }
    }

    /// A string given as valid UTF-8 bytes; escaped per RFC 8259 (`"`, `\`, control characters; `\u00XX` for
    /// controls without a short form). Non-ASCII is kept as is.
    public mutating func string(utf8: UnsafeRawBufferPointer) {
        let n = utf8.count
        // The usual case, nothing to escape: the whole token (`,"value"`) in one write.
        if let base = utf8.baseAddress, JSONWriter.firstNeedingEscape(base, from: 0, count: n) == n {
            let comma = needsComma
            write(upTo: n &+ 3) { d in
                var i = 0
                if comma { d[0] = UInt8(ascii: ","); i = 1 }
                d[i] = UInt8(ascii: "\"")
                UnsafeMutableRawPointer(d + (i &+ 1)).copyMemory(from: base, byteCount: n)
                d[i &+ n &+ 1] = UInt8(ascii: "\"")
                return i &+ n &+ 2
            }
            needsComma = true
            return
        }
        comma()
        put(UInt8(ascii: "\""))
        appendEscaped(utf8)
        put(UInt8(ascii: "\""))
        needsComma = true
    }

    /// One string value made of `parts` joined by `separator` (each part escaped as by ``string(_:)-(String)``),
    /// without building the joined `String` (a channel's epoch, written for every channel of every `subscribe`).
    public mutating func string(joining a: String, _ b: String, _ c: String, separator: StaticString) {
        comma()
        put(UInt8(ascii: "\""))
        var a = a, b = b, c = c  // (no array of the parts: that would be an allocation)
        a.withUTF8 { appendEscaped(UnsafeRawBufferPointer($0)) }
        appendStatic(separator)
        b.withUTF8 { appendEscaped(UnsafeRawBufferPointer($0)) }
        appendStatic(separator)
        c.withUTF8 { appendEscaped(UnsafeRawBufferPointer($0)) }
        put(UInt8(ascii: "\""))
        needsComma = true
    }

    /// Writes pre-validated JSON (a whole value) as is.
    public mutating func raw(_ json: UnsafeRawBufferPointer) {
        comma()
        put(json)
        needsComma = true
    }

    public mutating func raw(_ json: [UInt8]) {
        json.withUnsafeBytes { raw($0) }
    }

    /// Pre-validated JSON held as a string (e.g. an echoed `id`).
    public mutating func raw(_ json: String) {
        var json = json
        json.withUTF8 { raw(UnsafeRawBufferPointer($0)) }
    }

    public mutating func int(_ value: Int) { int(Int64(value)) }

    public mutating func int(_ value: Int64) {
        if value < 0 {
            comma()
            put(UInt8(ascii: "-"))
            appendDecimal(value.magnitude)
        } else {
            appendDecimal(UInt64(value), comma: needsComma)
        }
        needsComma = true
    }

    public mutating func uint(_ value: UInt64) {
        appendDecimal(value, comma: needsComma)
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
            put(UInt8(ascii: "."))
            put(UInt8(ascii: "0"))
        } else {
            var s = value.description
            s.withUTF8 { put(UnsafeRawBufferPointer($0)) }
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
        put(UnsafeRawBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

    mutating func int64Digits(_ value: Int64) {
        if value < 0 { put(UInt8(ascii: "-")) }
        appendDecimal(value.magnitude)
    }

    /// Fast itoa: digits written in place, two at a time; `comma` puts a `,` before them in the same write.
    mutating func appendDecimal(_ value: UInt64, comma: Bool = false) {
        var digits = 1
        var t = value
        while t >= 10 { t /= 10; digits &+= 1 }
        let pairs = JSONWriter.digitPairs.utf8Start
        let lead = comma ? 1 : 0
        write(upTo: digits &+ lead) { start in
            start[0] = UInt8(ascii: ",")  // overwritten by the first digit when there is no comma
            let dst = start + lead
            var i = digits
            var v = value
            while v >= 100 {
                let r = Int(v % 100) &* 2
                v /= 100
                i &-= 2
                dst[i] = pairs[r]
                dst[i &+ 1] = pairs[r &+ 1]
            }
            if v >= 10 {
                let r = Int(v) &* 2
                dst[0] = pairs[r]
                dst[1] = pairs[r &+ 1]
            } else {
                dst[0] = UInt8(truncatingIfNeeded: v) &+ 0x30
            }
            return digits &+ lead
        }
    }

    static let digitPairs: StaticString = """
        00010203040506070809101112131415161718192021222324252627282930313233343536373839\
        40414243444546474849505152535455565758596061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899
        """

    static let hexDigits: StaticString = "0123456789abcdef"

    mutating func appendEscaped(_ s: UnsafeRawBufferPointer) {
        let n = s.count
        guard n > 0, let base = s.baseAddress else { return }
        var runStart = 0
        while true {
            let i = JSONWriter.firstNeedingEscape(base, from: runStart, count: n)
            if runStart < i { put(UnsafeRawBufferPointer(start: base + runStart, count: i &- runStart)) }
            if i == n { return }
            let b = base.load(fromByteOffset: i, as: UInt8.self)
            let short: UInt8
            switch b {
            case UInt8(ascii: "\""): short = UInt8(ascii: "\"")
            case UInt8(ascii: "\\"): short = UInt8(ascii: "\\")
            case 0x08: short = UInt8(ascii: "b")
            case 0x0C: short = UInt8(ascii: "f")
            case 0x0A: short = UInt8(ascii: "n")
            case 0x0D: short = UInt8(ascii: "r")
            case 0x09: short = UInt8(ascii: "t")
            default: short = 0
            }
            if short != 0 {
                write(upTo: 2) { d in d[0] = UInt8(ascii: "\\"); d[1] = short; return 2 }
            } else {
                let hex = JSONWriter.hexDigits.utf8Start
                write(upTo: 6) { d in
                    d[0] = UInt8(ascii: "\\"); d[1] = UInt8(ascii: "u"); d[2] = UInt8(ascii: "0"); d[3] = UInt8(ascii: "0")
                    d[4] = hex[Int(b >> 4)]; d[5] = hex[Int(b & 0xF)]
                    return 6
                }
            }
            runStart = i &+ 1
        }
    }

    /// The index of the first byte at or after `from` that JSON requires to be escaped (`"`, `\`, or below
    /// 0x20), or `count`. Eight bytes at a time (SWAR).
    @inline(__always)
    static func firstNeedingEscape(_ base: UnsafeRawPointer, from: Int, count n: Int) -> Int {
        var p = from
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        while p &+ 8 <= n {
            let x = UInt64(littleEndian: base.loadUnaligned(fromByteOffset: p, as: UInt64.self))
            // Bytes >= 0x80 are masked out by `~x` (a flagged lower byte may set bits above it: only the
            // lowest flag is used).
            let mask = ((x &- ones &* 0x20) | ((x ^ (ones &* 0x22)) &- ones) | ((x ^ (ones &* 0x5C)) &- ones)) & ~x & highs
            if mask != 0 { return p &+ (mask.trailingZeroBitCount &>> 3) }
            p &+= 8
        }
        while p < n {
            let b = base.load(fromByteOffset: p, as: UInt8.self)
            if b < 0x20 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") { return p }
            p &+= 1
        }
        return n
    }

    /// How many bytes `string(utf8:)` writes between the quotes.
    static func escapedLength(_ s: UnsafeRawBufferPointer) -> Int {
        let n = s.count
        guard n > 0, let base = s.baseAddress else { return 0 }
        var total = n
        var i = firstNeedingEscape(base, from: 0, count: n)
        while i < n {
            switch base.load(fromByteOffset: i, as: UInt8.self) {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), 0x08, 0x0C, 0x0A, 0x0D, 0x09: total &+= 1
            default: total &+= 5
            }
            i = firstNeedingEscape(base, from: i &+ 1, count: n)
        }
        return total
    }

    /// How many bytes `string(_:)` writes between the quotes.
    package static func escapedLength(_ s: String) -> Int {
        var s = s
        return s.withUTF8 { escapedLength(UnsafeRawBufferPointer($0)) }
    }
}
