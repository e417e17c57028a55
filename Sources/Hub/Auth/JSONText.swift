/// The only JSON the Auth module touches: an in-place object reader for tokens and a tiny deterministic writer for
/// token minting and error bodies.
enum JSONText {
    enum NumberResult: Equatable {
        case value(Int64)
        case notANumber
        case outOfRange
    }

    /// A JSON object's top-level members, read in place: what the verifier reads from a token's header and
    /// claims. The hub's own strict scanner (RFC 8259; depth limit 32) validates the whole object; members are
    /// kept as byte ranges and looked up by name, so a token costs no `[String: Any]`, `NSNumber` or dynamic
    /// cast (those were about half of a verify's user-space time: Benchmarks/results/setup). Callers rely on:
    /// - duplicate member names resolve to the lexically last one (allowed by RFC 7515 §5.2),
    /// - `nil` from `init` for anything that is not a JSON object (including excessive nesting),
    /// - names match after unescaping (`"s\u0075b"` is `sub`).
    struct Object {
        private let bytes: [UInt8]
        private let members: [(key: JSONValue, value: JSONValue)]

        init?(_ bytes: [UInt8]) {
            var members: [(key: JSONValue, value: JSONValue)] = []
            members.reserveCapacity(8)  // a token's header and claims: one allocation instead of one per doubling
            let valid = bytes.withUnsafeBytes { raw -> Bool in
                do {
                    try JSONScanner.forEachMember(in: raw, maxDepth: 32) { members.append(($0, $1)) }
                    return true
                } catch {
                    return false
                }
            }
            guard valid else { return nil }
            self.bytes = bytes
            self.members = members
        }

        /// The value of the last member named `name`, if any.
        func value(_ name: StaticString) -> JSONValue? {
            bytes.withUnsafeBytes { raw -> JSONValue? in
                for member in members.reversed() where member.key.stringEquals(name, in: raw) { return member.value }
                return nil
            }
        }

        /// A string value, decoded; nil for any other kind.
        func string(_ value: JSONValue) -> String? {
            guard value.kind == .string else { return nil }
            return bytes.withUnsafeBytes { JSONScanner.decodeString(value, in: $0) }
        }

        /// An array's elements when all are strings, decoded; nil for anything else.
        func strings(_ value: JSONValue) -> [String]? {
            guard value.kind == .array else { return nil }
            return bytes.withUnsafeBytes { raw -> [String]? in
                var out: [String] = []
                var allStrings = true
                try? JSONScanner.forEachElement(of: value, in: raw) { element in
                    if element.kind == .string { out.append(JSONScanner.decodeString(element, in: raw)) } else { allStrings = false }
                }
                return allStrings ? out : nil
            }
        }

        /// Reads a NumericDate: integers as-is, other numbers (fraction, exponent, beyond Int64) as a Double
        /// truncated toward zero; strings, booleans, null, arrays, objects, non-finite or out-of-Int64-range
        /// values are rejected.
        func numericDate(_ value: JSONValue) -> NumberResult {
            guard value.kind == .number else { return .notANumber }
            return bytes.withUnsafeBytes { raw -> NumberResult in
                if !value.isFractional, let integer = JSONScanner.int64(value, in: raw) { return .value(integer) }
                let text = String(decoding: UnsafeRawBufferPointer(rebasing: raw[value.range]), as: UTF8.self)
                let double = Double(text) ?? .infinity
                guard double.isFinite else { return .outOfRange }
                guard let exact = Int64(exactly: double.rounded(.towardZero)) else { return .outOfRange }
                return .value(exact)
            }
        }
    }

    /// A JSON string literal, quotes included: the hub's one JSON escaper (`JSONWriter.string`).
    static func quote(_ text: String) -> String {
        var w = JSONWriter(capacity: text.utf8.count + 8)
        w.string(text)
        return String(decoding: w.takeBytes(), as: UTF8.self)
    }
}
