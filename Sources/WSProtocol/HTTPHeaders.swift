/// The header fields of an HTTP/1.1 message head, in wire order.
///
/// Names keep the spelling the peer sent; every lookup compares names ASCII case-insensitively
/// (RFC 9110 section 5.1). Repeated fields are kept as separate entries.
public struct HTTPHeaders: Sendable {
    /// One header field as it appeared on the wire (value trimmed of surrounding whitespace).
    public struct Entry: Sendable, Equatable {
        public var name: String
        public var value: String
        public init(name: String, value: String) { self.name = name; self.value = value }
    }

    public private(set) var entries: [Entry]

    public init() { entries = [] }
    public init(_ pairs: [(String, String)]) { entries = pairs.map { Entry(name: $0.0, value: $0.1) } }

    public var count: Int { entries.count }

    public mutating func add(name: String, value: String) {
        // A request head has a handful of fields: one allocation for up to 16 instead of one per doubling.
        if entries.capacity == 0 { entries.reserveCapacity(16) }
        entries.append(Entry(name: name, value: value))
    }

    /// The value of the first field called `name`, if any.
    public subscript(first name: String) -> String? {
        for entry in entries where HTTPHeaders.equalsIgnoringCase(entry.name, name) { return entry.value }
        return nil
    }

    /// Every value of the fields called `name`, in wire order.
    public func values(_ name: String) -> [String] {
        entries.lazy.filter { HTTPHeaders.equalsIgnoringCase($0.name, name) }.map(\.value)
    }

    /// The comma-separated list elements of every field called `name` (RFC 9110 section 5.6.1):
    /// trimmed, lowercased, empty elements skipped. Not for values that may contain quoted strings.
    public func tokens(_ name: String) -> [String] {
        rawTokens(name).map { $0.lowercased() }
    }

    /// Like ``tokens(_:)`` but keeps the case (subprotocol names are case-sensitive).
    func rawTokens(_ name: String) -> [String] {
        var result: [String] = []
        for value in values(name) {
            for element in value.utf8.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: true) {
                let trimmed = HTTPHeaders.trimOWS(element)
                if !trimmed.isEmpty { result.append(String(decoding: trimmed, as: UTF8.self)) }
            }
        }
        return result
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
        for entry in entries where HTTPHeaders.equalsIgnoringCase(entry.name, name) {
            var value = entry.value
            value.makeContiguousUTF8()
            value.utf8.withContiguousStorageIfAvailable { bytes in
                var i = 0
                while i < bytes.count {
                    var end = i
                    while end < bytes.count && bytes[end] != UInt8(ascii: ",") { end += 1 }
                    var lo = i, hi = end
                    while lo < hi && (bytes[lo] == 0x20 || bytes[lo] == 0x09) { lo += 1 }
                    while hi > lo && (bytes[hi - 1] == 0x20 || bytes[hi - 1] == 0x09) { hi -= 1 }
                    if lo < hi {
                        elements += 1
                        if hi - lo == expected.utf8CodeUnitCount {
                            var equal = true
                            for k in 0..<(hi - lo) where HTTPHeaders.lowerASCII(bytes[lo + k]) != expected.utf8Start[k] {
                                equal = false
                                break
                            }
                            if equal { found = true }
                        }
                    }
                    i = end + 1
                }
            }
        }
        switch match {
        case .contains: return found
        case .only: return found && elements == 1
        }
    }

    static func trimOWS(_ bytes: Substring.UTF8View.SubSequence) -> Substring.UTF8View.SubSequence {
        var slice = bytes
        while let f = slice.first, f == 0x20 || f == 0x09 { slice = slice.dropFirst() }
        while let l = slice.last, l == 0x20 || l == 0x09 { slice = slice.dropLast() }
        return slice
    }

    /// ASCII case-insensitive comparison (header names are ASCII tokens).
    static func equalsIgnoringCase(_ a: String, _ b: String) -> Bool {
        // O(1) for native strings, and most names looked up differ in length from most names present.
        guard a.utf8.count == b.utf8.count else { return false }
        // Both contiguous (native and small strings are): compare the bytes in place. The views' generic iterators
        // cost ~10 instructions a byte, and the upgrade looks up a dozen names among every field (issue 12).
        let compared = a.utf8.withContiguousStorageIfAvailable { x in
            b.utf8.withContiguousStorageIfAvailable { y -> Bool in
                for k in 0..<x.count where x[k] != y[k] && lowerASCII(x[k]) != lowerASCII(y[k]) { return false }
                return true
            }
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
