import Foundation
import Testing
@testable import WSProtocol

/// Exhaustive and differential checks of ``UTF8Validator`` against the standard library, for both of its
/// paths: the byte-wise DFA (short chunks, chunk heads and tails) and the 16-byte vector steps (runs of
/// non-ASCII text with at least 3 bytes before and 16 after in the same chunk).
///
/// The full enumerations take minutes in a debug build; by default every `stride`-th case runs (a prime
/// stride, so all byte values still occur). `UTF8_EXHAUSTIVE=1 swift test --filter UTF8Exhaustive` runs all.
@Suite("UTF8Validator exhaustive")
struct UTF8ExhaustiveTests {
    static let full = ProcessInfo.processInfo.environment["UTF8_EXHAUSTIVE"] != nil
    static func stride(_ sampled: Int) -> Int { full ? 1 : sampled }
    static func oracle(_ bytes: UnsafeRawBufferPointer) -> Bool {
        String(validating: bytes.bindMemory(to: UInt8.self), as: UTF8.self) != nil
    }

    static func ours(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var v = UTF8Validator()
        return v.validate(bytes) && v.isComplete
    }

    /// One byte per class of the minimal UTF-8 automaton, both ends of each range (so a comparison off by
    /// one at a class boundary shows): 00-7F, 80-8F, 90-9F, A0-BF, C0-C1, C2-DF, E0, E1-EC, ED, EE-EF, F0,
    /// F1-F3, F4, F5-FF.
    static let representatives: [UInt8] = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                                           0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]

    /// Every sequence of 1, 2 and 3 bytes (2^24 + 2^16 + 2^8) through the DFA, whole and (3 bytes) cut
    /// after the first or the second byte: same verdict as the standard library.
    @Test func everySequenceUpToThreeBytes() {
        var mismatches = 0
        var buffer: (UInt8, UInt8, UInt8) = (0, 0, 0)
        withUnsafeMutableBytes(of: &buffer) { raw in
            for length in 1...2 {
                for n in 0..<(1 << (8 * length)) {
                    for k in 0..<length { raw[k] = UInt8(truncatingIfNeeded: n >> (8 * k)) }
                    let bytes = UnsafeRawBufferPointer(rebasing: raw[0..<length])
                    if Self.ours(bytes) != Self.oracle(bytes) { mismatches += 1 }
                }
            }
            let all = UnsafeRawBufferPointer(raw)
            for n in Swift.stride(from: 0, to: 1 << 24, by: Self.stride(31)) {
                raw[0] = UInt8(truncatingIfNeeded: n >> 16)
                raw[1] = UInt8(truncatingIfNeeded: n >> 8)
                raw[2] = UInt8(truncatingIfNeeded: n)
                let expected = Self.oracle(all)
                if Self.ours(all) != expected { mismatches += 1; continue }
                // Cut after byte 1 or 2 (which byte goes first differs by n so both cuts are covered evenly).
                let cut = 1 + n & 1
                var v = UTF8Validator()
                let split = v.validate(UnsafeRawBufferPointer(rebasing: all[0..<cut]))
                    && v.validate(UnsafeRawBufferPointer(rebasing: all[cut...])) && v.isComplete
                if split != expected { mismatches += 1 }
            }
        }
        #expect(mismatches == 0)
    }

    /// Every 4-byte sequence whose first two bytes are anything (2^16) and whose last two are class
    /// representatives, through the DFA.
    @Test func fourByteSequences() {
        var mismatches = 0
        var buffer: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        withUnsafeMutableBytes(of: &buffer) { raw in
            let all = UnsafeRawBufferPointer(raw)
            for n in Swift.stride(from: 0, to: 1 << 16, by: Self.stride(97)) {
                raw[0] = UInt8(truncatingIfNeeded: n >> 8)
                raw[1] = UInt8(truncatingIfNeeded: n)
                for c in Self.representatives {
                    raw[2] = c
                    for d in Self.representatives {
                        raw[3] = d
                        if Self.ours(all) != Self.oracle(all) { mismatches += 1 }
                    }
                }
            }
        }
        #expect(mismatches == 0)
    }

    /// The vector steps: a sequence of up to 4 bytes placed at every offset of a 16-byte block inside
    /// valid multi-byte text (so the steps run over it and see it at every lane and across block borders),
    /// for every pair of bytes (2^16) followed by representatives, and every 3- and 4-byte combination of
    /// representatives.
    @Test func vectorPathAtEveryLane() {
        // 40 bytes of valid 2-byte text before (so the vector steps are running), 40 after.
        let before = Array(String(repeating: "é", count: 20).utf8)
        let after = Array(String(repeating: "ж", count: 20).utf8)
        var mismatches = 0
        var cases: [[UInt8]] = []
        for a in 0...255 {
            for b in 0...255 { cases.append([UInt8(a), UInt8(b)]) }
        }
        for a in Self.representatives {
            for b in Self.representatives {
                for c in Self.representatives {
                    cases.append([a, b, c])
                    for d in Self.representatives { cases.append([a, b, c, d]) }
                }
            }
        }
        var buffer = [UInt8](repeating: 0, count: before.count + 16 + 4 + after.count)
        buffer.withUnsafeMutableBytes { raw in
            for seq in Swift.stride(from: 0, to: cases.count, by: Self.stride(13)).map({ cases[$0] }) {
                // Shift the sequence through 16 lanes: pad with 0...15 ASCII bytes after the prefix...
                // (Every 16th case takes each shift, so the lanes are covered evenly without 16x the time.)
                let shift = (Int(seq[0]) &+ Int(seq[1]) &* 7 &+ seq.count) & 15
                var n = 0
                for x in before { raw[n] = x; n += 1 }
                for _ in 0..<shift { raw[n] = 0x41; n += 1 }
                for x in seq { raw[n] = x; n += 1 }
                for x in after { raw[n] = x; n += 1 }
                let bytes = UnsafeRawBufferPointer(rebasing: raw[0..<n])
                if Self.ours(bytes) != Self.oracle(bytes) {
                    mismatches += 1
                    if mismatches < 5 { Issue.record("mismatch on \(seq) shifted \(shift)") }
                }
            }
        }
        #expect(mismatches == 0)
    }

    /// Long mixed text (ASCII runs, every length of code point), sometimes with one byte replaced, inserted
    /// or removed, fed in random chunks: same verdict as the standard library, and when invalid the chunk
    /// that fails is the one holding the first invalid byte.
    @Test func randomMixedTextInRandomChunks() {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("UTF8 random mixed-text seed \(seed)")
        var rng = SplitMix64(seed: seed)
        let pieces: [String] = ["a", "plain ASCII text, long enough for the 16-byte steps. ", "é", "ж", "€", "日本語",
                                "한국어", "𝄞", "😀", "\u{10FFFF}", "\u{D7FF}", "\u{E000}", "\u{FFFF}", "\u{80}", "\u{800}",
                                "\u{10000}", " ", "Съешь же ещё"]
        var mismatches = 0
        for _ in 0..<4000 {
            var bytes: [UInt8] = []
            for _ in 0..<Int.random(in: 1...60, using: &rng) { bytes += Array(pieces.randomElement(using: &rng)!.utf8) }
            switch Int.random(in: 0..<4, using: &rng) {
            case 0: bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            case 1: bytes.insert(UInt8.random(in: 0x80...0xFF, using: &rng), at: Int.random(in: 0...bytes.count, using: &rng))
            case 2: bytes.remove(at: Int.random(in: 0..<bytes.count, using: &rng))
            default: break
            }
            let expected = bytes.withUnsafeBytes { Self.oracle($0) }
            // The first invalid byte: the shortest prefix that is not a prefix of valid UTF-8.
            var firstBad: Int? = nil
            if !expected {
                var v = UTF8Validator()
                for k in 0..<bytes.count where !bytes[k...k].withUnsafeBytes({ v.validate($0) }) { firstBad = k; break }
            }
            var cuts = (0..<Int.random(in: 0...5, using: &rng)).map { _ in Int.random(in: 0...bytes.count, using: &rng) }
            cuts.sort()
            var v = UTF8Validator()
            var start = 0
            var failedChunk: Range<Int>? = nil
            for cut in cuts + [bytes.count] {
                if !bytes[start..<cut].withUnsafeBytes({ v.validate($0) }) { failedChunk = start..<cut; break }
                start = cut
            }
            let ok = failedChunk == nil && v.isComplete
            if ok != expected {
                mismatches += 1
            } else if let bad = firstBad, failedChunk != nil, !(failedChunk!.contains(bad)) {
                mismatches += 1  // failed too late or too early
            }
            if mismatches > 0 && mismatches < 5 && ok != expected { Issue.record("mismatch on \(bytes) cuts \(cuts) seed \(seed)") }
        }
        #expect(mismatches == 0)
    }
}
