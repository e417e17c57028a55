import Foundation

/// One WebSocket connection as `HubClient` needs it: open, send text, receive text, close. Two implementations:
/// `POSIXTransport` (WSProtocol's client handshake and codec over a socket; what runs on Linux and in the tests) and
/// `URLSessionTransport` (`URLSessionWebSocketTask`, for Apple platforms).
public protocol HubTransport: Sendable {
    /// Opens the WebSocket to `url`, offering `protocols` in `Sec-WebSocket-Protocol`. Throws when it cannot.
    func connect(url: URL, protocols: [String]) async throws
    /// Sends one text message.
    func send(text: String) async throws
    /// The next message; `.closed` once, when the connection ends (with the peer's close code, or 1006).
    func receive() async -> HubTransportMessage
    /// Sends a close frame and ends the connection; `receive()` then returns `.closed`.
    func close(code: UInt16, reason: String) async
}

public enum HubTransportMessage: Sendable, Equatable {
    case text(String)
    /// `code` 1006 when the connection ended without a close frame (the network, or a failed connect).
    case closed(code: UInt16, reason: String)
}

/// Why a connect failed before the WebSocket opened.
public struct HubTransportError: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// The HTTP status of a refused upgrade (401, 429, 503, …), when there was one.
    public let httpStatus: Int?
    /// The URL or the setup cannot work with this transport (a `wss://` URL on a transport without TLS, no host):
    /// `HubClient` stops at once (`willRetry: false`) rather than retry what cannot succeed.
    public let isConfigurationError: Bool
    public init(_ description: String, httpStatus: Int? = nil, isConfigurationError: Bool = false) {
        self.description = description
        self.httpStatus = httpStatus
        self.isConfigurationError = isConfigurationError
    }
}
