/// Something a peer sent that breaks RFC 6455 / RFC 7692 or a configured limit.
/// Every violation knows the close code that answers it, so the caller never has to guess.
public struct ProtocolViolation: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Kind: Hashable, Sendable {
        // Framing (answered with 1002)
        case reservedBitsSet
        case reservedOpcode(UInt8)
        case fragmentedControlFrame
        case controlFrameTooLong(UInt64)
        case nonMinimalLength
        case lengthHighBitSet
        case unmaskedClientFrame
        case maskedServerFrame
        case unexpectedContinuation
        case expectedContinuation
        case invalidCloseBodyLength
        case invalidCloseCode(UInt16)
        case frameAfterClose
        // Payload (answered with 1007)
        case invalidUTF8
        case invalidCompressedData
        // Limits (answered with 1009)
        case frameTooLarge(UInt64)
        case messageTooLarge(Int)
        case decompressedTooLarge(Int)
        // Data the endpoint does not accept (answered with 1003)
        case unsupportedData
    }

    public let kind: Kind
    @inlinable public init(_ kind: Kind) { self.kind = kind }

    /// The close code an endpoint sends when it meets this violation.
    public var closeCode: CloseCode {
        switch kind {
        case .invalidUTF8, .invalidCompressedData: return .invalidPayloadData
        case .frameTooLarge, .messageTooLarge, .decompressedTooLarge: return .messageTooBig
        case .unsupportedData: return .unsupportedData
        default: return .protocolError
        }
    }

    public var description: String {
        switch kind {
        case .reservedBitsSet: return "RSV bit set without a negotiated extension"
        case .reservedOpcode(let op): return "reserved opcode 0x\(String(op, radix: 16))"
        case .fragmentedControlFrame: return "fragmented control frame"
        case .controlFrameTooLong(let n): return "control frame payload of \(n) bytes (max 125)"
        case .nonMinimalLength: return "payload length not minimally encoded"
        case .lengthHighBitSet: return "64-bit payload length with the most significant bit set"
        case .unmaskedClientFrame: return "client frame is not masked"
        case .maskedServerFrame: return "server frame is masked"
        case .unexpectedContinuation: return "continuation frame without a message in progress"
        case .expectedContinuation: return "new data frame while a fragmented message is in progress"
        case .invalidCloseBodyLength: return "close frame body of 1 byte"
        case .invalidCloseCode(let c): return "invalid close code \(c)"
        case .frameAfterClose: return "frame received after close"
        case .invalidUTF8: return "invalid UTF-8 in text message or close reason"
        case .invalidCompressedData: return "invalid permessage-deflate data"
        case .frameTooLarge(let n): return "frame of \(n) bytes exceeds the frame size limit"
        case .messageTooLarge(let n): return "message of \(n)+ bytes exceeds the message size limit"
        case .decompressedTooLarge(let n): return "decompressed message of \(n)+ bytes exceeds the message size limit"
        case .unsupportedData: return "unsupported data type"
        }
    }
}
