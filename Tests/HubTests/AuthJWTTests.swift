import Foundation
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

private typealias F = AuthFixtures
private let now: Int64 = 1_800_000_000

// MARK: - Round trips

@Test func hs256RoundTrip() throws {
    let signer = try JWTSigner(key: .hmacSecret(F.secret))
    let claims = JWTClaims(sub: "acct-42", exp: now + 900, iat: now, nbf: now - 5, iss: "api", aud: ["hub", "api"],
                           jti: "t-1", extra: ["role": .string("member")])
    let token = try signer.sign(claims)
    let verifier = try JWTVerifier(key: .hmacSecret(F.secret), issuer: "api", audience: "hub")
    let verified = try verifier.verify(token, now: now).get()
    #expect(verified == VerifiedToken(subject: "acct-42", expiresAt: now + 900, issuedAt: now, notBefore: now - 5,
                                      issuer: "api", audience: ["hub", "api"], tokenID: "t-1", algorithm: .hs256))
}

@Test(arguments: ["rsa", "ec"])
func asymmetricRoundTrip(kind: String) throws {
    let pair = kind == "rsa" ? F.rsa : F.ec
    let signer = try JWTSigner(key: .privateKeyPEM(pair.privatePEM))
    let verifier = try JWTVerifier(key: .publicKeyPEM(pair.publicPEM))
    #expect(signer.algorithm == (kind == "rsa" ? .rs256 : .es256))
    #expect(verifier.algorithm == signer.algorithm)
    let token = try signer.sign(JWTClaims(subject: "acct-7", now: now, ttl: 900))
    let verified = try verifier.verify(token, now: now + 10).get()
    #expect(verified.subject == "acct-7")
    #expect(verified.expiresAt == now + 900)
    #expect(verified.issuedAt == now)
    if kind == "ec" {
        #expect(Base64URL.decode(String(token.split(separator: ".")[2]))?.count == 64)
    }
}

/// ES256 signatures are randomised and r/s are often < 32 bytes: sign many to exercise left padding.
@Test func es256ManySignaturesVerify() throws {
    let signer = try JWTSigner(key: .privateKeyPEM(F.ec.privatePEM))
    let verifier = try JWTVerifier(key: .publicKeyPEM(F.ec.publicPEM))
    for index in 0..<200 {
        let token = try signer.sign(JWTClaims(subject: "acct-\(index)", now: now, ttl: 900))
        #expect(throws: Never.self) { try verifier.verify(token, now: now).get() }
    }
}

// MARK: - Known vector and interop with the openssl CLI

/// The keyed key (SHA-256 states after the padded key, copied per message) gives one-shot `HMAC()`'s result for keys shorter
/// and longer than SHA-256's 64-byte block (long keys are hashed first) and messages across block boundaries, also
/// when many threads share one key, as the loops do.
@Test func keyedHMACMatchesOneShot() async throws {
    var rng = SystemRandomNumberGenerator()
    for keyLength in [32, 63, 64, 65, 200] {
        let secret = (0..<keyLength).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let key = try #require(HMACSHA256Key(secret: secret))
        for messageLength in [0, 1, 55, 56, 63, 64, 65, 200, 8192] {
            let message = (0..<messageLength).map { _ in UInt8.random(in: 0...255, using: &rng) }
            #expect(key.mac(message[...]) == HMACSHA256.mac(key: secret, message: message[...]))
        }
    }
    let secret = Array("a shared secret of more than thirty-two bytes".utf8)
    let key = try #require(HMACSHA256Key(secret: secret))
    let mismatches = await withTaskGroup(of: Int.self) { group in
        for task in 0..<8 {
            group.addTask {
                var bad = 0
                for i in 0..<500 {
                    let message = Array("token \(task) \(i)".utf8)
                    if key.mac(message[...]) != HMACSHA256.mac(key: secret, message: message[...]) { bad += 1 }
                }
                return bad
            }
        }
        return await group.reduce(0, +)
    }
    #expect(mismatches == 0)
}

/// RFC 7515 Appendix A.1 (HS256). The token has no `sub`, so the verifier reports
/// `missing_subject`, which it can only reach after the signature check passed.
@Test func rfc7515AppendixA1() throws {
    let key = try #require(Base64URL.decode("AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow"))
    let token = "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9"
        + ".eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ"
        + ".dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    let input = Array(token.utf8[..<token.utf8.lastIndex(of: UInt8(ascii: "."))!])
    #expect(HMACSHA256.mac(key: key, message: input[...]).map(Base64URL.encode) == "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
    #expect(HMACSHA256Key(secret: key)?.mac(input[...]).map(Base64URL.encode) == "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")

    let verifier = try JWTVerifier(key: .hmacSecret(key), issuer: "joe")
    #expect(F.reason(verifier.verify(token, now: 1_300_819_300)) == .missingSubject)

    var wrongKey = key
    wrongKey[0] ^= 1
    let wrong = try JWTVerifier(key: .hmacSecret(wrongKey), issuer: "joe")
    #expect(F.reason(wrong.verify(token, now: 1_300_819_300)) == .badSignature)
}

@Test func tokensSignedByOpenSSLCLIVerify() throws {
    let payload = JWTClaims(subject: "cli", now: now, ttl: 900).json()
    for (pair, alg) in [(F.rsa, "RS256"), (F.ec, "ES256")] {
        let directory = F.makeTemporaryDirectory("cli-sign")
        let input = F.b64(#"{"alg":"\#(alg)","typ":"JWT"}"#) + "." + F.b64(payload)
        try Data(input.utf8).write(to: URL(fileURLWithPath: directory + "/input"))
        let status = F.runOpenSSL(["dgst", "-sha256", "-sign", pair.privatePath, "-out", directory + "/sig", directory + "/input"])
        #expect(status == 0)
        var signature = try [UInt8](Data(contentsOf: URL(fileURLWithPath: directory + "/sig")))
        if alg == "ES256" {
            // The CLI writes DER; JOSE wants raw r||s. The DER form itself must be refused.
            let verifier = try JWTVerifier(key: .publicKeyPEM(pair.publicPEM))
            #expect(F.reason(verifier.verify(input + "." + Base64URL.encode(signature), now: now)) == .badSignature)
            signature = try #require(ECDSASignature.raw(fromDER: signature))
        }
        let verifier = try JWTVerifier(key: .publicKeyPEM(pair.publicPEM))
        let result = verifier.verify(input + "." + Base64URL.encode(signature), now: now)
        #expect(throws: Never.self) { try result.get() }
    }
}

@Test func tokensSignedByUsVerifyWithOpenSSLCLI() throws {
    for pair in [F.rsa, F.ec] {
        let token = try JWTSigner(key: .privateKeyPEM(pair.privatePEM)).sign(JWTClaims(subject: "x", now: now, ttl: 60))
        let parts = token.split(separator: ".").map(String.init)
        var signature = try #require(Base64URL.decode(parts[2]))
        if pair.privatePEM == F.ec.privatePEM { signature = try #require(ECDSASignature.der(fromRaw: signature)) }
        let directory = F.makeTemporaryDirectory("cli-verify")
        try Data((parts[0] + "." + parts[1]).utf8).write(to: URL(fileURLWithPath: directory + "/input"))
        try Data(signature).write(to: URL(fileURLWithPath: directory + "/sig"))
        let status = F.runOpenSSL(["dgst", "-sha256", "-verify", pair.publicPath, "-signature", directory + "/sig", directory + "/input"])
        #expect(status == 0)
    }
}

// MARK: - Header and algorithm rejections

private let goodPayload = #"{"sub":"acct-1","exp":\#(now + 900)}"#

@Test(arguments: ["none", "None", "NONE", "HS512", "RS256", "ES256", "hs256", ""])
func hs256VerifierRejectsOtherAlgorithms(alg: String) throws {
    let header = #"{"alg":"\#(alg)","typ":"JWT"}"#
    let unsigned = F.b64(header) + "." + F.b64(goodPayload) + "."
    let signed = F.hs256Token(header: header, payload: goodPayload)
    let verifier = try F.hsVerifier()
    #expect(F.reason(verifier.verify(unsigned, now: now)) == .algorithmNotAllowed)
    #expect(F.reason(verifier.verify(signed, now: now)) == .algorithmNotAllowed)
}

@Test func asymmetricVerifiersRejectNoneAndMismatchedAlgorithms() throws {
    let rsaVerifier = try JWTVerifier(key: .publicKeyPEM(F.rsa.publicPEM))
    let ecVerifier = try JWTVerifier(key: .publicKeyPEM(F.ec.publicPEM))
    let none = F.b64(#"{"alg":"none"}"#) + "." + F.b64(goodPayload) + "."
    #expect(F.reason(rsaVerifier.verify(none, now: now)) == .algorithmNotAllowed)
    #expect(F.reason(ecVerifier.verify(none, now: now)) == .algorithmNotAllowed)

    let es = try JWTSigner(key: .privateKeyPEM(F.ec.privatePEM)).sign(payloadJSON: goodPayload)
    let rs = try JWTSigner(key: .privateKeyPEM(F.rsa.privatePEM)).sign(payloadJSON: goodPayload)
    let hs = try JWTSigner(key: .hmacSecret(F.secret)).sign(payloadJSON: goodPayload)
    #expect(F.reason(rsaVerifier.verify(es, now: now)) == .algorithmNotAllowed)
    #expect(F.reason(ecVerifier.verify(rs, now: now)) == .algorithmNotAllowed)
    #expect(F.reason(try F.hsVerifier().verify(rs, now: now)) == .algorithmNotAllowed)
    #expect(F.reason(rsaVerifier.verify(hs, now: now)) == .algorithmNotAllowed)
}

/// The classic confusion attack: HS256 with the server's RSA public key PEM text as the HMAC secret.
@Test(arguments: ["rsa", "ec"])
func algorithmConfusionIsRejected(kind: String) throws {
    let pair = kind == "rsa" ? F.rsa : F.ec
    let forged = try JWTSigner(key: .hmacSecret(Array(pair.publicPEM.utf8))).sign(payloadJSON: goodPayload)
    let verifier = try JWTVerifier(key: .publicKeyPEM(pair.publicPEM))
    let failure = try #require(F.failure(verifier.verify(forged, now: now)))
    #expect(failure.reason == .algorithmNotAllowed)
    #expect(failure.code == "UNAUTHORIZED")
}

@Test func critHeaderIsRejected() throws {
    let hs = F.hs256Token(header: #"{"alg":"HS256","crit":["exp"],"exp":1}"#, payload: goodPayload)
    #expect(F.reason(try F.hsVerifier().verify(hs, now: now)) == .unsupportedHeader)
    let rs = try F.asymmetricToken(header: #"{"alg":"RS256","crit":[]}"#, payload: goodPayload, privatePEM: F.rsa.privatePEM)
    #expect(F.reason(try JWTVerifier(key: .publicKeyPEM(F.rsa.publicPEM)).verify(rs, now: now)) == .unsupportedHeader)
}

@Test(arguments: [
    (#"{"alg":"HS256","typ":"JWT"}"#, nil),
    (#"{"alg":"HS256","typ":"jwt"}"#, nil),
    (#"{"alg":"HS256"}"#, nil),
    (#"{"alg":"HS256","typ":"JWS"}"#, AuthFailure.Reason.malformed),
    (#"{"alg":"HS256","typ":"\u004aWt"}"#, nil),
    (#"{"alg":"HS256","typ":"JW"}"#, AuthFailure.Reason.malformed),
    (#"{"alg":"HS256","typ":"JWTS"}"#, AuthFailure.Reason.malformed),
    (#"{"alg":"HS256","typ":"JWT","typ":"x"}"#, AuthFailure.Reason.malformed),
    (#"{"alg":"HS256","typ":1}"#, AuthFailure.Reason.malformed),
    (#"{"typ":"JWT"}"#, AuthFailure.Reason.malformed),
    (#"{"alg":256}"#, AuthFailure.Reason.malformed),
    (#"["HS256"]"#, AuthFailure.Reason.malformed),
    (#"not json"#, AuthFailure.Reason.malformed),
])
func headerValidation(header: String, expected: AuthFailure.Reason?) throws {
    let token = F.hs256Token(header: header, payload: goodPayload)
    #expect(F.reason(try F.hsVerifier().verify(token, now: now)) == expected)
}

// MARK: - Structure and signature rejections

@Test func tamperedPayloadAndSignatureAreRejected() throws {
    let signers: [(JWTSigner, JWTVerifier)] = [
        (try JWTSigner(key: .hmacSecret(F.secret)), try F.hsVerifier()),
        (try JWTSigner(key: .privateKeyPEM(F.rsa.privatePEM)), try JWTVerifier(key: .publicKeyPEM(F.rsa.publicPEM))),
        (try JWTSigner(key: .privateKeyPEM(F.ec.privatePEM)), try JWTVerifier(key: .publicKeyPEM(F.ec.publicPEM))),
    ]
    for (signer, verifier) in signers {
        let token = try signer.sign(JWTClaims(sub: "victim", exp: now + 900))
        #expect(throws: Never.self) { try verifier.verify(token, now: now).get() }
        let escalated = F.replacingSegment(token, 1, with: F.b64(#"{"sub":"admin","exp":\#(now + 900)}"#))
        #expect(F.reason(verifier.verify(escalated, now: now)) == .badSignature)
        #expect(F.reason(verifier.verify(F.flippingSignatureBit(token), now: now)) == .badSignature)
        // Truncated signature: three bytes fewer, re-encoded canonically.
        let signature = try #require(Base64URL.decode(String(token.split(separator: ".")[2])))
        let shortened = F.replacingSegment(token, 2, with: Base64URL.encode(signature.dropLast(3)))
        #expect(F.reason(verifier.verify(shortened, now: now)) == .badSignature)
        // Raw truncation of the text usually leaves a non-canonical tail (malformed); either way refused.
        #expect(F.reason(verifier.verify(String(token.dropLast(4)), now: now)) != nil)
        // Signature stripped entirely.
        #expect(F.reason(verifier.verify(F.replacingSegment(token, 2, with: ""), now: now)) == .badSignature)
        // Truncated inside the payload: two segments.
        let cut = String(token[..<token.lastIndex(of: ".")!])
        #expect(F.reason(verifier.verify(cut, now: now)) == .malformed)
    }
}

@Test func wrongSegmentCountsAreMalformed() throws {
    let token = F.hs256Token(payload: goodPayload)
    let verifier = try F.hsVerifier()
    let parts = token.split(separator: ".").map(String.init)
    for candidate in [parts[0], parts[0] + "." + parts[1], token + "." + parts[2], token + ".", "..", "...", ".x.y", "x..y"] {
        #expect(F.reason(verifier.verify(candidate, now: now)) == .malformed, "\(candidate.prefix(20))")
    }
    #expect(F.reason(verifier.verify("", now: now)) == .missingToken)
}

@Test func badBase64URLIsMalformed() throws {
    let token = F.hs256Token(payload: goodPayload)
    let verifier = try F.hsVerifier()
    let parts = token.split(separator: ".").map(String.init)
    let variants = [
        "+" + parts[0].dropFirst() + "." + parts[1] + "." + parts[2],      // '+' is base64, not base64url
        parts[0] + "=." + parts[1] + "." + parts[2],                        // padding
        parts[0] + "." + parts[1] + "." + parts[2] + "=",                   // padded signature
        parts[0] + "." + parts[1] + "." + parts[2].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/") + "/",
        parts[0] + " ." + parts[1] + "." + parts[2],                        // whitespace (header)
        parts[0] + "." + parts[1] + "." + parts[2] + "AA",                  // impossible length (43 + 2 = 45 ≡ 1 mod 4)
    ]
    for (index, candidate) in variants.enumerated() {
        #expect(F.reason(verifier.verify(candidate, now: now)) == .malformed, "variant \(index)")
    }
}

@Test func es256SignatureOfWrongLengthIsRejected() throws {
    let signer = try JWTSigner(key: .privateKeyPEM(F.ec.privatePEM))
    let verifier = try JWTVerifier(key: .publicKeyPEM(F.ec.publicPEM))
    let token = try signer.sign(JWTClaims(sub: "a", exp: now + 900))
    let raw = try #require(Base64URL.decode(String(token.split(separator: ".")[2])))
    for signature in [raw + [0], Array(raw.dropLast()), [0] + raw, Array(raw.prefix(32)), raw + raw] {
        let failure = try #require(F.failure(verifier.verify(F.replacingSegment(token, 2, with: Base64URL.encode(signature)), now: now)))
        #expect(failure.reason == .badSignature)
        #expect(failure.message.contains("64 bytes"))
    }
    // Right length, zero r and s.
    let zeros = F.replacingSegment(token, 2, with: Base64URL.encode([UInt8](repeating: 0, count: 64)))
    #expect(F.reason(verifier.verify(zeros, now: now)) == .badSignature)
}

@Test func oversizeTokensAreRejectedBeforeDecoding() throws {
    let verifier = try F.hsVerifier()
    let big = String(repeating: "a", count: JWTVerifier.maximumTokenBytes + 1)
    #expect(F.reason(verifier.verify(big, now: now)) == .tokenTooLarge)
    let atLimit = String(repeating: "a", count: JWTVerifier.maximumTokenBytes)
    #expect(F.reason(verifier.verify(atLimit, now: now)) == .malformed)
    // A genuine, validly signed token just over the limit is still refused.
    let padding = String(repeating: "x", count: JWTVerifier.maximumTokenBytes)
    let huge = F.hs256Token(payload: #"{"sub":"a","exp":\#(now + 900),"pad":"\#(padding)"}"#)
    #expect(F.reason(verifier.verify(huge, now: now)) == .tokenTooLarge)
}

/// The verifier decodes a token's parts into one scratch buffer of the token's size (the header and the signature
/// side by side, then the payload over them): tokens near the size limit whose bulk is in the header, or in the
/// payload, verify, with every claim read from the right bytes.
@Test func tokensNearTheLimitVerifyWhereverTheirBulkIs() throws {
    let verifier = try F.hsVerifier()
    let bulk = String(repeating: "x", count: JWTVerifier.maximumTokenBytes * 3 / 4 - 200)
    let bigHeader = F.hs256Token(header: #"{"alg":"HS256","kid":"\#(bulk)","typ":"JWT"}"#,
                                 payload: #"{"sub":"header-bulk","exp":\#(now + 900)}"#)
    let bigPayload = F.hs256Token(payload: #"{"pad":"\#(bulk)","sub":"payload-bulk","exp":\#(now + 900),"jti":"j1"}"#)
    #expect(bigHeader.utf8.count > JWTVerifier.maximumTokenBytes - 400 && bigHeader.utf8.count <= JWTVerifier.maximumTokenBytes)
    #expect(bigPayload.utf8.count > JWTVerifier.maximumTokenBytes - 400 && bigPayload.utf8.count <= JWTVerifier.maximumTokenBytes)
    #expect(try verifier.verify(bigHeader, now: now).get().subject == "header-bulk")
    let verified = try verifier.verify(bigPayload, now: now).get()
    #expect(verified.subject == "payload-bulk")
    #expect(verified.tokenID == "j1")
    #expect(verified.expiresAt == now + 900)
}

@Test func deeplyNestedHeaderDoesNotCrash() throws {
    let header = String(repeating: "[", count: 5000)
    let token = F.b64(header) + "." + F.b64(goodPayload) + ".AAAA"
    #expect(F.reason(try F.hsVerifier().verify(token, now: now)) == .malformed)
}

// MARK: - Claims

@Test func expiredTokenHasDistinctCode() throws {
    let token = F.hs256Token(payload: #"{"sub":"a","exp":1000}"#)
    let failure = try #require(F.failure(try F.hsVerifier(leeway: 30).verify(token, now: 5000)))
    #expect(failure.reason == .expired)
    #expect(failure.code == "ErrAccessTokenExpired")
    #expect(failure.httpBody() == #"{"error":{"code":"ErrAccessTokenExpired","message":"access token has expired"}}"#)
}

@Test(arguments: [
    (30, Int64(1029), true), (30, Int64(1030), false),
    (0, Int64(999), true), (0, Int64(1000), false),
    (30, Int64(-5), true),
])
func expiryLeewayBoundaries(leeway: Int, at: Int64, accepted: Bool) throws {
    let token = F.hs256Token(payload: #"{"sub":"a","exp":1000}"#)
    let result = try F.hsVerifier(leeway: leeway).verify(token, now: at)
    #expect(F.reason(result) == (accepted ? nil : .expired))
}

@Test(arguments: [(Int64(1969), false), (Int64(1970), true), (Int64(2500), true)])
func notBeforeBoundaries(at: Int64, accepted: Bool) throws {
    let token = F.hs256Token(payload: #"{"sub":"a","exp":9000,"nbf":2000}"#)
    let result = try F.hsVerifier(leeway: 30).verify(token, now: at)
    #expect(F.reason(result) == (accepted ? nil : .notYetValid))
}

@Test func issuerIsEnforcedWhenConfigured() throws {
    let verifier = try F.hsVerifier(issuer: "https://api.example.com")
    let good = F.hs256Token(payload: #"{"sub":"a","exp":\#(now + 60),"iss":"https://api.example.com"}"#)
    let wrong = F.hs256Token(payload: #"{"sub":"a","exp":\#(now + 60),"iss":"https://evil.example.com"}"#)
    let missing = F.hs256Token(payload: #"{"sub":"a","exp":\#(now + 60)}"#)
    let typed = F.hs256Token(payload: #"{"sub":"a","exp":\#(now + 60),"iss":["https://api.example.com"]}"#)
    #expect(F.reason(verifier.verify(good, now: now)) == nil)
    #expect(F.reason(verifier.verify(wrong, now: now)) == .wrongIssuer)
    #expect(F.reason(verifier.verify(missing, now: now)) == .wrongIssuer)
    #expect(F.reason(verifier.verify(typed, now: now)) == .invalidClaim)
    // Not configured: any issuer is fine.
    #expect(F.reason(try F.hsVerifier().verify(wrong, now: now)) == nil)
}

@Test(arguments: [
    (#""hub""#, nil), (#"["api","hub"]"#, nil),
    (#""api""#, AuthFailure.Reason.wrongAudience), (#"["api","web"]"#, .wrongAudience), (#"[]"#, .wrongAudience),
    (#""HUB""#, .wrongAudience), ("null", .invalidClaim), (#"["hub",1]"#, .invalidClaim), ("7", .invalidClaim),
])
func audienceIsEnforcedWhenConfigured(aud: String, expected: AuthFailure.Reason?) throws {
    let token = F.hs256Token(payload: #"{"sub":"a","exp":\#(now + 60),"aud":\#(aud)}"#)
    #expect(F.reason(try F.hsVerifier(audience: "hub").verify(token, now: now)) == expected)
}

@Test func missingAudienceFailsWhenConfigured() throws {
    let token = F.hs256Token(payload: #"{"sub":"a","exp":\#(now + 60)}"#)
    #expect(F.reason(try F.hsVerifier(audience: "hub").verify(token, now: now)) == .wrongAudience)
}

@Test(arguments: [
    (#"{"exp":9999999999}"#, AuthFailure.Reason.missingSubject),
    (#"{"sub":"","exp":9999999999}"#, .missingSubject),
    (#"{"sub":42,"exp":9999999999}"#, .missingSubject),
    (#"{"sub":null,"exp":9999999999}"#, .missingSubject),
    (#"{"sub":"a"}"#, .missingExpiry),
    (#"{"sub":"a","exp":"9999999999"}"#, .invalidClaim),
    (#"{"sub":"a","exp":true}"#, .invalidClaim),
    (#"{"sub":"a","exp":null}"#, .invalidClaim),
    (#"{"sub":"a","exp":[1]}"#, .invalidClaim),
    (#"{"sub":"a","exp":1e300}"#, .invalidClaim),
    (#"{"sub":"a","exp":18446744073709551615}"#, .invalidClaim),
    (#"{"sub":"a","exp":9999999999,"nbf":"1"}"#, .invalidClaim),
    (#"{"sub":"a","exp":9999999999,"iat":false}"#, .invalidClaim),
    (#"["sub","a"]"#, .malformed),
])
func claimValidation(payload: String, expected: AuthFailure.Reason) throws {
    let token = F.hs256Token(payload: payload)
    #expect(F.reason(try F.hsVerifier().verify(token, now: now)) == expected)
}

/// The claims reader (`JSONText.Fields`) reads members in place: the last of duplicate names wins, names match after
/// unescaping, and a member that is present with the wrong kind (even `null`) is refused, not taken as absent.
@Test(arguments: [
    (#"{"sub":"a","sub":"b","exp":9999999999}"#, "b" as String?, nil as AuthFailure.Reason?),
    (#"{"s\u0075b":"esc","exp":9999999999}"#, "esc", nil),
    (#"{"sub":"a\u00e9","exp":9999999999}"#, "aé", nil),
    (#"{"sub":"a","exp":1,"exp":9999999999}"#, "a", nil),
    (#"{"sub":"a","exp":9999999999,"exp":1}"#, nil, .expired),
    (#"{"sub":"a","exp":9999999999,"iss":null}"#, nil, .invalidClaim),
    (#"{"sub":"a","exp":9999999999,"nbf":null}"#, nil, .invalidClaim),
    (#"{"sub":"a","exp":9999999999,"aud":{"x":1}}"#, nil, .invalidClaim),
    (#"{"sub":"a","exp":9999999999,"extra":{"deep":[1,{"k":null}]},"jti":7}"#, "a", nil),
    (#"{"sub":"a","exp":-0}"#, nil, .expired),
    (#"{"sub":"a","exp":9999999999.99e0}"#, "a", nil),
    (#"{"sub":"a","exp":9999999999,}"#, nil, .malformed),
    // Only whole names match: longer names sharing a wanted one's start, shorter ones, escaped longer ones.
    (#"{"subject":"x","sub":"a","su":"y","exp":9999999999,"expires":1,"ex":1}"#, "a", nil),
    (#"{"s\u0075bject":"x","sub":"a","exp":9999999999}"#, "a", nil),
    (#"{"subject":"x","exp":9999999999}"#, nil, .missingSubject),
    (#"{"sub":"a","expiration":9999999999}"#, nil, .missingExpiry),
    // More members than the reader keeps names for, the wanted ones last.
    (#"{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"sub":"many","exp":9999999999}"#, "many", nil),
])
func claimsReaderSemantics(payload: String, subject: String?, expected: AuthFailure.Reason?) throws {
    let token = F.hs256Token(payload: payload)
    let result = try F.hsVerifier().verify(token, now: now)
    #expect(F.reason(result) == expected)
    if let subject { #expect((try? result.get())?.subject == subject) }
}

@Test(arguments: [
    (#"{"alg":"HS256","crit":null}"#, AuthFailure.Reason.unsupportedHeader as AuthFailure.Reason?),
    (#"{"alg":"HS256","typ":null}"#, .malformed),
    (#"{"alg":"HS256","typ":"jwt"}"#, nil),
    (#"{"alg":"RS256","alg":"HS256"}"#, nil),
    (#"{"alg":"HS256","alg":"none"}"#, .algorithmNotAllowed),
    (#"{"\u0061lg":"HS256"}"#, nil),
    (#"{"alg":["HS256"]}"#, .malformed),
])
func headerReaderSemantics(header: String, expected: AuthFailure.Reason?) throws {
    let token = F.hs256Token(header: header, payload: goodPayload)
    #expect(F.reason(try F.hsVerifier().verify(token, now: now)) == expected)
}

@Test func numericDatesAcceptFloatsAndTruncate() throws {
    let token = F.hs256Token(payload: #"{"sub":"a","exp":1000.9,"nbf":10.5,"iat":1.0E2}"#)
    let verified = try F.hsVerifier(leeway: 0).verify(token, now: 999).get()
    #expect(verified.expiresAt == 1000)
    #expect(verified.notBefore == 10)
    #expect(verified.issuedAt == 100)
    #expect(F.reason(try F.hsVerifier(leeway: 0).verify(token, now: 1000)) == .expired)
}

@Test func identityFailuresWinOverExpiry() throws {
    // An expired token for the wrong audience must not tell the client to refresh.
    let token = F.hs256Token(payload: #"{"sub":"a","exp":1000,"aud":"other"}"#)
    let failure = try #require(F.failure(try F.hsVerifier(audience: "hub").verify(token, now: 99999)))
    #expect(failure.reason == .wrongAudience)
    #expect(failure.code == "UNAUTHORIZED")
}

@Test func extremeTimesDoNotOverflow() throws {
    let token = F.hs256Token(payload: #"{"sub":"a","exp":9223372036854775807,"nbf":-9223372036854775808}"#)
    #expect(F.reason(try F.hsVerifier(leeway: 300).verify(token, now: Int64.max - 1)) == nil)
    #expect(F.reason(try F.hsVerifier(leeway: 300).verify(token, now: Int64.min)) == nil)
}

// MARK: - Keys

@Test func unusableKeysAreRefused() throws {
    #expect(throws: JWTKeyError.self) { try JWTVerifier(key: .hmacSecret(Array(repeating: 1, count: 31))) }
    #expect(throws: JWTKeyError.self) { try JWTVerifier(key: .hmacSecret([])) }
    #expect(throws: JWTKeyError.self) { try JWTSigner(key: .hmacSecret(Array(repeating: 1, count: 16))) }
    #expect(throws: JWTKeyError.self) { try JWTVerifier(key: .publicKeyPEM("")) }
    #expect(throws: JWTKeyError.self) { try JWTVerifier(key: .publicKeyPEM("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")) }
    // A private key PEM is not a public key PEM.
    #expect(throws: JWTKeyError.self) { try JWTVerifier(key: .publicKeyPEM(F.rsa.privatePEM)) }
    #expect(throws: JWTKeyError.self) { try JWTSigner(key: .privateKeyPEM(F.rsa.publicPEM)) }
    let weakRSA = F.generate(["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"], name: "rsa1024")
    #expect(throws: JWTKeyError.self) { try JWTVerifier(key: .publicKeyPEM(weakRSA.publicPEM)) }
    let p384 = F.generate(["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"], name: "p384")
    #expect(throws: JWTKeyError.self) { try JWTVerifier(key: .publicKeyPEM(p384.publicPEM)) }
    let ed25519 = F.generate(["-algorithm", "ED25519"], name: "ed25519")
    #expect(throws: JWTKeyError.self) { try JWTVerifier(key: .publicKeyPEM(ed25519.publicPEM)) }
}

@Test func leewayIsClamped() throws {
    #expect(try F.hsVerifier(leeway: -10).leeway == 0)
    #expect(try F.hsVerifier(leeway: 100_000).leeway == JWTVerifier.maximumLeeway)
}

// MARK: - Signer output

@Test func signerWritesDeterministicClaims() throws {
    let claims = JWTClaims(sub: "a\"b", exp: 2, iat: 1, nbf: 1, iss: "i", aud: ["x"], jti: "j",
                           extra: ["z": .array([.int(1), .bool(true), .null]), "a": .object(["k": .double(1.5)]), "sub": .string("ignored")])
    #expect(claims.json() == #"{"iss":"i","sub":"a\"b","aud":"x","exp":2,"nbf":1,"iat":1,"jti":"j","a":{"k":1.5},"z":[1,true,null]}"#)
    let signer = try JWTSigner(key: .hmacSecret(F.secret), keyID: "k1")
    #expect(signer.headerJSON == #"{"alg":"HS256","kid":"k1","typ":"JWT"}"#)
    let token = try signer.sign(claims)
    #expect(token == (try signer.sign(claims)))
    #expect(try F.hsVerifier().verify(token, now: 0).get().subject == "a\"b")
}

@Test(arguments: [
    ("900", Int64(900)), ("900s", 900), ("15m", 900), ("2h", 7200), ("1d", 86_400), ("366d", 366 * 86_400),
    ("", nil), ("m", nil), ("0", nil), ("-5m", nil), ("15x", nil), ("1.5h", nil), ("367d", nil), (" 15m", nil),
    ("15mm", nil), ("9999999999", nil), ("١٥m", nil),
] as [(String, Int64?)])
func ttlParsing(text: String, seconds: Int64?) {
    #expect(JWTClaims.parseTTL(text) == seconds)
}

@Test func claimsFromTTLSaturate() {
    #expect(JWTClaims(subject: "a", now: Int64.max - 1, ttl: 900).exp == Int64.max)
    #expect(JWTClaims(subject: "a", now: 100, ttl: 900).exp == 1000)
}

/// RFC 4231's HMAC-SHA256 test cases 1-7 (short and long keys, data across blocks, case 5 truncated to 128 bits),
/// through the keyed implementation the verifier uses and through OpenSSL's one-shot `HMAC()`.
@Test func rfc4231TestVectors() throws {
    func hex(_ bytes: [UInt8]) -> String { bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }
    let longKey = [UInt8](repeating: 0xaa, count: 131)
    let cases: [(key: [UInt8], data: [UInt8], mac: String)] = [
        ([UInt8](repeating: 0x0b, count: 20), Array("Hi There".utf8),
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
        (Array("Jefe".utf8), Array("what do ya want for nothing?".utf8),
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
        ([UInt8](repeating: 0xaa, count: 20), [UInt8](repeating: 0xdd, count: 50),
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
        (Array(1...25), [UInt8](repeating: 0xcd, count: 50),
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
        ([UInt8](repeating: 0x0c, count: 20), Array("Test With Truncation".utf8), "a3b6167473100ee06e0c796c2955552b"),
        (longKey, Array("Test Using Larger Than Block-Size Key - Hash Key First".utf8),
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
        (longKey, Array(("This is a test using a larger than block-size key and a larger than block-size data. The key needs to "
                         + "be hashed before being used by the HMAC algorithm.").utf8),
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
    ]
    for (n, c) in cases.enumerated() {
        let keyed = try #require(HMACSHA256Key(secret: c.key)?.mac(c.data[...]), "case \(n + 1)")
        let oneShot = try #require(HMACSHA256.mac(key: c.key, message: c.data[...]), "case \(n + 1)")
        #expect(hex(keyed).hasPrefix(c.mac) && hex(keyed).count == 64, "case \(n + 1): \(hex(keyed))")
        #expect(hex(oneShot).hasPrefix(c.mac), "case \(n + 1): \(hex(oneShot))")
    }
}
