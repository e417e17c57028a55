import HubJSON
import HubRouting

/// Parsing of the client protocol (docs/PROTOCOL.md section 1.2): one JSON object per WebSocket text message.

/// A JSON value kept as its raw bytes (already validated), for echoing an `id` as the client sent it.
public struct RawJSON: Sendable, Hashable, CustomStringConvertible {
    /// The JSON text. Held as a `String` because an `id` of up to 15 bytes then needs no allocation.
    public var text: String

    public init(bytes: UnsafeRawBufferPointer) { self.text = String(decoding: bytes, as: UTF8.self) }
    public init(bytes: [UInt8]) { self.text = String(decoding: bytes, as: UTF8.self) }

    /// `RawJSON("\"s1\"")`, `RawJSON("7")`: for tests and callers that hold JSON text.
    public init(_ text: String) { self.text = text }

    public var bytes: [UInt8] { Array(text.utf8) }
    public var description: String { text }
}

/// A position to resume one channel from (`subscribe`'s `since`): what the last `subscribed` reply said, with
/// `seq`/`broadcastSeq` advanced to the last event the app received in each stream.
public struct SincePosition: Sendable, Hashable {
    public var channel: String
    public var epoch: String
    public var seq: UInt64
    public var broadcastSeq: UInt64

    public init(channel: String, epoch: String, seq: UInt64, broadcastSeq: UInt64) {
        self.channel = channel
        self.epoch = epoch
        self.seq = seq
        self.broadcastSeq = broadcastSeq
    }
}

/// One parsed client message.
public enum ClientMessage: Sendable, Hashable {
    case subscribe(channels: [String], since: [SincePosition], id: RawJSON?)
    case unsubscribe(channels: [String], id: RawJSON?)
    /// `platform` and `appVersion` are read only from a connection's first message (first-message auth), where a
    /// browser, which cannot send `X-Platform`/`X-App-Version` headers, says what it is.
    case auth(token: String, platform: String?, appVersion: String?, id: RawJSON?)
    case ping(id: RawJSON?)

    public var id: RawJSON? {
        switch self {
        case .subscribe(_, _, let id), .unsubscribe(_, let id), .auth(_, _, _, let id), .ping(let id): return id
        }
    }

    /// At most this many channel names in one subscribe/unsubscribe.
    public static let maxChannelsPerMessage = 64
    /// At most this many UTF-8 bytes per channel name.
    public static let maxChannelNameBytes = 128
    /// At most this many UTF-8 bytes per epoch in `since` (the hub's are about 30).
    public static let maxEpochBytes = 128
}

/// The `details` object of a client error reply.
public enum ClientErrorDetails: Sendable, Hashable {
    /// `{"unknownChannels":[...]}`
    case unknownChannels([String])
    /// `{"retryAfter":N}` (seconds)
    case retryAfter(Int)
}

/// A client error: the reply `{"type":"error","id":...,"error":{"code":...,"message":...,"details":...}}`.
public struct ClientProtocolError: Error, Sendable, Hashable {
    public var code: String
    public var message: String
    public var details: ClientErrorDetails?
    /// The request's `id`, when it could be read, so the error reply echoes it.
    public var id: RawJSON?

    public init(code: String = ClientProtocolError.validationError, message: String,
                details: ClientErrorDetails? = nil, id: RawJSON? = nil) {
        self.code = code
        self.message = message
        self.details = details
        self.id = id
    }

    /// `VALIDATION_ERROR` "unknown channel" with `details.unknownChannels` (subscribe/unsubscribe with a name
    /// that is not configured: nothing changes).
    public static func unknownChannels(_ names: [String], id: RawJSON?) -> ClientProtocolError {
        ClientProtocolError(message: names.count == 1 ? "unknown channel" : "unknown channels",
                            details: .unknownChannels(names), id: id)
    }

    /// `RATE_LIMITED` with `details.retryAfter` (seconds until a message is accepted again).
    public static func rateLimited(retryAfter seconds: Int, id: RawJSON?) -> ClientProtocolError {
        ClientProtocolError(code: rateLimited, message: "rate limit exceeded, retry in \(seconds) s",
                            details: .retryAfter(seconds), id: id)
    }

    public static let validationError = "VALIDATION_ERROR"
    public static let unauthorized = "UNAUTHORIZED"
    public static let tokenExpired = "ErrAccessTokenExpired"
    public static let forbidden = "FORBIDDEN"
    public static let rateLimited = "RATE_LIMITED"
}

extension ClientMessage {
    /// Parses one client text message.
    ///
    /// Order of checks: JSON syntax (the message says at which byte), top level is an object, `id` is a string
    /// or a number (read first so that every later error echoes it), `type`, then the type's fields.
    /// Unknown extra fields are ignored (forward compatible). Duplicate keys: the last one wins.
    public static func parse(_ bytes: UnsafeRawBufferPointer) throws(ClientProtocolError) -> ClientMessage {
        var type: JSONValue?
        var idValue: JSONValue?
        var channels: JSONValue?
        var token: JSONValue?
        var since: JSONValue?
        var platform: JSONValue?
        var appVersion: JSONValue?
        do {
            try JSONScanner.forEachMember(in: bytes) { key, value in
                if key.stringEquals("type", in: bytes) { type = value }
                else if key.stringEquals("id", in: bytes) { idValue = value }
                else if key.stringEquals("channels", in: bytes) { channels = value }
                else if key.stringEquals("token", in: bytes) { token = value }
                else if key.stringEquals("since", in: bytes) { since = value }
                else if key.stringEquals("platform", in: bytes) { platform = value }
                else if key.stringEquals("appVersion", in: bytes) { appVersion = value }
            }
        } catch {
            if error.isNotAnObject {
                throw ClientProtocolError(message: "message must be a JSON object")
            }
            throw ClientProtocolError(message: error.description)
        }

        var id: RawJSON?
        if let idValue {
            guard idValue.kind == .string || idValue.kind == .number else {
                throw ClientProtocolError(message: "\"id\" must be a string or a number")
            }
            id = RawJSON(bytes: idValue.slice(of: bytes))
        }
        func fail(_ message: String) -> ClientProtocolError { ClientProtocolError(message: message, id: id) }

        guard let type else { throw fail("missing \"type\"") }
        guard type.kind == .string else { throw fail("\"type\" must be a string") }

        if type.stringEquals("subscribe", in: bytes) {
            let names = try channelList(channels, in: bytes, fail)
            return .subscribe(channels: names, since: try sinceList(since, channels: names, in: bytes, fail), id: id)
        }
        if type.stringEquals("unsubscribe", in: bytes) {
            return .unsubscribe(channels: try channelList(channels, in: bytes, fail), id: id)
        }
        if type.stringEquals("ping", in: bytes) { return .ping(id: id) }
        if type.stringEquals("auth", in: bytes) {
            guard let token else { throw fail("missing \"token\"") }
            guard token.kind == .string, token.range.count > 2 else { throw fail("\"token\" must be a non-empty string") }
            for (name, value) in [("platform", platform), ("appVersion", appVersion)] where value != nil && value?.kind != .string {
                throw fail("\"\(name)\" must be a string")
            }
            return .auth(token: JSONScanner.decodeString(token, in: bytes),
                         platform: platform.map { JSONScanner.decodeString($0, in: bytes) },
                         appVersion: appVersion.map { JSONScanner.decodeString($0, in: bytes) }, id: id)
        }
        throw fail("unknown type \(quotedForMessage(JSONScanner.decodeString(type, in: bytes)))")
    }

    public static func parse(_ bytes: [UInt8]) throws(ClientProtocolError) -> ClientMessage {
        let result: Result<ClientMessage, ClientProtocolError> = bytes.withUnsafeBytes { buf in
            do throws(ClientProtocolError) { return .success(try parse(buf)) } catch { return .failure(error) }
        }
        return try result.get()
    }

    static func channelList(_ value: JSONValue?, in bytes: UnsafeRawBufferPointer,
                            _ fail: (String) -> ClientProtocolError) throws(ClientProtocolError) -> [String] {
        guard let value else { throw fail("missing \"channels\"") }
        guard value.kind == .array else { throw fail("\"channels\" must be an array of strings") }
        var names: [String] = []
        var problem: String?
        var count = 0
        do {
            try JSONScanner.forEachElement(of: value, in: bytes) { element in
                guard problem == nil else { return }
                count += 1
                if element.kind != .string { problem = "\"channels\" must be an array of strings"; return }
                if count > maxChannelsPerMessage {
                    problem = "too many channels in one message (at most \(maxChannelsPerMessage))"
                    return
                }
                if JSONScanner.decodedStringLength(element, in: bytes) > maxChannelNameBytes {
                    problem = "channel name longer than \(maxChannelNameBytes) bytes"
                    return
                }
                let name = JSONScanner.decodeString(element, in: bytes)
                // By bytes: a name canonically equivalent to another is another name (unknown, unless configured).
                if !names.contains(where: { ExactString($0) == ExactString(name) }) { names.append(name) }
            }
        } catch {
            throw fail(error.description) // unreachable: the array was validated
        }
        if let problem { throw fail(problem) }
        if count == 0 { throw fail("\"channels\" must not be empty") }
        return names
    }
}

extension ClientMessage {
    /// `"since":{"wallet_updates":{"epoch":"…","seq":17,"broadcastSeq":3}}`: every named channel must be in
    /// `channels`, and every position needs all three fields. `null` or absent: no resume.
    static func sinceList(_ value: JSONValue?, channels: [String], in bytes: UnsafeRawBufferPointer,
                          _ fail: (String) -> ClientProtocolError) throws(ClientProtocolError) -> [SincePosition] {
        guard let value, value.kind != .null else { return [] }
        guard value.kind == .object else { throw fail("\"since\" must be an object of positions by channel") }
        var positions: [SincePosition] = []
        var problem: String?
        do {
            try JSONScanner.forEachMember(of: value, in: bytes) { key, position in
                guard problem == nil else { return }
                let channel = JSONScanner.decodeString(key, in: bytes)
                guard channels.contains(where: { ExactString($0) == ExactString(channel) }) else {
                    problem = "\"since\" names \(quotedForMessage(channel)), which is not in \"channels\""
                    return
                }
                switch sincePosition(position, channel: channel, in: bytes) {
                case .success(let p):
                    positions.removeAll { ExactString($0.channel) == ExactString(channel) }  // duplicate keys: the last one wins
                    positions.append(p)
                case .failure(let message):
                    problem = message.text
                }
            }
        } catch {
            throw fail(error.description) // unreachable: the object was validated
        }
        if let problem { throw fail(problem) }
        return positions
    }

    struct Problem: Error { let text: String }

    static func sincePosition(_ value: JSONValue, channel: String, in bytes: UnsafeRawBufferPointer) -> Result<SincePosition, Problem> {
        let name = quotedForMessage(channel)
        guard value.kind == .object else { return .failure(Problem(text: "\"since\".\(name) must be an object with epoch, seq and broadcastSeq")) }
        var epoch: JSONValue?, seq: JSONValue?, broadcastSeq: JSONValue?
        try? JSONScanner.forEachMember(of: value, in: bytes) { key, member in
            if key.stringEquals("epoch", in: bytes) { epoch = member }
            else if key.stringEquals("seq", in: bytes) { seq = member }
            else if key.stringEquals("broadcastSeq", in: bytes) { broadcastSeq = member }
        }
        guard let epoch, epoch.kind == .string, JSONScanner.decodedStringLength(epoch, in: bytes) <= maxEpochBytes else {
            return .failure(Problem(text: "\"since\".\(name).epoch must be a string of at most \(maxEpochBytes) bytes"))
        }
        func number(_ v: JSONValue?, _ field: String) -> Result<UInt64, Problem> {
            guard let v, let n = JSONScanner.int64(v, in: bytes), n >= 0 else {
                return .failure(Problem(text: "\"since\".\(name).\(field) must be a non-negative integer"))
            }
            return .success(UInt64(n))
        }
        return number(seq, "seq").flatMap { s in
            number(broadcastSeq, "broadcastSeq").map { b in
                SincePosition(channel: channel, epoch: JSONScanner.decodeString(epoch, in: bytes), seq: s, broadcastSeq: b)
            }
        }
    }
}

/// `"name"` for an error message, cut to 64 bytes (on a character boundary) so a huge value does not make a
/// huge reply.
func quotedForMessage(_ s: String) -> String {
    var cut = s
    if s.utf8.count > 64 {
        let u = Array(s.utf8.prefix(65))
        var n = 64
        while n > 0 && u[n] & 0xC0 == 0x80 { n -= 1 } // back up to a scalar boundary
        cut = String(decoding: u[..<n], as: UTF8.self) + "…"
    }
    return "\"\(cut)\""
}
