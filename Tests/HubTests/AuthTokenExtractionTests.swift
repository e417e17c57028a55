import Testing
@testable import Hub

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
}

@Test func nonBearerSchemeHasSpecificMessage() throws {
    guard case .failure(let failure) = TokenExtraction.bearerToken(authorizationHeader: "Basic x", accessTokenQuery: nil) else {
        Issue.record("expected failure")
        return
    }
    #expect(failure.message.contains("Bearer"))
    #expect(!failure.message.contains("Basic x"))
}
