import Testing
@testable import WSProtocol

@Suite("Masking")
struct MaskingTests {
    static func reference(_ bytes: inout [UInt8], key: [UInt8], phase: Int) {
        for i in bytes.indices { bytes[i] ^= key[(phase + i) % 4] }
    }

    @Test func differentialAgainstByteByByteReference() {
        let keyBytes: [UInt8] = [0x37, 0xfa, 0x21, 0x3d]
        let key = UInt32(keyBytes[0]) | UInt32(keyBytes[1]) << 8 | UInt32(keyBytes[2]) << 16 | UInt32(keyBytes[3]) << 24
        var rng = SplitMix64(seed: 0x6D61_736B)
        let source = (0..<(1024 + 8)).map { _ in UInt8.random(in: 0...255, using: &rng) }
        var failures = 0
        for size in 0...1024 {
            for offset in 0..<8 {
                for phase in 0..<4 {
                    var buffer = source
                    var expected = Array(source[offset..<(offset + size)])
                    Self.reference(&expected, key: keyBytes, phase: phase)
                    let next = buffer.withUnsafeMutableBytes {
                        applyMask(UnsafeMutableRawBufferPointer(rebasing: $0[offset..<(offset + size)]), key: key, phase: phase)
                    }
                    if Array(buffer[offset..<(offset + size)]) != expected || next != (phase + size) % 4
                        || buffer[..<offset] != source[..<offset] || buffer[(offset + size)...] != source[(offset + size)...] {
                        failures += 1
                        if failures < 5 { Issue.record("size \(size) offset \(offset) phase \(phase)") }
                    }
                }
            }
        }
        #expect(failures == 0)
    }

    @Test func phaseCarriesAcrossChunks() {
        var rng = SplitMix64(seed: 42)
        let original = (0..<1000).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let key: UInt32 = 0xDEAD_BEEF
        var whole = original
        _ = whole.withUnsafeMutableBytes { applyMask($0, key: key, phase: 0) }
        var pieces = original
        var phase = 0
        var at = 0
        for n in [1, 3, 7, 13, 64, 5, 907] {
            phase = pieces.withUnsafeMutableBytes { applyMask(UnsafeMutableRawBufferPointer(rebasing: $0[at..<(at + n)]), key: key, phase: phase) }
            at += n
        }
        #expect(pieces == whole)
        // Masking twice restores the input.
        _ = whole.withUnsafeMutableBytes { applyMask($0, key: key, phase: 0) }
        #expect(whole == original)
    }

    @Test func rfcMaskedHello() {
        var payload: [UInt8] = [0x7f, 0x9f, 0x4d, 0x51, 0x58]
        let next = payload.withUnsafeMutableBytes { applyMask($0, key: 0x3d21_fa37, phase: 0) }
        #expect(payload == Array("Hello".utf8))
        #expect(next == 1)
    }
}
