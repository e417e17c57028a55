import Foundation

/// The only JSON the Auth module touches: one parse entry point and a tiny deterministic writer for token minting
/// and error bodies.
enum JSONText {
    /// Parses a JSON object with the hub's own strict scanner (RFC 8259; depth limit 32) into Foundation values,
    /// which is what the verifier reads. Callers rely on:
    /// - numbers arrive as `NSNumber` (integers as Int64, others as Double; booleans are distinguished by
    ///   `JSONText.numericDate(_:)`),
    /// - duplicate member names resolve to the lexically last one (allowed by RFC 7515 §5.2),
    /// - `nil` for anything that is not a JSON object (including excessive nesting).
    /// Foundation's `JSONSerialization` did this before at about two thirds of a token's verify cost.
    static func parseJSONObject(_ bytes: [UInt8]) -> [String: Any]? {
        bytes.withUnsafeBytes { raw -> [String: Any]? in
            var members: [(JSONValue, JSONValue)] = []
            do {
                try JSONScanner.forEachMember(in: raw, maxDepth: 32) { members.append(($0, $1)) }
            } catch {
                return nil
            }
            var object: [String: Any] = [:]
            for (key, value) in members { object[JSONScanner.decodeString(key, in: raw)] = foundationValue(value, in: raw) }
            return object
        }
    }

    private static func foundationValue(_ value: JSONValue, in raw: UnsafeRawBufferPointer) -> Any {
        switch value.kind {
        case .string:
            return JSONScanner.decodeString(value, in: raw)
        case .number:
            if !value.isFractional, let integer = JSONScanner.int64(value, in: raw) { return NSNumber(value: integer) }
            let text = String(decoding: UnsafeRawBufferPointer(rebasing: raw[value.range]), as: UTF8.self)
            return NSNumber(value: Double(text) ?? .infinity)
        case .true:
            return NSNumber(value: true)
        case .false:
            return NSNumber(value: false)
        case .null:
            return NSNull()
        case .array:
            var elements: [Any] = []
            try? JSONScanner.forEachElement(of: value, in: raw) { elements.append(foundationValue($0, in: raw)) }
            return elements
        case .object:
            var members: [String: Any] = [:]
            try? JSONScanner.forEachMember(of: value, in: raw) { key, member in
                members[JSONScanner.decodeString(key, in: raw)] = foundationValue(member, in: raw)
            }
            return members
        }
    }

    enum NumberResult: Equatable {
        case value(Int64)
        case notANumber
        case outOfRange
    }

    /// Reads a NumericDate: integers as-is, floats truncated toward zero; strings, booleans,
    /// non-finite or out-of-Int64-range values are rejected.
    static func numericDate(_ value: Any) -> NumberResult {
        guard let number = value as? NSNumber, !(value is String) else { return .notANumber }
        let type = String(cString: number.objCType)
        switch type {
        case "c", "B":
            return .notANumber // JSON true/false
        case "d", "f":
            let double = number.doubleValue
            guard double.isFinite else { return .outOfRange }
            let truncated = double.rounded(.towardZero)
            guard let exact = Int64(exactly: truncated) else { return .outOfRange }
            return .value(exact)
        case "Q", "L":
            let unsigned = number.uint64Value
            guard unsigned <= UInt64(Int64.max) else { return .outOfRange }
            return .value(Int64(unsigned))
        default:
            return .value(number.int64Value)
        }
    }

    /// A JSON string literal, quotes included: the hub's one JSON escaper (`JSONWriter.string`).
    static func quote(_ text: String) -> String {
        var w = JSONWriter(capacity: text.utf8.count + 8)
        w.string(text)
        return String(decoding: w.takeBytes(), as: UTF8.self)
    }
}
