import HubSupport

/// Mints compact JWS JWTs: HS256 from a shared secret (`hubctl token`), RS256/ES256 from a
/// private key PEM (tests and tooling). The header is `{"alg":"…","typ":"JWT"}` plus `kid` if set.
public struct JWTSigner: Sendable {
    public enum Key: Sendable {
        /// At least 32 bytes.
        case hmacSecret([UInt8])
        /// Unencrypted RSA (≥ 2048 bits → RS256) or P-256 EC (→ ES256) private key PEM.
        case privateKeyPEM(String)
    }

    private let material: JWTKeyMaterial
    public let algorithm: JWTAlgorithm
    public let keyID: String?

    public init(key: Key, keyID: String? = nil) throws(JWTKeyError) {
        switch key {
        case .hmacSecret(let secret):
            material = try .hmac(secret)
        case .privateKeyPEM(let pem):
            material = .asymmetric(try OpenSSLKey.privateKey(pem: pem))
        }
        algorithm = material.algorithm
        self.keyID = keyID
    }

    /// The protected header JSON this signer writes.
    public var headerJSON: String {
        var out = #"{"alg":"# + JSONText.quote(algorithm.rawValue)
        if let keyID { out += #","kid":"# + JSONText.quote(keyID) }
        out += #","typ":"JWT"}"#
        return out
    }

    /// Signs `claims`. Throws only if OpenSSL fails (allocation failure or an unusable key).
    public func sign(_ claims: JWTClaims) throws(JWTKeyError) -> String {
        try sign(payloadJSON: claims.json())
    }

    /// Signs an arbitrary payload (tests use this for deliberately odd claim sets).
    public func sign(payloadJSON: String) throws(JWTKeyError) -> String {
        let signingInput = Base64URL.encode(Array(headerJSON.utf8)) + "." + Base64URL.encode(Array(payloadJSON.utf8))
        let input = Array(signingInput.utf8)
        let signature: [UInt8]?
        switch material {
        case .secret(let key): signature = key.mac(input[...])
        case .asymmetric(let key): signature = key.sign(input)
        }
        guard let signature else { throw JWTKeyError("signing with \(algorithm.rawValue) failed") }
        return signingInput + "." + Base64URL.encode(signature)
    }
}
