import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubJSON
@testable import HubRouting

private enum Expect: Sendable, Equatable {
    case token(String)
    case failure(AuthFailure.Reason)
}

@Test(arguments: [
    ("Bearer abc.def.ghi", nil, Expect.token("abc.def.ghi")),
    ("bearer abc", nil, .token("abc")),
    ("BEARER abc", nil, .token("abc")),
    ("BeArEr    abc", nil, .token("abc")),
    ("Bearer\tabc", nil, .token("abc")),
    ("  Bearer abc  ", nil, .token("abc")),
    (nil, "abc", .token("abc")),
    (nil, " abc ", .token("abc")),
    ("Bearer header", "query", .token("header")),          // header preferred
    ("Basic dXNlcjpwYXNz", "query", .failure(.malformed)),  // invalid header does not fall back
    ("", "query", .token("query")),                         // empty header counts as absent
    ("   ", nil, .failure(.missingToken)),
    (nil, nil, .failure(.missingToken)),
    (nil, "", .failure(.missingToken)),
    ("", "", .failure(.missingToken)),
    ("Basic dXNlcjpwYXNz", nil, .failure(.malformed)),
    ("Token abc", nil, .failure(.malformed)),
    ("abc.def.ghi", nil, .failure(.malformed)),
    ("Bearer", nil, .failure(.malformed)),
    ("Bearer    ", nil, .failure(.malformed)),
    ("Bearerabc", nil, .failure(.malformed)),
    ("Bearer abc def", nil, .failure(.malformed)),
    (nil, "abc def", .failure(.malformed)),
] as [(String?, String?, Expect)])
private func tokenExtraction(header: String?, query: String?, expected: Expect) {
    let actual: Expect
    switch TokenExtraction.bearerToken(authorizationHeader: header, accessTokenQuery: query) {
    case .success(let token): actual = .token(token)
    case .failure(let failure): actual = .failure(failure.reason)
    }
    #expect(actual == expected)
    // The upgrade's way: the header's bytes as they lie in the request head, the token handed over as bytes.
    let fromBytes: Expect
    switch withBearerTokenString(header: header, query: query) {
    case .success(let token): fromBytes = .token(token)
    case .failure(let failure): fromBytes = .failure(failure.reason)
    }
    #expect(fromBytes == expected)
}

/// `TokenExtraction.withBearerToken` on a header's and a query value's bytes, the token it hands over made a `String`
/// to compare.
private func withBearerTokenString(header: String?, query: String?) -> Result<String, AuthFailure> {
    let queryBytes = query.map { Array($0.utf8) }
    func run(_ query: UnsafeBufferPointer<UInt8>?) -> Result<String, AuthFailure> {
        TokenExtraction.withBearerToken(authorizationHeader: header.map { Array($0.utf8)[...] }, accessTokenQuery: query) {
            .success(String(decoding: $0, as: UTF8.self))
        }
    }
    guard let queryBytes else { return run(nil) }
    return queryBytes.withUnsafeBufferPointer { run($0) }
}

@Test func nonBearerSchemeHasSpecificMessage() throws {
    guard case .failure(let failure) = TokenExtraction.bearerToken(authorizationHeader: "Basic x", accessTokenQuery: nil) else {
        Issue.record("expected failure")
        return
    }
    #expect(failure.message.contains("Bearer"))
    #expect(!failure.message.contains("Basic x"))
}

/// The byte rules (every ASCII value without a CR) give exactly what the `Character` rules give, and hand every
/// other value to them (and so does the upgrade's `withBearerToken` on the header's bytes): the parametrised cases above, and 20 000 random header/query pairs drawn from the
/// characters that matter (spaces, tabs, LF, CR, "Bearer" in any case, token bytes, non-ASCII).
@Test func byteRulesAgreeWithCharacterRules() {
    func same(_ a: Result<String, AuthFailure>, _ b: Result<String, AuthFailure>) -> Bool {
        switch (a, b) {
        case (.success(let x), .success(let y)): return x == y
        case (.failure(let x), .failure(let y)): return x.reason == y.reason && x.message == y.message
        default: return false
        }
    }
    var generator = SystemRandomNumberGenerator()
    let pieces = ["Bearer", "bearer", "BEARER", "Bear", "Basic", " ", "  ", "\t", "\n", "\r", "\r\n", "abc.def", "x",
                  "é", "\u{301}", "", "=", "%20"]
    func value() -> String? {
        if Int.random(in: 0..<5, using: &generator) == 0 { return nil }
        return (0..<Int.random(in: 0...5, using: &generator)).map { _ in pieces.randomElement(using: &generator)! }.joined()
    }
    var usedBytes = 0
    for _ in 0..<20_000 {
        let header = value(), query = value()
        let reference = TokenExtraction.bearerTokenOfCharacters(authorizationHeader: header, accessTokenQuery: query)
        if let fast = TokenExtraction.bearerTokenOfBytes(authorizationHeader: header, accessTokenQuery: query) {
            usedBytes += 1
            #expect(same(fast, reference), "header \(String(reflecting: header)) query \(String(reflecting: query))")
        } else {
            let plain = { (v: String?) in v.map { $0.utf8.allSatisfy { $0 < 0x80 && $0 != 0x0D } } ?? true }
            #expect(!(plain(header) && plain(query)), "plain ASCII left to the Character rules: \(String(reflecting: header))")
        }
        #expect(same(TokenExtraction.bearerToken(authorizationHeader: header, accessTokenQuery: query), reference))
        #expect(same(withBearerTokenString(header: header, query: query), reference),
                "bytes: header \(String(reflecting: header)) query \(String(reflecting: query))")
    }
    #expect(usedBytes > 5_000)
}
