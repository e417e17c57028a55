/// A WebSocket close status code (RFC 6455 section 7.4).
///
/// Hub's own application codes live in 4000-4999 and are documented in `docs/PROTOCOL.md`.
public struct CloseCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16
    @inlinable public init(rawValue: UInt16) { self.rawValue = rawValue }
    @inlinable public init(_ rawValue: UInt16) { self.rawValue = rawValue }

    public static let normalClosure = CloseCode(1000)
    public static let goingAway = CloseCode(1001)
    public static let protocolError = CloseCode(1002)
    public static let unsupportedData = CloseCode(1003)
    /// Never sent on the wire: stands for "the close frame had no body".
    public static let noStatusReceived = CloseCode(1005)
    /// Never sent on the wire: stands for "the connection dropped without a close frame".
    public static let abnormalClosure = CloseCode(1006)
    public static let invalidPayloadData = CloseCode(1007)
    public static let policyViolation = CloseCode(1008)
    public static let messageTooBig = CloseCode(1009)
    public static let mandatoryExtension = CloseCode(1010)
    public static let internalError = CloseCode(1011)

    /// Whether `code` may appear in a close frame sent by a peer (RFC 6455 7.4.1 and 7.4.2):
    /// 1000-1003, 1007-1011 (the IANA registry's assigned codes 1012-1014 are accepted too),
    /// and 3000-4999. 0-999, 1004-1006, 1015, 1016-2999 and 5000+ are protocol errors.
    @inlinable public static func isValidOnWire(_ code: UInt16) -> Bool {
        switch code {
        case 1000...1003, 1007...1014, 3000...4999: return true
        default: return false
        }
    }

    public var description: String { String(rawValue) }
}
