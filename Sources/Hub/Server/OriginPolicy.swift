import Foundation

/// `--allowed-origins`: which browser origins may open a WebSocket. Tokens are bearer tokens, not cookies, so this is
/// defence in depth against a page on another site driving a user's browser; native apps send no `Origin` and are
/// never refused by it. Without the option every origin is allowed.
///
/// Entries are origins as browsers serialise them (`https://app.example.com`, `http://localhost:3000`) or a wildcard
/// for subdomains (`https://*.example.com`, which does not match `https://example.com` itself). Compared without
/// regard to ASCII case.
public struct OriginPolicy: Sendable, Equatable {
    private var exact: Set<String> = []
    /// (scheme + "://", "." + domain, optional ":port") for `scheme://*.domain[:port]`.
    private var wildcards: [(prefix: String, suffix: String)] = []
    public private(set) var entries: [String] = []

    public init() {}

    /// Parses a comma-separated list. Throws a message for an entry that is not an origin.
    public init(list: String) throws(HubConfiguration.ConfigurationError) {
        for raw in list.split(separator: ",") {
            let entry = raw.trimmingCharacters(in: .whitespaces).lowercased()
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
                wildcards.append((scheme, String(rest)))
            } else {
                guard !host.contains("*") else {
                    throw .init(message: "--allowed-origins: \"\(entry)\": a wildcard is only allowed as the first label")
                }
                exact.insert(entry)
            }
            entries.append(entry)
        }
        guard !entries.isEmpty else { throw .init(message: "--allowed-origins: the list is empty") }
    }

    /// Whether the check is on at all.
    public var isRestricted: Bool { !entries.isEmpty }

    /// Whether a request with this `Origin` header value (nil: none sent) may upgrade.
    public func allows(_ origin: String?) -> Bool {
        guard isRestricted, let origin else { return true }
        let o = origin.lowercased()
        if exact.contains(o) { return true }
        for w in wildcards where o.hasPrefix(w.prefix) && o.hasSuffix(w.suffix) {
            let label = o.dropFirst(w.prefix.count).dropLast(w.suffix.count)
            if !label.isEmpty && !label.contains(":") && !label.contains("/") { return true }
        }
        return false
    }

    public static func == (a: OriginPolicy, b: OriginPolicy) -> Bool { a.entries == b.entries }
}
