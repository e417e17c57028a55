/// A WebSocket frame opcode (RFC 6455 section 5.2). Reserved opcodes (3-7, 0xB-0xF) have no case:
/// a decoder that meets one fails with ``ProtocolViolation/Kind/reservedOpcode``.
public enum Opcode: UInt8, Sendable, CaseIterable {
    case continuation = 0x0
    case text = 0x1
    case binary = 0x2
    case close = 0x8
    case ping = 0x9
    case pong = 0xA

    /// Control frames (close, ping, pong) have the high bit of the opcode set.
    @inlinable public var isControl: Bool { rawValue & 0x8 != 0 }
}
