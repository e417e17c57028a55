import Crypto
import Foundation

/// HS256 verification of the hub's access tokens with swift-crypto's HMAC.
///
/// jwt-kit would do the same in one call, but it pulls in swift-certificates, swift-asn1 and the
/// _CryptoExtras module (RSA, ECDSA, EdDSA): minutes more of release build on our two shared cores for an
/// algorithm we do not use. The checks mirror the hub's for HS256: header `alg` must be `HS256`, the signature
/// must verify (constant-time), `exp` is required, `exp`/`nbf` are checked with a 30 s leeway, `sub` is the account.
struct HS256Verifier: Sendable {
    let key: SymmetricKey
    let leeway: Double = 30

    init(secret: String) {
        self.key = SymmetricKey(data: Data(secret.utf8))
    }

    /// Returns the account (`sub`) of a valid token, nil otherwise.
    func account(fromToken token: Substring) -> String? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
            let headerData = Self.base64URLDecode(parts[0]),
            let payloadData = Self.base64URLDecode(parts[1]),
            let signature = Self.base64URLDecode(parts[2])
        else { return nil }
        guard let header = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
            header["alg"] as? String == "HS256"
        else { return nil }
        let signingInput = Data(token.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        guard HMAC<SHA256>.isValidAuthenticationCode(signature, authenticating: signingInput, using: key) else {
            return nil
        }
        guard let claims = try? JSONSerialization.jsonObject(with: payloadData) as? [String: Any],
            let sub = claims["sub"] as? String, !sub.isEmpty,
            let exp = (claims["exp"] as? NSNumber)?.doubleValue
        else { return nil }
        let now = Date().timeIntervalSince1970
        if exp + leeway < now { return nil }
        if let nbf = (claims["nbf"] as? NSNumber)?.doubleValue, nbf - leeway > now { return nil }
        return sub
    }

    static func base64URLDecode(_ s: Substring) -> Data? {
        var b64 = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        let rem = b64.utf8.count % 4
        if rem == 1 { return nil }
        if rem > 0 { b64 += String(repeating: "=", count: 4 - rem) }
        return Data(base64Encoded: b64)
    }
}
