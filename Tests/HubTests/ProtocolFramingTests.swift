import Foundation
import Testing
@testable import Hub

struct ProtocolFramingTests {
    /// Feeds `chunks`, returning the lines (as strings) and "<tooLong>" markers, and whether each line was
    /// handed out as a view into the chunk (zero-copy).
    func frame(_ chunks: [String], max: Int, finish: Bool = false) -> [String] {
        var framer = LineFramer(maxLineBytes: max)
        var out: [String] = []
        let handle: (LineFramer.Line) -> Void = { line in
            switch line {
            case .line(let b): out.append(String(decoding: b, as: UTF8.self))
            case .tooLong: out.append("<tooLong>")
            }
        }
        for c in chunks { Array(c.utf8).withUnsafeBytes { framer.feed($0, handle) } }
        if finish { framer.finish(handle) }
        return out
    }

    @Test func basicLines() {
        #expect(frame(["a\nbb\r\n\nccc\n"], max: 10) == ["a", "bb", "", "ccc"])
        #expect(frame(["a", "b", "c\n", "d"], max: 10) == ["abc"])
        #expect(frame(["a", "b", "c\n", "d"], max: 10, finish: true) == ["abc", "d"])
        #expect(frame(["x\r", "\ny\n"], max: 10) == ["x", "y"])
        // Only a trailing \r is stripped.
        #expect(frame(["a\rb\n"], max: 10) == ["a\rb"])
    }

    @Test func limitIsOnTheLineWithoutItsTerminator() {
        #expect(frame(["12345\n"], max: 5) == ["12345"])
        #expect(frame(["12345\r\n"], max: 5) == ["12345"])
        #expect(frame(["123456\n"], max: 5) == ["<tooLong>"])
        #expect(frame(["123", "45\r", "\n"], max: 5) == ["12345"])
        #expect(frame(["123", "456", "\n"], max: 5) == ["<tooLong>"])
        #expect(frame(["12345\r", "x\n"], max: 5) == ["<tooLong>"])
    }

    @Test func overLongLineThenRecovery() {
        let long = String(repeating: "x", count: 100)
        // Entirely in one read.
        #expect(frame([long + "\nok\n"], max: 10) == ["<tooLong>", "ok"])
        // Spread over many reads: one tooLong, nothing buffered past the limit, then the next line.
        var framer = LineFramer(maxLineBytes: 10)
        var out: [String] = []
        for chunk in ["{\"op\":", String(repeating: "y", count: 50), String(repeating: "z", count: 50), "zz\n{\"a\"", ":1}\n"] {
            Array(chunk.utf8).withUnsafeBytes { buf in
                framer.feed(buf) { line in
                    if case .line(let b) = line { out.append(String(decoding: b, as: UTF8.self)) } else { out.append("<tooLong>") }
                }
            }
            #expect(framer.pending.count <= 11)
        }
        #expect(out == ["<tooLong>", "{\"a\":1}"])
        #expect(!framer.hasPartialLine)
    }

    @Test func zeroCopyWhenInsideOneRead() {
        var framer = LineFramer(maxLineBytes: 100)
        let chunk = Array("abc\ndef\ngh".utf8)
        var starts: [Int] = []
        chunk.withUnsafeBytes { buf in
            framer.feed(buf) { line in
                if case .line(let b) = line { starts.append(b.baseAddress! - buf.baseAddress!) }
            }
        }
        #expect(starts == [0, 4])
        #expect(framer.pending == Array("gh".utf8))
    }

    @Test func everySplitOfMixedStream() {
        let stream = "first\r\n" + String(repeating: "L", count: 40) + "\n\nlast\n"
        let expected = ["first", "<tooLong>", "", "last"]
        let bytes = Array(stream.utf8)
        for i in 0...bytes.count {
            for j in i...bytes.count {
                let parts = [bytes[..<i], bytes[i..<j], bytes[j...]].map { String(decoding: $0, as: UTF8.self) }
                #expect(frame(parts, max: 16) == expected, "\(i) \(j)")
            }
        }
    }

    // MARK: Event encoding

    func encoded(_ type: String, _ channel: String, _ seq: UInt64, broadcast: Bool, data: String?,
                 headroom: Int = EventEncoding.defaultHeadroom) -> (all: [UInt8], payload: String) {
        let (buffer, start) = data.map {
            EventEncoding.encode(type: type, channel: channel, seq: seq, broadcast: broadcast, data: Array($0.utf8),
                                 headroom: headroom)
        } ?? EventEncoding.encode(type: type, channel: channel, seq: seq, broadcast: broadcast, data: nil,
                                  headroom: headroom)
        return (buffer, String(decoding: buffer[start...], as: UTF8.self))
    }

    @Test func eventShape() throws {
        let e = encoded("wallet_balance_changed", "wallet_updates", 17, broadcast: false, data: #"{"balance":"1.5"}"#)
        #expect(e.payload == #"{"type":"wallet_balance_changed","channel":"wallet_updates","seq":17,"data":{"balance":"1.5"}}"#)
        #expect(Array(e.all[..<10]) == Array(repeating: 0, count: 10))
        let b = encoded("maintenance", "profile_updates", 3, broadcast: true, data: "{}")
        #expect(b.payload == #"{"type":"maintenance","channel":"profile_updates","seq":3,"broadcast":true,"data":{}}"#)
        let n = encoded("t", "c", 1, broadcast: false, data: nil, headroom: 0)
        #expect(n.payload == #"{"type":"t","channel":"c","seq":1,"data":null}"#)
        #expect(n.all.count == n.payload.utf8.count)
        let q = encoded("we\"ird\n", "c", UInt64.max, broadcast: false, data: "1", headroom: 4)
        #expect(q.payload == #"{"type":"we\"ird\n","channel":"c","seq":18446744073709551615,"data":1}"#)
        #expect(q.all.count == 4 + q.payload.utf8.count)
        #expect((try? JSONSerialization.jsonObject(with: Data(q.payload.utf8))) != nil)
    }

    @Test(arguments: [
        "  {\"a\" :\t[1 , 2]\r\n}  ", "\"\\u00e9\\ud83d\\ude00 \\\" raw é😀\"", "-1.0e+300", "[]", "null", "true",
        "{\"nested\":{\"deep\":[[[\"\\/\"]]]}}",
    ])
    func dataIsByteForByte(_ data: String) {
        let e = encoded("t", "ch", 9, broadcast: true, data: data)
        let prefix = #"{"type":"t","channel":"ch","seq":9,"broadcast":true,"data":"#
        #expect(e.payload == prefix + data + "}")
        // Exactly sized: one allocation, no slack.
        #expect(e.all.count == 10 + EventEncoding.payloadSize(type: "t", channel: "ch", seq: 9, broadcast: true,
                                                              dataCount: data.utf8.count))
    }

    @Test func fromAPublishLine() throws {
        let line = Array(#"{"op":"publish","channel":"c","account":"a","type":"t","data": { "x" : "\u0041" } }"#.utf8)
        let (buffer, start) = try line.withUnsafeBytes { buf in
            guard case .publish(let p) = try SocketRequest.parse(line: buf).request else { throw CancellationError() }
            return EventEncoding.encode(type: p.type, channel: p.channel, seq: 1, broadcast: p.target == .broadcast,
                                        data: p.dataBytes(in: buf))
        }
        #expect(String(decoding: buffer[start...], as: UTF8.self)
                == #"{"type":"t","channel":"c","seq":1,"data":{ "x" : "\u0041" }}"#)
        #expect(EventEncoding.framedSize(payloadCount: 125) == 127)
        #expect(EventEncoding.framedSize(payloadCount: 126) == 130)
        #expect(EventEncoding.framedSize(payloadCount: 65535) == 65539)
        #expect(EventEncoding.framedSize(payloadCount: 65536) == 65546)
    }
}
