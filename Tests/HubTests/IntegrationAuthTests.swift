import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// Token verification configured on the real binary: public keys (and algorithm confusion), issuer and
/// audience, nbf, HUB_JWT_SECRET.
@Suite struct IntegrationAuthTests {
    static func refusal(_ hub: HubProcess, _ token: String) throws -> (Int, String?) {
        do {
            let ws = try TestWebSocket.connect(port: hub.port, headers: [("Authorization", "Bearer \(token)")])
            withExtendedLifetime(ws) {}
            return (101, nil)
        } catch let refused as TestWebSocket.Refused {
            return (refused.status, refused.errorCode)
        }
    }

    @Test(arguments: ["rsa", "ec"])
    func publicKeyVerificationAndAlgorithmConfusion(_ kind: String) throws {
        let pair = kind == "rsa" ? AuthFixtures.rsa : AuthFixtures.ec
        let hub = try HubProcess(["--jwt-public-key", pair.publicPath])
        #expect(hub.startupLine.contains("auth \(kind == "rsa" ? "RS256" : "ES256") (public key \(pair.publicPath))"), "\(hub.startupLine)")
        let now = Int64(time(nil))
        let good = try JWTSigner(key: .privateKeyPEM(pair.privatePEM)).sign(JWTClaims(sub: "acc_pk", exp: now + 900))
        let ws = try hub.client("acc_pk", channels: ["wallet_updates"], token: good)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_pk")["delivered"] as? Int == 1)
        #expect(try ws.nextText() == #"{"type":"test_event","channel":"wallet_updates","seq":1,"data":{}}"#)

        // HS256 "signed" with the public key as the HMAC secret: the classic confusion attack.
        let forged = try JWTSigner(key: .hmacSecret(Array(pair.publicPEM.utf8))).sign(JWTClaims(sub: "acc_pk", exp: now + 900))
        #expect(try Self.refusal(hub, forged) == (401, "UNAUTHORIZED"))
        // The other asymmetric algorithm, with its own valid key.
        let other = kind == "rsa" ? AuthFixtures.ec : AuthFixtures.rsa
        let wrongKey = try JWTSigner(key: .privateKeyPEM(other.privatePEM)).sign(JWTClaims(sub: "acc_pk", exp: now + 900))
        #expect(try Self.refusal(hub, wrongKey) == (401, "UNAUTHORIZED"))
        #expect(try Self.refusal(hub, IntegrationRefusalTests.noneToken("acc_pk")) == (401, "UNAUTHORIZED"))
        // In-band refresh with a forged token is refused and keeps the connection.
        try ws.send(text: "{\"type\":\"auth\",\"token\":\"\(forged)\"}")
        #expect((try parseObject(try ws.nextText())["error"] as? [String: Any])?["code"] as? String == "UNAUTHORIZED")
        let stats = try hub.stats()
        #expect(stats["auth"] as? String == "\(kind == "rsa" ? "RS256" : "ES256") (public key \(pair.publicPath))")
    }

    @Test func issuerAudienceAndNotBefore() throws {
        let hub = try HubProcess(["--jwt-issuer", "https://api.example", "--jwt-audience", "hub", "--jwt-leeway", "5s"])
        let signer = try JWTSigner(key: .hmacSecret(try hub.secret()))
        let now = Int64(time(nil))
        func token(iss: String? = "https://api.example", aud: [String]? = ["hub"], nbf: Int64? = nil) throws -> String {
            try signer.sign(JWTClaims(sub: "acc_1", exp: now + 900, iat: now, nbf: nbf, iss: iss, aud: aud))
        }
        #expect(try Self.refusal(hub, try token()) == (101, nil))
        #expect(try Self.refusal(hub, try token(aud: ["other", "hub"])) == (101, nil))
        #expect(try Self.refusal(hub, try token(iss: "https://evil.example")) == (401, "UNAUTHORIZED"))
        #expect(try Self.refusal(hub, try token(iss: nil)) == (401, "UNAUTHORIZED"))
        #expect(try Self.refusal(hub, try token(aud: ["other"])) == (401, "UNAUTHORIZED"))
        #expect(try Self.refusal(hub, try token(aud: nil)) == (401, "UNAUTHORIZED"))
        #expect(try Self.refusal(hub, try token(nbf: now + 60)) == (401, "UNAUTHORIZED"))
        #expect(try Self.refusal(hub, try token(nbf: now + 3)) == (101, nil))  // within the leeway
        // No sub; no exp.
        let noSub = try signer.sign(payloadJSON: "{\"exp\":\(now + 900),\"iss\":\"https://api.example\",\"aud\":\"hub\"}")
        #expect(try Self.refusal(hub, noSub) == (401, "UNAUTHORIZED"))
        let noExp = try signer.sign(payloadJSON: "{\"sub\":\"acc_1\",\"iss\":\"https://api.example\",\"aud\":\"hub\"}")
        #expect(try Self.refusal(hub, noExp) == (401, "UNAUTHORIZED"))
        // Expired beyond the 5 s leeway.
        #expect(try Self.refusal(hub, try signer.sign(JWTClaims(sub: "acc_1", exp: now - 10, iss: "https://api.example", aud: ["hub"])))
                == (401, "ErrAccessTokenExpired"))
        let metrics = try rawHTTP(port: hub.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").body
        #expect(metrics.contains("hub_auth_failures_total{reason=\"expired\"} 1\n"), "\(metrics)")
        #expect(metrics.contains("hub_auth_failures_total{reason=\"wrong_issuer\"} 2\n"), "\(metrics)")
    }

    @Test func secretFromTheEnvironment() throws {
        let secret = "an-environment-secret-of-at-least-32-bytes!"
        let hub = try HubProcess(environment: ["HUB_JWT_SECRET": secret])
        #expect(hub.startupLine.contains("auth HS256 (secret from HUB_JWT_SECRET)"), "\(hub.startupLine)")
        #expect(!hub.log.contains(secret))
        let token = try JWTSigner(key: .hmacSecret(Array(secret.utf8))).sign(JWTClaims(sub: "acc_e", exp: Int64(time(nil)) + 900))
        #expect(try Self.refusal(hub, token) == (101, nil))
        // No secret is generated when one is given.
        #expect(access(hub.stateDirectory + "/jwt-secret", F_OK) != 0)
    }
}
