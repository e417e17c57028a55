import Testing
@testable import WSProtocol

private let hello = Array("Hello".utf8)

@Test func rfc7692HelloSingleBlock() throws {
    // RFC 7692 section 7.2.3.1.
    let deflater = PerMessageDeflater(windowBits: 15, noContextTakeover: false)
    #expect(deflater.compressMessage(hello) == [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00])
    let inflater = PerMessageInflater(noContextTakeover: false)
    #expect(try inflater.decompressMessage([0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], limit: 100) == hello)
}

@Test func rfc7692SharedContext() throws {
    // RFC 7692 section 7.2.3.2: with context takeover the second "Hello" is a back-reference.
    let deflater = PerMessageDeflater(windowBits: 15, noContextTakeover: false)
    #expect(deflater.compressMessage(hello) == [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00])
    #expect(deflater.compressMessage(hello) == [0xf2, 0x00, 0x11, 0x00, 0x00])
    let inflater = PerMessageInflater(noContextTakeover: false)
    #expect(try inflater.decompressMessage([0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], limit: 100) == hello)
    #expect(try inflater.decompressMessage([0xf2, 0x00, 0x11, 0x00, 0x00], limit: 100) == hello)
}

@Test func noContextTakeoverRepeatsTheSameBytes() throws {
    let deflater = PerMessageDeflater(windowBits: 15, noContextTakeover: true)
    for _ in 0..<3 { #expect(deflater.compressMessage(hello) == [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]) }
    let inflater = PerMessageInflater(noContextTakeover: true)
    for _ in 0..<3 { #expect(try inflater.decompressMessage([0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], limit: 5) == hello) }
    // A back-reference into a previous message is invalid once the context is reset.
    #expect(throws: ProtocolViolation(.invalidCompressedData)) {
        try inflater.decompressMessage([0xf2, 0x00, 0x11, 0x00, 0x00], limit: 100)
    }
}

@Test func rfc7692OtherEncodings() throws {
    let inflater = PerMessageInflater(noContextTakeover: false)
    // 7.2.3.3: stored block ("Hello" uncompressed), 7.2.3.4: BFINAL set.
    #expect(try inflater.decompressMessage([0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00], limit: 100) == hello)
    #expect(try inflater.decompressMessage([0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], limit: 100) == hello)
    // The context was reset after the final block; the stream goes on.
    #expect(try inflater.decompressMessage([0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], limit: 100) == hello)
    // 7.2.3.5: two deflate blocks in one message.
    #expect(try inflater.decompressMessage([0xf2, 0x48, 0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xca, 0xc9, 0xc9, 0x07, 0x00],
                                           limit: 100) == hello)
    // An empty message.
    let deflater = PerMessageDeflater(windowBits: 15, noContextTakeover: false)
    let empty = deflater.compressMessage([UInt8]())
    #expect(try inflater.decompressMessage(empty, limit: 0) == [])
    #expect(try inflater.decompressMessage([0x00], limit: 0) == [])
}

@Test func emptyMessagesKeepTheContextIntact() throws {
    let deflater = PerMessageDeflater(windowBits: 15, noContextTakeover: false)
    let inflater = PerMessageInflater(noContextTakeover: false)
    for message in [[], [], hello, [], hello, [0x42]] as [[UInt8]] {
        let compressed = deflater.compressMessage(message)
        #expect(!compressed.isEmpty)
        #expect(try inflater.decompressMessage(compressed, limit: 10) == message)
        #expect(try inflater.decompressMessage([], limit: 10) == [])
    }
}

/// Deterministic pseudo-random bytes (SplitMix64) so a failure is reproducible.
struct DeflateTestRNG: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E3779B97F4A7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) &* 0x94D049BB133111EB
        return z ^ (z >> 31)
    }
}

func deflateTestRandomBytes(_ n: Int, _ rng: inout DeflateTestRNG) -> [UInt8] { (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) } }

func deflateTestJSON(_ n: Int, _ rng: inout DeflateTestRNG) -> [UInt8] {
    var s = ""
    while s.utf8.count < n {
        s += "{\"channel\":\"room-\(Int.random(in: 0..<50, using: &rng))\",\"seq\":\(Int.random(in: 0..<100_000, using: &rng)),"
        s += "\"text\":\"héllo wörld ✓ \(Int.random(in: 0..<1000, using: &rng))\"},"
    }
    return Array(s.utf8.prefix(n))
}

@Test(arguments: 9...15, [false, true])
func roundTrips(windowBits: Int, takeover: Bool) throws {
    var rng = DeflateTestRNG(state: UInt64(windowBits * 2 + (takeover ? 1 : 0)))
    let deflater = PerMessageDeflater(windowBits: windowBits, noContextTakeover: !takeover)
    let inflater = PerMessageInflater(noContextTakeover: !takeover)
    for size in [0, 1, 5, 100, 1000, 4096, 20_000, 70_000] {
        for message in [deflateTestRandomBytes(size, &rng), deflateTestJSON(size, &rng)] {
            let compressed = deflater.compressMessage(message)
            let back = try inflater.decompressMessage(compressed, limit: message.count)
            #expect(back == message, "size \(size)")
        }
    }
}

@Test func windowBitsEightIsHonoured() throws {
    // Compressing with zlib windowBits 9 for a negotiated 8 must never reach back more than 256 bytes.
    // A 300-byte period forces a choice: matches 300 back are out of reach; the result must still round-trip
    // with an inflater, and a window-8-strict decoder would be equally happy (zlib's max distance is 2^9 - 262).
    var rng = DeflateTestRNG(state: 8)
    let period = deflateTestRandomBytes(300, &rng)
    let message = Array((0..<20).map { _ in period }.joined())
    let deflater = PerMessageDeflater(parameters: PMDParams(serverMaxWindowBits: 8), role: .server)
    #expect(deflater.windowBits == 8)
    let compressed = deflater.compressMessage(message)
    #expect(compressed.count > 300 * 10 / 2)  // nothing matched 300 back
    #expect(try PerMessageInflater(noContextTakeover: false).decompressMessage(compressed, limit: message.count) == message)
}

@Test func outputIsAppendedAndLimitCountsTheWholeOutput() throws {
    let inflater = PerMessageInflater(noContextTakeover: true)
    var output: [UInt8] = [1, 2, 3]
    try [UInt8]([0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]).withUnsafeBytes { raw in
        try inflater.decompressMessage(raw, into: &output, limit: 8)
    }
    #expect(output == [1, 2, 3] + hello)
    output = [1, 2, 3, 4]
    #expect(throws: ProtocolViolation(.decompressedTooLarge(8))) {
        try [UInt8]([0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]).withUnsafeBytes { raw in
            try inflater.decompressMessage(raw, into: &output, limit: 7)
        }
    }
}

@Test func exactLimitIsAllowedOneMoreIsNot() throws {
    let deflater = PerMessageDeflater(windowBits: 15, noContextTakeover: true)
    let message = [UInt8](repeating: 0x41, count: 50_000)
    let compressed = deflater.compressMessage(message)
    let inflater = PerMessageInflater(noContextTakeover: true)
    #expect(try inflater.decompressMessage(compressed, limit: 50_000) == message)
    #expect(throws: ProtocolViolation(.decompressedTooLarge(50_000))) {
        try inflater.decompressMessage(compressed, limit: 49_999)
    }
}

@Test func zipBombIsStoppedAtTheLimit() throws {
    // 64 MiB of zeros compresses to ~64 KiB; take a 4 KiB prefix and its sync-flushed remainder is still
    // a valid deflate stream prefix that inflates to far more than the limit.
    let deflater = PerMessageDeflater(windowBits: 15, noContextTakeover: true, level: 9)
    let zeros = [UInt8](repeating: 0, count: 8 << 20)
    let bomb = deflater.compressMessage(zeros)
    #expect(bomb.count < 16 * 1024)
    let inflater = PerMessageInflater(noContextTakeover: true)
    var output: [UInt8] = []
    do {
        try bomb.withUnsafeBytes { raw in try inflater.decompressMessage(raw, into: &output, limit: 1 << 20) }
        Issue.record("bomb accepted")
    } catch let violation as ProtocolViolation {
        #expect(violation == ProtocolViolation(.decompressedTooLarge((1 << 20) + 1)))
        #expect(violation.closeCode == .messageTooBig)
    }
    #expect(output.count == (1 << 20) + 1)
    #expect(output.capacity < 4 << 20)  // grew with the output, never to the 8 MiB the bomb claims
    // The inflater is usable again after the failure (context reset).
    #expect(try inflater.decompressMessage([0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], limit: 10) == hello)
}

@Test(arguments: [
    [0xff, 0xff, 0xff, 0xff],  // invalid block type 3
    [0x07],  // BTYPE 11 (reserved)
    [0x00, 0x05, 0x00, 0x00, 0x00],  // stored block with LEN/NLEN mismatch
    [0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x42, 0x42],  // garbage after a final block
    [0x4a, 0x04, 0x00, 0x00, 0xff, 0xff, 0x4a, 0x04, 0x23, 0x04, 0x00],  // distance too far back on a fresh context
] as [[UInt8]])
func corruptDataIsInvalid(_ data: [UInt8]) {
    let inflater = PerMessageInflater(noContextTakeover: true)
    #expect(throws: ProtocolViolation(.invalidCompressedData)) { try inflater.decompressMessage(data, limit: 1 << 20) }
    #expect(ProtocolViolation(.invalidCompressedData).closeCode == .invalidPayloadData)
}

@Test func roleSelectsTheDirection() {
    let p = PMDParams(serverNoContextTakeover: true, clientNoContextTakeover: false, serverMaxWindowBits: 10, clientMaxWindowBits: 12)
    let config = PMDConfig(compressionLevel: 1, memLevel: 9, minimumSizeToCompress: 32)
    let serverDeflater = PerMessageDeflater(parameters: p, role: .server, configuration: config)
    #expect(serverDeflater.windowBits == 10 && serverDeflater.noContextTakeover)
    #expect(!serverDeflater.shouldCompress(31) && serverDeflater.shouldCompress(32))
    let clientDeflater = PerMessageDeflater(parameters: p, role: .client)
    #expect(clientDeflater.windowBits == 12 && !clientDeflater.noContextTakeover)
    #expect(!PerMessageInflater(parameters: p, role: .server).noContextTakeover)
    #expect(PerMessageInflater(parameters: p, role: .client).noContextTakeover)
}
