/// A close frame body: the 2-byte big-endian `code` followed by `reason` as UTF-8, truncated at a
/// character boundary so the whole body fits a control frame (125 bytes).
public func closePayload(code: CloseCode, reason: String) -> [UInt8] {
    var out: [UInt8] = [UInt8(code.rawValue >> 8), UInt8(code.rawValue & 0xFF)]
    var utf8 = Array(reason.utf8)
    if utf8.count > 123 {
        var end = 123
        // Step back over continuation bytes so we cut before a code point's lead byte.
        while end > 0 && utf8[end] & 0xC0 == 0x80 { end -= 1 }
        utf8.removeSubrange(end...)
    }
    out.append(contentsOf: utf8)
    return out
}

/// The close handshake (RFC 6455 sections 5.5.1, 7.1) as a pure state machine: no sockets, no clocks.
/// The connection reports events and carries out the returned action.
///
/// Who closes TCP: the server closes the TCP connection after sending its close reply, and after
/// receiving the reply to its own close. A client sends its reply (or waits for the server's reply)
/// and then waits for the server to close TCP (falling back to closing itself after a timeout,
/// which is the caller's business).
public struct CloseHandshake: Sendable, Hashable {
    public enum State: Sendable, Hashable {
        case open
        /// We sent a close frame and wait for the peer's.
        case closeSent
        /// Both close frames have been exchanged, or the connection was failed.
        case closed
    }

    public enum Action: Sendable, Hashable {
        case none
        /// Send a close frame with this code (nil: empty body), then close TCP if `thenCloseTCP`.
        case sendClose(code: CloseCode?, thenCloseTCP: Bool)
        /// Close the TCP connection now.
        case closeTCP
        /// Nothing to send; wait for the server to close TCP (client only).
        case awaitTCPClose
    }

    public let role: Role
    public private(set) var state: State = .open

    public init(role: Role) { self.role = role }

    /// We want to close (shutdown, going away, policy): send a close frame and wait for the reply.
    public mutating func close(code: CloseCode) -> Action {
        guard state == .open else { return .none }
        state = .closeSent
        return .sendClose(code: code, thenCloseTCP: false)
    }

    /// The peer sent a close frame (already validated by ``MessageReader``; `code` nil for an empty body).
    public mutating func peerSentClose(code: UInt16?) -> Action {
        switch state {
        case .open:
            state = .closed
            // Echo the peer's code (RFC 6455 5.5.1: "typically echos the status code it received").
            return .sendClose(code: code.map(CloseCode.init(rawValue:)), thenCloseTCP: role == .server)
        case .closeSent:
            state = .closed
            return role == .server ? .closeTCP : .awaitTCPClose
        case .closed:
            return .none
        }
    }

    /// The peer broke the protocol: fail the connection (RFC 6455 7.1.7): send the violation's close
    /// code if we have not sent a close yet, then close TCP without waiting for a reply.
    public mutating func violation(_ violation: ProtocolViolation) -> Action {
        switch state {
        case .open:
            state = .closed
            return .sendClose(code: violation.closeCode, thenCloseTCP: true)
        case .closeSent:
            state = .closed
            return .closeTCP
        case .closed:
            return .none
        }
    }
}
