/// Why a server's handshake response was refused by the client (RFC 6455 section 4.1: the client
/// must then fail the WebSocket connection).
public enum ClientHandshakeError: Error, Sendable, Equatable {
    case unexpectedStatus(Int)
    case missingUpgrade
    case missingConnection
    case invalidAccept
    case unexpectedSubprotocol(String)
    case invalidExtensions(String)
}

/// What the server agreed to.
public struct ClientHandshakeResult: Sendable, Equatable {
    public var subprotocol: String?
    /// Nil when permessage-deflate was not offered or the server declined it.
    public var deflate: PerMessageDeflateParameters?
}

/// The client side of the opening handshake (tests and the load generator).
public enum ClientHandshake {
    /// A fresh `Sec-WebSocket-Key`: Base64 of 16 random bytes from `SystemRandomNumberGenerator`.
    public static func makeKey() -> String {
        var rng = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(16)
        for _ in 0..<2 {
            let word = rng.next() as UInt64
            for shift in stride(from: 0, to: 64, by: 8) { bytes.append(UInt8(truncatingIfNeeded: word >> UInt64(shift))) }
        }
        return Base64.encode(bytes)
    }

    /// The upgrade request (`GET path HTTP/1.1`, Host, Upgrade, Connection, key, version 13, and the
    /// optional subprotocol and permessage-deflate offers).
    public static func request(host: String, path: String, key: String, subprotocols: [String] = [],
                               extraHeaders: [(String, String)] = [],
                               deflate: PerMessageDeflateConfiguration? = nil) -> [UInt8] {
        var head = "GET \(path) HTTP/1.1\r\nHost: \(host)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        head += "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n"
        if !subprotocols.isEmpty { head += "Sec-WebSocket-Protocol: \(subprotocols.joined(separator: ", "))\r\n" }
        if let deflate { head += "Sec-WebSocket-Extensions: \(PerMessageDeflate.clientOffer(deflate))\r\n" }
        for (name, value) in extraHeaders { head += "\(name): \(value)\r\n" }
        head += "\r\n"
        return Array(head.utf8)
    }

    /// Checks the server's response (RFC 6455 section 4.1, and RFC 7692 section 7.1 for deflate):
    /// status 101, `Upgrade: websocket`, `Connection: upgrade`, the exact `Sec-WebSocket-Accept`,
    /// a subprotocol only if it was offered, and extensions only as a valid answer to our offer.
    public static func verify(_ response: HTTPResponseHead, key: String, offeredSubprotocols: [String],
                              deflate: PerMessageDeflateConfiguration?) throws(ClientHandshakeError) -> ClientHandshakeResult {
        guard response.status == 101 else { throw .unexpectedStatus(response.status) }
        let headers = response.headers
        guard headers.tokens("Upgrade").contains("websocket") else { throw .missingUpgrade }
        guard headers.tokens("Connection").contains("upgrade") else { throw .missingConnection }
        let accepts = headers.values("Sec-WebSocket-Accept")
        guard accepts.count == 1, accepts[0] == WebSocketHandshake.acceptValue(forKey: key) else { throw .invalidAccept }
        var subprotocol: String? = nil
        let protocols = headers.values("Sec-WebSocket-Protocol")
        if !protocols.isEmpty {
            guard protocols.count == 1, offeredSubprotocols.contains(protocols[0]) else {
                throw .unexpectedSubprotocol(protocols.joined(separator: ", "))
            }
            subprotocol = protocols[0]
        }
        let extensions: [ExtensionOffer]
        do {
            extensions = try ExtensionOffer.parse(headers.values("Sec-WebSocket-Extensions"))
        } catch {
            throw .invalidExtensions(error.message)
        }
        let parameters = try PerMessageDeflate.acceptClientResponse(extensions, configuration: deflate)
        return ClientHandshakeResult(subprotocol: subprotocol, deflate: parameters)
    }
}
