import Foundation
import Testing
@testable import Hub
@testable import HubAuth

/// Not a timed assertion: prints the per-token cost of the HS256 verify path and of its parts so
/// regressions are visible in test logs. Release-build numbers are in JWTVerifier.swift's header
/// comment.
@Test func measureHS256VerifyCost() throws {
    let verifier = try JWTVerifier(key: .hmacSecret(AuthFixtures.secret), issuer: "api", audience: "hub")
    let signer = try JWTSigner(key: .hmacSecret(AuthFixtures.secret))
    let token = try signer.sign(JWTClaims(sub: "acct-12345", exp: 2_000_000_000, iat: 1_999_999_100, iss: "api", aud: ["hub"]))
    let iterations = 2000
    func perCall(_ body: () -> Void) -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        for _ in 0..<iterations { body() }
        return Double(DispatchTime.now().uptimeNanoseconds - start) / Double(iterations) / 1000
    }
    var ok = 0
    let verify = perCall { if case .success = verifier.verify(token, now: 1_999_999_200) { ok += 1 } }
    let payload = Array(JWTClaims(sub: "acct-12345", exp: 2_000_000_000, iat: 1_999_999_100, iss: "api", aud: ["hub"]).json().utf8)
    let names = JSONText.Names(["sub", "exp", "nbf", "iat", "iss", "aud", "jti"])
    let json = perCall { payload.withUnsafeBytes { _ = JSONText.Fields($0, names: names) } }
    let input = Array(token.utf8)[...]
    let hmac = perCall { _ = HMACSHA256.mac(key: AuthFixtures.secret, message: input) }
    #expect(ok == iterations)
    print("HS256 verify: \(String(format: "%.2f", verify)) µs/token; one JSON parse: \(String(format: "%.2f", json)) µs (×2 per token); HMAC: \(String(format: "%.2f", hmac)) µs")
}
