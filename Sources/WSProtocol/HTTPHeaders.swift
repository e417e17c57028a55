/// The header fields of an HTTP/1.1 message head, in wire order.
///
/// Names keep the spelling the peer sent; every lookup compares names ASCII case-insensitively
/// (RFC 9110 section 5.1). Repeated fields are kept as separate entries.
///
/// The fields are kept as bytes: every name and value back to back in one buffer, and where each one is in a
/// second. A request head costs the parser those two allocations, whatever it holds; a `String` is made only for
/// a value a caller asks for as one (`values`, `subscript(first:)`, `entries`). Before, every name and value was
/// a `String` of its own, most of them on the heap, each validated as UTF-8 on the way in (set-up cost).
/// Values are kept as sent, obs-text included; the `String` accessors decode them as UTF-8, repairing invalid
/// sequences to U+FFFD.
public struct HTTPHeaders: Sendable {
    /// One header field as it appeared on the wire (value trimmed of surrounding whitespace).
    public struct Entry: Sendable, Equatable {
        public var name: String
        public var value: String
        public init(name: String, value: String) { self.name = name; self.value = value }
    }

    /// Where one field is in `bytes`: its name is `start..<nameEnd`, its value `nameEnd..<end`.
    private struct Field: Sendable {
        var start: Int
        var nameEnd: Int
        var end: Int
    }

    private var bytes: [UInt8] = []
    private var fields: [Field] = []

    public init() {}
    public init(_ pairs: [(String, String)]) {
        for (name, value) in pairs { add(name: name, value: value) }
    }

    public var count: Int { fields.count }

    /// Every field, names and values as `String`s (made on each call).
    public var entries: [Entry] {
        fields.map { Entry(name: string(bytes[$0.start..<$0.nameEnd]), value: string(bytes[$0.nameEnd..<$0.end])) }
    }

    public mutating func add(name: String, value: String) {
        reserveOnFirstAdd()
        let start = bytes.count
        bytes.append(contentsOf: name.utf8)
        let nameEnd = bytes.count
        bytes.append(contentsOf: value.utf8)
        fields.append(Field(start: start, nameEnd: nameEnd, end: bytes.count))
    }

    /// A field from the parser (its read buffer or its line buffer).
    mutating func add(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        reserveOnFirstAdd()
        let start = bytes.count
        bytes.append(contentsOf: name)
        let nameEnd = bytes.count
        bytes.append(contentsOf: value)
        fields.append(Field(start: start, nameEnd: nameEnd, end: bytes.count))
    }

    private mutating func reserveOnFirstAdd() {
        // A request head has a handful of fields and a few hundred bytes: one allocation each for most heads
        // instead of one per doubling.
        guard fields.capacity == 0 else { return }
        fields.reserveCapacity(16)
        bytes.reserveCapacity(512)
    }

    private func string(_ slice: ArraySlice<UInt8>) -> String { String(decoding: slice, as: UTF8.self) }

    /// Calls `body` with every field called `name`, in wire order, until it returns false.
    private func forEach(named name: String, _ body: (Field) -> Bool) {
        guard !fields.isEmpty else { return }
        let found: Void? = name.utf8.withContiguousStorageIfAvailable { wanted in
            forEach(named: wanted, body)
        }
        if found == nil { Array(name.utf8).withUnsafeBufferPointer { forEach(named: $0, body) } }
    }

    private func forEach(named wanted: UnsafeBufferPointer<UInt8>, _ body: (Field) -> Bool) {
        bytes.withUnsafeBufferPointer { all in
            for field in fields
            where HTTPHeaders.equalsIgnoringCase(UnsafeBufferPointer(rebasing: all[field.start..<field.nameEnd]), wanted) {
                if !body(field) { return }
            }
        }
    }

    /// How many fields are called `name`.
    public func count(of name: String) -> Int {
        var n = 0
        forEach(named: name) { _ in n += 1; return true }
        return n
    }

    /// The value of the first field called `name` as sent, without making a `String`; nil when there is none.
    public func firstValueBytes(_ name: String) -> ArraySlice<UInt8>? {
        var found: ArraySlice<UInt8>? = nil
        forEach(named: name) { field in
            found = bytes[field.nameEnd..<field.end]
            return false
        }
        return found
    }

    /// The value of the first field called `name`, if any.
    public subscript(first name: String) -> String? {
        firstValueBytes(name).map(string)
    }

    /// Every value of the fields called `name`, in wire order.
    public func values(_ name: String) -> [String] {
        var result: [String] = []
        forEach(named: name) { field in
            result.append(string(bytes[field.nameEnd..<field.end]))
            return true
        }
        return result
    }

    /// The comma-separated list elements of every field called `name` (RFC 9110 section 5.6.1):
    /// trimmed, lowercased, empty elements skipped. Not for values that may contain quoted strings.
    public func tokens(_ name: String) -> [String] {
        rawTokens(name).map { $0.lowercased() }
    }

    /// Like ``tokens(_:)`` but keeps the case (subprotocol names are case-sensitive).
    func rawTokens(_ name: String) -> [String] {
        var result: [String] = []
        forEachElement(named: name) { lo, hi in
            result.append(string(bytes[lo..<hi]))
        }
        return result
    }

    /// Calls `body` with the bounds in `bytes` of every non-empty list element (trimmed of OWS) of the fields
    /// called `name`.
    private func forEachElement(named name: String, _ body: (Int, Int) -> Void) {
        forEach(named: name) { field in
            var i = field.nameEnd
            while i < field.end {
                var end = i
                while end < field.end && bytes[end] != UInt8(ascii: ",") { end += 1 }
                var lo = i, hi = end
                while lo < hi && (bytes[lo] == 0x20 || bytes[lo] == 0x09) { lo += 1 }
                while hi > lo && (bytes[hi - 1] == 0x20 || bytes[hi - 1] == 0x09) { hi -= 1 }
                if lo < hi { body(lo, hi) }
                i = end + 1
            }
            return true
        }
    }

    /// The list elements of the fields called `name` compared with `expected` (lowercase ASCII), ASCII
    /// case-insensitively, without building the list (`tokens(_:)` allocates a `String` per element; the upgrade
    /// checks run per handshake). `.contains`: some element equals it; `.only`: there is exactly one element and
    /// it equals it. Elements are compared as bytes: a non-ASCII look-alike (`K`, U+212A, which `lowercased()`
    /// turns into `k`) is not the ASCII token.
    public enum TokenMatch { case contains, only }
    public func hasToken(_ name: String, _ expected: StaticString, _ match: TokenMatch) -> Bool {
        var elements = 0
        var found = false
        forEachElement(named: name) { lo, hi in
            elements += 1
            guard hi - lo == expected.utf8CodeUnitCount else { return }
            for k in 0..<(hi - lo) where HTTPHeaders.lowerASCII(bytes[lo + k]) != expected.utf8Start[k] { return }
            found = true
        }
        switch match {
        case .contains: return found
        case .only: return found && elements == 1
        }
    }

    /// ASCII case-insensitive comparison (header names are ASCII tokens).
    static func equalsIgnoringCase(_ a: String, _ b: String) -> Bool {
        // O(1) for native strings, and most names looked up differ in length from most names present.
        guard a.utf8.count == b.utf8.count else { return false }
        // Both contiguous (native and small strings are): compare the bytes in place. The views' generic iterators
        // cost ~10 instructions a byte, and the upgrade looks up a dozen names among every field.
        let compared = a.utf8.withContiguousStorageIfAvailable { x in
            b.utf8.withContiguousStorageIfAvailable { y in equalsIgnoringCase(x, y) }
        }
        if let compared, let equal = compared { return equal }
        var ia = a.utf8.makeIterator(), ib = b.utf8.makeIterator()
        while true {
            switch (ia.next(), ib.next()) {
            case (nil, nil): return true
            case (let x?, let y?):
                if x != y && lowerASCII(x) != lowerASCII(y) { return false }
            default: return false
            }
        }
    }

    /// ASCII case-insensitive comparison of two byte strings.
    @inline(__always) static func equalsIgnoringCase(_ x: UnsafeBufferPointer<UInt8>, _ y: UnsafeBufferPointer<UInt8>) -> Bool {
        guard x.count == y.count else { return false }
        for k in 0..<x.count where x[k] != y[k] && lowerASCII(x[k]) != lowerASCII(y[k]) { return false }
        return true
    }

    @inline(__always) static func lowerASCII(_ b: UInt8) -> UInt8 { (b >= 0x41 && b <= 0x5A) ? b | 0x20 : b }

    /// RFC 9110 `tchar`.
    @inline(__always) static func isTokenChar(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"), UInt8(ascii: "'"),
             UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^"), UInt8(ascii: "_"),
             UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            return true
        default:
            return false
        }
    }

    static func isToken(_ s: String) -> Bool { !s.isEmpty && s.utf8.allSatisfy(isTokenChar) }
}
