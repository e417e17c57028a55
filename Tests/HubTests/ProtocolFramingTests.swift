import Foundation
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

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

    /// An event framed as every broker frames it (`LocalBroker.frame`): the whole frame, and its payload as text.
    func encoded(_ type: String, _ channel: String, _ seq: UInt64, broadcast: Bool, data: String) -> (event: PublishedEvent, payload: String) {
        var writer = JSONWriter(capacity: 64)
        let event = Array(data.utf8).withUnsafeBytes { raw in
            LocalBroker.frame(EventDraft(channel: 0, account: broadcast ? nil : AccountID("acc"), type: type, data: raw),
                              channelName: channel, seq: seq, now: 1, wall: 2, writer: &writer)
        }
        let frame = event.frame.bytes
        let header = [126: 4, 127: 10][Int(frame[1] & 0x7F)] ?? 2  // the 7-bit length, or a 16- or 64-bit one after it
        return (event, String(decoding: frame[header...], as: UTF8.self))
    }

    @Test func eventShape() throws {
        let e = encoded("wallet_balance_changed", "wallet_updates", 17, broadcast: false, data: #"{"balance":"1.5"}"#)
        #expect(e.payload == #"{"type":"wallet_balance_changed","channel":"wallet_updates","seq":17,"data":{"balance":"1.5"}}"#)
        #expect(Array(e.event.frame.bytes[..<2]) == [0x81, UInt8(e.payload.utf8.count)], "FIN, text, unmasked, its length")
        #expect(String(decoding: e.event.data, as: UTF8.self) == #"{"balance":"1.5"}"#)
        let b = encoded("maintenance", "profile_updates", 3, broadcast: true, data: "{}")
        #expect(b.payload == #"{"type":"maintenance","channel":"profile_updates","seq":3,"broadcast":true,"data":{}}"#)
        let q = encoded("we\"ird\n", "c", UInt64.max, broadcast: false, data: "1")
        #expect(q.payload == #"{"type":"we\"ird\n","channel":"c","seq":18446744073709551615,"data":1}"#)
        #expect((try? JSONSerialization.jsonObject(with: Data(q.payload.utf8))) != nil)
        // Past 125 and 65 535 bytes of payload: the 16- and 64-bit lengths.
        for size in [200, 70_000] {
            let big = encoded("t", "c", 1, broadcast: true, data: "\"" + String(repeating: "x", count: size) + "\"")
            #expect(big.payload.hasSuffix("x\"}") && big.payload.hasPrefix(#"{"type":"t""#))
            #expect(big.event.frame.bytes[1] == (size < 65_536 ? 126 : 127))
        }
    }

    @Test(arguments: [
        "  {\"a\" :\t[1 , 2]\r\n}  ", "\"\\u00e9\\ud83d\\ude00 \\\" raw é😀\"", "-1.0e+300", "[]", "null", "true",
        "{\"nested\":{\"deep\":[[[\"\\/\"]]]}}",
    ])
    func dataIsByteForByte(_ data: String) {
        let e = encoded("t", "ch", 9, broadcast: true, data: data)
        let prefix = #"{"type":"t","channel":"ch","seq":9,"broadcast":true,"data":"#
        #expect(e.payload == prefix + data + "}")
        #expect(String(decoding: e.event.data, as: UTF8.self) == data)
        // The size the publish intake checks against the frame limit before numbering is the frame's exact size.
        #expect(e.event.frame.count == EventEncoding.framedSize(payloadCount: EventEncoding.payloadSize(
            type: "t", channel: "ch", seq: 9, broadcast: true, dataCount: data.utf8.count)))
    }

    @Test func fromAPublishLine() throws {
        let line = Array(#"{"op":"publish","channel":"c","account":"a","type":"t","data": { "x" : "\u0041" } }"#.utf8)
        var writer = JSONWriter(capacity: 64)
        let event = try line.withUnsafeBytes { buf in
            guard case .publish(let p) = try SocketRequest.parse(line: buf).request else { throw CancellationError() }
            return LocalBroker.frame(EventDraft(channel: 0, account: AccountID("a"), type: p.type, data: p.dataBytes(in: buf)),
                                     channelName: p.channel, seq: 1, now: 1, wall: 2, writer: &writer)
        }
        #expect(String(decoding: event.frame.bytes[2...], as: UTF8.self)
                == #"{"type":"t","channel":"c","seq":1,"data":{ "x" : "\u0041" }}"#)
        #expect(EventEncoding.framedSize(payloadCount: 125) == 127)
        #expect(EventEncoding.framedSize(payloadCount: 126) == 130)
        #expect(EventEncoding.framedSize(payloadCount: 65535) == 65539)
        #expect(EventEncoding.framedSize(payloadCount: 65536) == 65546)
    }
}
