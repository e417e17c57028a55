import Testing
@testable import WSProtocol

/// `ByteScan.all` (8 bytes per step) against its byte-at-a-time definition: every range the hub uses and a few
/// more, buffers of every length up to 40 (the tail loop and the word loop), each byte value in every position,
/// and random buffers that mix in-range bytes with one or more out-of-range ones (borrows and carries between the
/// bytes of a word).
@Suite struct ByteScanTests {
    static let ranges: [ClosedRange<UInt8>] = [0x21...0x7E, 0...0x7F, 0x20...0x20, 0x41...0x5A, 1...0x7F, 0x7F...0x7F]

    static func reference(_ bytes: [UInt8], _ range: ClosedRange<UInt8>) -> Bool { bytes.allSatisfy(range.contains) }

    @Test(arguments: ranges) func everyByteInEveryPosition(_ range: ClosedRange<UInt8>) {
        var mismatches = 0
        for length in [1, 7, 8, 9, 16, 17] {
            for position in 0..<length {
                for value in 0...255 {
                    var bytes = [UInt8](repeating: range.lowerBound, count: length)
                    bytes[position] = UInt8(value)
                    let fast = bytes.withUnsafeBytes { ByteScan.all($0, in: range) }
                    if fast != Self.reference(bytes, range) { mismatches += 1 }
                }
            }
        }
        #expect(mismatches == 0)
    }

    @Test(arguments: ranges) func randomBuffers(_ range: ClosedRange<UInt8>) {
        var rng = SystemRandomNumberGenerator()
        var mismatches = 0
        for _ in 0..<20_000 {
            let length = Int.random(in: 0...40, using: &rng)
            var bytes = (0..<length).map { _ in UInt8.random(in: range, using: &rng) }
            for _ in 0..<Int.random(in: 0...2, using: &rng) where length > 0 {
                bytes[Int.random(in: 0..<length, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            }
            let offset = Int.random(in: 0...3, using: &rng)  // unaligned starts
            let padded = [UInt8](repeating: 0, count: offset) + bytes
            let fast = padded.withUnsafeBytes { ByteScan.all(UnsafeRawBufferPointer(rebasing: $0[offset...]), in: range) }
            if fast != Self.reference(bytes, range) { mismatches += 1 }
        }
        #expect(mismatches == 0)
    }

    @Test func firstIndexAndContains() {
        let bytes = Array("a=b&c=d".utf8)
        bytes.withUnsafeBytes { raw in
            #expect(ByteScan.firstIndex(of: UInt8(ascii: "&"), in: raw) == 3)
            #expect(ByteScan.firstIndex(of: UInt8(ascii: "="), in: raw, from: 2) == 5)
            #expect(ByteScan.firstIndex(of: UInt8(ascii: "="), in: raw, from: 7) == nil)
            #expect(ByteScan.firstIndex(of: UInt8(ascii: "x"), in: raw) == nil)
            #expect(ByteScan.contains(UInt8(ascii: "d"), in: raw))
            #expect(!ByteScan.contains(0x20, in: raw))
            #expect(!ByteScan.contains(0x20, in: UnsafeRawBufferPointer(start: nil, count: 0)))
        }
    }
}
