import WSProtocol

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
        if let result = bearerTokenOfBytes(authorizationHeader: authorizationHeader, accessTokenQuery: accessTokenQuery) {
            return result
        }
        return bearerTokenOfCharacters(authorizationHeader: authorizationHeader, accessTokenQuery: accessTokenQuery)
    }

    /// The rules on `Character`s: the definition, and the path for values with non-ASCII bytes or a CR.
    static func bearerTokenOfCharacters(authorizationHeader: String?, accessTokenQuery: String?) -> Result<String, AuthFailure> {
        if let header = authorizationHeader, let trimmed = nonEmptyTrimmed(header) {
            return parseAuthorization(trimmed)
        }
        if let query = accessTokenQuery, let trimmed = nonEmptyTrimmed(query) {
            guard !trimmed.contains(where: isSpace) else {
                return .failure(AuthFailure(.malformed, "access_token query parameter contains whitespace"))
            }
            return .success(String(trimmed))
        }
        return .failure(missing)
    }

    private static let missing = AuthFailure(.missingToken,
        "no access token: send 'Authorization: Bearer <token>' or the access_token query parameter")

    /// The bearer token of an upgrade request, handed to `body` as bytes: for a plain header or query value, the
    /// request head's own bytes, so no `String` is made of a token the verifier only reads. Values with
    /// non-ASCII bytes or a CR go through the `Character` rules. `accessTokenQuery`: the form-decoded value.
    package static func withBearerToken<R>(authorizationHeader: ArraySlice<UInt8>?, accessTokenQuery: UnsafeBufferPointer<UInt8>?,
                                   _ body: (UnsafeBufferPointer<UInt8>) -> Result<R, AuthFailure>) -> Result<R, AuthFailure> {
        let plain = withBuffer(authorizationHeader) { header in bearerToken(header: header, query: accessTokenQuery, body) }
        if let plain { return plain }
        let header = authorizationHeader.map { String(decoding: $0, as: UTF8.self) }
        let query = accessTokenQuery.map { String(decoding: $0, as: UTF8.self) }
        switch bearerTokenOfCharacters(authorizationHeader: header, accessTokenQuery: query) {
        case .success(var token): return token.withUTF8(body)
        case .failure(let failure): return .failure(failure)
        }
    }

    /// The same rules on the UTF-8 bytes, for values that are ASCII without a CR (every real token; nil otherwise).
    /// There every `Character` is one byte (only CR LF would make a two-byte grapheme), so the result is exactly
    /// the `Character` rules' (`AuthTokenExtractionTests` compares both), without grapheme breaking: the `Character`
    /// scans of a 200-byte token cost about as much as verifying its HMAC (Benchmarks/results/setup).
    static func bearerTokenOfBytes(authorizationHeader: String?, accessTokenQuery: String?) -> Result<String, AuthFailure>? {
        withUTF8(authorizationHeader) { header in
            withUTF8(accessTokenQuery) { query in
                bearerToken(header: header, query: query) { .success(String(decoding: $0, as: UTF8.self)) }
            }
        }
    }

    /// The byte rules: nil when a value present is not plain ASCII.
    private static func bearerToken<R>(header: UnsafeBufferPointer<UInt8>?, query: UnsafeBufferPointer<UInt8>?,
                                       _ body: (UnsafeBufferPointer<UInt8>) -> Result<R, AuthFailure>) -> Result<R, AuthFailure>? {
        if let header {
            switch scan(header, parseAuthorization) {
            case .notPlain: return nil
            case .blank: break  // counts as absent
            case .result(let result): return result.flatMap(body)
            }
        }
        if let query {
            switch scan(query, queryToken) {
            case .notPlain: return nil
            case .blank: break
            case .result(let result): return result.flatMap(body)
            }
        }
        return .failure(missing)
    }

    private static func withUTF8<T>(_ value: String?, _ body: (UnsafeBufferPointer<UInt8>?) -> T) -> T {
        guard var value else { return body(nil) }
        return value.withUTF8 { body($0) }
    }

    private static func withBuffer<T>(_ value: ArraySlice<UInt8>?, _ body: (UnsafeBufferPointer<UInt8>?) -> T) -> T {
        guard let value else { return body(nil) }
        return value.withUnsafeBufferPointer { body($0) }
    }

    /// A rule's outcome: the token's bytes (inside the value scanned), or why there is none.
    private typealias TokenBytes = Result<UnsafeBufferPointer<UInt8>, AuthFailure>

    private enum Scan { case notPlain, blank, result(TokenBytes) }

    private static func scan(_ bytes: UnsafeBufferPointer<UInt8>, _ rule: (UnsafeBufferPointer<UInt8>) -> TokenBytes) -> Scan {
        guard isPlainASCII(bytes) else { return .notPlain }
        guard let trimmed = trimmedRange(bytes) else { return .blank }
        return .result(rule(UnsafeBufferPointer(rebasing: bytes[trimmed])))
    }

    private static func queryToken(_ token: UnsafeBufferPointer<UInt8>) -> TokenBytes {
        guard !containsSpace(token) else {
            return .failure(AuthFailure(.malformed, "access_token query parameter contains whitespace"))
        }
        return .success(token)
    }

    private static func isPlainASCII(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let raw = UnsafeRawBufferPointer(bytes)
        return ByteScan.all(raw, in: 0...0x7F) && !ByteScan.contains(0x0D, in: raw)
    }

    @inline(__always) private static func isSpaceByte(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 }

    private static func containsSpace(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let raw = UnsafeRawBufferPointer(bytes)
        return ByteScan.contains(0x20, in: raw) || ByteScan.contains(0x09, in: raw)
    }

    /// Without leading and trailing space, tab and LF (CR is never here); nil when nothing is left.
    private static func trimmedRange(_ bytes: UnsafeBufferPointer<UInt8>) -> Range<Int>? {
        let keep = { (b: UInt8) in !isSpaceByte(b) && b != 0x0A }
        guard let start = bytes.firstIndex(where: keep), let end = bytes.lastIndex(where: keep) else { return nil }
        return start..<(end + 1)
    }

    private static func parseAuthorization(_ value: UnsafeBufferPointer<UInt8>) -> TokenBytes {
        let schemeEnd = value.firstIndex(where: isSpaceByte) ?? value.count
        let bearer: StaticString = "bearer"
        guard schemeEnd == bearer.utf8CodeUnitCount,
              (0..<schemeEnd).allSatisfy({ i in
                  let b = value[i]
                  return (b >= 0x41 && b <= 0x5A ? b | 0x20 : b) == bearer.utf8Start[i]
              }) else {
            return .failure(AuthFailure(.malformed, "Authorization header must use the Bearer scheme"))
        }
        var tokenStart = schemeEnd
        while tokenStart < value.count && isSpaceByte(value[tokenStart]) { tokenStart += 1 }
        let token = UnsafeBufferPointer(rebasing: value[tokenStart...])
        guard !token.isEmpty else {
            return .failure(AuthFailure(.malformed, "Authorization header has the Bearer scheme but no token"))
        }
        guard !containsSpace(token) else {
            return .failure(AuthFailure(.malformed, "Authorization header has more than one credential after Bearer"))
        }
        return .success(token)
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
