import Testing
@testable import WSProtocol

/// Our version of the Autobahn|Testsuite compression categories, without sockets:
/// 12.x sends payloads of different kinds and sizes with the default offer; 13.x varies the negotiated
/// parameters. Every case negotiates from a real offer string, then pushes messages through
/// deflater -> inflater in BOTH directions (server -> client and client -> server) and checks them byte for byte.
/// Autobahn sends 1000 messages per case; we send fewer (the machine is shared) but keep every size.
@Suite struct Autobahn12and13Tests {
    enum Payload: String, CaseIterable, Sendable {
        case text, json, binary, repetitive
    }

    static let sizes = [16, 64, 256, 1024, 4096, 8192, 16384, 32768, 65536, 131072]

    static func payload(_ kind: Payload, size: Int, seed: UInt64) -> [UInt8] {
        var rng = DeflateTestRNG(state: seed)
        switch kind {
        case .text:
            let words = ["lorem", "ipsum", "dolor", "sit", "amet", "häagen", "δέλτα", "✓", "hub", "websocket"]
            var s = [UInt8]()
            while s.count < size { s += Array((words.randomElement(using: &rng)! + " ").utf8) }
            return Array(s.prefix(size))
        case .json: return deflateTestJSON(size, &rng)
        case .binary: return deflateTestRandomBytes(size, &rng)
        case .repetitive: return (0..<size).map { UInt8(truncatingIfNeeded: $0 % 7) }
        }
    }

    /// Runs `count` messages of each size through both directions of a negotiated connection.
    static func exchange(offer: String, server: PerMessageDeflateConfiguration, kind: Payload, count: Int) throws {
        let negotiated = try #require(PerMessageDeflate.negotiate(offers: ExtensionOffer.parse([offer]), configuration: server))
        let p = negotiated.parameters
        let serverOut = PerMessageDeflater(parameters: p, role: .server, configuration: server)
        let clientIn = PerMessageInflater(parameters: p, role: .client)
        let clientOut = PerMessageDeflater(parameters: p, role: .client)
        let serverIn = PerMessageInflater(parameters: p, role: .server)
        var seed: UInt64 = 1
        for size in sizes {
            for _ in 0..<count {
                seed += 1
                let message = payload(kind, size: size, seed: seed)
                let down = serverOut.compressMessage(message)
                #expect(try clientIn.decompressMessage(down, limit: size) == message, "\(offer) \(kind) \(size) server->client")
                let up = clientOut.compressMessage(message)
                #expect(try serverIn.decompressMessage(up, limit: size) == message, "\(offer) \(kind) \(size) client->server")
                if kind == .repetitive { #expect(down.count < size / 4 + 16) }
            }
        }
    }

    // 12.1-12.5: the default offer, different payloads.
    @Test(arguments: Payload.allCases)
    func category12(kind: Payload) throws {
        try Self.exchange(offer: "permessage-deflate", server: PerMessageDeflateConfiguration(), kind: kind, count: 2)
    }

    // 13.1-13.7: different parameter sets (offers as Autobahn's client sends them), plus server policies.
    static let category13Offers: [(String, PerMessageDeflateConfiguration)] = [
        ("permessage-deflate", PerMessageDeflateConfiguration()),
        ("permessage-deflate; client_no_context_takeover", PerMessageDeflateConfiguration()),
        ("permessage-deflate; client_max_window_bits=8", PerMessageDeflateConfiguration()),
        ("permessage-deflate; client_max_window_bits=15", PerMessageDeflateConfiguration()),
        ("permessage-deflate; client_no_context_takeover; client_max_window_bits=8", PerMessageDeflateConfiguration()),
        ("permessage-deflate; client_no_context_takeover; client_max_window_bits=15", PerMessageDeflateConfiguration()),
        ("permessage-deflate; client_no_context_takeover; client_max_window_bits=9, permessage-deflate; client_max_window_bits=8",
         PerMessageDeflateConfiguration()),
        ("permessage-deflate; server_no_context_takeover; server_max_window_bits=8", PerMessageDeflateConfiguration()),
        ("permessage-deflate; server_max_window_bits=9; client_max_window_bits", PerMessageDeflateConfiguration(clientMaxWindowBits: 10)),
        ("permessage-deflate; client_max_window_bits",
         PerMessageDeflateConfiguration(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 8,
                                        clientMaxWindowBits: 8, compressionLevel: 1, memLevel: 1)),
        ("permessage-deflate", PerMessageDeflateConfiguration(compressionLevel: 9, memLevel: 9)),
        ("permessage-deflate", PerMessageDeflateConfiguration(compressionLevel: 0)),
    ]

    @Test(arguments: 0..<category13Offers.count)
    func category13(index: Int) throws {
        let (offer, server) = Self.category13Offers[index]
        for kind in [Payload.json, .binary] {
            try Self.exchange(offer: offer, server: server, kind: kind, count: 1)
        }
    }
}
