import Foundation
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

struct JSONWriterTests {
    func text(_ w: JSONWriter) -> String { String(decoding: w.bytes, as: UTF8.self) }

    static let escapes: [(String, String)] = [
        ("", #""""#),
        ("plain", #""plain""#),
        ("q\"b\\s/", #""q\"b\\s/""#),
        ("\u{08}\u{0C}\n\r\t", #""\b\f\n\r\t""#),
        ("\u{00}\u{01}\u{1F}", #""\u0000\u0001\u001f""#),
        ("\u{7F}é😀中", "\"\u{7F}é😀中\""),
        ("a\u{0B}b", #""a\u000bb""#),
    ]

    @Test(arguments: escapes.indices)
    func escaping(_ i: Int) throws {
        let (input, expected) = Self.escapes[i]
        var w = JSONWriter()
        w.string(input)
        #expect(text(w) == expected)
        // Round trip through Foundation.
        let back = try JSONSerialization.jsonObject(with: Data(w.bytes), options: [.fragmentsAllowed]) as? String
        #expect(back == input)
        // And through our scanner.
        let decoded = w.bytes.withUnsafeBytes { buf in
            (try? JSONScanner.validate(buf)).map { JSONScanner.decodeString($0, in: buf) }
        }
        #expect(decoded == input)
    }

    /// The SWAR escaping path against a byte-by-byte reference, on random strings mixing every class of byte
    /// at every alignment.
    @Test func escapingMatchesReference() throws {
        var rng = SplitMix64(seed: 42)
        let alphabet: [String] = ["a", "\"", "\\", "\n", "\u{01}", "\u{1F}", " ", "é", "😀", "\u{7F}", "~", "\t"]
        for _ in 0..<3000 {
            var s = ""
            for _ in 0..<Int(rng.next() % 40) { s += alphabet[Int(rng.next() % UInt64(alphabet.count))] }
            var reference = "\""
            for u in s.unicodeScalars {
                switch u {
                case "\"": reference += "\\\""
                case "\\": reference += "\\\\"
                case "\n": reference += "\\n"
                case "\t": reference += "\\t"
                case "\u{01}": reference += "\\u0001"
                case "\u{1F}": reference += "\\u001f"
                default: reference.unicodeScalars.append(u)
                }
            }
            reference += "\""
            var w = JSONWriter(capacity: 1)
            w.string(s)
            #expect(text(w) == reference)
            #expect(JSONWriter.escapedLength(s) == reference.utf8.count - 2)
        }
    }

    @Test func integers() {
        let cases: [(Int64, String)] = [
            (0, "0"), (7, "7"), (10, "10"), (99, "99"), (100, "100"), (-1, "-1"), (1234567, "1234567"),
            (Int64.max, "9223372036854775807"), (Int64.min, "-9223372036854775808"),
        ]
        for (v, s) in cases {
            var w = JSONWriter()
            w.int(v)
            #expect(text(w) == s)
        }
        var w = JSONWriter()
        w.uint(UInt64.max)
        #expect(text(w) == "18446744073709551615")
        for _ in 0..<2000 {
            let v = Int64.random(in: Int64.min...Int64.max) >> Int64.random(in: 0...63)
            var w = JSONWriter()
            w.int(v)
            #expect(text(w) == String(v))
        }
    }

    @Test func doubles() throws {
        let cases: [(Double, String)] = [
            (0, "0.0"), (12.5, "12.5"), (1700000000.5, "1700000000.5"), (-3, "-3.0"), (0.03, "0.03"),
            (.infinity, "null"), (.nan, "null"), (1e300, "1e+300"),
        ]
        for (v, s) in cases {
            var w = JSONWriter()
            w.double(v)
            #expect(text(w) == s)
            #expect((try? scanJSON(w.bytes).get()) != nil)
        }
    }

    @Test func structureAndCommas() throws {
        var w = JSONWriter()
        w.beginObject()
        w.field("a", 1)
        w.key("b")
        w.beginArray()
        w.int(1)
        w.beginObject()
        w.endObject()
        w.beginArray()
        w.endArray()
        w.string("x")
        w.null()
        w.bool(true)
        w.endArray()
        w.key("we\"ird")
        w.raw(Array(" {\"z\" : [ 1 ] } ".utf8))
        w.field("d", 0.5)
        w.endObject()
        #expect(text(w) == #"{"a":1,"b":[1,{},[],"x",null,true],"we\"ird": {"z" : [ 1 ] } ,"d":0.5}"#)
        let obj = try #require(try JSONSerialization.jsonObject(with: Data(w.bytes)) as? [String: Any])
        #expect(obj.count == 4)

        // Reuse keeps capacity and starts clean.
        let cap = w.capacity
        w.reset()
        w.beginArray()
        w.endArray()
        #expect(text(w) == "[]")
        #expect(w.capacity == cap)
    }

    /// Each value and key is written as one token with its comma (one capacity check): after a comma and without
    /// one, and with the storage growing at every point of the output.
    @Test func tokensAfterCommasAtEveryCapacity() {
        let expected = #"[7,-7,18446744073709551615,"static","plain",null,true,false,"esc\"aped",{"k":0,"key2":"v"},0,"s"]"#
        for capacity in 16...(expected.utf8.count + 1) {
            var w = JSONWriter(capacity: capacity)
            w.beginArray()
            w.int(7)
            w.int(-7)
            w.uint(UInt64.max)
            w.string("static" as StaticString)
            w.string("plain" as String)
            w.null()
            w.bool(true)
            w.bool(false)
            w.string("esc\"aped" as String)
            w.beginObject()
            w.field("k", 0)
            w.key("key2" as StaticString)
            w.string("v" as StaticString)
            w.endObject()
            w.uint(0)
            w.string("s" as String)
            w.endArray()
            #expect(text(w) == expected, "capacity \(capacity)")
        }
    }

    @Test func newlineResetsCommaState() {
        var w = JSONWriter()
        w.beginObject(); w.field("ok", true); w.endObject(); w.newline()
        w.beginObject(); w.field("ok", false); w.endObject(); w.newline()
        #expect(text(w) == "{\"ok\":true}\n{\"ok\":false}\n")
    }
}
