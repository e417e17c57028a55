/// A JSON value for non-registered claims.
public enum JWTClaimValue: Sendable, Equatable {
    case string(String)
    case int(Int64)
    case double(Double)
    case bool(Bool)
    case null
    case array([JWTClaimValue])
    case object([String: JWTClaimValue])

    /// Deterministic JSON: object members sorted by key; non-finite doubles written as `null`.
    func write(into out: inout String) {
        switch self {
        case .string(let value): out += JSONText.quote(value)
        case .int(let value): out += String(value)
        case .double(let value): out += value.isFinite ? "\(value)" : "null"
        case .bool(let value): out += value ? "true" : "false"
        case .null: out += "null"
        case .array(let values):
            out += "["
            for (index, value) in values.enumerated() {
                if index > 0 { out += "," }
                value.write(into: &out)
            }
            out += "]"
        case .object(let members):
            out += "{"
            for (index, member) in members.sorted(by: { $0.key < $1.key }).enumerated() {
                if index > 0 { out += "," }
                out += JSONText.quote(member.key)
                out += ":"
                member.value.write(into: &out)
            }
            out += "}"
        }
    }
}

/// Claims for minting a token.
public struct JWTClaims: Sendable, Equatable {
    /// Names written from the typed fields; `extra` entries with these names are ignored.
    public static let registeredNames: Set<String> = ["sub", "exp", "iat", "nbf", "iss", "aud", "jti"]

    public var sub: String
    public var exp: Int64
    public var iat: Int64?
    public var nbf: Int64?
    public var iss: String?
    /// One element is written as a JSON string, several as an array, empty/nil omitted.
    public var aud: [String]?
    public var jti: String?
    public var extra: [String: JWTClaimValue]

    public init(sub: String, exp: Int64, iat: Int64? = nil, nbf: Int64? = nil, iss: String? = nil,
                aud: [String]? = nil, jti: String? = nil, extra: [String: JWTClaimValue] = [:]) {
        self.sub = sub
        self.exp = exp
        self.iat = iat
        self.nbf = nbf
        self.iss = iss
        self.aud = aud
        self.jti = jti
        self.extra = extra
    }

    /// `sub` with `iat = now` and `exp = now + ttl` (seconds, saturating).
    public init(subject: String, now: Int64, ttl: Int64) {
        let (exp, overflow) = now.addingReportingOverflow(ttl)
        self.init(sub: subject, exp: overflow ? (ttl > 0 ? Int64.max : Int64.min) : exp, iat: now)
    }

    /// Parses a token lifetime such as `900`, `900s`, `15m`, `2h` or `1d` (for `hubctl token --ttl`).
    /// Returns seconds, or `nil` for anything else, zero/negative values, or more than 366 days.
    public static func parseTTL(_ text: String) -> Int64? {
        let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
        var digits = Substring(text)
        var unit: Int64 = 1
        if let last = digits.last, let multiplier = units[last] {
            unit = multiplier
            digits = digits.dropLast()
        }
        guard !digits.isEmpty, digits.count <= 9, digits.allSatisfy({ ("0"..."9").contains($0) }),
              let value = Int64(digits), value > 0 else { return nil }
        let seconds = value * unit
        return seconds <= 366 * 86_400 ? seconds : nil
    }

    /// Deterministic compact JSON: registered claims in a fixed order
    /// (iss, sub, aud, exp, nbf, iat, jti), then `extra` sorted by key.
    public func json() -> String {
        var out = "{"
        var first = true
        func member(_ name: String, _ write: (inout String) -> Void) {
            if !first { out += "," }
            first = false
            out += JSONText.quote(name)
            out += ":"
            write(&out)
        }
        if let iss { member("iss") { $0 += JSONText.quote(iss) } }
        member("sub") { $0 += JSONText.quote(sub) }
        if let aud, !aud.isEmpty {
            member("aud") { out in
                if aud.count == 1 {
                    out += JSONText.quote(aud[0])
                } else {
                    JWTClaimValue.array(aud.map(JWTClaimValue.string)).write(into: &out)
                }
            }
        }
        member("exp") { $0 += String(exp) }
        if let nbf { member("nbf") { $0 += String(nbf) } }
        if let iat { member("iat") { $0 += String(iat) } }
        if let jti { member("jti") { $0 += JSONText.quote(jti) } }
        for (key, value) in extra.sorted(by: { $0.key < $1.key }) where !JWTClaims.registeredNames.contains(key) {
            member(key) { value.write(into: &$0) }
        }
        out += "}"
        return out
    }
}
