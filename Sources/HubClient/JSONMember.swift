/// Finds a member of a JSON object's top level by name, as a range of the text's bytes, without parsing its value:
/// `HubEvent.data` is the backend's bytes, and a parse-and-write round trip would reorder keys, respell numbers and
/// merge keys that differ only in Unicode form. The text comes from the hub (valid JSON); on anything else the
/// answer is nil, never a crash.
enum JSONMember {
    static func range(of name: String, in b: [UInt8]) -> Range<Int>? {
        let wanted = Array(name.utf8)
        var i = skipSpace(b, 0)
        guard i < b.count, b[i] == UInt8(ascii: "{") else { return nil }
        i += 1
        while true {
            i = skipSpace(b, i)
            guard i < b.count, b[i] == UInt8(ascii: "\"") else { return nil }
            let keyStart = i + 1
            guard let keyEnd = skipString(b, i) else { return nil }
            // Compared as written (the hub writes its member names without escapes).
            let key = b[keyStart..<(keyEnd - 1)]
            i = skipSpace(b, keyEnd)
            guard i < b.count, b[i] == UInt8(ascii: ":") else { return nil }
            let valueStart = skipSpace(b, i + 1)
            guard let valueEnd = skipValue(b, valueStart) else { return nil }
            if key.elementsEqual(wanted) { return valueStart..<valueEnd }
            i = skipSpace(b, valueEnd)
            guard i < b.count, b[i] == UInt8(ascii: ",") else { return nil }
            i += 1
        }
    }

    private static func skipSpace(_ b: [UInt8], _ start: Int) -> Int {
        var i = start
        while i < b.count, b[i] == 0x20 || b[i] == 0x09 || b[i] == 0x0A || b[i] == 0x0D { i += 1 }
        return i
    }

    /// `b[start]` is a quote: the index after the closing one.
    private static func skipString(_ b: [UInt8], _ start: Int) -> Int? {
        var i = start + 1
        while i < b.count {
            switch b[i] {
            case UInt8(ascii: "\\"): i += 2
            case UInt8(ascii: "\""): return i + 1
            default: i += 1
            }
        }
        return nil
    }

    /// The index after the value that starts at `start`.
    private static func skipValue(_ b: [UInt8], _ start: Int) -> Int? {
        guard start < b.count else { return nil }
        switch b[start] {
        case UInt8(ascii: "\""):
            return skipString(b, start)
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            var depth = 0
            var i = start
            while i < b.count {
                switch b[i] {
                case UInt8(ascii: "\""):
                    guard let end = skipString(b, i) else { return nil }
                    i = end
                    continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    depth -= 1
                    if depth == 0 { return i + 1 }
                default: break
                }
                i += 1
            }
            return nil
        default:
            // A number, true, false or null: up to the next delimiter.
            var i = start
            while i < b.count, b[i] != UInt8(ascii: ","), b[i] != UInt8(ascii: "}"), b[i] != UInt8(ascii: "]"),
                  b[i] != 0x20, b[i] != 0x09, b[i] != 0x0A, b[i] != 0x0D { i += 1 }
            return i > start ? i : nil
        }
    }
}
