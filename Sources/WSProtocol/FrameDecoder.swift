/// An incremental, allocation-free WebSocket frame decoder (RFC 6455 section 5.2).
///
/// Feed it the stream split in any way: one byte at a time or many frames per buffer. A partial
/// header (at most 14 bytes) is kept in the decoder's own state, so the caller never keeps a tail:
/// every byte handed to ``next(_:at:)`` up to the returned offset is consumed. Payload bytes are
/// unmasked in place in the caller's buffer and handed out as chunks; a frame spanning reads yields
/// several chunks (the masking-key phase is carried).
///
/// Every frame produces exactly one ``Event/header(_:)`` followed by one or more
/// ``Event/payload(_:frameComplete:)`` events, the last with `frameComplete == true` (a frame with an
/// empty payload yields one empty chunk). Frame-level rules are checked here: RSV bits, reserved
/// opcodes, control frames (<= 125 bytes, never fragmented), minimal length encoding, the 64-bit high
/// bit, masking per ``Role`` and the frame size limit. Message-level rules (continuations, UTF-8,
/// close bodies) belong to ``MessageReader``.
///
/// After a thrown violation the decoder is poisoned: every later call throws the same violation and
/// consumes nothing, so no byte after the bad one is ever parsed from half-checked state (RFC 6455
/// section 7.1.7: after failing the connection an endpoint processes no further data).
public struct FrameDecoder {
    public enum Event {
        /// A complete header was decoded; payload chunks follow.
        case header(FrameHeader)
        /// Unmasked payload bytes inside the caller's buffer (valid until the buffer is reused).
        case payload(UnsafeMutableRawBufferPointer, frameComplete: Bool)
        /// Every byte of the buffer has been consumed; call again with the next read.
        case needMoreData
    }

    public let role: Role
    /// Frames whose payload is larger than this fail with ``ProtocolViolation/Kind/frameTooLarge(_:)`` (1009).
    public var maxFrameSize: UInt64
    /// Whether RSV1 may be set (a compression extension was negotiated). RSV2/RSV3 are always rejected.
    public var allowRSV1: Bool

    // Partial header bytes (at most 14).
    @usableFromInline var partial: (UInt64, UInt64) = (0, 0)
    @usableFromInline var partialCount = 0
    // Current frame's payload state.
    @usableFromInline var inPayload = false
    @usableFromInline var remaining: UInt64 = 0
    @usableFromInline var masked = false
    @usableFromInline var maskKey: UInt32 = 0
    @usableFromInline var phase = 0
    /// The violation that failed the stream; once set, ``next(_:at:)`` only rethrows it.
    @usableFromInline var failure: ProtocolViolation?

    public init(role: Role, maxFrameSize: UInt64 = 1 << 20, allowRSV1: Bool = false) {
        self.role = role
        self.maxFrameSize = maxFrameSize
        self.allowRSV1 = allowRSV1
    }

    /// True when the decoder is between frames (no partial header, no payload pending).
    public var isAtFrameBoundary: Bool { !inPayload && partialCount == 0 }

    /// The violation this decoder met, if any (it is then poisoned).
    public var violation: ProtocolViolation? { failure }

    /// Decodes the next event from `buffer[offset...]`, advancing `offset` past what it consumed.
    /// Throws the first violation met, and the same one on every later call.
    public mutating func next(_ buffer: UnsafeMutableRawBufferPointer, at offset: inout Int) throws(ProtocolViolation) -> Event {
        if let failure { throw failure }
        if inPayload { return payloadEvent(buffer, at: &offset) }
        do {
            return try nextHeader(buffer, at: &offset)
        } catch {
            failure = error
            throw error
        }
    }

    @inline(__always)
    mutating func nextHeader(_ buffer: UnsafeMutableRawBufferPointer, at offset: inout Int) throws(ProtocolViolation) -> Event {
        let available = buffer.count &- offset
        if partialCount == 0 && available >= 2, let base = buffer.baseAddress {
            // Fast path: the header starts in this buffer.
            let p = UnsafeRawPointer(base + offset)
            let b0 = p.load(as: UInt8.self)
            let b1 = p.load(fromByteOffset: 1, as: UInt8.self)
            try checkFirstByte(b0)
            try checkSecondByte(b1, firstByte: b0)
            let size = Self.headerSize(secondByte: b1)
            if available >= size {
                let header = try parseHeader(UnsafeRawBufferPointer(start: p, count: size))
                offset &+= size
                return startFrame(header)
            }
        }
        // Slow path: gather the header byte by byte into `partial`.
        // Each byte is checked before it counts as stored, so a throw leaves no half-checked header behind.
        while offset < buffer.count {
            let byte = buffer[offset]
            let index = partialCount
            if index == 0 { try checkFirstByte(byte) }
            if index == 1 { try checkSecondByte(byte, firstByte: UInt8(truncatingIfNeeded: partial.0)) }
            offset &+= 1
            withUnsafeMutableBytes(of: &partial) { $0[index] = byte }
            partialCount &+= 1
            if partialCount == 1 { continue }
            let stored = partial
            let b1 = UInt8(truncatingIfNeeded: stored.0 &>> 8)
            let size = Self.headerSize(secondByte: b1)
            if partialCount == size {
                let header = try withUnsafeBytes(of: stored) { raw in
                    Result { () throws(ProtocolViolation) -> FrameHeader in
                        try parseHeader(UnsafeRawBufferPointer(rebasing: raw[0..<size]))
                    }
                }.get()
                partialCount = 0
                return startFrame(header)
            }
        }
        return .needMoreData
    }

    @inline(__always)
    static func headerSize(secondByte b1: UInt8) -> Int {
        let len7 = b1 & 0x7F
        var size = 2
        if len7 == 126 { size = 4 } else if len7 == 127 { size = 10 }
        if b1 & 0x80 != 0 { size &+= 4 }
        return size
    }

    @inline(__always)
    func checkFirstByte(_ b0: UInt8) throws(ProtocolViolation) {
        if b0 & 0x30 != 0 || (b0 & 0x40 != 0 && !allowRSV1) { throw ProtocolViolation(.reservedBitsSet) }
        let op = b0 & 0x0F
        switch op {
        case 0x0, 0x1, 0x2: break
        case 0x8, 0x9, 0xA:
            if b0 & 0x80 == 0 { throw ProtocolViolation(.fragmentedControlFrame) }
        default: throw ProtocolViolation(.reservedOpcode(op))
        }
    }

    @inline(__always)
    func checkSecondByte(_ b1: UInt8, firstByte b0: UInt8) throws(ProtocolViolation) {
        let isMasked = b1 & 0x80 != 0
        switch role {
        case .server: if !isMasked { throw ProtocolViolation(.unmaskedClientFrame) }
        case .client: if isMasked { throw ProtocolViolation(.maskedServerFrame) }
        }
        let len7 = b1 & 0x7F
        if b0 & 0x08 != 0 && len7 > 125 {
            throw ProtocolViolation(.controlFrameTooLong(UInt64(len7)))
        }
    }

    /// Parses a complete header whose first two bytes were already checked.
    @inline(__always)
    func parseHeader(_ h: UnsafeRawBufferPointer) throws(ProtocolViolation) -> FrameHeader {
        let b0 = h[0], b1 = h[1]
        var length = UInt64(b1 & 0x7F)
        var at = 2
        if length == 126 {
            length = UInt64(UInt16(h[2]) << 8 | UInt16(h[3]))
            if length < 126 { throw ProtocolViolation(.nonMinimalLength) }
            at = 4
        } else if length == 127 {
            length = UInt64(bigEndian: h.loadUnaligned(fromByteOffset: 2, as: UInt64.self))
            if length & (1 << 63) != 0 { throw ProtocolViolation(.lengthHighBitSet) }
            if length <= 0xFFFF { throw ProtocolViolation(.nonMinimalLength) }
            at = 10
        }
        if length > maxFrameSize { throw ProtocolViolation(.frameTooLarge(length)) }
        let isMasked = b1 & 0x80 != 0
        let key: UInt32 = isMasked ? h.loadUnaligned(fromByteOffset: at, as: UInt32.self) : 0
        // checkFirstByte already refused reserved opcodes; this guard keeps that a thrown error, never a trap.
        guard let opcode = Opcode(rawValue: b0 & 0x0F) else { throw ProtocolViolation(.reservedOpcode(b0 & 0x0F)) }
        return FrameHeader(fin: b0 & 0x80 != 0, rsv1: b0 & 0x40 != 0, rsv2: b0 & 0x20 != 0, rsv3: b0 & 0x10 != 0,
                           opcode: opcode, masked: isMasked, maskKey: key, payloadLength: length)
    }

    @inline(__always)
    mutating func startFrame(_ header: FrameHeader) -> Event {
        inPayload = true
        remaining = header.payloadLength
        masked = header.masked
        maskKey = header.maskKey
        phase = 0
        return .header(header)
    }

    @inline(__always)
    mutating func payloadEvent(_ buffer: UnsafeMutableRawBufferPointer, at offset: inout Int) -> Event {
        let available = buffer.count &- offset
        if remaining == 0 {
            inPayload = false
            return .payload(UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<offset]), frameComplete: true)
        }
        if available == 0 { return .needMoreData }
        let take = remaining < UInt64(available) ? Int(remaining) : available
        let chunk = UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<(offset &+ take)])
        if masked { phase = applyMask(chunk, key: maskKey, phase: phase) }
        offset &+= take
        remaining &-= UInt64(take)
        let complete = remaining == 0
        if complete { inPayload = false }
        return .payload(chunk, frameComplete: complete)
    }
}

