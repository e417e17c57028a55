import Foundation
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// Shared fixtures for the Auth tests: keys generated once per test run with the `openssl` CLI.
enum AuthFixtures {
    static let secret: [UInt8] = Array("0123456789abcdef0123456789abcdef-hub-test-secret".utf8)

    struct KeyPair: Sendable {
        let privatePEM: String
        let publicPEM: String
        let directory: String
        var privatePath: String { directory + "/private.pem" }
        var publicPath: String { directory + "/public.pem" }
    }

    static let rsa = generate(["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], name: "rsa")
    static let ec = generate(["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"], name: "ec")

    static func generate(_ options: [String], name: String) -> KeyPair {
        let directory = makeTemporaryDirectory("keys-\(name)")
        let privatePath = directory + "/private.pem"
        let publicPath = directory + "/public.pem"
        runOpenSSL(["genpkey"] + options + ["-out", privatePath])
        runOpenSSL(["pkey", "-in", privatePath, "-pubout", "-out", publicPath])
        let privatePEM = (try? String(contentsOfFile: privatePath, encoding: .utf8)) ?? ""
        let publicPEM = (try? String(contentsOfFile: publicPath, encoding: .utf8)) ?? ""
        return KeyPair(privatePEM: privatePEM, publicPEM: publicPEM, directory: directory)
    }

    @discardableResult
    static func runOpenSSL(_ arguments: [String]) -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch { return -1 }
        process.waitUntilExit()
        return process.terminationStatus
    }

    static func makeTemporaryDirectory(_ label: String) -> String {
        let path = NSTemporaryDirectory() + "hub-auth-tests-\(label)-\(UUID().uuidString)"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    static func b64(_ text: String) -> String { Base64URL.encode(Array(text.utf8)) }

    /// An HS256 token over arbitrary header/payload JSON.
    static func hs256Token(header: String = #"{"alg":"HS256","typ":"JWT"}"#, payload: String, key: [UInt8] = secret) -> String {
        let input = b64(header) + "." + b64(payload)
        let mac = HMACSHA256.mac(key: key, message: Array(input.utf8)[...])!
        return input + "." + Base64URL.encode(mac)
    }

    /// A token over arbitrary header/payload JSON signed with a private key PEM (JOSE signature form).
    static func asymmetricToken(header: String, payload: String, privatePEM: String) throws -> String {
        let key = try OpenSSLKey.privateKey(pem: privatePEM)
        let input = b64(header) + "." + b64(payload)
        let signature = try #require(key.sign(Array(input.utf8)))
        return input + "." + Base64URL.encode(signature)
    }

    static func hsVerifier(issuer: String? = nil, audience: String? = nil, leeway: Int = 30) throws -> JWTVerifier {
        try JWTVerifier(key: .hmacSecret(secret), issuer: issuer, audience: audience, leeway: leeway)
    }

    static func failure(_ result: Result<VerifiedToken, AuthFailure>) -> AuthFailure? {
        if case .failure(let failure) = result { return failure }
        return nil
    }

    static func reason(_ result: Result<VerifiedToken, AuthFailure>) -> AuthFailure.Reason? {
        failure(result)?.reason
    }

    /// Replaces segment `index` of a token.
    static func replacingSegment(_ token: String, _ index: Int, with segment: String) -> String {
        var parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        parts[index] = segment
        return parts.joined(separator: ".")
    }

    /// Flips one bit in the first byte of the decoded signature (keeps valid base64url).
    static func flippingSignatureBit(_ token: String) -> String {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        var signature = Base64URL.decode(parts[2])!
        signature[0] ^= 0x01
        return replacingSegment(token, 2, with: Base64URL.encode(signature))
    }
}

@Test func fixtureKeysWereGenerated() {
    #expect(AuthFixtures.rsa.privatePEM.contains("PRIVATE KEY"))
    #expect(AuthFixtures.rsa.publicPEM.contains("BEGIN PUBLIC KEY"))
    #expect(AuthFixtures.ec.privatePEM.contains("PRIVATE KEY"))
    #expect(AuthFixtures.ec.publicPEM.contains("BEGIN PUBLIC KEY"))
}
