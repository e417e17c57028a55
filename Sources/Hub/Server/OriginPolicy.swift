import Foundation

/// `--allowed-origins`: which browser origins may open a WebSocket. Tokens are bearer tokens, not cookies, so this is
/// defence in depth against a page on another site driving a user's browser; native apps send no `Origin` and are
/// never refused by it. Without the option every origin is allowed.
///
/// Entries are origins as browsers serialise them (`https://app.example.com`, `http://localhost:3000`) or a wildcard
/// for subdomains (`https://*.example.com`, which does not match `https://example.com` itself). Compared without
/// regard to ASCII case.
public struct OriginPolicy: Sendable, Equatable {
    /// Entries' bytes, ASCII-lowercased.
    private var exact: Set<[UInt8]> = []
    /// (scheme + "://", "." + domain, optional ":port") for `scheme://*.domain[:port]`.
    private var wildcards: [(prefix: [UInt8], suffix: [UInt8])] = []
    public private(set) var entries: [String] = []

    public init() {}

    /// Parses a comma-separated list. Throws a message for an entry that is not an origin.
    public init(list: String) throws(HubConfiguration.ConfigurationError) {
        for raw in list.split(separator: ",") {
            let entry = String(decoding: Self.asciiLowercased(raw.trimmingCharacters(in: .whitespaces)), as: UTF8.self)
            guard !entry.isEmpty else { continue }
            guard let schemeEnd = entry.range(of: "://"), !entry[schemeEnd.upperBound...].isEmpty,
                  !entry[schemeEnd.upperBound...].contains("/") else {
                throw .init(message: "--allowed-origins: \"\(entry)\" is not an origin (scheme://host[:port], or scheme://*.domain)")
            }
            let scheme = String(entry[..<schemeEnd.upperBound])
            let host = entry[schemeEnd.upperBound...]
            if host.hasPrefix("*.") {
                let rest = host.dropFirst(1)  // ".domain[:port]"
                guard rest.count > 1, !rest.dropFirst().contains("*") else {
                    throw .init(message: "--allowed-origins: \"\(entry)\": a wildcard is only allowed as the first label")
                }
                wildcards.append((Array(scheme.utf8), Array(rest.utf8)))
            } else {
                guard !host.contains("*") else {
                    throw .init(message: "--allowed-origins: \"\(entry)\": a wildcard is only allowed as the first label")
                }
                exact.insert(Array(entry.utf8))
            }
            entries.append(entry)
        }
        guard !entries.isEmpty else { throw .init(message: "--allowed-origins: the list is empty") }
    }

    /// Whether the check is on at all.
    public var isRestricted: Bool { !entries.isEmpty }

    /// Whether a request with this `Origin` header value (nil: none sent) may upgrade. Compared by bytes with only
    /// ASCII letters folded (browsers serialise origins in ASCII, hosts in punycode): `String`'s Unicode rules would
    /// let `\u{212A}` (KELVIN SIGN) lowercase to `k`, or a canonically equivalent spelling pass as the allowed one.
    public func allows(_ origin: String?) -> Bool {
        guard isRestricted, let origin else { return true }
        let o = Self.asciiLowercased(origin)
        if exact.contains(o) { return true }
        for w in wildcards where o.count > w.prefix.count + w.suffix.count && o.starts(with: w.prefix) && o.reversed().starts(with: w.suffix.reversed()) {
            let label = o[w.prefix.count..<(o.count - w.suffix.count)]
            if !label.contains(UInt8(ascii: ":")) && !label.contains(UInt8(ascii: "/")) { return true }
        }
        return false
    }

    static func asciiLowercased(_ s: some StringProtocol) -> [UInt8] {
        s.utf8.map { (0x41...0x5A).contains($0) ? $0 | 0x20 : $0 }
    }

    public static func == (a: OriginPolicy, b: OriginPolicy) -> Bool { a.entries == b.entries }
}
