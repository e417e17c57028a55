import HubJSON

/// The only JSON the Auth module touches: an in-place object reader for tokens and a tiny deterministic writer for
/// token minting and error bodies.
package enum JSONText {
    enum NumberResult: Equatable {
        case value(Int64)
        case notANumber
        case outOfRange
    }

    /// The names a `Fields` reader keeps: at most 8, each 1 to 8 bytes of plain ASCII (a token's header and claim
    /// names), so a member's name is matched by one integer comparison.
    struct Names: Sendable {
        fileprivate let names: [StaticString]
        fileprivate let packed: [UInt64]
        init(_ names: [StaticString]) {
            precondition(names.count <= 8 && names.allSatisfy { (1...8).contains($0.utf8CodeUnitCount) })
            self.names = names
            packed = names.map(JSONValue.pack)
        }
    }

    /// A JSON object's top-level members named in `Names`, found in one pass over the bytes, in place: what the
    /// verifier reads from a token's header and claims. The hub's own strict scanner (RFC 8259; depth limit 32)
    /// validates the whole object; the wanted members' values are kept as byte ranges, so a token costs no
    /// `[String: Any]`, `NSNumber` or dynamic cast (about half of a verify's user-space time once:
    /// Benchmarks/results/setup), and no array. Callers rely on:
    /// - duplicate member names resolve to the lexically last one (allowed by RFC 7515 §5.2),
    /// - `nil` from `init` for anything that is not a JSON object (including excessive nesting),
    /// - names match after unescaping (`"s\u0075b"` is `sub`).
    /// It reads `bytes` and does not keep them alive: use it only while they are.
    struct Fields {
        private let bytes: UnsafeRawBufferPointer
        private var values = InlineArray<8, JSONValue?>(repeating: nil)

        init?(_ bytes: UnsafeRawBufferPointer, names: Names) {
            self.bytes = bytes
            var values = InlineArray<8, JSONValue?>(repeating: nil)
            do {
                try JSONScanner.forEachMember(in: bytes, maxDepth: 32) { key, value in
                    let word = key.packed(in: bytes)  // 0 for escaped names and names over 8 bytes
                    for i in names.packed.indices {
                        let match = word != 0
                            ? word == names.packed[i] && key.range.count &- 2 == names.names[i].utf8CodeUnitCount
                            : key.hasEscapes && key.stringEquals(names.names[i], in: bytes)
                        if match { values[i] = value }
                    }
                }
            } catch {
                return nil
            }
            self.values = values
        }

        /// The value of the last member called `names[index]`, if any.
        subscript(_ index: Int) -> JSONValue? { values[index] }

        /// A string value, decoded; nil for any other kind.
        func string(_ value: JSONValue) -> String? {
            guard value.kind == .string else { return nil }
            return JSONScanner.decodeString(value, in: bytes)
        }

        /// Whether `value` is a string equal to `expected`, ASCII letters compared without case; no `String` made
        /// unless the value has escapes.
        func string(_ value: JSONValue, equalsIgnoringCase expected: StaticString) -> Bool {
            guard value.kind == .string else { return false }
            if value.hasEscapes {
                return string(value).map { $0.lowercased() == expected.description.lowercased() } ?? false
            }
            let content = value.stringContent
            guard content.count == expected.utf8CodeUnitCount else { return false }
            for i in 0..<content.count where Self.lower(bytes[content.lowerBound + i]) != Self.lower(expected.utf8Start[i]) {
                return false
            }
            return true
        }

        @inline(__always) private static func lower(_ b: UInt8) -> UInt8 { (b >= 0x41 && b <= 0x5A) ? b | 0x20 : b }

        /// An array's elements when all are strings, decoded; nil for anything else.
        func strings(_ value: JSONValue) -> [String]? {
            guard value.kind == .array else { return nil }
            var out: [String] = []
            var allStrings = true
            try? JSONScanner.forEachElement(of: value, in: bytes) { element in
                if element.kind == .string { out.append(JSONScanner.decodeString(element, in: bytes)) } else { allStrings = false }
            }
            return allStrings ? out : nil
        }

        /// Reads a NumericDate: integers as-is, other numbers (fraction, exponent, beyond Int64) as a Double
        /// truncated toward zero; strings, booleans, null, arrays, objects, non-finite or out-of-Int64-range
        /// values are rejected.
        func numericDate(_ value: JSONValue) -> NumberResult {
            guard value.kind == .number else { return .notANumber }
            if !value.isFractional, let integer = JSONScanner.int64(value, in: bytes) { return .value(integer) }
            let text = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[value.range]), as: UTF8.self)
            let double = Double(text) ?? .infinity
            guard double.isFinite else { return .outOfRange }
            guard let exact = Int64(exactly: double.rounded(.towardZero)) else { return .outOfRange }
            return .value(exact)
        }
    }

    /// A JSON string literal, quotes included: the hub's one JSON escaper (`JSONWriter.string`).
    package static func quote(_ text: String) -> String {
        var w = JSONWriter(capacity: text.utf8.count + 8)
        w.string(text)
        return String(decoding: w.takeBytes(), as: UTF8.self)
    }
}
