/// Policy for permessage-deflate (RFC 7692). The same type serves both roles:
/// a server uses it in ``PerMessageDeflate/negotiate(offers:configuration:)``, a client in
/// ``PerMessageDeflate/clientOffer(_:)`` and ``PerMessageDeflate/acceptClientResponse(_:configuration:)``.
public struct PerMessageDeflateConfiguration: Sendable, Equatable {
    /// Server: whether to accept permessage-deflate at all.
    public var enabled: Bool
    /// Server: always answer with `server_no_context_takeover` (less memory per connection, worse ratio).
    /// Client: ask the server for it.
    public var serverNoContextTakeover: Bool
    /// Server: ask the client not to keep context (`client_no_context_takeover` in the answer).
    /// Client: declare that it will not keep context.
    public var clientNoContextTakeover: Bool
    /// Largest LZ77 window (8...15) the server compresses with. Client: requested via `server_max_window_bits`.
    public var serverMaxWindowBits: Int
    /// Largest window (8...15) the server lets the client use (sent only when the client offered
    /// `client_max_window_bits`). Client: the window it will use.
    public var clientMaxWindowBits: Int
    /// zlib compression level 0...9 (or -1 for zlib's default).
    public var compressionLevel: Int32
    /// zlib memLevel 1...9 (memory for the compressor's internal state; 8 is zlib's default).
    public var memLevel: Int32
    /// Messages shorter than this are sent uncompressed (RSV1 clear), which RFC 7692 allows.
    public var minimumSizeToCompress: Int

    public init(enabled: Bool = true, serverNoContextTakeover: Bool = false, clientNoContextTakeover: Bool = false,
                serverMaxWindowBits: Int = 15, clientMaxWindowBits: Int = 15, compressionLevel: Int32 = 6,
                memLevel: Int32 = 8, minimumSizeToCompress: Int = 64) {
        precondition((8...15).contains(serverMaxWindowBits) && (8...15).contains(clientMaxWindowBits), "window bits must be 8...15")
        precondition((-1...9).contains(compressionLevel) && (1...9).contains(memLevel), "invalid zlib level or memLevel")
        self.enabled = enabled
        self.serverNoContextTakeover = serverNoContextTakeover
        self.clientNoContextTakeover = clientNoContextTakeover
        self.serverMaxWindowBits = serverMaxWindowBits
        self.clientMaxWindowBits = clientMaxWindowBits
        self.compressionLevel = compressionLevel
        self.memLevel = memLevel
        self.minimumSizeToCompress = minimumSizeToCompress
    }
}

/// The negotiated permessage-deflate parameters of one connection (both directions).
public struct PerMessageDeflateParameters: Sendable, Equatable, CustomStringConvertible {
    /// The server resets its compressor after every message.
    public var serverNoContextTakeover: Bool
    /// The client resets its compressor after every message.
    public var clientNoContextTakeover: Bool
    /// The server's LZ77 window is at most 2^serverMaxWindowBits (8...15).
    public var serverMaxWindowBits: Int
    /// The client's LZ77 window is at most 2^clientMaxWindowBits (8...15).
    public var clientMaxWindowBits: Int

    public init(serverNoContextTakeover: Bool = false, clientNoContextTakeover: Bool = false,
                serverMaxWindowBits: Int = 15, clientMaxWindowBits: Int = 15) {
        self.serverNoContextTakeover = serverNoContextTakeover
        self.clientNoContextTakeover = clientNoContextTakeover
        self.serverMaxWindowBits = serverMaxWindowBits
        self.clientMaxWindowBits = clientMaxWindowBits
    }

    public var description: String {
        "server(noTakeover: \(serverNoContextTakeover), bits: \(serverMaxWindowBits)) client(noTakeover: \(clientNoContextTakeover), bits: \(clientMaxWindowBits))"
    }
}

/// permessage-deflate negotiation (RFC 7692 section 7.1).
public enum PerMessageDeflate {
    public static let extensionName = "permessage-deflate"

    /// Which end of the connection a compressor or decompressor belongs to.
    public enum Role: Sendable { case server, client }

    /// A permessage-deflate offer with its parameters checked (RFC 7692 section 7.1):
    /// only the four known names, each at most once, flags without values, window bits "8"..."15"
    /// (`server_max_window_bits` needs a value, `client_max_window_bits` may omit it).
    struct Offer: Equatable {
        var serverNoContextTakeover = false
        var clientNoContextTakeover = false
        var serverMaxWindowBits: Int? = nil
        /// Outer nil: parameter absent. Inner nil: present without a value.
        var clientMaxWindowBits: Int?? = nil

        init?(_ parameters: [ExtensionParameter]) {
            var seen = Set<String>()
            for p in parameters {
                guard seen.insert(p.name).inserted else { return nil }
                switch p.name {
                case "server_no_context_takeover":
                    guard p.value == nil else { return nil }
                    serverNoContextTakeover = true
                case "client_no_context_takeover":
                    guard p.value == nil else { return nil }
                    clientNoContextTakeover = true
                case "server_max_window_bits":
                    guard let v = p.value, let bits = PerMessageDeflate.windowBits(v) else { return nil }
                    serverMaxWindowBits = bits
                case "client_max_window_bits":
                    if let v = p.value {
                        guard let bits = PerMessageDeflate.windowBits(v) else { return nil }
                        clientMaxWindowBits = .some(bits)
                    } else {
                        clientMaxWindowBits = .some(nil)
                    }
                default:
                    return nil
                }
            }
        }
    }

    /// "8" ... "15" exactly (RFC 7692 ABNF: `%x38-39 / "1" %x30-35`, so no leading zeros or signs).
    static func windowBits(_ s: String) -> Int? {
        switch s {
        case "8": return 8
        case "9": return 9
        case "10": return 10
        case "11": return 11
        case "12": return 12
        case "13": return 13
        case "14": return 14
        case "15": return 15
        default: return nil
        }
    }

    /// Server side: walks `offers` in order and accepts the first acceptable permessage-deflate offer,
    /// skipping offers with unknown, duplicated or invalid parameters. Returns nil to decline
    /// (the connection proceeds uncompressed) or the parameters and the `Sec-WebSocket-Extensions` answer.
    ///
    /// The answer, parameter by parameter:
    /// - `server_no_context_takeover`: when offered or when the configuration forces it.
    /// - `client_no_context_takeover`: when the configuration asks for it or the client declared it.
    /// - `server_max_window_bits=M`: M = min(offered N, configured); sent when offered (RFC 7692 7.1.2.1
    ///   requires it then) or when the configured window is below 15.
    /// - `client_max_window_bits=M`: only if the client offered the parameter, and only when the configured
    ///   limit is below what the client already promised (its value, or 15 without one).
    /// A server window of 8 is compressed with zlib windowBits 9 (zlib's raw deflate rejects 8), which keeps
    /// the promise: zlib never emits a distance above 2^bits - 262, i.e. 250 for 9 bits, under 256.
    public static func negotiate(offers: [ExtensionOffer], configuration: PerMessageDeflateConfiguration)
        -> (parameters: PerMessageDeflateParameters, responseHeaderValue: String)? {
        guard configuration.enabled else { return nil }
        for offer in offers where offer.name == extensionName {
            guard let o = Offer(offer.parameters) else { continue }
            var p = PerMessageDeflateParameters()
            var answer = extensionName
            if o.serverNoContextTakeover || configuration.serverNoContextTakeover {
                p.serverNoContextTakeover = true
                answer += "; server_no_context_takeover"
            }
            if o.clientNoContextTakeover || configuration.clientNoContextTakeover {
                p.clientNoContextTakeover = true
                answer += "; client_no_context_takeover"
            }
            let serverBits = min(o.serverMaxWindowBits ?? 15, configuration.serverMaxWindowBits)
            p.serverMaxWindowBits = serverBits
            if o.serverMaxWindowBits != nil || serverBits < 15 {
                answer += "; server_max_window_bits=\(serverBits)"
            }
            switch o.clientMaxWindowBits {
            case .none:
                p.clientMaxWindowBits = 15  // must not answer it; the client may use any window
            case .some(let promised):
                let clientPromise = promised ?? 15
                if configuration.clientMaxWindowBits < clientPromise {
                    p.clientMaxWindowBits = configuration.clientMaxWindowBits
                    answer += "; client_max_window_bits=\(configuration.clientMaxWindowBits)"
                } else {
                    p.clientMaxWindowBits = clientPromise
                }
            }
            return (p, answer)
        }
        return nil
    }

    /// Client side: the `Sec-WebSocket-Extensions` value offering permessage-deflate. Always carries
    /// `client_max_window_bits` (announcing support for it), with a value when ours is below 15.
    public static func clientOffer(_ configuration: PerMessageDeflateConfiguration) -> String {
        var offer = extensionName
        if configuration.serverNoContextTakeover { offer += "; server_no_context_takeover" }
        if configuration.clientNoContextTakeover { offer += "; client_no_context_takeover" }
        if configuration.serverMaxWindowBits < 15 { offer += "; server_max_window_bits=\(configuration.serverMaxWindowBits)" }
        offer += "; client_max_window_bits"
        if configuration.clientMaxWindowBits < 15 { offer += "=\(configuration.clientMaxWindowBits)" }
        return offer
    }

    /// Client side: checks the server's `Sec-WebSocket-Extensions` answer (parsed) against the offer
    /// ``clientOffer(_:)`` made from `configuration`. Returns nil when the server declined (no extensions),
    /// the negotiated parameters when it accepted, and throws when the answer is not a valid response to
    /// our offer (unknown extension, several, invalid or unrequested parameters, windows above our request,
    /// a requested `server_no_context_takeover` missing). The client must then fail the connection.
    public static func acceptClientResponse(_ extensions: [ExtensionOffer], configuration: PerMessageDeflateConfiguration?)
        throws(ClientHandshakeError) -> PerMessageDeflateParameters? {
        guard let first = extensions.first else { return nil }
        guard let configuration, extensions.count == 1, first.name == extensionName else {
            throw .invalidExtensions("the server answered with extensions that were not offered")
        }
        guard let o = Offer(first.parameters) else { throw .invalidExtensions("invalid permessage-deflate parameters") }
        if configuration.serverNoContextTakeover && !o.serverNoContextTakeover {
            throw .invalidExtensions("server_no_context_takeover was requested but not granted")
        }
        var p = PerMessageDeflateParameters()
        p.serverNoContextTakeover = o.serverNoContextTakeover
        p.clientNoContextTakeover = o.clientNoContextTakeover || configuration.clientNoContextTakeover
        if let bits = o.serverMaxWindowBits {
            guard bits <= configuration.serverMaxWindowBits else {
                throw .invalidExtensions("server_max_window_bits=\(bits) exceeds the requested \(configuration.serverMaxWindowBits)")
            }
            p.serverMaxWindowBits = bits
        } else if configuration.serverMaxWindowBits < 15 {
            throw .invalidExtensions("server_max_window_bits was requested but not answered")
        }
        switch o.clientMaxWindowBits {
        case .none:
            p.clientMaxWindowBits = configuration.clientMaxWindowBits
        case .some(.none):
            throw .invalidExtensions("client_max_window_bits in a response needs a value")
        case .some(.some(let bits)):
            p.clientMaxWindowBits = min(bits, configuration.clientMaxWindowBits)
        }
        return p
    }
}
