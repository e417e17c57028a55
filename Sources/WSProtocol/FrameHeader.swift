/// The decoded fixed part of one WebSocket frame (RFC 6455 section 5.2).
public struct FrameHeader: Hashable, Sendable {
    public var fin: Bool
    public var rsv1: Bool
    public var rsv2: Bool
    public var rsv3: Bool
    public var opcode: Opcode
    public var masked: Bool
    /// The 4 masking-key bytes as loaded little-endian from the wire (0 when `masked` is false),
    /// the form ``applyMask(_:key:phase:)`` takes.
    public var maskKey: UInt32
    public var payloadLength: UInt64

    public init(fin: Bool = true, rsv1: Bool = false, rsv2: Bool = false, rsv3: Bool = false, opcode: Opcode,
                masked: Bool = false, maskKey: UInt32 = 0, payloadLength: UInt64) {
        self.fin = fin; self.rsv1 = rsv1; self.rsv2 = rsv2; self.rsv3 = rsv3
        self.opcode = opcode; self.masked = masked; self.maskKey = maskKey; self.payloadLength = payloadLength
    }
}

/// Which end of the connection this codec runs on.
public enum Role: Sendable, Hashable {
    /// This end is the server: incoming (client) frames must be masked, outgoing frames are not.
    case server
    /// This end is the client: incoming (server) frames must not be masked, outgoing frames are.
    case client
}
