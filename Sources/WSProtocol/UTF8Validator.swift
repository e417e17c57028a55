/// An incremental UTF-8 validator (RFC 3629, as RFC 6455 requires for text messages and close reasons).
///
/// State is carried across calls, so a text message can be validated chunk by chunk as its bytes arrive
/// (a code point may straddle two reads or two fragments). ``validate(_:)`` returns `false` for a chunk that
/// contains a byte that cannot be part of valid UTF-8: overlong forms, surrogates (U+D800...U+DFFF), code
/// points above U+10FFFF, stray continuation bytes, and truncated sequences (caught as soon as the byte that
/// should have continued them arrives). So the call that receives the first invalid byte already fails; no
/// later byte is needed. Once it has failed it stays failed. At message end check ``isComplete``.
///
/// How: ASCII is skipped 8/16 bytes at a time. Other text is checked 16 bytes per step with SIMD: each
/// byte against the three before it (see `vectorSteps`), which needs no state beyond a code point boundary.
/// Short chunks, chunk heads and tails, and code points split between chunks go through a shift-based DFA
/// (one 256-entry `UInt64` table, `state = table[byte] >> state`), whose state is what is carried over.
public struct UTF8Validator: Sendable {
    /// DFA state: a shift amount (a multiple of 6) in the low 6 bits; the bits above are ignored.
    @usableFromInline var state: UInt64 = UTF8Validator.accept

    // The states, as bit offsets into a table row. `reject` is 0 and every row has 0 in bits 0..<6, so once
    // rejected the DFA stays rejected without a branch.
    @usableFromInline static var reject: UInt64 { 0 }
    @usableFromInline static var accept: UInt64 { 6 }
    static var cont1: UInt64 { 12 }   // one more continuation byte 80...BF
    static var cont2: UInt64 { 18 }   // two more, 80...BF
    static var cont3: UInt64 { 24 }   // three more, 80...BF
    static var afterE0: UInt64 { 30 } // next A0...BF (no overlong 3-byte forms), then one more
    static var afterED: UInt64 { 36 } // next 80...9F (no surrogates), then one more
    static var afterF0: UInt64 { 42 } // next 90...BF (no overlong 4-byte forms), then two more
    static var afterF4: UInt64 { 48 } // next 80...8F (nothing above U+10FFFF), then two more

    /// `table[byte]` holds, at bit offset `s` for every state `s`, the 6-bit state after reading `byte` in
    /// state `s`. Allocated once, never freed.
    nonisolated(unsafe) static let table: UnsafePointer<UInt64> = {
        let t = UnsafeMutablePointer<UInt64>.allocate(capacity: 256)
        for byte in 0..<256 {
            var row: UInt64 = 0
            func on(_ from: UInt64, _ to: UInt64) { row |= to << from }
            switch byte {
            case 0x00...0x7F: on(accept, accept)
            case 0x80...0xBF:
                on(cont1, accept); on(cont2, cont1); on(cont3, cont2)
                if byte >= 0xA0 { on(afterE0, cont1) } else { on(afterED, cont1) }
                if byte >= 0x90 { on(afterF0, cont2) } else { on(afterF4, cont2) }
            case 0xC2...0xDF: on(accept, cont1)
            case 0xE0: on(accept, afterE0)
            case 0xED: on(accept, afterED)
            case 0xE1...0xEF: on(accept, cont2)
            case 0xF0: on(accept, afterF0)
            case 0xF4: on(accept, afterF4)
            case 0xF1...0xF3: on(accept, cont3)
            default: break  // C0, C1, F5...FF: invalid anywhere
            }
            t[byte] = row
        }
        return UnsafePointer(t)
    }()

    public init() {}

    /// True when no multi-byte sequence is pending (and nothing has failed): the text so far is complete UTF-8.
    @inlinable public var isComplete: Bool { state & 63 == Self.accept }

    /// Forgets all state, ready for the next message.
    @inlinable public mutating func reset() { self = UTF8Validator() }

    /// Validates the next chunk of the text. Returns false if the chunk holds an invalid byte (or an earlier
    /// chunk did).
    public mutating func validate(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var s = state & 63
        if s == Self.reject { return false }
        let count = bytes.count
        guard count > 0, let p = bytes.baseAddress else { return true }
        let highBits: UInt64 = 0x8080_8080_8080_8080
        var i = 0
        while true {
            // 1. Finish a code point left open (by the previous chunk, or by a vector step that stopped in it).
            while s != Self.accept {
                if i == count { state = s; return true }
                s = Self.table[Int(p.load(fromByteOffset: i, as: UInt8.self))] &>> s & 63
                i &+= 1
                if s == Self.reject { state = s; return false }
            }
            // 2. ASCII run: 16 bytes per step while it lasts, then 8. (Tried only when the run goes on,
            // so text with a few ASCII bytes between multi-byte characters does not pay for it.)
            while i < count {
                if p.load(fromByteOffset: i, as: UInt8.self) >= 0x80 { break }
                i &+= 1
                if i &+ 8 <= count && p.loadUnaligned(fromByteOffset: i, as: UInt64.self) & highBits == 0 {
                    i &+= 8
                    while i &+ 16 <= count {
                        let w = p.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                            | p.loadUnaligned(fromByteOffset: i &+ 8, as: UInt64.self)
                        if w & highBits != 0 { break }
                        i &+= 16
                    }
                }
            }
            if i == count { state = s; return true }
            // 3. Non-ASCII at a code point boundary. Near the start or the end of the chunk: the DFA, until
            // there is room for vectors (or to the end).
            if i < 3 || i &+ 16 > count {
                repeat {
                    s = Self.table[Int(p.load(fromByteOffset: i, as: UInt8.self))] &>> s & 63
                    i &+= 1
                } while i < count && (s != Self.accept || i < 3 || i &+ 16 > count)
                if s == Self.reject { state = s; return false }
                if i == count { state = s; return true }
                continue
            }
            // 4. 16 bytes per step, each byte checked against the three before it (all in this chunk: i >= 3).
            if !Self.vectorSteps(p, &i, count) { state = Self.reject; return false }
            // Stopped at i (end of room, or ASCII ahead): restart the DFA at the start of the code point
            // that holds byte i-1, so that a code point the steps left open is finished by step 1.
            var k = i
            if p.load(fromByteOffset: i &- 1, as: UInt8.self) >= 0xC0 { k = i &- 1 }
            else if p.load(fromByteOffset: i &- 2, as: UInt8.self) >= 0xE0 { k = i &- 2 }
            else if p.load(fromByteOffset: i &- 3, as: UInt8.self) >= 0xF0 { k = i &- 3 }
            while k < i {
                s = Self.table[Int(p.load(fromByteOffset: k, as: UInt8.self))] &>> s & 63
                k &+= 1
            }
        }
    }

    /// The vector part of ``validate(_:)``: from the code point boundary `i` (with `i >= 3`), checks 16 bytes
    /// per step while 16 remain and the next 16 are not all ASCII. For every byte it checks, locally, that
    /// - it is a continuation byte (80...BF) exactly when one is due: when the byte before is a lead byte
    ///   (>= C0), or the one two before is a 3- or 4-byte lead (>= E0), or the one three before a 4-byte lead
    ///   (>= F0). (This also rejects a 4th continuation byte in a row, and leads in place of continuations.)
    /// - it is not C0, C1, or F5...FF;
    /// - after E0 it is >= A0 (no overlong), after ED < A0 (no surrogate), after F0 >= 90 (no overlong),
    ///   after F4 < 90 (nothing above U+10FFFF).
    /// Valid UTF-8 is exactly the text in which no byte fails these checks and the last code point is whole.
    /// The bytes before a code point boundary create no obligation, so the check at the boundary `i` can
    /// read the real bytes before it. Returns false if a byte failed (the chunk is invalid).
    // (Comparisons are written vector-to-vector and masks tested through their bits: with a scalar operand
    // or through `any`, the standard library goes lane by lane.)
    @inline(__always)
    static func vectorSteps(_ p: UnsafeRawPointer, _ i: inout Int, _ count: Int) -> Bool {
        typealias V = SIMD16<UInt8>
        typealias Mask = SIMDMask<SIMD16<Int8>>
        func some(_ m: Mask) -> Bool {
            let w = unsafeBitCast(m, to: SIMD2<UInt64>.self)
            return w[0] | w[1] != 0
        }
        let x80 = V(repeating: 0x80), x40 = V(repeating: 0x40), xC0 = V(repeating: 0xC0), xE0 = V(repeating: 0xE0)
        let xF0 = V(repeating: 0xF0), xFE = V(repeating: 0xFE), xF5 = V(repeating: 0xF5), xA0 = V(repeating: 0xA0)
        let xED = V(repeating: 0xED), x90 = V(repeating: 0x90), xF4 = V(repeating: 0xF4)
        var errors = Mask(repeating: false)
        while i &+ 16 <= count {
            let cur = p.loadUnaligned(fromByteOffset: i, as: V.self)
            if unsafeBitCast(cur, to: SIMD2<UInt64>.self) & SIMD2(repeating: 0x8080_8080_8080_8080) == .zero { break }
            let p1 = p.loadUnaligned(fromByteOffset: i &- 1, as: V.self)
            let p2 = p.loadUnaligned(fromByteOffset: i &- 2, as: V.self)
            let p3 = p.loadUnaligned(fromByteOffset: i &- 3, as: V.self)
            let isContinuation = (cur &- x80) .< x40
            let due = (p1 .>= xC0) .| (p2 .>= xE0) .| (p3 .>= xF0)
            var bad = isContinuation .^ due
            bad .|= ((cur & xFE) .== xC0) .| (cur .>= xF5)
            bad .|= (p1 .== xE0) .& (cur .< xA0)
            bad .|= (p1 .== xED) .& (cur .>= xA0)
            bad .|= (p1 .== xF0) .& (cur .< x90)
            bad .|= (p1 .== xF4) .& (cur .>= x90)
            errors .|= bad
            i &+= 16
            if i & 63 == 0 && some(errors) { return false }
        }
        return !some(errors)
    }

    /// Validates a whole, self-contained byte sequence.
    public static func isValid(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var v = UTF8Validator()
        return v.validate(bytes) && v.isComplete
    }
}
