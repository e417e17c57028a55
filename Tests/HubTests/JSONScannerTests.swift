import Foundation
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// Validates `bytes`; returns the top-level value or the error.
func scanJSON(_ bytes: [UInt8], maxDepth: Int = JSONScanner.defaultMaxDepth) -> Result<JSONValue, JSONError> {
    bytes.withUnsafeBytes { buf in
        do throws(JSONError) { return .success(try JSONScanner.validate(buf, maxDepth: maxDepth)) } catch {
            return .failure(error)
        }
    }
}

func scanJSON(_ text: String) -> Result<JSONValue, JSONError> { scanJSON(Array(text.utf8)) }

struct JSONScannerTests {
    static let valid: [String] = [
        "{}", "[]", "0", "-0", "1", "-1", "12345678901234567890123", "1.5", "-0.0", "1e10", "1E+2", "1e-2",
        "0.5e-0", "\"\"", "\"a\"", "true", "false", "null", " \t\r\n{\"a\":[1,2,{\"b\":null}]} \n",
        "\"\\u00e9\\ud83d\\ude00\"", "\"\\/\\b\\f\\n\\r\\t\\\"\\\\\"", "\"é😀\u{10FFFF}\"", "{\"a\":1,\"a\":2}",
        "\"\\u0000\"", "[[],{},[{}]]", "{\"\":\"\"}", "[ 1 , 2 ]", "\"\u{7F}\"", "\"\\uDBFF\\uDFFF\"",
        "-1.25E-300",
    ]

    @Test(arguments: valid)
    func acceptsValid(_ doc: String) throws {
        let v = try scanJSON(doc).get()
        #expect(v.range.upperBound <= doc.utf8.count)
    }

    /// (document, error offset, reason)
    static let invalid: [(String, Int, String)] = [
        ("", 0, "unexpected end of input"),
        ("   ", 3, "unexpected end of input"),
        ("[1,]", 3, "trailing comma"),
        ("{\"a\":1,}", 7, "trailing comma"),
        ("[1 2]", 3, "expected ',' or ']'"),
        ("{\"a\":1 \"b\":2}", 7, "expected ',' or '}'"),
        ("{\"a\" 1}", 5, "expected ':'"),
        ("{a:1}", 1, "expected a string key"),
        ("{\"a\":}", 5, "expected a value"),
        ("01", 1, "leading zeros are not allowed"),
        ("-01", 2, "leading zeros are not allowed"),
        ("-", 1, "unexpected end of input"),
        ("-a", 1, "expected a digit"),
        ("1.", 2, "unexpected end of input"),
        ("1.e5", 2, "expected a digit"),
        ("1e", 2, "unexpected end of input"),
        ("1e+", 3, "unexpected end of input"),
        ("1ex", 2, "expected a digit"),
        (".5", 0, "expected a value"),
        ("+1", 0, "expected a value"),
        ("NaN", 0, "expected a value"),
        ("Infinity", 0, "expected a value"),
        ("'a'", 0, "expected a value"),
        ("[1]x", 3, "unexpected data after the top-level value"),
        ("{} {}", 3, "unexpected data after the top-level value"),
        ("1 2", 2, "unexpected data after the top-level value"),
        ("tru", 3, "unexpected end of input"),
        ("trUe", 2, "invalid literal"),
        ("nul", 3, "unexpected end of input"),
        ("\"\\ud800\"", 1, "lone surrogate"),
        ("\"\\udc00\"", 1, "lone surrogate"),
        ("\"a\\ud800\\u0041\"", 2, "lone surrogate"),
        ("\"\\ud800x\"", 1, "lone surrogate"),
        ("\"a\u{01}\"", 2, "control character in string"),
        ("\"\t\"", 1, "control character in string"),
        ("\"\n\"", 1, "control character in string"),
        ("\"\\x\"", 2, "invalid escape"),
        ("\"\\u12G4\"", 5, "invalid \\u escape"),
        ("\"abc", 4, "unexpected end of input"),
        ("[\"a\",", 5, "unexpected end of input"),
        ("\u{FEFF}{}", 0, "expected a value"),
        ("[1,,2]", 3, "expected a value"),
    ]

    @Test(arguments: invalid.indices)
    func rejectsInvalid(_ i: Int) {
        let (doc, offset, reason) = Self.invalid[i]
        guard case .failure(let e) = scanJSON(doc) else {
            Issue.record("accepted \(doc.debugDescription)")
            return
        }
        #expect(e.offset == offset, "\(doc.debugDescription)")
        #expect(e.reason == reason, "\(doc.debugDescription)")
    }

    /// The 8-bytes-at-a-time string scan: a special byte at every position of a long string is found.
    @Test func specialByteAtEveryPosition() {
        for n in 0..<40 {
            for k in 0..<n {
                var content = [UInt8](repeating: UInt8(ascii: "a"), count: n)
                content[k] = 0x1F
                #expect((try? scanJSON([0x22] + content + [0x22]).get()) == nil)
                if case .failure(let e) = scanJSON([0x22] + content + [0x22]) { #expect(e.offset == k + 1) }
                content[k] = 0x7F
                #expect((try? scanJSON([0x22] + content + [0x22]).get()) != nil)
                content[k] = 0xC3 // lead byte without continuation
                if case .failure(let e) = scanJSON([0x22] + content + [0x22]) { #expect(e.offset == k + 1) }
                else { Issue.record("accepted a truncated sequence at \(k) of \(n)") }
                content[k] = UInt8(ascii: "\"") // string ends early: the rest is trailing data
                #expect((try? scanJSON([0x22] + content + [0x22]).get()) == nil || k == n - 1)
                content[k] = UInt8(ascii: "\\")
                if k + 1 < n { content[k + 1] = UInt8(ascii: "n") }
                let r = scanJSON([0x22] + content + [0x22])
                #expect(((try? r.get()) != nil) == (k + 1 < n), "\(k) \(n)")
                if case .success(let v) = r { #expect(v.hasEscapes) }
            }
        }
    }

    @Test func errorDescription() {
        #expect(JSONError(offset: 17, reason: "expected ':'").description == "invalid JSON at byte 17: expected ':'")
    }

    static let invalidUTF8: [([UInt8], Int)] = [
        ([0x22, 0xC3, 0x28, 0x22], 1),             // bad continuation
        ([0x22, 0xC0, 0x80, 0x22], 1),             // overlong NUL
        ([0x22, 0xE0, 0x80, 0xAF, 0x22], 1),       // overlong
        ([0x22, 0xED, 0xA0, 0x80, 0x22], 1),       // UTF-8 encoded surrogate
        ([0x22, 0x61, 0xF4, 0x90, 0x80, 0x80, 0x22], 2), // above U+10FFFF
        ([0x22, 0xF5, 0x80, 0x80, 0x80, 0x22], 1),
        ([0x22, 0x80, 0x22], 1),                   // lone continuation
        ([0x22, 0xE2, 0x82], 1),                   // truncated
        ([0xFF], 0),                               // outside a string: not a value
    ]

    @Test(arguments: invalidUTF8.indices)
    func rejectsInvalidUTF8(_ i: Int) {
        let (doc, offset) = Self.invalidUTF8[i]
        guard case .failure(let e) = scanJSON(doc) else { Issue.record("accepted \(doc)"); return }
        #expect(e.offset == offset)
    }

    @Test func depthLimit() {
        let ok = String(repeating: "[", count: 64) + String(repeating: "]", count: 64)
        #expect((try? scanJSON(ok).get()) != nil)
        let deep = String(repeating: "[", count: 65) + String(repeating: "]", count: 65)
        guard case .failure(let e) = scanJSON(deep) else { Issue.record("accepted depth 65"); return }
        #expect(e.offset == 64)
        #expect(e.reason == "nesting deeper than 64 levels")
        let objects = String(repeating: "{\"a\":", count: 65) + "1" + String(repeating: "}", count: 65)
        #expect(throws: JSONError.self) { try scanJSON(objects).get() }
        let huge = String(repeating: "[", count: 100_000)
        #expect(throws: JSONError.self) { try scanJSON(huge).get() }
    }

    @Test func membersWithRangesAndKinds() throws {
        let doc = Array(#" {"a" : 1.5, "b":[1,{"x":2}], "c\n":"s\u0041", "d":true,"e":false,"f":null,"g":{}} "#.utf8)
        var seen: [(String, JSONKind, String)] = []
        try doc.withUnsafeBytes { buf in
            try JSONScanner.forEachMember(in: buf) { k, v in
                seen.append((JSONScanner.decodeString(k, in: buf), v.kind,
                             String(decoding: v.slice(of: buf), as: UTF8.self)))
            }
        }
        #expect(seen.map(\.0) == ["a", "b", "c\n", "d", "e", "f", "g"])
        #expect(seen.map(\.1) == [.number, .array, .string, .true, .false, .null, .object])
        #expect(seen.map(\.2) == ["1.5", "[1,{\"x\":2}]", "\"s\\u0041\"", "true", "false", "null", "{}"])
    }

    @Test func notAnObject() {
        for doc in ["[1]", "\"s\"", " 3 "] {
            let bytes = Array(doc.utf8)
            let e: JSONError? = bytes.withUnsafeBytes { buf in
                do throws(JSONError) { try JSONScanner.forEachMember(in: buf) { _, _ in }; return nil } catch { return error }
            }
            #expect(e?.reason == "expected a JSON object", "\(doc)")
        }
        // Syntax errors win over "not an object".
        let bytes = Array("[1,]".utf8)
        let e: JSONError? = bytes.withUnsafeBytes { buf in
            do throws(JSONError) { try JSONScanner.forEachMember(in: buf) { _, _ in }; return nil } catch { return error }
        }
        #expect(e?.reason == "trailing comma")
    }

    @Test func keyComparisonAndDecoding() throws {
        let doc = Array(#"{"op":1,"\u006fp":2,"o":3,"opx":4,"caf\u00e9":"\ud83d\ude00\n\/"}"#.utf8)
        try doc.withUnsafeBytes { buf in
            var matches = 0
            var last: JSONValue?
            try JSONScanner.forEachMember(in: buf) { k, v in
                if k.stringEquals("op", in: buf) { matches += 1 }
                if k.stringEquals("café", in: buf) { last = v }
                #expect(!k.stringEquals("", in: buf))
            }
            #expect(matches == 2)
            let v = try #require(last)
            #expect(JSONScanner.decodeString(v, in: buf) == "😀\n/")
            #expect(JSONScanner.decodedStringLength(v, in: buf) == "😀\n/".utf8.count)
        }
    }

    @Test func unescapedStringsDecodeToTheirBytes() throws {
        // The no-escape path copies the bytes between the quotes into the string: every length around the inline
        // limit (15 bytes), ASCII and multi-byte, a string that is the whole document and one inside an object.
        var rng = SplitMix64(seed: 7)
        let alphabet = ["a", "Z", "0", " ", "é", "€", "😀", "\u{7F}", "~"]
        for length in 0..<40 {
            var s = ""
            while s.utf8.count < length { s += alphabet[Int(rng.next() % UInt64(alphabet.count))] }
            for doc in ["\"\(s)\"", "{\"k\":\"\(s)\"}"] {
                let bytes = Array(doc.utf8)
                let decoded: String? = bytes.withUnsafeBytes { buf in
                    guard let v = try? JSONScanner.validate(buf) else { return nil }
                    if v.kind == .string { return JSONScanner.decodeString(v, in: buf) }
                    var inner: String?
                    try? JSONScanner.forEachMember(in: buf) { _, value in inner = JSONScanner.decodeString(value, in: buf) }
                    return inner
                }
                #expect(decoded.map { Array($0.utf8) } == Array(s.utf8), "\(doc)")
            }
        }
    }

    @Test func integers() {
        let cases: [(String, Int64?)] = [
            ("0", 0), ("-0", 0), ("42", 42), ("-42", -42),
            ("9223372036854775807", Int64.max), ("-9223372036854775808", Int64.min),
            ("9223372036854775808", nil), ("-9223372036854775809", nil), ("99999999999999999999", nil),
            ("1.0", nil), ("1e3", nil), ("\"1\"", nil),
        ]
        for (doc, expected) in cases {
            let bytes = Array(doc.utf8)
            let got: Int64? = bytes.withUnsafeBytes { buf in
                guard let v = try? JSONScanner.validate(buf) else { return nil }
                return JSONScanner.int64(v, in: buf)
            }
            #expect(got == expected, "\(doc)")
        }
    }

    @Test func arrayElements() throws {
        let doc = Array(#"{"channels":[ "a" , "b\u0063", 3 ,[4]] }"#.utf8)
        try doc.withUnsafeBytes { buf in
            var arr: JSONValue?
            try JSONScanner.forEachMember(in: buf) { _, v in arr = v }
            var items: [String] = []
            try JSONScanner.forEachElement(of: arr!, in: buf) { items.append(String(decoding: $0.slice(of: buf), as: UTF8.self)) }
            #expect(items == ["\"a\"", "\"b\\u0063\"", "3", "[4]"])
        }
    }

    // MARK: Differential against Foundation

    /// Documents generated valid must be accepted by both; mutated documents are compared to
    /// JSONSerialization. Known, documented disagreements (Foundation is more lenient than RFC 8259 in these
    /// places) are excluded via `foundationIsLenient`.
    @Test func differentialAgainstFoundation() throws {
        var rng = SplitMix64(seed: 0x5EED)
        var disagreements: [String] = []
        for _ in 0..<1500 {
            var g = JSONGenerator(rng: rng)
            let doc = g.document()
            rng = g.rng
            let bytes = Array(doc.utf8)
            let ours = scanJSON(bytes)
            let theirs = foundationAccepts(bytes)
            #expect(theirs, "Foundation rejected generated \(doc)")
            if case .failure(let e) = ours { Issue.record("rejected generated \(doc): \(e)") }

            // Mutate: delete, duplicate or replace one byte with a structural one, or truncate.
            for _ in 0..<4 {
                var m = bytes
                let i = Int(rng.next() % UInt64(m.count))
                switch rng.next() % 4 {
                case 0: m.remove(at: i)
                case 1: m.insert(m[i], at: i)
                case 2:
                    let structural = Array("{}[],:\"\\0-.e ".utf8)
                    m[i] = structural[Int(rng.next() % UInt64(structural.count))]
                default: m = Array(m[..<i])
                }
                let ours = scanJSON(m)
                let a = (try? ours.get()) != nil
                let b = foundationAccepts(m)
                if a != b && !knownDivergence(m, ours: ours, foundation: b) {
                    disagreements.append(String(decoding: m, as: UTF8.self))
                }
            }
        }
        #expect(disagreements.isEmpty, "\(disagreements.prefix(10))")
    }

    func foundationAccepts(_ bytes: [UInt8]) -> Bool {
        (try? JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed])) != nil
    }

    /// The two documented places where Foundation and RFC 8259 (and so this scanner) differ on generated input:
    /// - JSONSerialization accepts a trailing comma in an array (`[1,]`); RFC 8259 does not, and neither do we.
    /// - JSONSerialization rejects a number whose value overflows a Double (`97e972`); RFC 8259's grammar
    ///   accepts it (section 6 lets implementations limit range), and so do we: we never convert `data`.
    func knownDivergence(_ bytes: [UInt8], ours: Result<JSONValue, JSONError>, foundation: Bool) -> Bool {
        if case .failure(let e) = ours, e.reason == "trailing comma", foundation { return true }
        if case .success = ours, !foundation, hasHugeExponent(bytes) { return true }
        return false
    }

    func hasHugeExponent(_ bytes: [UInt8]) -> Bool {
        var i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
                var j = i + 1
                if j < bytes.count && bytes[j] == UInt8(ascii: "+") { j += 1 }
                var digits = 0
                while j < bytes.count && bytes[j] >= 0x30 && bytes[j] <= 0x39 { digits += 1; j += 1 }
                if digits >= 3 { return true }
            }
            i += 1
        }
        return false
    }
}

struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E3779B97F4A7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) &* 0x94D049BB133111EB
        return z ^ (z >> 31)
    }
}

/// Random valid JSON text with random whitespace, escapes and non-ASCII.
struct JSONGenerator {
    var rng: SplitMix64

    mutating func r(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }

    mutating func ws() -> String { ["", "", "", " ", "\n", "\t ", "\r\n"][r(7)] }

    mutating func document() -> String { ws() + value(depth: 0) + ws() }

    mutating func value(depth: Int) -> String {
        switch r(depth > 4 ? 5 : 7) {
        case 0: return string()
        case 1: return number()
        case 2: return ["true", "false", "null"][r(3)]
        case 3: return string()
        case 4: return number()
        case 5:
            let n = r(5)
            return "[" + (0..<n).map { _ in ws() + value(depth: depth + 1) + ws() }.joined(separator: ",") + "]"
        default:
            let n = r(5)
            return "{" + (0..<n).map { _ in ws() + string() + ws() + ":" + ws() + value(depth: depth + 1) + ws() }
                .joined(separator: ",") + "}"
        }
    }

    mutating func number() -> String {
        var s = r(3) == 0 ? "-" : ""
        s += r(4) == 0 ? "0" : String(r(9) + 1) + String(repeating: "7", count: r(4))
        if r(3) == 0 { s += "." + String(r(1000)) }
        if r(4) == 0 { s += ["e", "E"][r(2)] + ["", "+", "-"][r(3)] + String(r(30)) }
        return s
    }

    mutating func string() -> String {
        var s = "\""
        for _ in 0..<r(8) {
            switch r(10) {
            case 0: s += ["\\n", "\\t", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\r"][r(8)]
            case 1: s += String(format: "\\u%04x", r(0xD7FF) + 1)
            case 2: s += "\\ud83d\\ude00"
            case 3: s += ["é", "😀", "中", "\u{7F}"][r(4)]
            default: s += String(UnicodeScalar(UInt8(0x61 + r(26))))
            }
        }
        return s + "\""
    }
}
