import Foundation
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubJSON

/// What the engine does around `LineFramer`: the bytes a scan leaves (an incomplete line) are kept and handed back
/// in front of the next chunk. Returns each line (nil for a too-long one) and how many bytes are kept after each
/// chunk.
func frameLines(_ chunks: [[UInt8]], max: Int) -> (lines: [[UInt8]?], kept: [Int]) {
    var framer = LineFramer(maxLineBytes: max)
    var held: [UInt8] = []
    var lines: [[UInt8]?] = []
    var kept: [Int] = []
    for chunk in chunks {
        held += chunk
        let consumed = held.withUnsafeBytes { buffer -> Int in
            var start = 0
            while true {
                switch framer.next(in: buffer, from: start) {
                case .line(let range, let next):
                    lines.append(Array(buffer[range]))
                    start = next
                case .tooLong(let next):
                    lines.append(nil)
                    start = next
                case .incomplete(let keep):
                    return keep
                }
            }
        }
        held.removeFirst(consumed)
        kept.append(held.count)
    }
    return (lines, kept)
}

struct ProtocolFramingTests {
    /// Feeds `chunks`, returning the lines (as strings) and "<tooLong>" markers.
    func frame(_ chunks: [String], max: Int) -> [String] {
        frameLines(chunks.map { Array($0.utf8) }, max: max).lines.map { $0.map { String(decoding: $0, as: UTF8.self) } ?? "<tooLong>" }
    }

    @Test func basicLines() {
        #expect(frame(["a\nbb\r\n\nccc\n"], max: 10) == ["a", "bb", "", "ccc"])
        // A last line without its newline is not a line (yet).
        #expect(frame(["a", "b", "c\n", "d"], max: 10) == ["abc"])
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
        // Spread over many reads: one tooLong, nothing kept past the limit, then the next line.
        let chunks = ["{\"op\":", String(repeating: "y", count: 50), String(repeating: "z", count: 50), "zz\n{\"a\"", ":1}\n"]
        let (lines, kept) = frameLines(chunks.map { Array($0.utf8) }, max: 10)
        #expect(lines.map { $0.map { String(decoding: $0, as: UTF8.self) } ?? "<tooLong>" } == ["<tooLong>", "{\"a\":1}"])
        #expect(kept.allSatisfy { $0 <= 11 }, "\(kept)")
        #expect(kept.last == 0)
    }

    @Test func linesAreFoundInPlaceAndTheCallerMayStopBetweenThem() {
        var framer = LineFramer(maxLineBytes: 100)
        let chunk = Array("abc\ndef\r\ngh".utf8)
        chunk.withUnsafeBytes { buf in
            #expect(framer.next(in: buf, from: 0) == .line(0..<3, next: 4))
            // Stopping here and starting again later at 4 (the engine kept the rest) gives the same next line.
            #expect(framer.next(in: buf, from: 4) == .line(4..<7, next: 9))
            #expect(framer.next(in: buf, from: 9) == .incomplete(keep: 9))
            #expect(framer.next(in: buf, from: chunk.count) == .incomplete(keep: chunk.count))
        }
        #expect(!framer.discarding)
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
