import HubJSON
import HubRouting

/// Parsing of the Unix-socket protocol (docs/PROTOCOL.md section 2): one JSON request object per line.

/// An error reply: `{"ok":false,"error":{"code":...,"message":...},"id":...}`.
public struct SocketRequestError: Error, Sendable, Hashable {
    public var code: SocketErrorCode
    public var message: String
    /// The request's `id` when it could be read, echoed in the reply.
    public var id: RawJSON?

    public init(_ code: SocketErrorCode, _ message: String, id: RawJSON? = nil) {
        self.code = code
        self.message = message
        self.id = id
    }
}

/// Who a published event is for.
public enum PublishTarget: Sendable, Hashable {
    case account(AccountID)
    case broadcast
}

/// A parsed `publish`. `data` is the byte range of the `data` value in the request line (nil when absent,
/// meaning `null`): encode the event before the line's bytes are released.
public struct PublishRequest: Sendable, Hashable {
    public var channel: String
    public var target: PublishTarget
    public var type: String
    public var data: Range<Int>?
    /// `idempotencyKey`: a repeat within the window (same channel and account, or broadcast) is not delivered again.
    public var idempotencyKey: String?

    public init(channel: String, target: PublishTarget, type: String, data: Range<Int>?, idempotencyKey: String? = nil) {
        self.channel = channel
        self.target = target
        self.type = type
        self.data = data
        self.idempotencyKey = idempotencyKey
    }

    /// The `data` JSON bytes within `line` (the literal `null` when absent).
    public func dataBytes(in line: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
        guard let data else {
            let null: StaticString = "null"
            return UnsafeRawBufferPointer(start: null.utf8Start, count: null.utf8CodeUnitCount)
        }
        return UnsafeRawBufferPointer(rebasing: line[data])
    }

    /// The size of `data` in bytes (4 for an absent `data`).
    public var dataCount: Int { data?.count ?? 4 }

    /// Caller-side checks against the configuration: `UNKNOWN_CHANNEL` when `isConfigured(channel)` is false,
    /// `EVENT_TOO_LARGE` when the framed event (header + payload, with a 20-digit `seq` as an upper bound)
    /// would exceed `maxEventBytes`.
    public func validate(isConfigured: (String) -> Bool, maxEventBytes: Int,
                         id: RawJSON?) throws(SocketRequestError) {
        guard isConfigured(channel) else {
            throw SocketRequestError(.unknownChannel, "channel \(quotedForMessage(channel)) is not configured", id: id)
        }
        let payload = EventEncoding.payloadSize(type: type, channel: channel, seq: UInt64.max,
                                                broadcast: target == .broadcast, dataCount: dataCount)
        let framed = EventEncoding.framedSize(payloadCount: payload)
        guard framed <= maxEventBytes else {
            throw SocketRequestError(.eventTooLarge,
                                     "event of \(framed) bytes exceeds the limit of \(maxEventBytes) bytes", id: id)
        }
    }

    /// The same checks against a list of configured names, matched by bytes (`ChannelIndex`).
    public func validate(channels: [String], maxEventBytes: Int, id: RawJSON?) throws(SocketRequestError) {
        let index = ChannelIndex(channels)
        try validate(isConfigured: { index[$0] != nil }, maxEventBytes: maxEventBytes, id: id)
    }

    /// Event types the client protocol uses itself.
    public static let reservedTypes: [StaticString] = [
        "subscribed", "unsubscribed", "authenticated", "pong", "error", "token_expiring",
    ]
    public static let maxTypeBytes = 128
    public static let maxIdempotencyKeyBytes = 128
}

public enum DisconnectTarget: Sendable, Hashable {
    case connection(String)
    case account(AccountID)
}

public enum SocketRequest: Sendable, Hashable {
    case publish(PublishRequest)
    case stats
    case channels
    case channel(name: String, account: AccountID?)
    case connections(account: AccountID?, channel: String?, limit: Int)
    /// `node`: cluster mode, the node whose connection (or account's connections) to close; nil: this node for a
    /// connection id (ids are per node), every live node for an account.
    case disconnect(target: DisconnectTarget, code: UInt16, reason: String, node: String?)
    case tail(channel: String, account: AccountID?)
    /// The retained events of one stream with seq > `since` (`account` nil: the channel's broadcasts).
    case history(channel: String, account: AccountID?, since: UInt64)
    /// Cluster mode: the live nodes in the registry.
    case nodes

    public static let defaultConnectionsLimit = 100
    public static let defaultDisconnectCode: UInt16 = 1000
    public static let defaultDisconnectReason = "disconnected by operator"
    public static let maxCloseReasonBytes = 123
}

/// A request and its echoed `id`.
public struct ParsedSocketRequest: Sendable, Hashable {
    public var request: SocketRequest
    public var id: RawJSON?
}

extension SocketRequest {
    /// Parses one line (without its `\n` / `\r\n`).
    ///
    /// Order of checks: JSON syntax and top-level object (`INVALID_JSON`, with the byte offset), `id` type
    /// (`INVALID_REQUEST`, not echoed), `op` (`UNKNOWN_OP`), the op's fields (`INVALID_REQUEST` naming the
    /// field), then `RESERVED_TYPE`. Channel configuration and size limits are the caller's
    /// (`PublishRequest.validate`). Unknown extra fields are ignored. Optional fields given as `null` count as
    /// absent. Duplicate keys: the last one wins.
    public static func parse(line: UnsafeRawBufferPointer) throws(SocketRequestError) -> ParsedSocketRequest {
        var id: RawJSON?
        let request = try parse(line: line, id: &id)
        return ParsedSocketRequest(request: request, id: id)
    }

    /// `parse(line:)` with the echoed `id` (set once it has been read, also when an error follows) apart from the
    /// request, so a caller can consume the request, publish payload and all, without copying it.
    static func parse(line: UnsafeRawBufferPointer, id: inout RawJSON?) throws(SocketRequestError) -> SocketRequest {
        var f = Fields()
        do {
            try JSONScanner.forEachMember(in: line) { key, value in f.record(key, value, line) }
        } catch {
            throw SocketRequestError(.invalidJSON, error.isNotAnObject
                                     ? "request must be a JSON object (at byte \(error.offset))"
                                     : error.description)
        }

        if let idValue = f.id {
            guard idValue.kind == .string || idValue.kind == .number else {
                throw SocketRequestError(.invalidRequest, "\"id\" must be a string or a number")
            }
            id = RawJSON(bytes: idValue.slice(of: line))
        }
        var p = FieldReader(line: line, id: id)

        guard let op = f.op else { throw SocketRequestError(.unknownOp, "missing \"op\"", id: id) }
        guard op.kind == .string else { throw SocketRequestError(.unknownOp, "\"op\" must be a string", id: id) }

        let request: SocketRequest
        let opWord = op.hasEscapes ? packedDecoded(op, in: line) : op.packed(in: line)
        if opWord == Op.publish.rawValue {
            request = .publish(try parsePublish(f, &p))
        } else if opWord == Op.stats.rawValue {
            request = .stats
        } else if opWord == Op.channels.rawValue {
            request = .channels
        } else if opWord == Op.channel.rawValue {
            request = .channel(name: try p.requiredString(f.channel, "channel"),
                               account: try p.optionalString(f.account, "account").map { AccountID($0) })
        } else if op.stringEquals("connections", in: line) {
            var limit = defaultConnectionsLimit
            if let l = f.limit, l.kind != .null {
                guard let v = JSONScanner.int64(l, in: line), v >= 0, v <= Int64(Int32.max) else {
                    throw p.invalid("\"limit\" must be a non-negative integer")
                }
                limit = Int(v)
            }
            request = .connections(account: try p.optionalString(f.account, "account").map { AccountID($0) },
                                   channel: try p.optionalString(f.channel, "channel"), limit: limit)
        } else if op.stringEquals("disconnect", in: line) {
            request = try parseDisconnect(f, &p)
        } else if op.stringEquals("history", in: line) {
            request = try parseHistory(f, &p)
        } else if op.stringEquals("nodes", in: line) {
            request = .nodes
        } else if opWord == Op.tail.rawValue {
            request = .tail(channel: try p.requiredString(f.channel, "channel"),
                            account: try p.optionalString(f.account, "account").map { AccountID($0) })
        } else {
            throw SocketRequestError(.unknownOp,
                                     "unknown op \(quotedForMessage(JSONScanner.decodeString(op, in: line)))", id: id)
        }
        return request
    }

    public static func parse(line: [UInt8]) throws(SocketRequestError) -> ParsedSocketRequest {
        let result: Result<ParsedSocketRequest, SocketRequestError> = line.withUnsafeBytes { buf in
            do throws(SocketRequestError) { return .success(try parse(line: buf)) } catch { return .failure(error) }
        }
        return try result.get()
    }

    /// `packed` for a string with escapes (rare): decoded first.
    static func packedDecoded(_ v: JSONValue, in line: UnsafeRawBufferPointer) -> UInt64 {
        var bytes: [UInt8] = []
        JSONScanner.decodeString(v, in: line, into: &bytes)
        guard (1...8).contains(bytes.count), !bytes.contains(0) else { return 0 } // NUL would pack like padding
        var w: UInt64 = 0
        for (i, b) in bytes.enumerated() { w |= UInt64(b) << UInt64(i * 8) }
        return w
    }

    static func parsePublish(_ f: Fields, _ p: inout FieldReader) throws(SocketRequestError) -> PublishRequest {
        let line = p.line
        let channel = try p.requiredString(f.channel, "channel")
        guard let typeValue = f.type, typeValue.kind == .string else {
            throw p.invalid(f.type == nil ? "missing \"type\"" : "\"type\" must be a string")
        }
        let typeLength = JSONScanner.decodedStringLength(typeValue, in: line)
        guard typeLength > 0, typeLength <= PublishRequest.maxTypeBytes else {
            throw p.invalid("\"type\" must be a non-empty string of at most \(PublishRequest.maxTypeBytes) bytes")
        }
        let account = try p.optionalString(f.account, "account")
        var broadcast = false
        if let b = f.broadcast, b.kind != .null {
            guard b.kind == .true || b.kind == .false else { throw p.invalid("\"broadcast\" must be a boolean") }
            broadcast = b.kind == .true
        }
        let target: PublishTarget
        switch (account, broadcast) {
        case (let a?, false):
            guard !a.isEmpty else { throw p.invalid("\"account\" must be a non-empty string") }
            target = .account(AccountID(a))
        case (nil, true):
            target = .broadcast
        default:
            throw p.invalid("exactly one of \"account\" or \"broadcast\":true is required")
        }
        let mayBeReserved: Bool
        switch typeLength { case 4, 5, 10, 12, 13, 14: mayBeReserved = true; default: mayBeReserved = false }
        for reserved in PublishRequest.reservedTypes where mayBeReserved && typeValue.stringEquals(reserved, in: line) {
            throw SocketRequestError(.reservedType, "event type \"\(reserved)\" is reserved by the client protocol",
                                     id: p.id)
        }
        let type = JSONScanner.decodeString(typeValue, in: line)
        var data: Range<Int>?
        if let d = f.data, d.kind != .null { data = d.range }
        var idempotencyKey: String?
        if let k = f.idempotencyKey, k.kind != .null {
            let length = k.kind == .string ? JSONScanner.decodedStringLength(k, in: line) : 0
            guard length > 0, length <= PublishRequest.maxIdempotencyKeyBytes else {
                throw p.invalid("\"idempotencyKey\" must be a non-empty string of at most \(PublishRequest.maxIdempotencyKeyBytes) bytes")
            }
            idempotencyKey = JSONScanner.decodeString(k, in: line)
        }
        return PublishRequest(channel: channel, target: target, type: type, data: data, idempotencyKey: idempotencyKey)
    }

    static func parseHistory(_ f: Fields, _ p: inout FieldReader) throws(SocketRequestError) -> SocketRequest {
        let channel = try p.requiredString(f.channel, "channel")
        let account = try p.optionalString(f.account, "account")
        var broadcast = false
        if let b = f.broadcast, b.kind != .null {
            guard b.kind == .true || b.kind == .false else { throw p.invalid("\"broadcast\" must be a boolean") }
            broadcast = b.kind == .true
        }
        guard (account != nil) != broadcast, account?.isEmpty != true else {
            throw p.invalid("exactly one of \"account\" (non-empty) or \"broadcast\":true is required")
        }
        var since: UInt64 = 0
        if let s = f.since, s.kind != .null {
            guard let v = JSONScanner.int64(s, in: p.line), v >= 0 else { throw p.invalid("\"since\" must be a non-negative integer") }
            since = UInt64(v)
        }
        return .history(channel: channel, account: account.map { AccountID($0) }, since: since)
    }

    static func parseDisconnect(_ f: Fields, _ p: inout FieldReader) throws(SocketRequestError) -> SocketRequest {
        let conn = try p.optionalString(f.conn, "conn")
        let account = try p.optionalString(f.account, "account")
        let target: DisconnectTarget
        switch (conn, account) {
        case (let c?, nil):
            guard !c.isEmpty else { throw p.invalid("\"conn\" must be a non-empty string") }
            target = .connection(c)
        case (nil, let a?):
            guard !a.isEmpty else { throw p.invalid("\"account\" must be a non-empty string") }
            target = .account(AccountID(a))
        default:
            throw p.invalid("exactly one of \"conn\" or \"account\" is required")
        }
        var code = defaultDisconnectCode
        if let c = f.code, c.kind != .null {
            guard let v = JSONScanner.int64(c, in: p.line), v == 1000 || (3000...4999).contains(v) else {
                throw p.invalid("\"code\" must be 1000 or 3000-4999")
            }
            code = UInt16(v)
        }
        var reason = defaultDisconnectReason
        if let r = f.reason, r.kind != .null {
            guard r.kind == .string else { throw p.invalid("\"reason\" must be a string") }
            guard JSONScanner.decodedStringLength(r, in: p.line) <= maxCloseReasonBytes else {
                throw p.invalid("\"reason\" must be at most \(maxCloseReasonBytes) bytes")
            }
            reason = JSONScanner.decodeString(r, in: p.line)
        }
        var node: String? = nil
        if let n = try p.optionalString(f.node, "node") {
            guard !n.isEmpty else { throw p.invalid("\"node\" must be a non-empty string") }
            node = n
        }
        return .disconnect(target: target, code: code, reason: reason, node: node)
    }
}

/// Packed short op names (`JSONValue.packed`).
enum Op: UInt64 {
    case publish = 0x6873696c627570
    case stats = 0x7374617473
    case channels = 0x736c656e6e616863
    case channel = 0x6c656e6e616863
    case tail = 0x6c696174
}

/// The members a socket request may carry, recorded during the scan.
struct Fields {
    var op: JSONValue?
    var id: JSONValue?
    var channel: JSONValue?
    var account: JSONValue?
    var broadcast: JSONValue?
    var type: JSONValue?
    var data: JSONValue?
    var limit: JSONValue?
    var conn: JSONValue?
    var code: JSONValue?
    var reason: JSONValue?
    var since: JSONValue?
    var idempotencyKey: JSONValue?
    var node: JSONValue?

    /// Packed keys (`JSONValue.packed`); `ProtocolSocketTests` checks them against `JSONValue.pack`.
    enum Key: UInt64 {
        case op = 0x706f
        case id = 0x6469
        case type = 0x65707974
        case data = 0x61746164
        case conn = 0x6e6e6f63
        case code = 0x65646f63
        case limit = 0x74696d696c
        case reason = 0x6e6f73616572
        case since = 0x65636e6973
        case channel = 0x6c656e6e616863
        case account = 0x746e756f636361
        case node = 0x65646f6e
    }

    @inline(__always)
    mutating func record(_ key: JSONValue, _ value: JSONValue, _ line: UnsafeRawBufferPointer) {
        if key.hasEscapes { recordEscaped(key, value, line); return }
        guard let k = Key(rawValue: key.packed(in: line)) else {
            if key.stringEquals("broadcast", in: line) { broadcast = value }
            else if key.stringEquals("idempotencyKey", in: line) { idempotencyKey = value }
            return
        }
        switch k {
        case .op: op = value
        case .id: id = value
        case .type: type = value
        case .data: data = value
        case .conn: conn = value
        case .code: code = value
        case .limit: limit = value
        case .reason: reason = value
        case .since: since = value
        case .channel: channel = value
        case .account: account = value
        case .node: node = value
        }
    }

    /// A key written with escapes (`"\u006fp"`) has another raw length: compare decoded.
    mutating func recordEscaped(_ key: JSONValue, _ value: JSONValue, _ line: UnsafeRawBufferPointer) {
        switch JSONScanner.decodeString(key, in: line) {
        case "op": op = value
        case "id": id = value
        case "channel": channel = value
        case "account": account = value
        case "broadcast": broadcast = value
        case "type": type = value
        case "data": data = value
        case "limit": limit = value
        case "conn": conn = value
        case "code": code = value
        case "reason": reason = value
        case "since": since = value
        case "idempotencyKey": idempotencyKey = value
        case "node": node = value
        default: break
        }
    }
}

struct FieldReader {
    let line: UnsafeRawBufferPointer
    let id: RawJSON?

    func invalid(_ message: String) -> SocketRequestError {
        SocketRequestError(.invalidRequest, message, id: id)
    }

    func requiredString(_ v: JSONValue?, _ name: StaticString) throws(SocketRequestError) -> String {
        guard let v, v.kind != .null else { throw invalid("missing \"\(name)\"") }
        guard v.kind == .string else { throw invalid("\"\(name)\" must be a string") }
        return JSONScanner.decodeString(v, in: line)
    }

    func optionalString(_ v: JSONValue?, _ name: StaticString) throws(SocketRequestError) -> String? {
        guard let v, v.kind != .null else { return nil }
        guard v.kind == .string else { throw invalid("\"\(name)\" must be a string") }
        return JSONScanner.decodeString(v, in: line)
    }
}
