import Foundation
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubJSON
@testable import HubRouting

func parseSocket(_ text: String) -> Result<ParsedSocketRequest, SocketRequestError> {
    do throws(SocketRequestError) { return .success(try SocketRequest.parse(line: Array(text.utf8))) } catch {
        return .failure(error)
    }
}

struct ProtocolSocketTests {
    @Test func publishToAccount() throws {
        let line = #"{"op":"publish","channel":"wallet_updates","account":"acc_123","type":"wallet_balance_changed","data":{"balance":"1.5"}}"#
        let bytes = Array(line.utf8)
        let parsed = try parseSocket(line).get()
        #expect(parsed.id == nil)
        guard case .publish(let p) = parsed.request else { Issue.record("not a publish"); return }
        #expect(p.channel == "wallet_updates")
        #expect(p.target == .account("acc_123"))
        #expect(p.type == "wallet_balance_changed")
        let data = bytes.withUnsafeBytes { Array(p.dataBytes(in: $0)) }
        #expect(String(decoding: data, as: UTF8.self) == #"{"balance":"1.5"}"#)
    }

    @Test func publishBroadcastAndDefaults() throws {
        let parsed = try parseSocket(#"{"id":"p1","op":"publish","channel":"c","broadcast":true,"type":"maintenance"}"#).get()
        #expect(parsed.id == RawJSON("\"p1\""))
        guard case .publish(let p) = parsed.request else { Issue.record("not a publish"); return }
        #expect(p.target == .broadcast)
        #expect(p.data == nil)
        #expect(String(decoding: Array(p.dataBytes(in: UnsafeRawBufferPointer(start: nil, count: 0))), as: UTF8.self) == "null")
        // Explicit null data is null; broadcast:false with an account is a publish to the account.
        let q = try parseSocket(#"{"op":"publish","channel":"c","account":"a","broadcast":false,"type":"t","data":null,"extra":[1]}"#).get()
        guard case .publish(let p2) = q.request else { Issue.record("not a publish"); return }
        #expect(p2.target == .account("a"))
        #expect(p2.data == nil)
    }

    @Test func idempotencyKeyAndHistory() throws {
        guard case .publish(let p) = try parseSocket(#"{"op":"publish","channel":"c","account":"a","type":"t","idempotencyKey":"k-\u00e9"}"#).get().request
        else { Issue.record("not a publish"); return }
        #expect(p.idempotencyKey == "k-é")
        guard case .publish(let q) = try parseSocket(#"{"op":"publish","channel":"c","account":"a","type":"t","idempotencyKey":null}"#).get().request
        else { Issue.record("not a publish"); return }
        #expect(q.idempotencyKey == nil)
        for bad in ["\"\"", "7", "\"" + String(repeating: "k", count: 129) + "\""] {
            guard case .failure(let e) = parseSocket(#"{"op":"publish","channel":"c","account":"a","type":"t","idempotencyKey":"# + bad + "}") else {
                Issue.record("accepted \(bad)"); continue
            }
            #expect(e.code == .invalidRequest && e.message.contains("idempotencyKey"))
        }
        #expect(try parseSocket(#"{"op":"history","channel":"c","account":"a","since":4}"#).get().request
                == .history(channel: "c", account: "a", since: 4))
        #expect(try parseSocket(#"{"op":"history","channel":"c","broadcast":true}"#).get().request
                == .history(channel: "c", account: nil, since: 0))
        for bad in [#"{"op":"history","channel":"c"}"#, #"{"op":"history","channel":"c","account":"a","broadcast":true}"#,
                    #"{"op":"history","channel":"c","account":"a","since":-1}"#, #"{"op":"history","account":"a"}"#] {
            guard case .failure(let e) = parseSocket(bad) else { Issue.record("accepted \(bad)"); continue }
            #expect(e.code == .invalidRequest, "\(bad)")
        }
    }

    @Test func duplicateReply() {
        var w = JSONWriter()
        SocketReplies.published(seq: 3, delivered: 2, duplicate: true, id: RawJSON("9"), into: &w)
        #expect(String(decoding: w.bytes, as: UTF8.self) == #"{"ok":true,"seq":3,"delivered":2,"duplicate":true,"id":9}"# + "\n")
    }

    @Test func dataPassesThroughExactly() throws {
        let data = "[ 1 ,\n\t{\"k\" : \"\\u00e9\\ud83d\\ude00\" } , -0.0E+5 ]"
        let line = #"{"op":"publish","channel":"c","account":"a","type":"t","data": "# + data + " }"
        let bytes = Array(line.utf8)
        guard case .publish(let p) = try parseSocket(line).get().request else { Issue.record("not a publish"); return }
        #expect(bytes.withUnsafeBytes { Array(p.dataBytes(in: $0)) } == Array(data.utf8))
    }

    @Test func adminOps() throws {
        #expect(try parseSocket(#"{"op":"stats"}"#).get().request == .stats)
        #expect(try parseSocket(#"{"op":"stats","id":3}"#).get().id == RawJSON("3"))
        #expect(try parseSocket(#"{"op":"channels"}"#).get().request == .channels)
        #expect(try parseSocket(#"{"op":"channel","channel":"w"}"#).get().request == .channel(name: "w", account: nil))
        #expect(try parseSocket(#"{"op":"channel","channel":"w","account":"acc_1"}"#).get().request
                == .channel(name: "w", account: "acc_1"))
        #expect(try parseSocket(#"{"op":"connections"}"#).get().request
                == .connections(account: nil, channel: nil, limit: 100))
        #expect(try parseSocket(#"{"op":"connections","account":"acc_1","channel":"w","limit":5}"#).get().request
                == .connections(account: "acc_1", channel: "w", limit: 5))
        #expect(try parseSocket(#"{"op":"connections","account":null,"limit":0}"#).get().request
                == .connections(account: nil, channel: nil, limit: 0))
        #expect(try parseSocket(#"{"op":"disconnect","conn":"0-17","code":4000,"reason":"bye"}"#).get().request
                == .disconnect(target: .connection("0-17"), code: 4000, reason: "bye", node: nil))
        #expect(try parseSocket(#"{"op":"disconnect","account":"acc_1"}"#).get().request
                == .disconnect(target: .account("acc_1"), code: 1000, reason: "disconnected by operator", node: nil))
        #expect(try parseSocket(#"{"op":"disconnect","account":"a","code":3000,"reason":""}"#).get().request
                == .disconnect(target: .account("a"), code: 3000, reason: "", node: nil))
        // Cluster mode: the node whose connection (or account's connections) to close.
        #expect(try parseSocket(#"{"op":"disconnect","conn":"0-17","node":"n1"}"#).get().request
                == .disconnect(target: .connection("0-17"), code: 1000, reason: "disconnected by operator", node: "n1"))
        #expect(try parseSocket(#"{"op":"disconnect","account":"a","\u006eode":"n2","node":null}"#).get().request
                == .disconnect(target: .account("a"), code: 1000, reason: "disconnected by operator", node: nil))
        let reason123 = String(repeating: "r", count: 123)
        #expect(try parseSocket(#"{"op":"disconnect","conn":"1-1","code":4999,"reason":"\#(reason123)"}"#).get().request
                == .disconnect(target: .connection("1-1"), code: 4999, reason: reason123, node: nil))
        #expect(try parseSocket(#"{"op":"tail","channel":"w"}"#).get().request == .tail(channel: "w", account: nil))
        #expect(try parseSocket(#"{"op":"tail","channel":"w","account":"acc_1","id":"t"}"#).get()
                == ParsedSocketRequest(request: .tail(channel: "w", account: "acc_1"), id: RawJSON("\"t\"")))
        // Keys written with escapes are the same keys.
        #expect(try parseSocket(#"{"\u006fp":"channel","ch\u0061nnel":"w"}"#).get().request == .channel(name: "w", account: nil))
    }

    /// (line, code, message, id)
    static let errors: [(String, SocketErrorCode, String, String?)] = [
        ("", .invalidJSON, "invalid JSON at byte 0: unexpected end of input", nil),
        (#"{"op":"stats""#, .invalidJSON, "invalid JSON at byte 13: unexpected end of input", nil),
        (#"{"op" "stats"}"#, .invalidJSON, "invalid JSON at byte 6: expected ':'", nil),
        (#"{"op":"stats"}x"#, .invalidJSON, "invalid JSON at byte 14: unexpected data after the top-level value", nil),
        (#"  [1]"#, .invalidJSON, "request must be a JSON object (at byte 2)", nil),
        (#"{"op":"stats","id":[1]}"#, .invalidRequest, "\"id\" must be a string or a number", nil),
        (#"{"op":"stats","id":null}"#, .invalidRequest, "\"id\" must be a string or a number", nil),
        (#"{"id":1}"#, .unknownOp, "missing \"op\"", "1"),
        (#"{"op":7,"id":1}"#, .unknownOp, "\"op\" must be a string", "1"),
        (#"{"op":"reboot","id":"r"}"#, .unknownOp, "unknown op \"reboot\"", "\"r\""),
        (#"{"op":"publish","account":"a","type":"t","id":1}"#, .invalidRequest, "missing \"channel\"", "1"),
        (#"{"op":"publish","channel":5,"account":"a","type":"t"}"#, .invalidRequest, "\"channel\" must be a string", nil),
        (#"{"op":"publish","channel":"c","account":"a"}"#, .invalidRequest, "missing \"type\"", nil),
        (#"{"op":"publish","channel":"c","account":"a","type":1}"#, .invalidRequest, "\"type\" must be a string", nil),
        (#"{"op":"publish","channel":"c","account":"a","type":""}"#, .invalidRequest,
         "\"type\" must be a non-empty string of at most 128 bytes", nil),
        (#"{"op":"publish","channel":"c","type":"t"}"#, .invalidRequest,
         "exactly one of \"account\" or \"broadcast\":true is required", nil),
        (#"{"op":"publish","channel":"c","type":"t","broadcast":false}"#, .invalidRequest,
         "exactly one of \"account\" or \"broadcast\":true is required", nil),
        (#"{"op":"publish","channel":"c","type":"t","account":"a","broadcast":true}"#, .invalidRequest,
         "exactly one of \"account\" or \"broadcast\":true is required", nil),
        (#"{"op":"publish","channel":"c","type":"t","account":""}"#, .invalidRequest,
         "\"account\" must be a non-empty string", nil),
        (#"{"op":"publish","channel":"c","type":"t","account":1}"#, .invalidRequest, "\"account\" must be a string", nil),
        (#"{"op":"publish","channel":"c","type":"t","broadcast":"yes"}"#, .invalidRequest,
         "\"broadcast\" must be a boolean", nil),
        (#"{"op":"publish","channel":"c","type":"pong","account":"a","id":"x"}"#, .reservedType,
         "event type \"pong\" is reserved by the client protocol", "\"x\""),
        (#"{"op":"publish","channel":"c","type":"token_expiring","broadcast":true}"#, .reservedType,
         "event type \"token_expiring\" is reserved by the client protocol", nil),
        (#"{"op":"publish","channel":"c","type":"\u0065rror","broadcast":true}"#, .reservedType,
         "event type \"error\" is reserved by the client protocol", nil),
        (#"{"op":"channel"}"#, .invalidRequest, "missing \"channel\"", nil),
        (#"{"op":"channel","channel":"c","account":false}"#, .invalidRequest, "\"account\" must be a string", nil),
        (#"{"op":"connections","limit":-1}"#, .invalidRequest, "\"limit\" must be a non-negative integer", nil),
        (#"{"op":"connections","limit":1.5}"#, .invalidRequest, "\"limit\" must be a non-negative integer", nil),
        (#"{"op":"connections","limit":"5"}"#, .invalidRequest, "\"limit\" must be a non-negative integer", nil),
        (#"{"op":"connections","channel":[]}"#, .invalidRequest, "\"channel\" must be a string", nil),
        (#"{"op":"disconnect"}"#, .invalidRequest, "exactly one of \"conn\" or \"account\" is required", nil),
        (#"{"op":"disconnect","conn":"1-1","account":"a"}"#, .invalidRequest,
         "exactly one of \"conn\" or \"account\" is required", nil),
        (#"{"op":"disconnect","conn":""}"#, .invalidRequest, "\"conn\" must be a non-empty string", nil),
        (#"{"op":"disconnect","conn":"1-1","code":1001}"#, .invalidRequest, "\"code\" must be 1000 or 3000-4999", nil),
        (#"{"op":"disconnect","conn":"1-1","code":2999}"#, .invalidRequest, "\"code\" must be 1000 or 3000-4999", nil),
        (#"{"op":"disconnect","conn":"1-1","code":5000}"#, .invalidRequest, "\"code\" must be 1000 or 3000-4999", nil),
        (#"{"op":"disconnect","conn":"1-1","code":"4000"}"#, .invalidRequest, "\"code\" must be 1000 or 3000-4999", nil),
        (#"{"op":"disconnect","conn":"1-1","reason":7}"#, .invalidRequest, "\"reason\" must be a string", nil),
        (#"{"op":"disconnect","conn":"1-1","node":""}"#, .invalidRequest, "\"node\" must be a non-empty string", nil),
        (#"{"op":"disconnect","account":"a","node":3}"#, .invalidRequest, "\"node\" must be a string", nil),
        (#"{"op":"disconnect","conn":"1-1","reason":"\#(String(repeating: "é", count: 62))"}"#, .invalidRequest,
         "\"reason\" must be at most 123 bytes", nil),
        (#"{"op":"tail"}"#, .invalidRequest, "missing \"channel\"", nil),
    ]

    @Test(arguments: errors.indices)
    func requestErrors(_ i: Int) {
        let (line, code, message, id) = Self.errors[i]
        guard case .failure(let e) = parseSocket(line) else { Issue.record("accepted \(line)"); return }
        #expect(e.code == code, "\(line)")
        #expect(e.message == message, "\(line)")
        #expect(e.id == id.map(RawJSON.init), "\(line)")
    }

    @Test func packedKeyConstants() throws {
        let keys: [(Fields.Key, StaticString)] = [
            (.op, "op"), (.id, "id"), (.type, "type"), (.data, "data"), (.conn, "conn"), (.code, "code"),
            (.limit, "limit"), (.reason, "reason"), (.channel, "channel"), (.account, "account"), (.since, "since"),
            (.node, "node"),
        ]
        for (k, s) in keys { #expect(k.rawValue == JSONValue.pack(s), "\(s)") }
        let ops: [(Op, StaticString)] = [
            (.publish, "publish"), (.stats, "stats"), (.channels, "channels"), (.channel, "channel"), (.tail, "tail"),
        ]
        for (o, s) in ops { #expect(o.rawValue == JSONValue.pack(s), "\(s)") }
        // Escaped op names dispatch like plain ones; near misses do not.
        #expect(try parseSocket(#"{"op":"\u0073tats"}"#).get().request == .stats)
        #expect(try parseSocket(#"{"op":"t\u0061il","channel":"c"}"#).get().request == .tail(channel: "c", account: nil))
        #expect((try? parseSocket(#"{"op":"stat"}"#).get()) == nil)
        #expect((try? parseSocket(#"{"op":"statss"}"#).get()) == nil)
        #expect((try? parseSocket(#"{"op":"publish\u0000"}"#).get()) == nil)
        if case .failure(let e) = parseSocket(#"{"op":"stats\u0000"}"#) { #expect(e.code == .unknownOp) }
        else { Issue.record("stats\\u0000 accepted as stats") }
        // Keys at the very end of the buffer (packed read near the end).
        #expect(try parseSocket(#"{"op":"stats","x":1,"id":2}"#).get().id == RawJSON("2"))
    }

    @Test func typeLengthLimit() throws {
        let ok = String(repeating: "t", count: 128)
        #expect((try? parseSocket(#"{"op":"publish","channel":"c","account":"a","type":"\#(ok)"}"#).get()) != nil)
        guard case .failure(let e) = parseSocket(#"{"op":"publish","channel":"c","account":"a","type":"\#(ok)x"}"#) else {
            Issue.record("accepted a 129-byte type"); return
        }
        #expect(e.code == .invalidRequest)
    }

    @Test func callerValidation() throws {
        let p = PublishRequest(channel: "nope", target: .account("a"), type: "t", data: 0..<100)
        let configured = ["wallet_updates"]
        #expect(throws: SocketRequestError(.unknownChannel, "channel \"nope\" is not configured", id: RawJSON("1"))) {
            try p.validate(channels: configured, maxEventBytes: 1000, id: RawJSON("1"))
        }
        // Names match by bytes: KELVIN SIGN + "x" is canonically equivalent to "Kx", and not configured.
        let kelvin = PublishRequest(channel: "\u{212A}x", target: .account("a"), type: "t", data: 0..<10)
        #expect("\u{212A}x" == "Kx")  // what String == says, and why it is not used
        #expect(throws: SocketRequestError(.unknownChannel, "channel \"\u{212A}x\" is not configured", id: nil)) {
            try kelvin.validate(channels: ["Kx"], maxEventBytes: 1000, id: nil)
        }
        // Size: payload = 39 + 1 ("t") + 14 + 20 (max seq digits) + data; header 2 below 126 bytes, 4 above.
        var q = PublishRequest(channel: "wallet_updates", target: .account("a"), type: "t", data: 0..<50)
        try q.validate(channels: configured, maxEventBytes: 39 + 1 + 14 + 20 + 50 + 2, id: nil)
        #expect(throws: SocketRequestError.self) {
            try q.validate(channels: configured, maxEventBytes: 39 + 1 + 14 + 20 + 50 + 1, id: nil)
        }
        q.data = 0..<1000
        try q.validate(channels: configured, maxEventBytes: 39 + 1 + 14 + 20 + 1000 + 4, id: nil)
        do {
            try q.validate(channels: configured, maxEventBytes: 1000, id: nil)
            Issue.record("accepted too large")
        } catch {
            #expect(error.code == .eventTooLarge)
            #expect(error.message == "event of 1078 bytes exceeds the limit of 1000 bytes")
        }
        // Broadcast adds ,"broadcast":true (17 bytes).
        q.target = .broadcast
        #expect(throws: SocketRequestError.self) {
            try q.validate(channels: configured, maxEventBytes: 39 + 1 + 14 + 20 + 1000 + 4, id: nil)
        }
    }

    // MARK: Replies

    func reply(_ body: (inout JSONWriter) -> Void) -> String {
        var w = JSONWriter()
        body(&w)
        let s = String(decoding: w.bytes, as: UTF8.self)
        #expect(s.hasSuffix("\n"))
        #expect((try? JSONSerialization.jsonObject(with: Data(w.bytes.dropLast()))) != nil)
        return s
    }

    @Test func replies() {
        #expect(reply { SocketReplies.published(seq: 17, delivered: 2, id: nil, into: &$0) }
                == "{\"ok\":true,\"seq\":17,\"delivered\":2}\n")
        #expect(reply { SocketReplies.published(seq: 1, delivered: 0, id: RawJSON("\"p1\""), into: &$0) }
                == "{\"ok\":true,\"seq\":1,\"delivered\":0,\"id\":\"p1\"}\n")
        #expect(reply { SocketReplies.error(code: .unknownChannel, message: "channel \"nope\" is not configured", id: nil, into: &$0) }
                == #"{"ok":false,"error":{"code":"UNKNOWN_CHANNEL","message":"channel \"nope\" is not configured"}}"# + "\n")
        #expect(reply { SocketReplies.error(SocketRequestError(.notFound, "no connection \"9-9\"", id: RawJSON("4")), into: &$0) }
                == #"{"ok":false,"error":{"code":"NOT_FOUND","message":"no connection \"9-9\""},"id":4}"# + "\n")
        #expect(reply { SocketReplies.lineTooLong(maxLineBytes: 1048576, into: &$0) }
                == #"{"ok":false,"error":{"code":"LINE_TOO_LONG","message":"line longer than 1048576 bytes"}}"# + "\n")
        #expect(reply { SocketReplies.disconnected(1, id: nil, into: &$0) } == "{\"ok\":true,\"disconnected\":1}\n")
        #expect(reply { SocketReplies.tailing(channel: "wallet_updates", id: nil, into: &$0) }
                == "{\"ok\":true,\"tailing\":\"wallet_updates\"}\n")
        let data = Array(#"{"balance":"2"}"#.utf8)
        #expect(reply { w in
            data.withUnsafeBytes {
                SocketReplies.tailEvent(type: "wallet_balance_changed", channel: "wallet_updates", account: "acc_1",
                                        seq: 18, delivered: 2, at: 1700000001.2, data: $0, into: &w)
            }
        } == #"{"event":{"type":"wallet_balance_changed","channel":"wallet_updates","account":"acc_1","broadcast":false,"seq":18,"delivered":2,"at":1700000001.2,"data":{"balance":"2"}}}"# + "\n")
        #expect(reply { w in
            data.withUnsafeBytes {
                SocketReplies.tailEvent(type: "m", channel: "c", account: nil, seq: 3, delivered: 0, at: 5, data: $0, into: &w)
            }
        } == #"{"event":{"type":"m","channel":"c","account":null,"broadcast":true,"seq":3,"delivered":0,"at":5.0,"data":{"balance":"2"}}}"# + "\n")
        #expect(reply { w in
            SocketReplies.beginOK(into: &w)
            w.field("disconnected", 0)
            SocketReplies.finishOK(id: RawJSON("\"d\""), into: &w)
        } == "{\"ok\":true,\"disconnected\":0,\"id\":\"d\"}\n")
    }

    // MARK: Pipelining through LineFramer

    /// Three requests (one with CRLF, one invalid) fed at every split point: same replies in order.
    @Test func pipelinedAtEverySplit() {
        let tooLong = #"{"op":"publish","channel":"c","account":"a","type":"t","data":""# + String(repeating: "x", count: 300) + "\"}\n"
        let stream = Array(("{\"op\":\"stats\",\"id\":1}\r\n" + "{\"op\":\"nope\"}\n" + tooLong +
            #"{"op":"publish","channel":"c","account":"a","type":"t","data":[1, 2]}"# + "\n").utf8)
        func run(_ chunks: [ArraySlice<UInt8>]) -> [String] {
            frameLines(chunks.map { Array($0) }, max: 200).lines.map { line in
                guard let line else {
                    var w = JSONWriter()
                    SocketReplies.lineTooLong(maxLineBytes: 200, into: &w)
                    return String(decoding: w.bytes, as: UTF8.self)
                }
                return line.withUnsafeBytes { bytes in
                    do throws(SocketRequestError) {
                        let r = try SocketRequest.parse(line: bytes)
                        if case .publish(let p) = r.request {
                            return "publish " + String(decoding: p.dataBytes(in: bytes), as: UTF8.self)
                        }
                        return "\(r.request) \(r.id?.description ?? "-")"
                    } catch {
                        return error.code.rawValue
                    }
                }
            }
        }
        let expected = ["stats 1", "UNKNOWN_OP",
                        #"{"ok":false,"error":{"code":"LINE_TOO_LONG","message":"line longer than 200 bytes"}}"# + "\n",
                        "publish [1, 2]"]
        #expect(run([stream[...]]) == expected)
        for i in 0...stream.count {
            #expect(run([stream[..<i], stream[i...]]) == expected, "split at \(i)")
        }
        for i in stride(from: 0, through: stream.count, by: 13) {
            for j in stride(from: i, through: stream.count, by: 11) {
                #expect(run([stream[..<i], stream[i..<j], stream[j...]]) == expected, "split at \(i), \(j)")
            }
        }
        // One byte at a time.
        #expect(run(stream.indices.map { stream[$0...$0] }) == expected)
    }
}
