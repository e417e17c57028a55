import Foundation
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubJSON
@testable import HubRouting

@Test func authFailureCodes() {
    for reason in AuthFailure.Reason.allCases {
        let failure = AuthFailure(reason, "m")
        #expect(failure.code == (reason == .expired ? "ErrAccessTokenExpired" : "UNAUTHORIZED"))
        #expect(failure.httpStatus == 401)
    }
}

@Test func authFailureReasonLabelsAreUniqueSnakeCase() {
    let labels = AuthFailure.Reason.allCases.map(\.rawValue)
    #expect(Set(labels).count == labels.count)
    for label in labels {
        #expect(label.allSatisfy { $0.isLowercase || $0 == "_" }, "\(label)")
    }
    #expect(AuthFailure.Reason.algorithmNotAllowed.rawValue == "alg_not_allowed")
    #expect(AuthFailure.Reason.badSignature.rawValue == "bad_signature")
}

@Test func authFailureBodyIsExactAndEscaped() throws {
    let plain = AuthFailure(.badSignature, "access token signature is invalid")
    #expect(plain.httpBody() == #"{"error":{"code":"UNAUTHORIZED","message":"access token signature is invalid"}}"#)

    let nasty = AuthFailure(.malformed, "quote \" backslash \\ newline \n tab \t nul \u{0} bell \u{7} é 🎉")
    let body = nasty.httpBody()
    #expect(body == #"{"error":{"code":"UNAUTHORIZED","message":"quote \" backslash \\ newline \n tab \t nul \u0000 bell \u0007 é 🎉"}}"#)
    let parsed = try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
    let error = try #require(parsed["error"] as? [String: Any])
    #expect(error["message"] as? String == nasty.message)
    #expect(error["code"] as? String == "UNAUTHORIZED")
}

/// Messages never contain the token (nor any part of it).
@Test func authFailureMessagesDoNotEchoTheToken() throws {
    let verifier = try JWTVerifier(key: .hmacSecret(AuthFixtures.secret), issuer: "iss-x", audience: "aud-x")
    let payloads = [
        #"{"sub":"SECRETSUB","exp":1}"#, #"{"sub":"SECRETSUB","exp":"SECRETEXP"}"#,
        #"{"sub":"SECRETSUB","exp":99999999999,"iss":"SECRETISS"}"#,
        #"{"sub":"SECRETSUB","exp":99999999999,"iss":"iss-x","aud":"SECRETAUD"}"#,
    ]
    for payload in payloads {
        let token = AuthFixtures.hs256Token(payload: payload)
        let failure = try #require(AuthFixtures.failure(verifier.verify(token, now: 1000)))
        #expect(!failure.message.contains("SECRET"))
        #expect(!failure.httpBody().contains(token.prefix(10)))
    }
    let alg = AuthFixtures.hs256Token(header: #"{"alg":"SECRETALG"}"#, payload: payloads[0])
    #expect(!(AuthFixtures.failure(verifier.verify(alg, now: 1000))?.message.contains("SECRET") ?? true))
}
