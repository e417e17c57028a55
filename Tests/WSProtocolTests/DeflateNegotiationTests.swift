import Testing
@testable import WSProtocol

typealias P = PerMessageDeflateParameters
typealias Config = PerMessageDeflateConfiguration

struct NegotiationCase: Sendable, CustomTestStringConvertible {
    let offer: String, config: Config, answer: String?, parameters: P?
    var testDescription: String { "\(offer) / \(answer ?? "decline")" }
    init(_ offer: String, _ config: Config, _ answer: String?, _ parameters: P? = nil) {
        self.offer = offer; self.config = config; self.answer = answer; self.parameters = parameters
    }
    init(_ offer: String, _ answer: String?, _ parameters: P? = nil) { self.init(offer, Config(), answer, parameters) }
}

let pmd = "permessage-deflate"

/// RFC 7692 section 7.1: every parameter alone and combined, with the default server policy and with each policy knob.
let negotiationCases: [NegotiationCase] = [
    .init(pmd, pmd, P()),
    .init("\(pmd); server_no_context_takeover", "\(pmd); server_no_context_takeover", P(serverNoContextTakeover: true)),
    .init("\(pmd); client_no_context_takeover", "\(pmd); client_no_context_takeover", P(clientNoContextTakeover: true)),
    .init("\(pmd); server_max_window_bits=10", "\(pmd); server_max_window_bits=10", P(serverMaxWindowBits: 10)),
    .init("\(pmd); server_max_window_bits=8", "\(pmd); server_max_window_bits=8", P(serverMaxWindowBits: 8)),
    .init("\(pmd); server_max_window_bits=15", "\(pmd); server_max_window_bits=15", P()),
    .init("\(pmd); server_max_window_bits=\"12\"", "\(pmd); server_max_window_bits=12", P(serverMaxWindowBits: 12)),
    .init("\(pmd); client_max_window_bits", pmd, P()),
    .init("\(pmd); client_max_window_bits=10", pmd, P(clientMaxWindowBits: 10)),
    .init("\(pmd); client_max_window_bits=8", pmd, P(clientMaxWindowBits: 8)),
    .init("\(pmd); server_no_context_takeover; client_no_context_takeover; server_max_window_bits=9; client_max_window_bits=8",
          "\(pmd); server_no_context_takeover; client_no_context_takeover; server_max_window_bits=9",
          P(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 9, clientMaxWindowBits: 8)),
    .init("PerMessage-Deflate; Client_Max_Window_Bits", pmd, P()),
    // Declined offers: invalid values, values on flags, missing required value, duplicates, unknown names.
    .init("\(pmd); server_max_window_bits", nil),
    .init("\(pmd); server_max_window_bits=7", nil),
    .init("\(pmd); server_max_window_bits=16", nil),
    .init("\(pmd); server_max_window_bits=08", nil),
    .init("\(pmd); server_max_window_bits=+9", nil),
    .init("\(pmd); client_max_window_bits=7", nil),
    .init("\(pmd); client_max_window_bits=16", nil),
    .init("\(pmd); client_max_window_bits=abc", nil),
    .init("\(pmd); server_no_context_takeover=1", nil),
    .init("\(pmd); client_no_context_takeover=\"x\"", nil),
    .init("\(pmd); server_no_context_takeover; server_no_context_takeover", nil),
    .init("\(pmd); client_max_window_bits; client_max_window_bits=9", nil),
    .init("\(pmd); foo", nil),
    .init("x-webkit-deflate-frame", nil),
    .init(pmd, Config(enabled: false), nil),
    // Server policy.
    .init(pmd, Config(serverNoContextTakeover: true), "\(pmd); server_no_context_takeover", P(serverNoContextTakeover: true)),
    .init(pmd, Config(clientNoContextTakeover: true), "\(pmd); client_no_context_takeover", P(clientNoContextTakeover: true)),
    .init(pmd, Config(serverMaxWindowBits: 10), "\(pmd); server_max_window_bits=10", P(serverMaxWindowBits: 10)),
    .init("\(pmd); server_max_window_bits=12", Config(serverMaxWindowBits: 10), "\(pmd); server_max_window_bits=10",
          P(serverMaxWindowBits: 10)),
    .init("\(pmd); server_max_window_bits=9", Config(serverMaxWindowBits: 10), "\(pmd); server_max_window_bits=9",
          P(serverMaxWindowBits: 9)),
    .init(pmd, Config(clientMaxWindowBits: 10), pmd, P()),  // the client did not offer the parameter: must not send it
    .init("\(pmd); client_max_window_bits", Config(clientMaxWindowBits: 10), "\(pmd); client_max_window_bits=10",
          P(clientMaxWindowBits: 10)),
    .init("\(pmd); client_max_window_bits=12", Config(clientMaxWindowBits: 10), "\(pmd); client_max_window_bits=10",
          P(clientMaxWindowBits: 10)),
    .init("\(pmd); client_max_window_bits=9", Config(clientMaxWindowBits: 10), pmd, P(clientMaxWindowBits: 9)),
    .init("\(pmd); client_max_window_bits", Config(serverNoContextTakeover: true, clientNoContextTakeover: true,
                                                   serverMaxWindowBits: 8, clientMaxWindowBits: 8),
          "\(pmd); server_no_context_takeover; client_no_context_takeover; server_max_window_bits=8; client_max_window_bits=8",
          P(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 8, clientMaxWindowBits: 8)),
    // Several offers: the first acceptable one wins.
    .init("\(pmd); foo, \(pmd); client_max_window_bits=11", pmd, P(clientMaxWindowBits: 11)),
    .init("x-foo, \(pmd); server_max_window_bits=7, \(pmd)", pmd, P()),
    .init("\(pmd); server_no_context_takeover, \(pmd)", "\(pmd); server_no_context_takeover", P(serverNoContextTakeover: true)),
]

@Test(arguments: negotiationCases)
func negotiation(_ c: NegotiationCase) throws {
    let offers = try ExtensionOffer.parse([c.offer])
    let result = PerMessageDeflate.negotiate(offers: offers, configuration: c.config)
    #expect(result?.responseHeaderValue == c.answer)
    #expect(result?.parameters == c.parameters)
    if let result {
        // The answer must also be acceptable to a client that made this offer (parsed back the same way).
        let answer = try ExtensionOffer.parse([result.responseHeaderValue])
        #expect(answer.count == 1 && answer[0].name == pmd)
    }
}

@Test func offersSplitAcrossHeaderLines() throws {
    let offers = try ExtensionOffer.parse(["\(pmd); server_max_window_bits=99", "\(pmd); server_no_context_takeover"])
    #expect(PerMessageDeflate.negotiate(offers: offers, configuration: Config())?.parameters == P(serverNoContextTakeover: true))
}

let clientConfigs: [Config] = [
    Config(), Config(serverNoContextTakeover: true), Config(clientNoContextTakeover: true), Config(serverMaxWindowBits: 9),
    Config(clientMaxWindowBits: 8), Config(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 12,
                                           clientMaxWindowBits: 11),
]
let serverConfigs: [Config] = [
    Config(), Config(serverNoContextTakeover: true), Config(clientNoContextTakeover: true), Config(serverMaxWindowBits: 10),
    Config(clientMaxWindowBits: 9), Config(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 8,
                                           clientMaxWindowBits: 8),
]

/// Client offer -> server answer -> client check: both ends must agree on the same parameters,
/// and the agreement must respect both policies.
@Test(arguments: clientConfigs, serverConfigs)
func bothEndsAgree(client: Config, server: Config) throws {
    let offer = PerMessageDeflate.clientOffer(client)
    let negotiated = try #require(PerMessageDeflate.negotiate(offers: ExtensionOffer.parse([offer]), configuration: server))
    let seen = try PerMessageDeflate.acceptClientResponse(ExtensionOffer.parse([negotiated.responseHeaderValue]), configuration: client)
    #expect(seen == negotiated.parameters)
    let p = negotiated.parameters
    #expect(p.serverMaxWindowBits <= min(client.serverMaxWindowBits, server.serverMaxWindowBits))
    #expect(p.clientMaxWindowBits <= min(client.clientMaxWindowBits, server.clientMaxWindowBits))
    #expect(p.serverNoContextTakeover == (client.serverNoContextTakeover || server.serverNoContextTakeover))
    #expect(p.clientNoContextTakeover == (client.clientNoContextTakeover || server.clientNoContextTakeover))
}

@Test func clientOfferStrings() {
    #expect(PerMessageDeflate.clientOffer(Config()) == "\(pmd); client_max_window_bits")
    #expect(PerMessageDeflate.clientOffer(Config(serverNoContextTakeover: true, clientNoContextTakeover: true,
                                                 serverMaxWindowBits: 10, clientMaxWindowBits: 9))
        == "\(pmd); server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10; client_max_window_bits=9")
}

@Test func clientRequiresRequestedServerNoContextTakeover() throws {
    #expect(throws: ClientHandshakeError.self) {
        try PerMessageDeflate.acceptClientResponse(ExtensionOffer.parse([pmd]), configuration: Config(serverNoContextTakeover: true))
    }
    #expect(throws: ClientHandshakeError.self) {
        try PerMessageDeflate.acceptClientResponse(ExtensionOffer.parse([pmd]), configuration: nil)
    }
    #expect(throws: ClientHandshakeError.self) {
        try PerMessageDeflate.acceptClientResponse(ExtensionOffer.parse(["\(pmd), \(pmd)"]), configuration: Config())
    }
}
