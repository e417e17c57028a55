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
        guard count > 0, let p = bytes.baseAddress else { return true }
        var i = 0
        // Finish a code point left open by the previous chunk.
        while pending > 0 {
            if i == count { return true }
            let c = p.load(fromByteOffset: i, as: UInt8.self)
            if c < low || c > high { failed = true; return false }
            low = 0x80; high = 0xBF
            pending &-= 1
            i &+= 1
        }
        let highBits: UInt64 = 0x8080_8080_8080_8080
        while i < count {
            let b = p.load(fromByteOffset: i, as: UInt8.self)
            if b < 0x80 {
                i &+= 1
                // ASCII run: 16 bytes per step while it lasts, then 8. (Tried only when the run goes on,
                // so text with a few ASCII bytes between multi-byte characters does not pay for it.)
                if i &+ 8 <= count && p.loadUnaligned(fromByteOffset: i, as: UInt64.self) & highBits == 0 {
                    i &+= 8
                    while i &+ 16 <= count {
                        let w = p.loadUnaligned(fromByteOffset: i, as: UInt64.self) | p.loadUnaligned(fromByteOffset: i &+ 8, as: UInt64.self)
                        if w & highBits != 0 { break }
                        i &+= 16
                    }
                }
                continue
            }
            if i &+ 4 <= count {
                // Whole-sequence check on one 32-bit load (little-endian: the lead byte is the low byte).
                let w = p.loadUnaligned(fromByteOffset: i, as: UInt32.self)
                // The masks also reject stray continuation bytes (80-BF) and F8-FF as lead bytes.
                if b < 0xE0 {
                    if w & 0xC0E0 != 0x80C0 || b < 0xC2 { failed = true; return false }
                    i &+= 2
                } else if b < 0xF0 {
                    let cp = (w & 0x0F) &<< 12 | (w & 0x3F00) &>> 2 | (w & 0x3F_0000) &>> 16
                    if w & 0xC0_C0F0 != 0x80_80E0 || cp < 0x800 || cp & 0xF800 == 0xD800 { failed = true; return false }
                    i &+= 3
                } else {
                    let cp = (w & 0x07) &<< 18 | (w & 0x3F00) &<< 4 | (w & 0x3F_0000) &>> 10 | (w & 0x3F00_0000) &>> 24
                    if w & 0xC0C0_C0F8 != 0x8080_80F0 || cp < 0x1_0000 || cp > 0x10_FFFF { failed = true; return false }
                    i &+= 4
                }
                continue
            }
            // Near the end of the chunk: how many continuation bytes follow, and the allowed range of the first one.
            var lo: UInt8 = 0x80
            var hi: UInt8 = 0xBF
            let need: Int
            switch b {
            case 0xC2...0xDF: need = 1
            case 0xE1...0xEC, 0xEE...0xEF: need = 2
            case 0xE0: need = 2; lo = 0xA0        // no overlong 3-byte forms
            case 0xED: need = 2; hi = 0x9F        // no surrogates
            case 0xF1...0xF3: need = 3
            case 0xF0: need = 3; lo = 0x90        // no overlong 4-byte forms
            case 0xF4: need = 3; hi = 0x8F        // nothing above U+10FFFF
            default: failed = true; return false  // 80-C1 (stray / overlong), F5-FF
            }
            if i &+ need < count {
                // The whole sequence is in this chunk.
                let c1 = p.load(fromByteOffset: i &+ 1, as: UInt8.self)
                if c1 < lo || c1 > hi { failed = true; return false }
                if need >= 2 {
                    if p.load(fromByteOffset: i &+ 2, as: UInt8.self) & 0xC0 != 0x80 { failed = true; return false }
                    if need == 3 && p.load(fromByteOffset: i &+ 3, as: UInt8.self) & 0xC0 != 0x80 { failed = true; return false }
                }
                i &+= need &+ 1
            } else {
                // The sequence continues in the next chunk: check what is here, keep the rest as state.
                i &+= 1
                pending = UInt8(need)
                low = lo; high = hi
                while i < count {
                    let c = p.load(fromByteOffset: i, as: UInt8.self)
                    if c < low || c > high { failed = true; return false }
                    low = 0x80; high = 0xBF
                    pending &-= 1
                    i &+= 1
                }
                return true
            }
        }
        return true
    }

    /// Validates a whole, self-contained byte sequence.
    public static func isValid(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var v = UTF8Validator()
        return v.validate(bytes) && v.isComplete
    }
}
