/// An incremental UTF-8 validator (RFC 3629, as RFC 6455 requires for text messages and close reasons).
///
/// State is carried across calls, so a text message can be validated chunk by chunk as its bytes arrive
/// (a code point may straddle two reads or two fragments). ``validate(_:)`` returns `false` at the first
/// byte that cannot be part of valid UTF-8: overlong forms, surrogates (U+D800...U+DFFF), code points above
/// U+10FFFF, stray continuation bytes, and truncated sequences (caught as soon as the byte that should have
/// continued them arrives). Once it has failed it stays failed. At message end check ``isComplete``.
public struct UTF8Validator: Sendable {
    /// Continuation bytes still expected for the current code point (0...3).
    @usableFromInline var pending: UInt8 = 0
    /// Allowed range for the next continuation byte (narrower than 0x80...0xBF right after E0, ED, F0, F4).
    @usableFromInline var low: UInt8 = 0x80
    @usableFromInline var high: UInt8 = 0xBF
    @usableFromInline var failed = false

    public init() {}

    /// True when no multi-byte sequence is pending (and nothing has failed): the text so far is complete UTF-8.
    @inlinable public var isComplete: Bool { pending == 0 && !failed }

    /// Forgets all state, ready for the next message.
    @inlinable public mutating func reset() { self = UTF8Validator() }

    /// Validates the next chunk of the text. Returns false at the first invalid byte.
    public mutating func validate(_ bytes: UnsafeRawBufferPointer) -> Bool {
        if failed { return false }
        let count = bytes.count
        guard count > 0, let base = bytes.baseAddress else { return true }
        var i = 0
        var pending = self.pending
        var low = self.low
        var high = self.high
        while true {
            // Finish the current multi-byte sequence.
            while pending > 0 {
                if i == count {
                    self.pending = pending; self.low = low; self.high = high
                    return true
                }
                let c = base.load(fromByteOffset: i, as: UInt8.self)
                if c < low || c > high { self.failed = true; return false }
                low = 0x80; high = 0xBF
                pending &-= 1
                i &+= 1
            }
            // ASCII fast path: 16, then 8 bytes per step.
            while i &+ 16 <= count {
                let a = base.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                let b = base.loadUnaligned(fromByteOffset: i &+ 8, as: UInt64.self)
                if (a | b) & 0x8080_8080_8080_8080 != 0 { break }
                i &+= 16
            }
            if i &+ 8 <= count {
                let a = base.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                if a & 0x8080_8080_8080_8080 == 0 { i &+= 8; continue }
                // Skip the ASCII prefix of this word in one step (little-endian: lowest byte first).
                i &+= (a & 0x8080_8080_8080_8080).trailingZeroBitCount &>> 3
            }
            if i == count { break }
            let b = base.load(fromByteOffset: i, as: UInt8.self)
            i &+= 1
            if b < 0x80 { continue }
            switch b {
            case 0xC2...0xDF: pending = 1
            case 0xE0: pending = 2; low = 0xA0                   // no overlong 3-byte forms
            case 0xE1...0xEC, 0xEE...0xEF: pending = 2
            case 0xED: pending = 2; high = 0x9F                  // no surrogates
            case 0xF0: pending = 3; low = 0x90                   // no overlong 4-byte forms
            case 0xF1...0xF3: pending = 3
            case 0xF4: pending = 3; high = 0x8F                  // nothing above U+10FFFF
            default: self.failed = true; return false            // 80-C1 (stray/overlong), F5-FF
            }
        }
        self.pending = 0; self.low = 0x80; self.high = 0xBF
        return true
    }

    /// Validates a whole, self-contained byte sequence.
    public static func isValid(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var v = UTF8Validator()
        return v.validate(bytes) && v.isComplete
    }
}
