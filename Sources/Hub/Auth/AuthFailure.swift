/// Why a connection was refused authentication.
///
/// `reason.rawValue` is a stable, low-cardinality metrics label. `code` is what clients branch on:
/// `ErrAccessTokenExpired` means "refresh the access token and retry", anything else (`UNAUTHORIZED`)
/// means the credentials are not usable. `message` is for humans and never contains the token.
public struct AuthFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Reason: String, Sendable, CaseIterable {
        case missingToken = "missing_token"
        case tokenTooLarge = "token_too_large"
        case malformed
        case algorithmNotAllowed = "alg_not_allowed"
        case unsupportedHeader = "unsupported_header"
        case badSignature = "bad_signature"
        case invalidClaim = "invalid_claim"
        case missingSubject = "missing_subject"
        case missingExpiry = "missing_exp"
        case wrongIssuer = "wrong_issuer"
        case wrongAudience = "wrong_audience"
        case notYetValid = "not_yet_valid"
        case expired
    }

    public let reason: Reason
    /// Specific, human-readable, safe to send to the client: it never echoes the token or claim values.
    public let message: String

    public init(_ reason: Reason, _ message: String) {
        self.reason = reason
        self.message = message
    }

    public static let unauthorizedCode = "UNAUTHORIZED"

    /// Error code for the JSON body: clients refresh on `ErrAccessTokenExpired`, log out otherwise.
    public var code: String {
        reason == .expired ? "ErrAccessTokenExpired" : Self.unauthorizedCode
    }

    /// HTTP status to send with `httpBody()`.
    public var httpStatus: Int { 401 }

    /// Exactly `{"error":{"code":"…","message":"…"}}`, JSON-escaped.
    public func httpBody() -> String {
        #"{"error":{"code":"# + JSONText.quote(code) + #","message":"# + JSONText.quote(message) + "}}"
    }

    public var description: String { "\(reason.rawValue): \(message)" }
}
