import Glibc

/// A string compared and hashed by its exact UTF-8 bytes.
///
/// Swift's `String` compares by Unicode canonical equivalence: "café" written NFC (`63 61 66 c3 a9`) and NFD
/// (`63 61 66 65 cc 81`) are `==` and hash alike, and so are U+00C5 and U+212B, or a Hangul syllable and its jamo.
/// Identifiers must not work that way: RFC 7519 §7.3 compares claim values with no normalisation, so two account ids
/// are one account only when their bytes are equal. Every identifier that a client, a token or the backend supplies
/// and that the hub compares (account ids, channel names) goes through this type. Its comparisons are `@inlinable`:
/// every dictionary probe of a stream, subscription or account key in the other modules runs them.
public struct ExactString: Hashable, Comparable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral {
    /// The identifier as received (its bytes are kept as they are: Swift never normalises a string's storage).
    public let string: String

    @inlinable public init(_ string: String) { self.string = string }
    @inlinable public init(stringLiteral value: String) { self.string = value }

    public var description: String { string }

    @inlinable public static func == (a: ExactString, b: ExactString) -> Bool {
        // The same representation is the same bytes: a short id (up to 15 bytes) is stored inline in the string's
        // two words, so two equal short ids are equal words, and two copies of one long id share its buffer. This
        // is the first step of `String`'s own `==` too; anything else is compared byte by byte below (one
        // string's bytes may be inline and the other's in a buffer: equal, with different words).
        if MemoryLayout<String>.size == 16,
           unsafeBitCast(a.string, to: (UInt64, UInt64).self) == unsafeBitCast(b.string, to: (UInt64, UInt64).self) {
            return true
        }
        let x = a.string.utf8, y = b.string.utf8
        guard x.count == y.count else { return false }
        // Both contiguous (native and small strings are): one `memcmp`, not `elementsEqual`'s byte-at-a-time walk
        // through the generic iterator, on every dictionary probe of a stream, subscription or account key.
        let compared = x.withContiguousStorageIfAvailable { p in
            y.withContiguousStorageIfAvailable { q -> Bool in
                guard let pa = p.baseAddress, let qa = q.baseAddress else { return p.count == q.count }
                return memcmp(pa, qa, p.count) == 0
            }
        }
        if let compared, let equal = compared { return equal }
        return x.elementsEqual(y)
    }

    /// Byte order (UTF-8 order is code point order), for stable listings.
    @inlinable public static func < (a: ExactString, b: ExactString) -> Bool {
        a.string.utf8.lexicographicallyPrecedes(b.string.utf8)
    }

    @inlinable public func hash(into hasher: inout Hasher) {
        // One hashing function for every storage: a string without contiguous UTF-8 is made contiguous first,
        // so equal bytes always feed the hasher the same way.
        if let hashed: Void = string.utf8.withContiguousStorageIfAvailable({ hasher.combine(bytes: UnsafeRawBufferPointer($0)) }) {
            return hashed
        }
        var copy = string
        copy.makeContiguousUTF8()
        copy.utf8.withContiguousStorageIfAvailable { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }
}

/// An account id: a token's `sub`, a publish line's `account`. Byte-exact (see ``ExactString``).
public typealias AccountID = ExactString

/// The configured channels by exact name (see ``ExactString``): a name canonically equivalent to a configured one,
/// but not byte-equal, is an unknown channel.
public struct ChannelIndex: Sendable {
    /// Beyond 8 names: the first index of each.
    private let indices: [ExactString: Int]
    /// Up to 8 names: the configured names in order, scanned instead of hashed (the usual two or three: a byte
    /// comparison per name costs less than hashing the name, once per published event).
    private let few: [ExactString]?

    public init(_ names: [String]) {
        var indices: [ExactString: Int] = [:]
        if names.count <= 8 {
            few = names.map { ExactString($0) }
        } else {
            few = nil
            for (i, name) in names.enumerated() where indices[ExactString(name)] == nil { indices[ExactString(name)] = i }
        }
        self.indices = indices
    }

    /// The channel's index in the configured list (the first, if a name is configured twice), or nil for an
    /// unknown name.
    public subscript(name: String) -> Int? {
        let key = ExactString(name)
        if let few { return few.firstIndex(of: key) }
        return indices[key]
    }
}
