/// Writes WebSocket frame headers and whole frames (RFC 6455 section 5.2).
///
/// The hot path for fan-out is ``writeHeader(into:endingAt:opcode:fin:rsv1:payloadLength:maskKey:)``:
/// encode an event once into a buffer that leaves ``maxServerHeaderSize`` bytes of headroom, prepend
/// the header in place, and send the same bytes to every subscriber (server frames are never masked).
public enum FrameEncoder {
    /// Largest header a server writes (no masking key): 2 + 8.
    public static let maxServerHeaderSize = 10
    /// Largest header a client writes (with masking key): 2 + 8 + 4.
    public static let maxClientHeaderSize = 14

    /// The header size for a payload of `payloadLength` bytes.
    @inlinable
    public static func headerSize(payloadLength: Int, masked: Bool) -> Int {
        precondition(payloadLength >= 0, "negative payload length")
        let base = payloadLength <= 125 ? 2 : (payloadLength <= 0xFFFF ? 4 : 10)
        return masked ? base + 4 : base
    }

    /// Writes a frame header into `buffer` so that it ends exactly at `payloadOffset`.
    ///
    /// - Parameters:
    ///   - buffer: the buffer holding (or about to hold) the payload at `payloadOffset`.
    ///   - payloadOffset: where the payload starts; needs `headerSize(payloadLength:masked:)` bytes before it.
    ///   - maskKey: when given, the header carries this key (wire order = little-endian bytes of the value).
    ///     The payload is NOT masked by this call: use ``applyMask(_:key:phase:)`` on it.
    /// - Returns: the offset where the header (and so the frame) starts.
    @inlinable
    @discardableResult
    public static func writeHeader(into buffer: UnsafeMutableRawBufferPointer, endingAt payloadOffset: Int,
                                   opcode: Opcode, fin: Bool = true, rsv1: Bool = false,
                                   payloadLength: Int, maskKey: UInt32? = nil) -> Int {
        let size = headerSize(payloadLength: payloadLength, masked: maskKey != nil)
        precondition(payloadOffset >= size && payloadOffset <= buffer.count, "not enough headroom for the frame header")
        let start = payloadOffset &- size
        let p = buffer.baseAddress! + start
        p.storeBytes(of: (fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) | opcode.rawValue, as: UInt8.self)
        let maskBit: UInt8 = maskKey != nil ? 0x80 : 0
        var at = 2
        if payloadLength <= 125 {
            p.storeBytes(of: maskBit | UInt8(payloadLength), toByteOffset: 1, as: UInt8.self)
        } else if payloadLength <= 0xFFFF {
            p.storeBytes(of: maskBit | 126, toByteOffset: 1, as: UInt8.self)
            p.storeBytes(of: UInt16(payloadLength).bigEndian, toByteOffset: 2, as: UInt16.self)
            at = 4
        } else {
            p.storeBytes(of: maskBit | 127, toByteOffset: 1, as: UInt8.self)
            p.storeBytes(of: UInt64(payloadLength).bigEndian, toByteOffset: 2, as: UInt64.self)
            at = 10
        }
        if let key = maskKey { p.storeBytes(of: key, toByteOffset: at, as: UInt32.self) }
        return start
    }

    /// Appends one whole frame to `output`. With a `maskKey` the appended copy of the payload is masked
    /// (the caller's payload is untouched).
    public static func encode(opcode: Opcode, payload: UnsafeRawBufferPointer, fin: Bool = true, rsv1: Bool = false,
                              maskKey: UInt32? = nil, into output: inout [UInt8]) {
        let size = headerSize(payloadLength: payload.count, masked: maskKey != nil)
        var header: (UInt64, UInt64) = (0, 0)  // 16 bytes of stack space for the <= 14-byte header
        withUnsafeMutableBytes(of: &header) { raw in
            writeHeader(into: raw, endingAt: size, opcode: opcode, fin: fin, rsv1: rsv1,
                        payloadLength: payload.count, maskKey: maskKey)
            output.append(contentsOf: UnsafeRawBufferPointer(rebasing: raw[0..<size]))
        }
        let payloadStart = output.count
        output.append(contentsOf: payload)
        if let key = maskKey {
            output.withUnsafeMutableBytes { raw in
                _ = applyMask(UnsafeMutableRawBufferPointer(rebasing: raw[payloadStart...]), key: key, phase: 0)
            }
        }
    }

    /// Appends one whole frame to `output` (the `[UInt8]` convenience).
    public static func encode(opcode: Opcode, payload: [UInt8], fin: Bool = true, rsv1: Bool = false,
                              maskKey: UInt32? = nil, into output: inout [UInt8]) {
        payload.withUnsafeBytes { encode(opcode: opcode, payload: $0, fin: fin, rsv1: rsv1, maskKey: maskKey, into: &output) }
    }

    /// One whole frame. Unmasked (server) unless a `maskKey` is given.
    public static func frame(opcode: Opcode, payload: [UInt8], fin: Bool = true, rsv1: Bool = false,
                             maskKey: UInt32? = nil) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(payload.count + maxClientHeaderSize)
        encode(opcode: opcode, payload: payload, fin: fin, rsv1: rsv1, maskKey: maskKey, into: &out)
        return out
    }

    /// Appends one whole client frame, masked with a fresh key from `SystemRandomNumberGenerator`.
    public static func encodeClient(opcode: Opcode, payload: UnsafeRawBufferPointer, fin: Bool = true, rsv1: Bool = false,
                                    into output: inout [UInt8]) {
        encode(opcode: opcode, payload: payload, fin: fin, rsv1: rsv1, maskKey: randomMaskKey(), into: &output)
    }

    /// One whole client frame, masked with a fresh key from `SystemRandomNumberGenerator`.
    public static func clientFrame(opcode: Opcode, payload: [UInt8], fin: Bool = true, rsv1: Bool = false) -> [UInt8] {
        frame(opcode: opcode, payload: payload, fin: fin, rsv1: rsv1, maskKey: randomMaskKey())
    }

    /// A masking key from the system's cryptographically secure generator (RFC 6455 section 10.3).
    public static func randomMaskKey() -> UInt32 {
        var rng = SystemRandomNumberGenerator()
        return rng.next()
    }
}
