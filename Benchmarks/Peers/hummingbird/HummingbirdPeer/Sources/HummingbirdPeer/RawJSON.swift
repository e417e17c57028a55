/// Byte-level helpers for the publish path.
///
/// Foundation's `JSONSerialization` parses a publish line quickly on Linux, but writing JSON back is slow (dynamic
/// casts per value: about 15 µs for a small `data` object, more than the rest of a publish together). The hub
/// passes `data` to clients byte for byte, so this peer does the same: once `JSONSerialization` has validated the
/// line, `rawMember` finds the byte range of the top-level `"data"` value, and strings are escaped by hand.
enum RawJSON {
    /// The byte range of the value of the top-level member `name` of a valid JSON object, or nil when it is absent
    /// (or its key is spelled with escapes: the caller then falls back to re-encoding).
    static func rawMember(_ name: String, in bytes: UnsafeRawBufferPointer) -> Range<Int>? {
        let key = Array(name.utf8)
        var i = 0
        let n = bytes.count
        func skipSpace() { while i < n, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 } }
        /// i at an opening quote → i just past the closing quote.
        func skipString() {
            i += 1
            while i < n {
                if bytes[i] == UInt8(ascii: "\\") { i += 2; continue }
                if bytes[i] == UInt8(ascii: "\"") { i += 1; return }
                i += 1
            }
        }
        func skipValue() {
            var depth = 0
            while i < n {
                switch bytes[i] {
                case UInt8(ascii: "\""): skipString(); if depth == 0 { return }; continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    if depth == 0 { return }
                    depth -= 1
                    if depth == 0 { i += 1; return }
                case UInt8(ascii: ","), 0x20, 0x0A, 0x0D, 0x09: if depth == 0 { return }
                default: break
                }
                i += 1
            }
        }
        skipSpace()
        guard i < n, bytes[i] == UInt8(ascii: "{") else { return nil }
        i += 1
        while i < n {
            skipSpace()
            guard i < n, bytes[i] == UInt8(ascii: "\"") else { return nil }
            let keyStart = i + 1
            skipString()
            let isKey = i - 1 - keyStart == key.count && key.indices.allSatisfy { bytes[keyStart + $0] == key[$0] }
            skipSpace()
            guard i < n, bytes[i] == UInt8(ascii: ":") else { return nil }
            i += 1
            skipSpace()
            let valueStart = i
            skipValue()
            if isKey { return valueStart..<i }
            skipSpace()
            guard i < n, bytes[i] == UInt8(ascii: ",") else { return nil }
            i += 1
        }
        return nil
    }

    /// A string as a JSON string literal.
    static func quote(_ s: String) -> String {
        var out = "\""
        out.reserveCapacity(s.utf8.count + 2)
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
        return out
    }
}
