import COpenSSL
import Foundation
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

@Suite struct HubctlTokenTests {
    static func base64URLDecode(_ text: Substring) -> Data? {
        var s = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while s.count % 4 != 0 { s += "=" }
        return Data(base64Encoded: s)
    }

    /// HMAC-SHA256 computed here with OpenSSL's one-shot EVP API, independent of JWTSigner's code.
    static func referenceHMAC(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length = 32
        let ok = key.withUnsafeBufferPointer { k in
            message.withUnsafeBufferPointer { m in
                EVP_Q_mac(nil, "HMAC", nil, "SHA256", nil, k.baseAddress, k.count, m.baseAddress, m.count,
                          &out, 32, &length)
            }
        }
        precondition(ok != nil)
        return out
    }

    @Test func shortSecretIsRefusedLikeTheHubDoes() throws {
        let dir = "/tmp/hubctl-token-short-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try Data("short\n".utf8).write(to: URL(fileURLWithPath: dir + "/jwt-secret"))
        let run = try HubctlRun.run(["token", "acc_1"], environment: ["HUB_STATE_DIR": dir])
        #expect(run.code == 4)
        #expect(run.stderr.contains("at least 32"), "\(run.stderr)")
    }

    @Test func ttlIsParsedBySharedRules() throws {
        let dir = "/tmp/hubctl-token-ttl-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try Data(String(repeating: "k", count: 40).utf8).write(to: URL(fileURLWithPath: dir + "/jwt-secret"))
        #expect(try HubctlRun.run(["token", "a", "--ttl", "366d"], environment: ["HUB_STATE_DIR": dir]).code == 0)
        let tooLong = try HubctlRun.run(["token", "a", "--ttl", "367d"], environment: ["HUB_STATE_DIR": dir])
        #expect(tooLong.code == 2 && tooLong.stderr.contains("--ttl"))
    }

    @Test func cliPrintsOnlyTheToken() throws {
        let dir = "/tmp/hubctl-token-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try Data("  topsecret-topsecret-topsecret-32b\n".utf8).write(to: URL(fileURLWithPath: dir + "/jwt-secret"))
        let before = Int(Date().timeIntervalSince1970)
        let run = try HubctlRun.run(["token", "acc_1", "--ttl", "2h"], environment: ["HUB_STATE_DIR": dir])
        #expect(run.code == 0, "\(run.stderr)")
        let token = run.stdout.trimmingCharacters(in: .newlines)
        #expect(run.stdout == token + "\n" && !token.contains(" "))
        let parts = token.split(separator: ".")
        try #require(parts.count == 3)
        #expect(Array(Self.base64URLDecode(parts[2])!) == Self.referenceHMAC(key: Array("topsecret-topsecret-topsecret-32b".utf8),
                                                                          message: Array("\(parts[0]).\(parts[1])".utf8)))
        let claims = try #require(try JSONSerialization.jsonObject(with: Self.base64URLDecode(parts[1])!) as? [String: Any])
        let iat = try #require(claims["iat"] as? Int)
        #expect(iat >= before && iat <= before + 5)
        #expect(claims["exp"] as? Int == iat + 7200)
        #expect(claims["sub"] as? String == "acc_1")

        // --secret-file beats $HUB_JWT_SECRET_FILE beats the state dir; --json shape.
        try Data("other-other-other-other-other-32b".utf8).write(to: URL(fileURLWithPath: dir + "/other"))
        let json = try HubctlRun.run(["token", "acc_2", "--json", "--secret-file", dir + "/other"],
                                     environment: ["HUB_JWT_SECRET_FILE": dir + "/missing", "HUB_STATE_DIR": dir])
        #expect(json.code == 0, "\(json.stderr)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect(object["account"] as? String == "acc_2")
        let minted = try #require(object["token"] as? String)
        let mintedParts = minted.split(separator: ".")
        #expect(Array(Self.base64URLDecode(mintedParts[2])!) == Self.referenceHMAC(key: Array("other-other-other-other-other-32b".utf8),
                message: Array("\(mintedParts[0]).\(mintedParts[1])".utf8)))
        let exp = try #require(object["expiresAt"] as? Int)
        #expect(exp >= before + 900 && exp <= before + 905, "default TTL is 15m")

        let env = try HubctlRun.run(["token", "acc_3"], environment: ["HUB_JWT_SECRET_FILE": dir + "/other"])
        #expect(env.code == 0)
    }
}
