/// XORs `payload` in place with a WebSocket masking key (RFC 6455 section 5.3), starting at key
/// byte `phase` (0...3), and returns the phase for the next chunk of the same frame.
///
/// - Parameters:
///   - payload: the bytes to (un)mask, at any alignment.
///   - key: the 4 mask bytes as loaded little-endian from the wire (`loadUnaligned(as: UInt32.self)`
///     on a little-endian host), so key byte `j` is `UInt8(truncatingIfNeeded: key >> (8 * j))`.
///   - phase: which key byte pairs with `payload[0]`; a frame's first chunk uses 0.
/// - Returns: `(phase + payload.count) % 4`.
///
/// The bulk runs 32 bytes per step as four unaligned 64-bit words; only the < 8-byte tail goes byte by byte.
@inlinable
public func applyMask(_ payload: UnsafeMutableRawBufferPointer, key: UInt32, phase: Int) -> Int {
    let count = payload.count
    guard count > 0, let base = payload.baseAddress else { return phase & 3 }
    let shift = UInt32(truncatingIfNeeded: 8 &* (phase & 3))
    // Rotate so that byte j of `k32` pairs with payload byte j (little-endian host).
    let k32 = (key &>> shift) | (key &<< (32 &- shift))
    let k64 = UInt64(k32) | (UInt64(k32) &<< 32)
    var i = 0
    while i &+ 32 <= count {
        let w0 = base.loadUnaligned(fromByteOffset: i, as: UInt64.self)
        let w1 = base.loadUnaligned(fromByteOffset: i &+ 8, as: UInt64.self)
        let w2 = base.loadUnaligned(fromByteOffset: i &+ 16, as: UInt64.self)
        let w3 = base.loadUnaligned(fromByteOffset: i &+ 24, as: UInt64.self)
        base.storeBytes(of: w0 ^ k64, toByteOffset: i, as: UInt64.self)
        base.storeBytes(of: w1 ^ k64, toByteOffset: i &+ 8, as: UInt64.self)
        base.storeBytes(of: w2 ^ k64, toByteOffset: i &+ 16, as: UInt64.self)
        base.storeBytes(of: w3 ^ k64, toByteOffset: i &+ 24, as: UInt64.self)
        i &+= 32
    }
    while i &+ 8 <= count {
        let w = base.loadUnaligned(fromByteOffset: i, as: UInt64.self)
        base.storeBytes(of: w ^ k64, toByteOffset: i, as: UInt64.self)
        i &+= 8
    }
    // i is a multiple of 8, hence of 4: tail byte i pairs with k32 byte (i & 3).
    while i < count {
        let b = base.load(fromByteOffset: i, as: UInt8.self)
        base.storeBytes(of: b ^ UInt8(truncatingIfNeeded: k32 &>> (8 &* UInt32(truncatingIfNeeded: i & 3))), toByteOffset: i, as: UInt8.self)
        i &+= 1
    }
    return (phase &+ count) & 3
}
