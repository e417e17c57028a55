import Foundation
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubJSON
@testable import HubRouting

func parseClient(_ text: String) -> Result<ClientMessage, ClientProtocolError> {
    do throws(ClientProtocolError) { return .success(try ClientMessage.parse(Array(text.utf8))) } catch {
        return .failure(error)
    }
}

struct ProtocolClientTests {
    @Test func subscribe() throws {
        let m = try parseClient(#"{"type":"subscribe","channels":["profile_updates","wallet_updates"],"id":"s1"}"#).get()
        #expect(m == .subscribe(channels: ["profile_updates", "wallet_updates"], since: [], id: RawJSON("\"s1\"")))
    }

    @Test func subscribeWithSince() throws {
        let m = try parseClient(#"{"type":"subscribe","channels":["a","b"],"since":{"b":{"epoch":"E.1.2","seq":17,"broadcastSeq":3,"x":0},"\u0061":{"epoch":"F","seq":0,"broadcastSeq":9}}}"#).get()
        #expect(m == .subscribe(channels: ["a", "b"], since: [SincePosition(channel: "b", epoch: "E.1.2", seq: 17, broadcastSeq: 3),
                                                           SincePosition(channel: "a", epoch: "F", seq: 0, broadcastSeq: 9)], id: nil))
        #expect(try parseClient(#"{"type":"subscribe","channels":["a"],"since":null}"#).get() == .subscribe(channels: ["a"], since: [], id: nil))
    }

    @Test func unsubscribeWithDuplicatesAndEscapes() throws {
        let m = try parseClient(#"{"id":12.5e1,"channels":["b","a","b","\u0061","c"],"type":"unsubscribe"}"#).get()
        #expect(m == .unsubscribe(channels: ["b", "a", "c"], id: RawJSON("12.5e1")))
    }

    @Test func authAndPing() throws {
        #expect(try parseClient(#"{"type":"auth","token":"eyJ.x.y","id":"a1"}"#).get()
                == .auth(token: "eyJ.x.y", platform: nil, appVersion: nil, id: RawJSON("\"a1\"")))
        #expect(try parseClient(#"{"type":"ping","id":7}"#).get() == .ping(id: RawJSON("7")))
        #expect(try parseClient(#" {"type":"ping"} "#).get() == .ping(id: nil))
        // Unknown extra fields are ignored; an id with escapes is echoed as sent.
        #expect(try parseClient(#"{"type":"ping","future":{"x":[1]},"id":"\u00e9"}"#).get()
                == .ping(id: RawJSON(#""\u00e9""#)))
    }

    /// (message, expected error message, expected echoed id)
    static let errors: [(String, String, String?)] = [
        ("", "invalid JSON at byte 0: unexpected end of input", nil),
        (#"{"type":"ping","id":"s1""#, "invalid JSON at byte 24: unexpected end of input", nil),
        (#"{"type":"ping",}"#, "invalid JSON at byte 15: trailing comma", nil),
        ("[1]", "message must be a JSON object", nil),
        ("\"ping\"", "message must be a JSON object", nil),
        (#"{"type":"ping","id":{"a":1}}"#, "\"id\" must be a string or a number", nil),
        (#"{"type":"ping","id":null}"#, "\"id\" must be a string or a number", nil),
        (#"{"type":"ping","id":true}"#, "\"id\" must be a string or a number", nil),
        (#"{"id":"x"}"#, "missing \"type\"", "\"x\""),
        (#"{"id":"x","type":5}"#, "\"type\" must be a string", "\"x\""),
        (#"{"id":1,"type":"dance"}"#, "unknown type \"dance\"", "1"),
        (#"{"id":1,"type":"Subscribe","channels":["a"]}"#, "unknown type \"Subscribe\"", "1"),
        (#"{"type":"subscribe","id":"s"}"#, "missing \"channels\"", "\"s\""),
        (#"{"type":"subscribe","channels":"a","id":"s"}"#, "\"channels\" must be an array of strings", "\"s\""),
        (#"{"type":"subscribe","channels":["a",1],"id":"s"}"#, "\"channels\" must be an array of strings", "\"s\""),
        (#"{"type":"unsubscribe","channels":[],"id":"s"}"#, "\"channels\" must not be empty", "\"s\""),
        (#"{"type":"auth","id":"a"}"#, "missing \"token\"", "\"a\""),
        (#"{"type":"auth","token":"","id":"a"}"#, "\"token\" must be a non-empty string", "\"a\""),
        (#"{"type":"auth","token":42,"id":"a"}"#, "\"token\" must be a non-empty string", "\"a\""),
        (#"{"type":"subscribe","channels":["a"],"since":[1],"id":"s"}"#, "\"since\" must be an object of positions by channel", "\"s\""),
        (#"{"type":"subscribe","channels":["a"],"since":{"b":{}},"id":"s"}"#, "\"since\" names \"b\", which is not in \"channels\"", "\"s\""),
        (#"{"type":"subscribe","channels":["a"],"since":{"a":7},"id":"s"}"#, "\"since\".\"a\" must be an object with epoch, seq and broadcastSeq", "\"s\""),
        (#"{"type":"subscribe","channels":["a"],"since":{"a":{"seq":1,"broadcastSeq":0}},"id":"s"}"#, "\"since\".\"a\".epoch must be a string of at most 128 bytes", "\"s\""),
        (#"{"type":"subscribe","channels":["a"],"since":{"a":{"epoch":"e","broadcastSeq":0}},"id":"s"}"#, "\"since\".\"a\".seq must be a non-negative integer", "\"s\""),
        (#"{"type":"subscribe","channels":["a"],"since":{"a":{"epoch":"e","seq":1.5,"broadcastSeq":0}},"id":"s"}"#, "\"since\".\"a\".seq must be a non-negative integer", "\"s\""),
        (#"{"type":"subscribe","channels":["a"],"since":{"a":{"epoch":"e","seq":1,"broadcastSeq":-1}},"id":"s"}"#, "\"since\".\"a\".broadcastSeq must be a non-negative integer", "\"s\""),
    ]

    @Test(arguments: errors.indices)
    func validationErrors(_ i: Int) {
        let (text, message, id) = Self.errors[i]
        guard case .failure(let e) = parseClient(text) else { Issue.record("accepted \(text)"); return }
        #expect(e.code == "VALIDATION_ERROR")
        #expect(e.message == message, "\(text)")
        #expect(e.id == id.map(RawJSON.init), "\(text)")
        #expect(e.details == nil)
    }

    @Test func channelCaps() {
        let many = (0...64).map { "\"c\($0)\"" }.joined(separator: ",")
        guard case .failure(let e) = parseClient(#"{"type":"subscribe","channels":[\#(many)],"id":9}"#) else {
            Issue.record("accepted 65 channels"); return
        }
        #expect(e.message == "too many channels in one message (at most 64)")
        #expect(e.id == RawJSON("9"))
        // 64 distinct names are fine, and 65 entries that collapse to fewer are still refused (the cap is on
        // the request as sent).
        let ok = (0..<64).map { "\"c\($0)\"" }.joined(separator: ",")
        #expect((try? parseClient(#"{"type":"subscribe","channels":[\#(ok)]}"#).get()) != nil)

        let long = String(repeating: "x", count: 129)
        guard case .failure(let e2) = parseClient(#"{"type":"subscribe","channels":["\#(long)"]}"#) else {
            Issue.record("accepted a 129-byte name"); return
        }
        #expect(e2.message == "channel name longer than 128 bytes")
        let max = String(repeating: "é", count: 64) // 128 bytes
        #expect((try? parseClient(#"{"type":"subscribe","channels":["\#(max)"]}"#).get()) != nil)
    }

    @Test func longUnknownTypeIsCut() {
        let t = String(repeating: "é", count: 100)
        guard case .failure(let e) = parseClient(#"{"type":"\#(t)"}"#) else { Issue.record("accepted"); return }
        #expect(e.message == "unknown type \"" + String(repeating: "é", count: 32) + "…\"")
    }

    // MARK: Replies

    func reply(_ body: (inout JSONWriter) -> Void) -> String {
        var w = JSONWriter()
        body(&w)
        #expect((try? JSONSerialization.jsonObject(with: Data(w.bytes))) != nil)
        return String(decoding: w.bytes, as: UTF8.self)
    }

    @Test func replies() {
        #expect(reply { ClientReplies.subscribed(channels: ["profile_updates", "wallet_updates"], id: RawJSON("\"s1\""), into: &$0) }
                == #"{"type":"subscribed","channels":["profile_updates","wallet_updates"],"id":"s1"}"#)
        #expect(reply { ClientReplies.unsubscribed(channels: ["wallet_updates"], id: RawJSON("\"u1\""), into: &$0) }
                == #"{"type":"unsubscribed","channels":["wallet_updates"],"id":"u1"}"#)
        #expect(reply { ClientReplies.subscribed(channels: ["a"], id: nil, into: &$0) }
                == #"{"type":"subscribed","channels":["a"]}"#)
        #expect(reply {
            ClientReplies.subscribed(channels: ["a", "b"], positions: [
                .init(channel: "a", epoch: .init(hub: "E", account: "1", broadcast: "2"), seq: 17, broadcastSeq: 3),
                .init(channel: "b", epoch: .init(hub: "E", account: "3", broadcast: "4"), seq: 0, broadcastSeq: 0, recovered: false, reason: "too_old"),
            ], id: RawJSON("1"), into: &$0)
        } == #"{"type":"subscribed","channels":["a","b"],"positions":{"a":{"epoch":"E.1.2","seq":17,"broadcastSeq":3},"b":{"epoch":"E.3.4","seq":0,"broadcastSeq":0,"recovered":false,"reason":"too_old"}},"id":1}"#)
        // The epoch is written from its parts: the same text as `ChannelEpoch.text`, each part escaped.
        for parts in [("E", "1", "2"), ("", "", ""), ("a\"b", "\\", "\u{1}é")] {
            let epoch = ClientReplies.ChannelEpoch(hub: parts.0, account: parts.1, broadcast: parts.2)
            let written = reply { ClientReplies.subscribed(channels: ["c"], positions: [.init(channel: "c", epoch: epoch, seq: 1, broadcastSeq: 2)],
                                                           id: nil, into: &$0) }
            var expected = JSONWriter()
            expected.string(epoch.text)
            #expect(written.contains(#""epoch":"# + String(decoding: expected.bytes, as: UTF8.self) + ","), "\(written)")
        }
        #expect(reply { ClientReplies.authenticated(expiresAt: 1700000900, id: RawJSON("\"a1\""), into: &$0) }
                == #"{"type":"authenticated","expiresAt":1700000900,"id":"a1"}"#)
        #expect(reply { ClientReplies.pong(id: RawJSON("7"), into: &$0) } == #"{"type":"pong","id":7}"#)
        #expect(reply { ClientReplies.pong(id: nil, into: &$0) } == #"{"type":"pong"}"#)
        #expect(reply { ClientReplies.tokenExpiring(expiresIn: 60, into: &$0) }
                == #"{"type":"token_expiring","expiresIn":60}"#)
        #expect(reply {
            ClientReplies.error(code: "VALIDATION_ERROR", message: "unknown channel",
                                details: .unknownChannels(["nope"]), id: RawJSON("\"s1\""), into: &$0)
        } == #"{"type":"error","id":"s1","error":{"code":"VALIDATION_ERROR","message":"unknown channel","details":{"unknownChannels":["nope"]}}}"#)
        #expect(reply {
            ClientReplies.error(code: "RATE_LIMITED", message: "too many messages", details: .retryAfter(12),
                                id: nil, into: &$0)
        } == #"{"type":"error","error":{"code":"RATE_LIMITED","message":"too many messages","details":{"retryAfter":12}}}"#)
    }

    @Test func serverSideErrors() {
        #expect(reply { ClientReplies.error(.unknownChannels(["nope"], id: RawJSON("\"s1\"")), into: &$0) }
                == #"{"type":"error","id":"s1","error":{"code":"VALIDATION_ERROR","message":"unknown channel","details":{"unknownChannels":["nope"]}}}"#)
        #expect(reply { ClientReplies.error(.rateLimited(retryAfter: 3, id: nil), into: &$0) }
                == #"{"type":"error","error":{"code":"RATE_LIMITED","message":"rate limit exceeded, retry in 3 s","details":{"retryAfter":3}}}"#)
    }

    @Test func errorReplyFromParseError() {
        guard case .failure(let e) = parseClient(#"{"type":"nope","id":"q\"1"}"#) else { Issue.record("accepted"); return }
        #expect(reply { ClientReplies.error(e, into: &$0) }
                == #"{"type":"error","id":"q\"1","error":{"code":"VALIDATION_ERROR","message":"unknown type \"nope\""}}"#)
    }
}
