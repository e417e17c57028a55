/// A strict RFC 8259 validator and tokenizer that builds no DOM.
///
/// The scanner works over borrowed bytes (`UnsafeRawBufferPointer`). Callers walk the members of a top-level
/// object (`JSONScanner.forEachMember(in:_:)`) and get, for each member, the key and the value as
/// `JSONValue`s: a kind and an exact byte range into the scanned bytes. Nested values are fully validated
/// (UTF-8, escapes, numbers, depth). Nothing is allocated on the success path.
///
/// Ranges are offsets into the scanned buffer: they stay meaningful only as long as the caller keeps the bytes.

/// The kind of a JSON value.
public enum JSONKind: UInt8, Sendable, Hashable {
    case object, array, string, number, `true`, `false`, null
}

/// One scanned JSON value: its kind and its exact bytes (for a string, including the quotes).
public struct JSONValue: Sendable, Hashable {
    public var kind: JSONKind
    /// The value's bytes in the scanned buffer (strings include their quotes).
    public var range: Range<Int>
    /// Strings only: whether the string contains a backslash escape (and so needs decoding).
    public var hasEscapes: Bool
    /// Numbers only: whether the number has a fraction or an exponent.
    public var isFractional: Bool

    @inlinable
    public init(kind: JSONKind, range: Range<Int>, hasEscapes: Bool = false, isFractional: Bool = false) {
        self.kind = kind
        self.range = range
        self.hasEscapes = hasEscapes
        self.isFractional = isFractional
    }

    /// Strings only: the bytes between the quotes (still escaped when `hasEscapes`).
    @inlinable public var stringContent: Range<Int> { (range.lowerBound + 1)..<(range.upperBound - 1) }

    /// Whether this is a string whose decoded value equals `literal`; allocates nothing when the string has
    /// no escapes.
    @inlinable @inline(__always)
    public func stringEquals(_ literal: StaticString, in bytes: UnsafeRawBufferPointer) -> Bool {
        guard kind == .string else { return false }
        if hasEscapes { return JSONScanner.decodeString(self, in: bytes) == literal.description }
        let content = stringContent
        let n = literal.utf8CodeUnitCount
        guard content.count == n else { return false }
        if n == 0 { return true }
        let a = bytes.baseAddress! + content.lowerBound  // n > 0 bytes of content lie in `bytes`: it is not empty
        return memcmpBytes(a, UnsafeRawPointer(literal.utf8Start), n)
    }

    /// For a string of 1 to 8 bytes without escapes: its bytes packed little-endian into a UInt64 (first byte
    /// lowest), so a key can be matched with one integer comparison (`JSONValue.pack("op")`); 0 otherwise.
    @inlinable @inline(__always)
    public func packed(in bytes: UnsafeRawBufferPointer) -> UInt64 {
        let n = range.count &- 2
        guard kind == .string, !hasEscapes, n >= 1, n <= 8, let base = bytes.baseAddress else { return 0 }
        let start = range.lowerBound &+ 1
        if start &+ 8 <= bytes.count {
            let word = UInt64(littleEndian: base.loadUnaligned(fromByteOffset: start, as: UInt64.self))
            return n == 8 ? word : word & ((1 &<< UInt64(n &* 8)) &- 1)
        }
        var v: UInt64 = 0
        for i in 0..<n { v |= UInt64(base.load(fromByteOffset: start &+ i, as: UInt8.self)) &<< UInt64(i &* 8) }
        return v
    }

    /// `packed(in:)` of a literal (1 to 8 ASCII bytes).
    public static func pack(_ s: StaticString) -> UInt64 {
        var v: UInt64 = 0
        for i in 0..<min(s.utf8CodeUnitCount, 8) { v |= UInt64(s.utf8Start[i]) << UInt64(i * 8) }
        return v
    }

    /// The value's raw bytes in `bytes`.
    @inlinable
    public func slice(of bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(rebasing: bytes[range])
    }
}

@inlinable @inline(__always)
func memcmpBytes(_ a: UnsafeRawPointer, _ b: UnsafeRawPointer, _ n: Int) -> Bool {
    var i = 0
    while i &+ 8 <= n {
        if a.loadUnaligned(fromByteOffset: i, as: UInt64.self) != b.loadUnaligned(fromByteOffset: i, as: UInt64.self) {
            return false
        }
        i &+= 8
    }
    while i < n {
        if a.load(fromByteOffset: i, as: UInt8.self) != b.load(fromByteOffset: i, as: UInt8.self) { return false }
        i &+= 1
    }
    return true
}

/// A JSON syntax error: where (byte offset from the start of the document, 0-based) and why.
public struct JSONError: Error, Sendable, Hashable, CustomStringConvertible {
    public var offset: Int
    public var reason: String

    public init(offset: Int, reason: String) {
        self.offset = offset
        self.reason = reason
    }

    /// The reason `forEachMember(in:)` gives for a valid document that is not an object.
    public static let notAnObject = "expected a JSON object"

    /// Whether the document was valid JSON but not an object.
    public var isNotAnObject: Bool { reason == JSONError.notAnObject }

    /// "invalid JSON at byte 17: expected ':'"
    public var description: String { "invalid JSON at byte \(offset): \(reason)" }
}

public struct JSONScanner {
    /// The default nesting limit (objects and arrays).
    public static let defaultMaxDepth = 64

    @usableFromInline let bytes: UnsafeRawBufferPointer
    @usableFromInline let end: Int
    @usableFromInline let maxDepth: Int
    @usableFromInline var pos: Int

    @usableFromInline
    init(_ bytes: UnsafeRawBufferPointer, maxDepth: Int) {
        self.bytes = bytes
        self.end = bytes.count
        self.maxDepth = maxDepth
        self.pos = 0
    }

    // MARK: Entry points

    /// Validates a whole document (any top-level value) and returns the top-level value.
    public static func validate(_ bytes: UnsafeRawBufferPointer,
                                maxDepth: Int = defaultMaxDepth) throws(JSONError) -> JSONValue {
        var s = JSONScanner(bytes, maxDepth: maxDepth)
        s.skipWhitespace()
        let v = try s.parseValue(depth: 0)
        try s.expectEnd()
        return v
    }

    /// Validates a whole document that must be an object, calling `body(key, value)` for each top-level member
    /// in order. `body` may be called before a later syntax error is found: callers must only record what they
    /// see and act on it after this returns. A valid document that is not an object throws
    /// "expected a JSON object" at the value's offset.
    public static func forEachMember(in bytes: UnsafeRawBufferPointer, maxDepth: Int = defaultMaxDepth,
                                     _ body: (JSONValue, JSONValue) -> Void) throws(JSONError) {
        var s = JSONScanner(bytes, maxDepth: maxDepth)
        s.skipWhitespace()
        let start = s.pos
        if s.pos < s.end && s.bytes[s.pos] == UInt8(ascii: "{") {
            _ = try s.parseObject(depth: 0, visitor: body)
            try s.expectEnd()
        } else {
            _ = try s.parseValue(depth: 0)
            try s.expectEnd()
            throw JSONError(offset: start, reason: JSONError.notAnObject)
        }
    }

    /// Calls `body(key, value)` for each member of an already validated object value.
    public static func forEachMember(of object: JSONValue, in bytes: UnsafeRawBufferPointer,
                                     _ body: (JSONValue, JSONValue) -> Void) throws(JSONError) {
        guard object.kind == .object else { throw JSONError(offset: object.range.lowerBound, reason: "expected an object") }
        var s = JSONScanner(bytes, maxDepth: Int.max)
        s.pos = object.range.lowerBound
        _ = try s.parseObject(depth: 0, visitor: body)
    }

    /// Calls `body(element)` for each element of an already validated array value.
    public static func forEachElement(of array: JSONValue, in bytes: UnsafeRawBufferPointer,
                                      _ body: (JSONValue) -> Void) throws(JSONError) {
        guard array.kind == .array else { throw JSONError(offset: array.range.lowerBound, reason: "expected an array") }
        var s = JSONScanner(bytes, maxDepth: Int.max)
        s.pos = array.range.lowerBound
        _ = try s.parseArray(depth: 0, visitor: body)
    }

    // MARK: Value helpers

    /// Decodes a validated string value. Allocates only for the resulting `String` (none for short strings).
    public static func decodeString(_ value: JSONValue, in bytes: UnsafeRawBufferPointer) -> String {
        let content = UnsafeRawBufferPointer(rebasing: bytes[value.stringContent])
        if !value.hasEscapes {
            return String(unsafeUninitializedCapacity: content.count) { buffer in
                UnsafeMutableRawBufferPointer(buffer).copyMemory(from: content)
                return content.count
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(content.count)
        decodeEscapes(content, into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends the decoded UTF-8 bytes of a validated string value to `out`.
    public static func decodeString(_ value: JSONValue, in bytes: UnsafeRawBufferPointer, into out: inout [UInt8]) {
        let content = UnsafeRawBufferPointer(rebasing: bytes[value.stringContent])
        if !value.hasEscapes { out.append(contentsOf: content); return }
        decodeEscapes(content, into: &out)
    }

    /// The decoded UTF-8 length of a validated string value (no allocation).
    public static func decodedStringLength(_ value: JSONValue, in bytes: UnsafeRawBufferPointer) -> Int {
        if !value.hasEscapes { return value.range.count - 2 }
        var n = 0
        let c = UnsafeRawBufferPointer(rebasing: bytes[value.stringContent])
        var i = 0
        while i < c.count {
            let b = c[i]
            if b != UInt8(ascii: "\\") { n += 1; i += 1; continue }
            let e = c[i + 1]
            if e != UInt8(ascii: "u") { n += 1; i += 2; continue }
            let u = hex4(c, i + 2)
            i += 6
            if u >= 0xD800 && u <= 0xDBFF { n += 4; i += 6 } else { n += u < 0x80 ? 1 : (u < 0x800 ? 2 : 3) }
        }
        return n
    }

    /// The value of an integer number (no fraction, no exponent) if it fits in Int64; nil otherwise.
    public static func int64(_ value: JSONValue, in bytes: UnsafeRawBufferPointer) -> Int64? {
        guard value.kind == .number, !value.isFractional else { return nil }
        var i = value.range.lowerBound
        let end = value.range.upperBound
        var negative = false
        if bytes[i] == UInt8(ascii: "-") { negative = true; i += 1 }
        // Accumulate negatively so that Int64.min fits.
        var acc: Int64 = 0
        while i < end {
            let d = Int64(bytes[i] &- 0x30)
            let (m, o1) = acc.multipliedReportingOverflow(by: 10)
            let (s, o2) = m.subtractingReportingOverflow(d)
            if o1 || o2 { return nil }
            acc = s
            i += 1
        }
        if negative { return acc }
        let (r, o) = Int64(0).subtractingReportingOverflow(acc)
        return o ? nil : r
    }

    static func hex4(_ c: UnsafeRawBufferPointer, _ at: Int) -> UInt32 {
        var v: UInt32 = 0
        for k in 0..<4 { v = v << 4 | UInt32(hexValue(c[at + k])) }
        return v
    }

    @inline(__always)
    package static func hexValue(_ b: UInt8) -> UInt8 {
        switch b {
        case 0x30...0x39: return b - 0x30
        case 0x41...0x46: return b - 0x41 + 10
        case 0x61...0x66: return b - 0x61 + 10
        default: return 0xFF
        }
    }

    static func decodeEscapes(_ c: UnsafeRawBufferPointer, into out: inout [UInt8]) {
        var i = 0
        while i < c.count {
            let b = c[i]
            if b != UInt8(ascii: "\\") { out.append(b); i += 1; continue }
            let e = c[i + 1]
            i += 2
            switch e {
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var u = hex4(c, i)
                i += 4
                if u >= 0xD800 && u <= 0xDBFF {
                    let lo = hex4(c, i + 2)
                    i += 6
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00)
                }
                appendUTF8(u, to: &out)
            default: out.append(e) // '"', '\\', '/'
            }
        }
    }

    static func appendUTF8(_ u: UInt32, to out: inout [UInt8]) {
        if u < 0x80 {
            out.append(UInt8(u))
        } else if u < 0x800 {
            out.append(UInt8(0xC0 | (u >> 6)))
            out.append(UInt8(0x80 | (u & 0x3F)))
        } else if u < 0x10000 {
            out.append(UInt8(0xE0 | (u >> 12)))
            out.append(UInt8(0x80 | ((u >> 6) & 0x3F)))
            out.append(UInt8(0x80 | (u & 0x3F)))
        } else {
            out.append(UInt8(0xF0 | (u >> 18)))
            out.append(UInt8(0x80 | ((u >> 12) & 0x3F)))
            out.append(UInt8(0x80 | ((u >> 6) & 0x3F)))
            out.append(UInt8(0x80 | (u & 0x3F)))
        }
    }

    // MARK: Grammar

    @inline(__always)
    mutating func skipWhitespace() {
        while pos < end {
            switch bytes[pos] {
            case 0x20, 0x0A, 0x0D, 0x09: pos &+= 1
            default: return
            }
        }
    }

    mutating func expectEnd() throws(JSONError) {
        skipWhitespace()
        if pos != end { throw JSONError(offset: pos, reason: "unexpected data after the top-level value") }
    }

    @inline(__always)
    func fail(_ reason: String) -> JSONError {
        JSONError(offset: pos, reason: pos >= end ? "unexpected end of input" : reason)
    }

    /// Parses a value at `pos` (whitespace already skipped). `depth` is the nesting of the enclosing containers.
    mutating func parseValue(depth: Int) throws(JSONError) -> JSONValue {
        guard pos < end else { throw fail("") }
        switch bytes[pos] {
        case UInt8(ascii: "{"): return try parseObject(depth: depth, visitor: { _, _ in })
        case UInt8(ascii: "["): return try parseArray(depth: depth, visitor: { _ in })
        case UInt8(ascii: "\""): return try parseString()
        case UInt8(ascii: "-"), 0x30...0x39: return try parseNumber()
        case UInt8(ascii: "t"): return try parseLiteral("true", .true)
        case UInt8(ascii: "f"): return try parseLiteral("false", .false)
        case UInt8(ascii: "n"): return try parseLiteral("null", .null)
        default: throw fail("expected a value")
        }
    }

    mutating func parseLiteral(_ word: StaticString, _ kind: JSONKind) throws(JSONError) -> JSONValue {
        let start = pos
        let n = word.utf8CodeUnitCount
        let w = word.utf8Start
        for k in 0..<n {
            guard pos < end, bytes[pos] == w[k] else { throw fail("invalid literal") }
            pos &+= 1
        }
        return JSONValue(kind: kind, range: start..<pos)
    }

    mutating func parseObject(depth: Int, visitor: (JSONValue, JSONValue) -> Void) throws(JSONError) -> JSONValue {
        let start = pos
        if depth >= maxDepth { throw JSONError(offset: pos, reason: "nesting deeper than \(maxDepth) levels") }
        pos &+= 1 // '{'
        skipWhitespace()
        if pos < end && bytes[pos] == UInt8(ascii: "}") {
            pos &+= 1
            return JSONValue(kind: .object, range: start..<pos)
        }
        while true {
            guard pos < end, bytes[pos] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
            let key = try parseString()
            skipWhitespace()
            guard pos < end, bytes[pos] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            pos &+= 1
            skipWhitespace()
            let value = try parseValue(depth: depth + 1)
            visitor(key, value)
            if try endOfItem(closer: UInt8(ascii: "}")) { return JSONValue(kind: .object, range: start..<pos) }
        }
    }

    mutating func parseArray(depth: Int, visitor: (JSONValue) -> Void) throws(JSONError) -> JSONValue {
        let start = pos
        if depth >= maxDepth { throw JSONError(offset: pos, reason: "nesting deeper than \(maxDepth) levels") }
        pos &+= 1 // '['
        skipWhitespace()
        if pos < end && bytes[pos] == UInt8(ascii: "]") {
            pos &+= 1
            return JSONValue(kind: .array, range: start..<pos)
        }
        while true {
            let value = try parseValue(depth: depth + 1)
            visitor(value)
            if try endOfItem(closer: UInt8(ascii: "]")) { return JSONValue(kind: .array, range: start..<pos) }
        }
    }

    /// After a member or element: consumes `,` and returns false (another must follow), or consumes the closing
    /// bracket and returns true.
    @inline(__always)
    mutating func endOfItem(closer: UInt8) throws(JSONError) -> Bool {
        skipWhitespace()
        guard pos < end else { throw fail("") }
        let b = bytes[pos]
        if b == UInt8(ascii: ",") {
            pos &+= 1
            skipWhitespace()
            if pos < end && bytes[pos] == closer { throw fail("trailing comma") }
            return false
        }
        if b == closer {
            pos &+= 1
            return true
        }
        throw fail(closer == UInt8(ascii: "}") ? "expected ',' or '}'" : "expected ',' or ']'")
    }

    mutating func parseNumber() throws(JSONError) -> JSONValue {
        let start = pos
        var fractional = false
        if bytes[pos] == UInt8(ascii: "-") { pos &+= 1 }
        guard pos < end else { throw fail("") }
        let first = bytes[pos]
        if first == UInt8(ascii: "0") {
            pos &+= 1
            if pos < end && isDigit(bytes[pos]) { throw fail("leading zeros are not allowed") }
        } else if isDigit(first) {
            pos &+= 1
            while pos < end && isDigit(bytes[pos]) { pos &+= 1 }
        } else {
            throw fail("expected a digit")
        }
        if pos < end && bytes[pos] == UInt8(ascii: ".") {
            fractional = true
            pos &+= 1
            guard pos < end, isDigit(bytes[pos]) else { throw fail("expected a digit") }
            while pos < end && isDigit(bytes[pos]) { pos &+= 1 }
        }
        if pos < end && (bytes[pos] | 0x20) == UInt8(ascii: "e") {
            fractional = true
            pos &+= 1
            if pos < end && (bytes[pos] == UInt8(ascii: "+") || bytes[pos] == UInt8(ascii: "-")) { pos &+= 1 }
            guard pos < end, isDigit(bytes[pos]) else { throw fail("expected a digit") }
            while pos < end && isDigit(bytes[pos]) { pos &+= 1 }
        }
        return JSONValue(kind: .number, range: start..<pos, isFractional: fractional)
    }

    @inline(__always)
    func isDigit(_ b: UInt8) -> Bool { b &- 0x30 < 10 }

    @inline(__always)
    func isContinuation(_ i: Int) -> Bool { i < end && bytes[i] & 0xC0 == 0x80 }

    @inline(__always)
    mutating func parseString() throws(JSONError) -> JSONValue {
        let start = pos
        pos &+= 1 // opening quote
        var escapes = false
        while true {
            pos = skipPlainASCII(from: pos)
            guard pos < end else { throw fail("") }
            let b = bytes[pos]
            if b == UInt8(ascii: "\"") {
                pos &+= 1
                return JSONValue(kind: .string, range: start..<pos, hasEscapes: escapes)
            }
            if b == UInt8(ascii: "\\") {
                escapes = true
                try parseEscape()
            } else if b < 0x20 {
                throw fail("control character in string")
            } else {
                try parseUTF8Sequence(b)
            }
        }
    }

    /// The index of the first byte at or after `from` that is not printable ASCII other than `"` and `\`
    /// (or `end`). Eight bytes at a time (SWAR), then byte by byte.
    @inline(__always)
    func skipPlainASCII(from: Int) -> Int {
        var p = from
        let end = self.end
        guard let base = bytes.baseAddress else { return p }
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        while p &+ 8 <= end {
            let x = UInt64(littleEndian: base.loadUnaligned(fromByteOffset: p, as: UInt64.self))
            let quote = x ^ (ones &* 0x22)
            let backslash = x ^ (ones &* 0x5C)
            let mask = ((x &- ones &* 0x20) | (quote &- ones) | (backslash &- ones)) & ~x & highs
                | (x & highs)
            // Note: `~x` also masks out bytes >= 0x80, which the `x & highs` term reports anyway.
            if mask != 0 { return p &+ (mask.trailingZeroBitCount &>> 3) }
            p &+= 8
        }
        while p < end {
            let b = base.load(fromByteOffset: p, as: UInt8.self)
            if b < 0x20 || b >= 0x80 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") { return p }
            p &+= 1
        }
        return p
    }

    mutating func parseEscape() throws(JSONError) {
        let escStart = pos
        pos &+= 1
        guard pos < end else { throw fail("") }
        switch bytes[pos] {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
             UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
            pos &+= 1
        case UInt8(ascii: "u"):
            pos &+= 1
            let u = try parseHex4()
            if u >= 0xDC00 && u <= 0xDFFF {
                throw JSONError(offset: escStart, reason: "lone surrogate")
            }
            if u >= 0xD800 && u <= 0xDBFF {
                guard pos + 1 < end, bytes[pos] == UInt8(ascii: "\\"), bytes[pos + 1] == UInt8(ascii: "u") else {
                    throw JSONError(offset: escStart, reason: "lone surrogate")
                }
                pos &+= 2
                let lo = try parseHex4()
                guard lo >= 0xDC00 && lo <= 0xDFFF else { throw JSONError(offset: escStart, reason: "lone surrogate") }
            }
        default:
            throw fail("invalid escape")
        }
    }

    mutating func parseHex4() throws(JSONError) -> UInt32 {
        var v: UInt32 = 0
        for _ in 0..<4 {
            guard pos < end else { throw fail("") }
            let h = JSONScanner.hexValue(bytes[pos])
            guard h != 0xFF else { throw fail("invalid \\u escape") }
            v = v << 4 | UInt32(h)
            pos &+= 1
        }
        return v
    }

    /// Validates one multi-byte UTF-8 sequence starting with `lead` at `pos` (RFC 3629: no overlong forms, no
    /// surrogates, nothing above U+10FFFF).
    mutating func parseUTF8Sequence(_ lead: UInt8) throws(JSONError) {
        let p = pos
        var ok = false
        var len = 0
        switch lead {
        case 0xC2...0xDF:
            len = 2; ok = isContinuation(p + 1)
        case 0xE0:
            len = 3; ok = p + 1 < end && (0xA0...0xBF).contains(bytes[p + 1]) && isContinuation(p + 2)
        case 0xE1...0xEC, 0xEE, 0xEF:
            len = 3; ok = isContinuation(p + 1) && isContinuation(p + 2)
        case 0xED:
            len = 3; ok = p + 1 < end && (0x80...0x9F).contains(bytes[p + 1]) && isContinuation(p + 2)
        case 0xF0:
            len = 4; ok = p + 1 < end && (0x90...0xBF).contains(bytes[p + 1]) && isContinuation(p + 2) && isContinuation(p + 3)
        case 0xF1...0xF3:
            len = 4; ok = isContinuation(p + 1) && isContinuation(p + 2) && isContinuation(p + 3)
        case 0xF4:
            len = 4; ok = p + 1 < end && (0x80...0x8F).contains(bytes[p + 1]) && isContinuation(p + 2) && isContinuation(p + 3)
        default:
            ok = false
        }
        guard ok else { throw JSONError(offset: p, reason: "invalid UTF-8") }
        pos &+= len
    }
}
