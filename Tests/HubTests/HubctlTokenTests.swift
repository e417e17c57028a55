import COpenSSL
import Foundation
import Testing
@testable import Hub

@Suite struct HubctlTokenTests {
    static func base64URLDecode(_ text: Substring) -> Data? {
        var s = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while s.count % 4 != 0 { s += "=" }
        return Data(base64Encoded: s)
    }

    /// HMAC-SHA256 computed here with OpenSSL's one-shot EVP API, independent of DevToken's code.
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

    @Test func hmacMatchesRFC4231() {
        // RFC 4231 test case 2.
        let mac = DevToken.hmacSHA256(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8))
        #expect(mac.map { String(format: "%02x", $0) }.joined()
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }

    @Test func mintedTokenVerifies() throws {
        let secret = Array("s3cret-for-tests".utf8)
        let token = DevToken.mint(account: "acc_\"1\"", ttl: 900, secret: secret, now: 1_700_000_000)
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        try #require(parts.count == 3)
        #expect(!token.contains("=") && !token.contains("+") && !token.contains("/"))
        let signature = try #require(Self.base64URLDecode(parts[2]))
        #expect(Array(signature) == Self.referenceHMAC(key: secret, message: Array("\(parts[0]).\(parts[1])".utf8)))
        let header = try #require(try JSONSerialization.jsonObject(with: Self.base64URLDecode(parts[0])!) as? [String: Any])
        #expect(header["alg"] as? String == "HS256")
        #expect(header["typ"] as? String == "JWT")
        let claims = try #require(try JSONSerialization.jsonObject(with: Self.base64URLDecode(parts[1])!) as? [String: Any])
        #expect(claims["sub"] as? String == "acc_\"1\"")
        #expect(claims["iat"] as? Int == 1_700_000_000)
        #expect(claims["exp"] as? Int == 1_700_000_900)
    }

    @Test(arguments: [
        ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("600", 600), ("1", 1), ("3650d", 315_360_000),
    ])
    func ttlParses(text: String, seconds: Int) {
        #expect(DevToken.parseTTL(text) == seconds)
    }

    @Test(arguments: ["", "0", "0s", "-5", "15x", "m", "1.5h", " 15m", "15 m", "1e3", "99999999999999999999d", "99999999999999d", "3651d", "15mm"])
    func ttlRejects(text: String) {
        #expect(DevToken.parseTTL(text) == nil)
    }

    @Test func secretFileWhitespaceIsIgnored() {
        #expect(DevToken.secret(fromFileContents: Array("  abc def \n\n".utf8)) == Array("abc def".utf8))
        #expect(DevToken.secret(fromFileContents: Array(" \n".utf8)).isEmpty)
    }

    @Test func cliPrintsOnlyTheToken() throws {
        let dir = "/tmp/hubctl-token-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try Data("  topsecret\n".utf8).write(to: URL(fileURLWithPath: dir + "/jwt-secret"))
        let before = Int(Date().timeIntervalSince1970)
        let run = try HubctlRun.run(["token", "acc_1", "--ttl", "2h"], environment: ["HUB_STATE_DIR": dir])
        #expect(run.code == 0, "\(run.stderr)")
        let token = run.stdout.trimmingCharacters(in: .newlines)
        #expect(run.stdout == token + "\n" && !token.contains(" "))
        let parts = token.split(separator: ".")
        try #require(parts.count == 3)
        #expect(Array(Self.base64URLDecode(parts[2])!) == Self.referenceHMAC(key: Array("topsecret".utf8),
                                                                          message: Array("\(parts[0]).\(parts[1])".utf8)))
        let claims = try #require(try JSONSerialization.jsonObject(with: Self.base64URLDecode(parts[1])!) as? [String: Any])
        let iat = try #require(claims["iat"] as? Int)
        #expect(iat >= before && iat <= before + 5)
        #expect(claims["exp"] as? Int == iat + 7200)
        #expect(claims["sub"] as? String == "acc_1")

        // --secret-file beats $HUB_JWT_SECRET_FILE beats the state dir; --json shape.
        try Data("other".utf8).write(to: URL(fileURLWithPath: dir + "/other"))
        let json = try HubctlRun.run(["token", "acc_2", "--json", "--secret-file", dir + "/other"],
                                     environment: ["HUB_JWT_SECRET_FILE": dir + "/missing", "HUB_STATE_DIR": dir])
        #expect(json.code == 0, "\(json.stderr)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect(object["account"] as? String == "acc_2")
        let minted = try #require(object["token"] as? String)
        let mintedParts = minted.split(separator: ".")
        #expect(Array(Self.base64URLDecode(mintedParts[2])!) == Self.referenceHMAC(key: Array("other".utf8),
                message: Array("\(mintedParts[0]).\(mintedParts[1])".utf8)))
        let exp = try #require(object["expiresAt"] as? Int)
        #expect(exp >= before + 900 && exp <= before + 905, "default TTL is 15m")

        let env = try HubctlRun.run(["token", "acc_3"], environment: ["HUB_JWT_SECRET_FILE": dir + "/other"])
        #expect(env.code == 0)
    }
}
