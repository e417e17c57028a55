import Testing
@testable import WSProtocol

typealias PMDParams = PerMessageDeflateParameters
typealias PMDConfig = PerMessageDeflateConfiguration

struct NegotiationCase: Sendable, CustomTestStringConvertible {
    let offer: String, config: PMDConfig, answer: String?, parameters: PMDParams?
    var testDescription: String { "\(offer) / \(answer ?? "decline")" }
    init(_ offer: String, _ config: PMDConfig, _ answer: String?, _ parameters: PMDParams? = nil) {
        self.offer = offer; self.config = config; self.answer = answer; self.parameters = parameters
    }
    init(_ offer: String, _ answer: String?, _ parameters: PMDParams? = nil) { self.init(offer, PMDConfig(), answer, parameters) }
}

private let pmd = "permessage-deflate"

/// RFC 7692 section 7.1: every parameter alone and combined, with the default server policy and with each policy knob.
private let negotiationCases: [NegotiationCase] = [
    .init(pmd, pmd, PMDParams()),
    .init("\(pmd); server_no_context_takeover", "\(pmd); server_no_context_takeover", PMDParams(serverNoContextTakeover: true)),
    .init("\(pmd); client_no_context_takeover", "\(pmd); client_no_context_takeover", PMDParams(clientNoContextTakeover: true)),
    .init("\(pmd); server_max_window_bits=10", "\(pmd); server_max_window_bits=10", PMDParams(serverMaxWindowBits: 10)),
    .init("\(pmd); server_max_window_bits=8", "\(pmd); server_max_window_bits=8", PMDParams(serverMaxWindowBits: 8)),
    .init("\(pmd); server_max_window_bits=15", "\(pmd); server_max_window_bits=15", PMDParams()),
    .init("\(pmd); server_max_window_bits=\"12\"", "\(pmd); server_max_window_bits=12", PMDParams(serverMaxWindowBits: 12)),
    .init("\(pmd); client_max_window_bits", pmd, PMDParams()),
    .init("\(pmd); client_max_window_bits=10", pmd, PMDParams(clientMaxWindowBits: 10)),
    .init("\(pmd); client_max_window_bits=8", pmd, PMDParams(clientMaxWindowBits: 8)),
    .init("\(pmd); server_no_context_takeover; client_no_context_takeover; server_max_window_bits=9; client_max_window_bits=8",
          "\(pmd); server_no_context_takeover; client_no_context_takeover; server_max_window_bits=9",
          PMDParams(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 9, clientMaxWindowBits: 8)),
    .init("PerMessage-Deflate; Client_Max_Window_Bits", pmd, PMDParams()),
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
    .init(pmd, PMDConfig(enabled: false), nil),
    // Server policy.
    .init(pmd, PMDConfig(serverNoContextTakeover: true), "\(pmd); server_no_context_takeover", PMDParams(serverNoContextTakeover: true)),
    .init(pmd, PMDConfig(clientNoContextTakeover: true), "\(pmd); client_no_context_takeover", PMDParams(clientNoContextTakeover: true)),
    .init(pmd, PMDConfig(serverMaxWindowBits: 10), "\(pmd); server_max_window_bits=10", PMDParams(serverMaxWindowBits: 10)),
    .init("\(pmd); server_max_window_bits=12", PMDConfig(serverMaxWindowBits: 10), "\(pmd); server_max_window_bits=10",
          PMDParams(serverMaxWindowBits: 10)),
    .init("\(pmd); server_max_window_bits=9", PMDConfig(serverMaxWindowBits: 10), "\(pmd); server_max_window_bits=9",
          PMDParams(serverMaxWindowBits: 9)),
    .init(pmd, PMDConfig(clientMaxWindowBits: 10), pmd, PMDParams()),  // the client did not offer the parameter: must not send it
    .init("\(pmd); client_max_window_bits", PMDConfig(clientMaxWindowBits: 10), "\(pmd); client_max_window_bits=10",
          PMDParams(clientMaxWindowBits: 10)),
    .init("\(pmd); client_max_window_bits=12", PMDConfig(clientMaxWindowBits: 10), "\(pmd); client_max_window_bits=10",
          PMDParams(clientMaxWindowBits: 10)),
    .init("\(pmd); client_max_window_bits=9", PMDConfig(clientMaxWindowBits: 10), pmd, PMDParams(clientMaxWindowBits: 9)),
    .init("\(pmd); client_max_window_bits", PMDConfig(serverNoContextTakeover: true, clientNoContextTakeover: true,
                                                   serverMaxWindowBits: 8, clientMaxWindowBits: 8),
          "\(pmd); server_no_context_takeover; client_no_context_takeover; server_max_window_bits=8; client_max_window_bits=8",
          PMDParams(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 8, clientMaxWindowBits: 8)),
    // Several offers: the first acceptable one wins.
    .init("\(pmd); foo, \(pmd); client_max_window_bits=11", pmd, PMDParams(clientMaxWindowBits: 11)),
    .init("x-foo, \(pmd); server_max_window_bits=7, \(pmd)", pmd, PMDParams()),
    .init("\(pmd); server_no_context_takeover, \(pmd)", "\(pmd); server_no_context_takeover", PMDParams(serverNoContextTakeover: true)),
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
    #expect(PerMessageDeflate.negotiate(offers: offers, configuration: PMDConfig())?.parameters == PMDParams(serverNoContextTakeover: true))
}

private let clientConfigs: [PMDConfig] = [
    PMDConfig(), PMDConfig(serverNoContextTakeover: true), PMDConfig(clientNoContextTakeover: true), PMDConfig(serverMaxWindowBits: 9),
    PMDConfig(clientMaxWindowBits: 8), PMDConfig(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 12,
                                           clientMaxWindowBits: 11),
]
private let serverConfigs: [PMDConfig] = [
    PMDConfig(), PMDConfig(serverNoContextTakeover: true), PMDConfig(clientNoContextTakeover: true), PMDConfig(serverMaxWindowBits: 10),
    PMDConfig(clientMaxWindowBits: 9), PMDConfig(serverNoContextTakeover: true, clientNoContextTakeover: true, serverMaxWindowBits: 8,
                                           clientMaxWindowBits: 8),
]

/// Client offer -> server answer -> client check: both ends must agree on the same parameters,
/// and the agreement must respect both policies.
@Test(arguments: clientConfigs, serverConfigs)
func bothEndsAgree(client: PMDConfig, server: PMDConfig) throws {
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
    #expect(PerMessageDeflate.clientOffer(PMDConfig()) == "\(pmd); client_max_window_bits")
    #expect(PerMessageDeflate.clientOffer(PMDConfig(serverNoContextTakeover: true, clientNoContextTakeover: true,
                                                 serverMaxWindowBits: 10, clientMaxWindowBits: 9))
        == "\(pmd); server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10; client_max_window_bits=9")
}

@Test func clientRequiresRequestedServerNoContextTakeover() throws {
    #expect(throws: ClientHandshakeError.self) {
        try PerMessageDeflate.acceptClientResponse(ExtensionOffer.parse([pmd]), configuration: PMDConfig(serverNoContextTakeover: true))
    }
    #expect(throws: ClientHandshakeError.self) {
        try PerMessageDeflate.acceptClientResponse(ExtensionOffer.parse([pmd]), configuration: nil)
    }
    #expect(throws: ClientHandshakeError.self) {
        try PerMessageDeflate.acceptClientResponse(ExtensionOffer.parse(["\(pmd), \(pmd)"]), configuration: PMDConfig())
    }
}
