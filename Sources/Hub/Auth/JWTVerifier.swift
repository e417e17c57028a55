import HubSupport

/// Key material a `JWTVerifier` trusts. The key alone decides the accepted algorithm:
/// `hmacSecret` → HS256, an RSA public key → RS256, a P-256 EC public key → ES256.
public enum JWTKey: Sendable {
    /// Shared HMAC secret (raw bytes; at least 32, RFC 7518 §3.2).
    case hmacSecret([UInt8])
    /// SPKI public key PEM (`-----BEGIN PUBLIC KEY-----`), RSA ≥ 2048 bits or EC P-256.
    case publicKeyPEM(String)
}

/// What a valid token says about the connecting client.
public struct VerifiedToken: Sendable, Equatable {
    /// The account (`sub`), non-empty.
    public let subject: String
    /// `exp`, unix seconds. The hub may close the socket when this passes.
    public let expiresAt: Int64
    public let issuedAt: Int64?
    public let notBefore: Int64?
    public let issuer: String?
    /// `aud` normalised to a list (empty when absent).
    public let audience: [String]
    /// `jti`, when present and a string.
    public let tokenID: String?
    public let algorithm: JWTAlgorithm
}

/// Verifies compact JWS JWTs (RFC 7515/7519) for the hub's `/ws` handshake.
///
/// Policy:
/// - Exactly one algorithm is accepted, implied by the configured key; `alg` must equal it
///   (`none`, other algorithms and HS/RS confusion are `alg_not_allowed`).
/// - `typ`, if present, must be `JWT` (case-insensitive); any `crit` header is refused.
/// - `sub` (non-empty string) and `exp` (NumericDate) are required: tokens are short-lived
///   (900 s) and a token without `exp` would be valid forever.
/// - `nbf`/`iat` optional; NumericDates may be integers or floats (truncated), never strings/bools.
/// - `iss`/`aud` are enforced only when configured.
/// - Expired when `now >= exp + leeway`; not yet valid when `now + leeway < nbf`.
/// - Tokens longer than `maximumTokenBytes` are rejected before any decoding.
/// - Claims are parsed only after the signature is valid.
/// - When several checks fail, identity checks (`sub`, `iss`, `aud`) win over time checks, so a
///   client is only told to refresh (`ErrAccessTokenExpired`) when a refresh can actually help.
///
/// Claims are parsed in place with the hub's own JSON scanner (no Foundation objects per handshake). The HMAC runs
/// on SHA-256 states keyed once (`HMACSHA256Key`), not OpenSSL 3's one-shot `HMAC()`, which fetches the digest and
/// re-keys on each call. Costs per token: Benchmarks/README.md, "Measurements behind the code".
public struct JWTVerifier: Sendable {
    /// 8 KiB: far above any real access token, small enough to bound work per handshake.
    public static let maximumTokenBytes = 8 * 1024
    /// Default clock-skew allowance. 30 s is small relative to the 900 s token lifetime and covers
    /// NTP-level skew between the token issuer and the hub.
    public static let defaultLeeway = 30
    /// Leeway is clamped to 0...maximumLeeway.
    public static let maximumLeeway = 300

    private let material: JWTKeyMaterial
    public let algorithm: JWTAlgorithm
    public let issuer: String?
    public let audience: String?
    public let leeway: Int

    /// Throws when the key is unusable (short secret, unreadable PEM, weak or unsupported key).
    public init(key: JWTKey, issuer: String? = nil, audience: String? = nil,
                leeway: Int = JWTVerifier.defaultLeeway) throws(JWTKeyError) {
        switch key {
        case .hmacSecret(let secret):
            material = try .hmac(secret)
        case .publicKeyPEM(let pem):
            material = .asymmetric(try OpenSSLKey.publicKey(pem: pem))
        }
        algorithm = material.algorithm
        self.issuer = issuer
        self.audience = audience
        self.leeway = min(max(leeway, 0), JWTVerifier.maximumLeeway)
    }

    public func verify(_ token: String, now: Int64) -> Result<VerifiedToken, AuthFailure> {
        var token = token
        return token.withUTF8 { verify(bytes: $0, now: now) }
    }

    /// The token's bytes, as found in the request head (no `String` made of it). The decoded parts are shorter
    /// than their text, so one scratch buffer of the token's size, on the stack, holds them: the verify allocates
    /// nothing but the strings of the result (six arrays before).
    public func verify(bytes token: UnsafeBufferPointer<UInt8>, now: Int64) -> Result<VerifiedToken, AuthFailure> {
        if token.isEmpty { return .failure(AuthFailure(.missingToken, "no access token was provided")) }
        if token.count > JWTVerifier.maximumTokenBytes {
            return .failure(AuthFailure(.tokenTooLarge, "access token exceeds \(JWTVerifier.maximumTokenBytes) bytes"))
        }
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: token.count) { scratch in
            do throws(AuthFailure) {
                return .success(try verify(token, scratch: scratch, now: now))
            } catch {
                return .failure(error)
            }
        }
    }

    private static let headerNames = JSONText.Names(["alg", "typ", "crit"])
    private static let claimNames = JSONText.Names(["sub", "exp", "nbf", "iat", "iss", "aud", "jti"])

    private func verify(_ bytes: UnsafeBufferPointer<UInt8>, scratch: UnsafeMutableBufferPointer<UInt8>,
                        now: Int64) throws(AuthFailure) -> VerifiedToken {
        // Structure: header.payload.signature
        var firstDot = -1, secondDot = -1, dotCount = 0
        for index in 0..<bytes.count where bytes[index] == UInt8(ascii: ".") {
            dotCount += 1
            if dotCount == 1 { firstDot = index } else if dotCount == 2 { secondDot = index } else { break }
        }
        guard dotCount == 2 else {
            throw AuthFailure(.malformed, "access token must have exactly three dot-separated parts")
        }
        let headerPart = UnsafeBufferPointer(rebasing: bytes[..<firstDot])
        let payloadPart = UnsafeBufferPointer(rebasing: bytes[(firstDot + 1)..<secondDot])
        let signaturePart = UnsafeBufferPointer(rebasing: bytes[(secondDot + 1)...])
        guard !headerPart.isEmpty, !payloadPart.isEmpty else {
            throw AuthFailure(.malformed, "access token has an empty header or payload")
        }

        // Header, decoded to the scratch buffer's start
        guard let headerCount = Base64URL.decode(headerPart, into: scratch) else {
            throw AuthFailure(.malformed, "access token header is not valid base64url")
        }
        let headerBytes = UnsafeMutableBufferPointer(rebasing: scratch[..<headerCount])
        guard let header = JSONText.Fields(UnsafeRawBufferPointer(headerBytes), names: Self.headerNames) else {
            throw AuthFailure(.malformed, "access token header is not a JSON object")
        }
        guard let algValue = header[0], let alg = header.string(algValue) else {
            throw AuthFailure(.malformed, "access token header has no alg")
        }
        guard Self.sameBytes(alg, algorithm.rawValue) else {
            throw AuthFailure(.algorithmNotAllowed, "access token algorithm is not accepted; this hub requires \(algorithm.rawValue)")
        }
        if let typValue = header[1] {
            guard header.string(typValue, equalsIgnoringCase: "jwt") else {
                throw AuthFailure(.malformed, "access token header typ must be JWT")
            }
        }
        if header[2] != nil {
            throw AuthFailure(.unsupportedHeader, "access token header has critical extensions (crit), which are not supported")
        }

        // Signature over ASCII(header '.' payload), decoded after the header
        let rest = UnsafeMutableBufferPointer(rebasing: scratch[headerCount...])
        guard let signatureCount = Base64URL.decode(signaturePart, into: rest) else {
            throw AuthFailure(.malformed, "access token signature is not valid base64url")
        }
        let signature = UnsafeRawBufferPointer(UnsafeMutableBufferPointer(rebasing: rest[..<signatureCount]))
        try checkSignature(signature, over: UnsafeBufferPointer(rebasing: bytes[..<secondDot]))

        // Claims (only now that the token is authentic), decoded over the header
        guard let payloadCount = Base64URL.decode(payloadPart, into: scratch) else {
            throw AuthFailure(.malformed, "access token payload is not valid base64url")
        }
        let payloadBytes = UnsafeMutableBufferPointer(rebasing: scratch[..<payloadCount])
        guard let claims = JSONText.Fields(UnsafeRawBufferPointer(payloadBytes), names: Self.claimNames) else {
            throw AuthFailure(.malformed, "access token payload is not a JSON object")
        }
        return try validate(claims: claims, now: now)
    }

    private func checkSignature(_ signature: UnsafeRawBufferPointer, over input: UnsafeBufferPointer<UInt8>) throws(AuthFailure) {
        switch material {
        case .secret(let key):
            guard signature.count == 32 else {
                throw AuthFailure(.badSignature, "access token signature has the wrong length for HS256")
            }
            guard key.isMAC(signature, of: input) else {
                throw AuthFailure(.badSignature, "access token signature is invalid")
            }
        case .asymmetric(let key):
            if key.algorithm == .es256, signature.count != 2 * ECDSASignature.componentBytes {
                throw AuthFailure(.badSignature, "access token signature has the wrong length for ES256 (expected 64 bytes)")
            }
            guard key.verify(signature: Array(signature), over: Array(input)[...]) else {
                throw AuthFailure(.badSignature, "access token signature is invalid")
            }
        }
    }

    private func numericClaim(_ claims: JSONText.Fields, _ index: Int, _ name: StaticString) throws(AuthFailure) -> Int64? {
        guard let raw = claims[index] else { return nil }
        switch claims.numericDate(raw) {
        case .value(let value): return value
        case .notANumber: throw AuthFailure(.invalidClaim, "access token \(name) claim must be a number")
        case .outOfRange: throw AuthFailure(.invalidClaim, "access token \(name) claim is out of range")
        }
    }

    /// `claims` holds `claimNames`: 0 sub, 1 exp, 2 nbf, 3 iat, 4 iss, 5 aud, 6 jti.
    private func validate(claims: JSONText.Fields, now: Int64) throws(AuthFailure) -> VerifiedToken {
        guard let subValue = claims[0], let subject = claims.string(subValue), !subject.isEmpty else {
            throw AuthFailure(.missingSubject, "access token has no subject (sub)")
        }
        guard let expiresAt = try numericClaim(claims, 1, "exp") else {
            throw AuthFailure(.missingExpiry, "access token has no expiry (exp)")
        }
        let notBefore = try numericClaim(claims, 2, "nbf")
        let issuedAt = try numericClaim(claims, 3, "iat")

        var tokenIssuer: String? = nil
        if let issValue = claims[4] {
            guard let value = claims.string(issValue) else {
                throw AuthFailure(.invalidClaim, "access token iss claim must be a string")
            }
            tokenIssuer = value
        }
        // RFC 7519 §7.3: claim values compare with no normalisation, so by bytes, not `String` ==.
        if let issuer, !(tokenIssuer.map { Self.sameBytes($0, issuer) } ?? false) {
            throw AuthFailure(.wrongIssuer, "access token was not issued by the expected issuer")
        }

        var tokenAudience: [String] = []
        if let audValue = claims[5] {
            if let value = claims.string(audValue) {
                tokenAudience = [value]
            } else if let values = claims.strings(audValue) {
                tokenAudience = values
            } else {
                throw AuthFailure(.invalidClaim, "access token aud claim must be a string or an array of strings")
            }
        }
        if let audience, !tokenAudience.contains(where: { Self.sameBytes($0, audience) }) {
            throw AuthFailure(.wrongAudience, "access token is not intended for this service (aud)")
        }

        let leeway = Int64(leeway)
        if let notBefore {
            let (shifted, overflow) = now.addingReportingOverflow(leeway)
            if !overflow, shifted < notBefore {
                throw AuthFailure(.notYetValid, "access token is not valid yet (nbf)")
            }
        }
        let (deadline, overflow) = expiresAt.addingReportingOverflow(leeway)
        if !overflow, now >= deadline {
            throw AuthFailure(.expired, "access token has expired")
        }

        let tokenID = claims[6].flatMap { claims.string($0) }
        return VerifiedToken(subject: subject, expiresAt: expiresAt, issuedAt: issuedAt, notBefore: notBefore,
                             issuer: tokenIssuer, audience: tokenAudience, tokenID: tokenID, algorithm: algorithm)
    }
}

extension JWTVerifier {
    /// Claim values and algorithm names compare by UTF-8 bytes: `String` == would equate canonically equivalent text.
    static func sameBytes(_ a: String, _ b: String) -> Bool { a.utf8.elementsEqual(b.utf8) }
}
