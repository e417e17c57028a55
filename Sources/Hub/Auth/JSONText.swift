import Foundation

/// The only JSON the Auth module touches: one parse entry point (swappable for the hub's own scanner)
/// and a tiny deterministic writer for token minting and error bodies.
enum JSONText {
    /// Parses a JSON object. This is the single Foundation dependency for JSON parsing in Auth;
    /// replace its body to move to the hub's own scanner. Callers rely on:
    /// - numbers arrive as `NSNumber` (booleans are distinguished by `JSONText.number(_:)`),
    /// - duplicate member names resolve to the lexically last one (allowed by RFC 7515 §5.2),
    /// - `nil` for anything that is not a JSON object (including excessive nesting).
    static func parseJSONObject(_ bytes: [UInt8]) -> [String: Any]? {
        guard bytes.first == UInt8(ascii: "{") || bytes.first.map(isJSONWhitespace) == true else { return nil }
        let object = try? JSONSerialization.jsonObject(with: Data(bytes), options: [])
        return object as? [String: Any]
    }

    private static func isJSONWhitespace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D
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
