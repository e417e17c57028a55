/// Finds the bearer token of a `/ws` upgrade request.
///
/// Rules:
/// - `Authorization: Bearer <token>`: scheme case-insensitive, one or more spaces/tabs before the
///   token, surrounding whitespace ignored; the token itself must not contain whitespace.
/// - `?access_token=<token>` (browsers cannot set headers on WebSocket): the caller passes the
///   already percent-decoded value.
/// - Both present: the header wins and the query parameter is ignored (it is the more private
///   channel: query strings end up in access logs). A present-but-invalid header is an error; it
///   does not fall back to the query.
/// - An empty or all-whitespace value counts as absent.
/// - Neither present: `missing_token`. A non-Bearer scheme: `malformed`.
public enum TokenExtraction {
    public static func bearerToken(authorizationHeader: String?, accessTokenQuery: String?) -> Result<String, AuthFailure> {
        if let header = authorizationHeader, let trimmed = nonEmptyTrimmed(header) {
            return parseAuthorization(trimmed)
        }
        if let query = accessTokenQuery, let trimmed = nonEmptyTrimmed(query) {
            guard !trimmed.contains(where: isSpace) else {
                return .failure(AuthFailure(.malformed, "access_token query parameter contains whitespace"))
            }
            return .success(String(trimmed))
        }
        return .failure(AuthFailure(.missingToken,
            "no access token: send 'Authorization: Bearer <token>' or the access_token query parameter"))
    }

    private static func isSpace(_ c: Character) -> Bool { c == " " || c == "\t" }

    private static func nonEmptyTrimmed(_ value: String) -> Substring? {
        guard let start = value.firstIndex(where: { !isSpace($0) && $0 != "\r" && $0 != "\n" }),
              let end = value.lastIndex(where: { !isSpace($0) && $0 != "\r" && $0 != "\n" }) else { return nil }
        return value[start...end]
    }

    private static func parseAuthorization(_ value: Substring) -> Result<String, AuthFailure> {
        let schemeEnd = value.firstIndex(where: isSpace) ?? value.endIndex
        let scheme = value[..<schemeEnd]
        guard scheme.lowercased() == "bearer" else {
            return .failure(AuthFailure(.malformed, "Authorization header must use the Bearer scheme"))
        }
        let token = value[schemeEnd...].drop(while: isSpace)
        guard !token.isEmpty else {
            return .failure(AuthFailure(.malformed, "Authorization header has the Bearer scheme but no token"))
        }
        guard !token.contains(where: isSpace) else {
            return .failure(AuthFailure(.malformed, "Authorization header has more than one credential after Bearer"))
        }
        return .success(String(token))
    }
}
