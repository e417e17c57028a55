import Foundation
import Testing
@testable import WSProtocol

@Suite("UTF8Validator")
struct UTF8ValidatorTests {
    /// Validates `bytes` cut at `cuts`; returns (all chunks accepted, complete at end, index of the failing chunk).
    static func run(_ bytes: [UInt8], cuts: [Int]) -> (ok: Bool, failedChunk: Int?) {
        var v = UTF8Validator()
        var start = 0
        for (n, cut) in (cuts + [bytes.count]).enumerated() {
            let ok = bytes[start..<cut].withUnsafeBytes { v.validate($0) }
            if !ok { return (false, n) }
            start = cut
        }
        return (v.isComplete, nil)
    }

    static func oracle(_ bytes: [UInt8]) -> Bool { String(validating: bytes, as: UTF8.self) != nil }

    static let table: [([UInt8], Bool, String)] = [
        ([], true, "empty"),
        (Array("Hello-µ@ßöäüàá-UTF-8!!".utf8), true, "Autobahn 6.2 mixed"),
        (Array("κόσμε".utf8), true, "kosme"),
        ([0xF0, 0x90, 0x80, 0x80], true, "U+10000"),
        ([0xF4, 0x8F, 0xBF, 0xBF], true, "U+10FFFF"),
        ([0xF4, 0x90, 0x80, 0x80], false, "U+110000"),
        ([0xEF, 0xBF, 0xBF], true, "U+FFFF"),
        ([0xED, 0x9F, 0xBF], true, "U+D7FF"),
        ([0xED, 0xA0, 0x80], false, "U+D800 surrogate"),
        ([0xED, 0xBF, 0xBF], false, "U+DFFF surrogate"),
        ([0xEE, 0x80, 0x80], true, "U+E000"),
        ([0xC0, 0xAF], false, "overlong / 2 bytes"),
        ([0xC1, 0xBF], false, "overlong C1"),
        ([0xE0, 0x80, 0xAF], false, "overlong / 3 bytes"),
        ([0xE0, 0x9F, 0xBF], false, "overlong U+07FF in 3 bytes"),
        ([0xF0, 0x80, 0x80, 0xAF], false, "overlong / 4 bytes"),
        ([0xF0, 0x8F, 0xBF, 0xBF], false, "overlong U+FFFF in 4 bytes"),
        ([0x80], false, "lone continuation"),
        ([0xBF], false, "lone continuation BF"),
        ([0xF5, 0x80, 0x80, 0x80], false, "F5 lead"),
        ([0xFE], false, "FE"),
        ([0xFF], false, "FF"),
        ([0xC2], false, "truncated 2-byte at end"),
        ([0xE2, 0x82], false, "truncated 3-byte at end"),
        ([0xF0, 0x9F, 0x98], false, "truncated 4-byte at end"),
        ([0xC2, 0x41], false, "truncated 2-byte followed by ASCII"),
        ([0xE2, 0x82, 0x41], false, "truncated 3-byte followed by ASCII"),
        (Array("0123456789abcdef0123456789abcde".utf8) + [0xE2, 0x82, 0xAC], true, "euro after 31 ASCII"),
        (Array("0123456789abcdef0123456789abcde".utf8) + [0x80] + Array("xyz".utf8), false, "stray byte after ASCII run"),
    ]

    @Test func tableAtEverySplit() {
        for (bytes, valid, name) in Self.table {
            #expect(Self.oracle(bytes) == valid, "oracle disagrees on \(name)")
            for cut in 0...bytes.count {
                #expect(Self.run(bytes, cuts: [cut]).ok == valid, "\(name) cut \(cut)")
            }
            #expect(Self.run(bytes, cuts: Array(0..<bytes.count)).ok == valid, "\(name) bytewise")
        }
    }

    @Test func failsAtTheFirstInvalidByte() {
        // The invalid byte is the 3rd of a surrogate: the chunk holding it fails, earlier chunks pass.
        let bytes: [UInt8] = Array("ab".utf8) + [0xED] + [0xA0, 0x80] + Array("zz".utf8)
        #expect(Self.run(bytes, cuts: [1, 2, 3, 4, 5, 6]).failedChunk == 3)
        // A truncated sequence is caught at the byte that should have continued it.
        let truncated: [UInt8] = [0x41, 0xE2, 0x82, 0x41, 0x41]
        #expect(Self.run(truncated, cuts: [1, 2, 3, 4]).failedChunk == 3)
        // Once failed, stays failed.
        var v = UTF8Validator()
        #expect(![UInt8]([0xFF]).withUnsafeBytes { v.validate($0) })
        #expect(![UInt8]([0x41]).withUnsafeBytes { v.validate($0) })
        #expect(!v.isComplete)
    }

    @Test func differentialRandom() {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("UTF8 differential seed \(seed)")
        var rng = SplitMix64(seed: seed)
        // Building blocks: ASCII runs, valid code points of every length, and adversarial bytes.
        let pieces: [[UInt8]] = [
            Array("plain ascii text ".utf8), Array("é".utf8), Array("€".utf8), Array("𝄞".utf8), Array("\u{10FFFF}".utf8),
            [0x80], [0xC0], [0xC1, 0x80], [0xE0, 0x80], [0xED, 0xA0], [0xF4, 0x90], [0xF5], [0xFF], [0xE2], [0xF0, 0x9F],
            [0xED, 0x9F, 0xBF], [0xEF, 0xBF, 0xBD], [0x00], [0x7F],
        ]
        var mismatches = 0
        for _ in 0..<3000 {
            var bytes: [UInt8] = []
            if Bool.random(using: &rng) {
                for _ in 0..<Int.random(in: 0...20, using: &rng) { bytes += pieces.randomElement(using: &rng)! }
            } else {
                bytes = (0..<Int.random(in: 0...40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            }
            let cuts = (0..<Int.random(in: 0...4, using: &rng)).map { _ in Int.random(in: 0...bytes.count, using: &rng) }.sorted()
            let ours = Self.run(bytes, cuts: cuts).ok
            let foundation = String(data: Data(bytes), encoding: .utf8) != nil
            if ours != Self.oracle(bytes) || ours != foundation {
                mismatches += 1
                if mismatches < 5 { Issue.record("mismatch on \(bytes) cuts \(cuts) (seed \(seed))") }
            }
        }
        #expect(mismatches == 0)
    }

    @Test func exhaustiveTwoAndThreeBytePrefixes() {
        // Every 2-byte sequence, and every 3-byte sequence with lead E0...F4, against the stdlib.
        var mismatches = 0
        for a in 0...255 {
            for b in 0...255 {
                let bytes: [UInt8] = [UInt8(a), UInt8(b)]
                if Self.run(bytes, cuts: [1]).ok != Self.oracle(bytes) { mismatches += 1 }
            }
        }
        for a in 0xE0...0xF4 {
            for b in 0x70...0xC5 {
                for c in [0x41, 0x80, 0xBF, 0xC0] {
                    let bytes: [UInt8] = [UInt8(a), UInt8(b), UInt8(c)] + (a >= 0xF0 ? [0x80] : [])
                    if Self.run(bytes, cuts: [2]).ok != Self.oracle(bytes) { mismatches += 1 }
                }
            }
        }
        #expect(mismatches == 0)
    }
}
