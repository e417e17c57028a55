// RESP, the Redis serialization protocol (RESP2 and RESP3), as a pure codec: no I/O, no clocks, no threads.
// The decoder follows the engine's read contract (`ConnectionHandler.connectionReadable`, like `LineFramer`): it is
// handed the bytes the engine holds, returns each complete value and how many bytes it consumed, and the engine keeps
// the rest in front of the next read. Partial aggregates and partial bulk strings are absorbed by the decoder, so
// the engine only ever keeps an incomplete header line (bounded by `RESPLimits.maxLineBytes`).
//
// Redis is the hub's own broker, but its replies still cross a socket: every length, count and number is checked,
// nothing is trusted for an allocation size, nesting is bounded, and a decoder that has thrown stays failed (it
// never parses from a half-checked state).

/// One RESP value. RESP2 and RESP3 types map onto these cases:
/// `+` simple, `-` and `!` error, `:` integer, `$` and `=` bulk (a verbatim string's `xxx:` format prefix is
/// checked and dropped), `$-1`, `*-1` and `_` null, `*` and `~` array, `%` map (keys and values alternating),
/// `>` push, `#` boolean, `,` double, `(` big number. `|` attributes are checked and dropped: the value they annotate
/// is returned in their place.
public enum RESPValue: Sendable, Equatable {
    case simple(String)
    case error(String)
    case integer(Int64)
    case bulk([UInt8])
    case null
    case array([RESPValue])
    case map([RESPValue])
    case push([RESPValue])
    case boolean(Bool)
    case double(Double)
    case bigNumber(String)

    /// A simple or bulk string as text (bulk bytes that are not UTF-8 are repaired, as `String(decoding:)` does).
    public var string: String? {
        switch self {
        case .simple(let s): return s
        case .bulk(let b): return String(decoding: b, as: UTF8.self)
        default: return nil
        }
    }

    public var int: Int64? {
        if case .integer(let n) = self { return n }
        return nil
    }

    /// The elements of an array, set or push.
    public var elements: [RESPValue]? {
        switch self {
        case .array(let a), .push(let a): return a
        default: return nil
        }
    }

    /// The message of an error reply.
    public var errorMessage: String? {
        if case .error(let message) = self { return message }
        return nil
    }

    public var isError: Bool { errorMessage != nil }
}

/// Bounds on what the decoder accepts. Redis's own limits are larger (`proto-max-bulk-len` 512 MB); the hub never
/// stores or asks for anything near these.
public struct RESPLimits: Sendable, Equatable {
    /// A header line or a simple string/error/number, without its CRLF.
    public var maxLineBytes: Int
    /// One bulk string or bulk error.
    public var maxBulkBytes: Int
    /// Elements of one aggregate (a map counts keys and values).
    public var maxElements: Int
    /// Aggregates inside aggregates (attributes included).
    public var maxDepth: Int

    public init(maxLineBytes: Int = 64 << 10, maxBulkBytes: Int = 64 << 20, maxElements: Int = 1 << 20, maxDepth: Int = 32) {
        self.maxLineBytes = max(1, maxLineBytes)
        self.maxBulkBytes = max(0, maxBulkBytes)
        self.maxElements = max(0, maxElements)
        self.maxDepth = max(1, maxDepth)
    }
}

/// Why a byte stream is not RESP (or not RESP the decoder accepts).
public struct RESPError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable, Equatable {
        /// A type byte RESP does not define.
        case unknownType
        /// A streamed string or aggregate (`$?`, `*?`): RESP3 defines them, Redis never sends them.
        case unsupported
        /// A length or count that is not a decimal integer, is negative where null is not allowed, or overflows.
        case badLength
        case badInteger
        case badDouble
        case badBoolean
        case badBigNumber
        /// A verbatim string without its three-byte format and colon.
        case badVerbatim
        /// A null (`_`) line that is not empty.
        case badNull
        /// A line ends with a bare CR or LF, or a bulk payload is not followed by CRLF.
        case badTerminator
        case lineTooLong
        case bulkTooLong
        case tooManyElements
        case tooDeep
    }

    public let kind: Kind
    /// Offset of the offending byte in the buffer the failing call was handed.
    public let offset: Int

    public var description: String { "RESP: \(kind.rawValue) at offset \(offset)" }
}

/// Incremental RESP decoder (see the file header for the read contract).
public struct RESPDecoder: Sendable {
    public enum Next: Sendable, Equatable {
        /// A complete top-level value; scanning goes on at `next`.
        case value(RESPValue, next: Int)
        /// No complete value: consume up to `keep` (the decoder has absorbed those bytes) and hand the rest back in
        /// front of the next read.
        case incomplete(keep: Int)
    }

    public let limits: RESPLimits
    /// The error that failed the stream: every later call throws it again.
    public private(set) var failure: RESPError? = nil

    private struct Aggregate: Sendable {
        let type: UInt8
        let expected: Int
        var items: [RESPValue]
    }
    private var stack: [Aggregate] = []

    /// A bulk string (or bulk error, or verbatim string) whose payload is arriving: `bytes` so far, then its CRLF.
    private struct PendingBulk: Sendable {
        let type: UInt8
        let length: Int
        var bytes: [UInt8]
        var terminatorSeen = 0
    }
    private var bulk: PendingBulk? = nil

    public init(limits: RESPLimits = RESPLimits()) {
        self.limits = limits
    }

    /// True between values: nothing absorbed that belongs to an unfinished one.
    public var isIdle: Bool { stack.isEmpty && bulk == nil && failure == nil }

    /// The next complete top-level value of `buffer` at or after `start`.
    public mutating func next(in buffer: UnsafeRawBufferPointer, from start: Int) throws(RESPError) -> Next {
        if let failure { throw failure }
        do throws(RESPError) {
            return try scan(buffer, from: start)
        } catch {
            failure = error
            stack = []
            bulk = nil
            throw error
        }
    }

    /// One value after another, in three phases: the rest of a bulk payload (`continueBulk`), else a type byte and
    /// its line (`nextLine`), then what that line means (`open`). A value closes the aggregates it completes.
    private mutating func scan(_ buffer: UnsafeRawBufferPointer, from start: Int) throws(RESPError) -> Next {
        var i = max(0, min(start, buffer.count))
        while true {
            let value: RESPValue?
            if bulk != nil {
                guard let payload = try continueBulk(buffer, at: &i) else { return .incomplete(keep: i) }
                value = payload
            } else {
                guard let line = try nextLine(buffer, at: i) else { return .incomplete(keep: i) }
                i = line.after
                value = try open(line, available: buffer.count - i)
            }
            if let value, let done = complete(value) { return .value(done, next: i) }
        }
    }

    /// The payload bytes of the pending bulk, then its CRLF, each possibly split across reads. nil when they have not
    /// all arrived; `i` moves past what was absorbed either way.
    private mutating func continueBulk(_ buffer: UnsafeRawBufferPointer, at i: inout Int) throws(RESPError) -> RESPValue? {
        guard var pending = bulk else { return nil }
        let count = buffer.count
        let want = pending.length - pending.bytes.count
        if want > 0 {
            let take = min(want, count - i)
            if take > 0 {
                pending.bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[i..<(i + take)]))
                i += take
            }
            if take < want {
                bulk = pending
                return nil
            }
        }
        while pending.terminatorSeen < 2 {
            guard i < count else {
                bulk = pending
                return nil
            }
            let expected: UInt8 = pending.terminatorSeen == 0 ? 0x0D : 0x0A
            guard buffer[i] == expected else { throw RESPError(kind: .badTerminator, offset: i) }
            pending.terminatorSeen += 1
            i += 1
        }
        bulk = nil
        return try Self.bulkValue(type: pending.type, pending.bytes, offset: i)
    }

    /// A type byte and its line, found without absorbing anything.
    private struct Line {
        let type: UInt8
        let bytes: UnsafeRawBufferPointer
        /// Where the line's bytes start in the read, for errors.
        let offset: Int
        /// Just past its CRLF.
        let after: Int
    }

    /// The line starting at `i`, or nil when it has not all arrived. An unknown type byte fails at once.
    private func nextLine(_ buffer: UnsafeRawBufferPointer, at i: Int) throws(RESPError) -> Line? {
        guard i < buffer.count else { return nil }
        let type = buffer[i]
        guard Self.isKnownType(type) else { throw RESPError(kind: .unknownType, offset: i) }
        guard let lineEnd = try Self.findLineEnd(buffer, from: i + 1, limit: limits.maxLineBytes) else { return nil }
        return Line(type: type, bytes: UnsafeRawBufferPointer(rebasing: buffer[(i + 1)..<lineEnd]), offset: i + 1,
                    after: lineEnd + 2)
    }

    /// What a line means: a value complete with its line, or nil when it opened a bulk or an aggregate (or an empty
    /// attribute, which annotates the next value). `available`: bytes of this read after the line.
    private mutating func open(_ l: Line, available: Int) throws(RESPError) -> RESPValue? {
        let line = l.bytes
        switch l.type {
        case UInt8(ascii: "+"):
            return .simple(String(decoding: line, as: UTF8.self))
        case UInt8(ascii: "-"):
            return .error(String(decoding: line, as: UTF8.self))
        case UInt8(ascii: ":"):
            guard let n = Self.parseInteger(line) else { throw RESPError(kind: .badInteger, offset: l.offset) }
            return .integer(n)
        case UInt8(ascii: "_"):
            guard line.isEmpty else { throw RESPError(kind: .badNull, offset: l.offset) }
            return .null
        case UInt8(ascii: "#"):
            guard line.count == 1, line[0] == UInt8(ascii: "t") || line[0] == UInt8(ascii: "f") else {
                throw RESPError(kind: .badBoolean, offset: l.offset)
            }
            return .boolean(line[0] == UInt8(ascii: "t"))
        case UInt8(ascii: ","):
            guard let d = Self.parseDouble(line) else { throw RESPError(kind: .badDouble, offset: l.offset) }
            return .double(d)
        case UInt8(ascii: "("):
            guard Self.isBigNumber(line) else { throw RESPError(kind: .badBigNumber, offset: l.offset) }
            return .bigNumber(String(decoding: line, as: UTF8.self))
        case UInt8(ascii: "$"), UInt8(ascii: "!"), UInt8(ascii: "="):
            return try openBulk(l, available: available)
        case UInt8(ascii: "*"), UInt8(ascii: "~"), UInt8(ascii: "%"), UInt8(ascii: ">"), UInt8(ascii: "|"):
            return try openAggregate(l)
        default:
            throw RESPError(kind: .unknownType, offset: l.offset - 1)
        }
    }

    /// A bulk string's length line: null, or the start of a payload (`bulk`).
    private mutating func openBulk(_ l: Line, available: Int) throws(RESPError) -> RESPValue? {
        if l.bytes.first == UInt8(ascii: "?") { throw RESPError(kind: .unsupported, offset: l.offset) }
        guard let n = Self.parseInteger(l.bytes), n >= (l.type == UInt8(ascii: "$") ? -1 : 0) else {
            throw RESPError(kind: .badLength, offset: l.offset)
        }
        if n == -1 { return .null }
        guard n <= Int64(limits.maxBulkBytes) else { throw RESPError(kind: .bulkTooLong, offset: l.offset) }
        let length = Int(n)
        var bytes: [UInt8] = []
        // Reserve what has arrived at most: the length alone is not a reason to allocate.
        bytes.reserveCapacity(min(length, available))
        bulk = PendingBulk(type: l.type, length: length, bytes: bytes)
        return nil
    }

    /// An aggregate's count line: null, an empty aggregate, or a new open one on `stack`.
    private mutating func openAggregate(_ l: Line) throws(RESPError) -> RESPValue? {
        if l.bytes.first == UInt8(ascii: "?") { throw RESPError(kind: .unsupported, offset: l.offset) }
        guard let n = Self.parseInteger(l.bytes), n >= (l.type == UInt8(ascii: "*") ? -1 : 0) else {
            throw RESPError(kind: .badLength, offset: l.offset)
        }
        if n == -1 { return .null }
        // A map or attribute of n pairs holds 2n values.
        let pairs = l.type == UInt8(ascii: "%") || l.type == UInt8(ascii: "|")
        guard n <= Int64(pairs ? limits.maxElements / 2 : limits.maxElements) else {
            throw RESPError(kind: .tooManyElements, offset: l.offset)
        }
        let expected = pairs ? Int(n) * 2 : Int(n)
        guard stack.count < limits.maxDepth else { throw RESPError(kind: .tooDeep, offset: l.after - 1) }
        if expected == 0 { return l.type == UInt8(ascii: "|") ? nil : Self.aggregateValue(type: l.type, []) }
        var items: [RESPValue] = []
        items.reserveCapacity(min(expected, 1024))
        stack.append(Aggregate(type: l.type, expected: expected, items: items))
        return nil
    }

    private static func isKnownType(_ type: UInt8) -> Bool {
        switch type {
        case UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: ":"), UInt8(ascii: "_"), UInt8(ascii: "#"), UInt8(ascii: ","),
             UInt8(ascii: "("), UInt8(ascii: "$"), UInt8(ascii: "!"), UInt8(ascii: "="), UInt8(ascii: "*"), UInt8(ascii: "~"),
             UInt8(ascii: "%"), UInt8(ascii: ">"), UInt8(ascii: "|"):
            return true
        default:
            return false
        }
    }

    /// Adds a finished value to the innermost open aggregate, closing every aggregate it completes. Returns the
    /// top-level value when one is complete.
    private mutating func complete(_ value: RESPValue) -> RESPValue? {
        var value = value
        while var top = stack.popLast() {
            top.items.append(value)
            guard top.items.count == top.expected else {
                stack.append(top)
                return nil
            }
            if top.type == UInt8(ascii: "|") { return nil }  // attributes dropped: the annotated value follows
            value = Self.aggregateValue(type: top.type, top.items)
        }
        return value
    }

    private static func aggregateValue(type: UInt8, _ items: [RESPValue]) -> RESPValue {
        switch type {
        case UInt8(ascii: "%"): return .map(items)
        case UInt8(ascii: ">"): return .push(items)
        default: return .array(items)
        }
    }

    private static func bulkValue(type: UInt8, _ bytes: [UInt8], offset: Int) throws(RESPError) -> RESPValue {
        switch type {
        case UInt8(ascii: "!"):
            return .error(String(decoding: bytes, as: UTF8.self))
        case UInt8(ascii: "="):
            guard bytes.count >= 4, bytes[3] == UInt8(ascii: ":") else { throw RESPError(kind: .badVerbatim, offset: offset) }
            return .bulk(Array(bytes[4...]))
        default:
            return .bulk(bytes)
        }
    }

    /// The index of the CR of the CRLF that ends the line starting at `from`, or nil when it has not arrived.
    /// A bare CR or LF inside the line is an error (simple strings cannot hold them), and so is a line longer than
    /// `limit` whatever follows.
    private static func findLineEnd(_ buffer: UnsafeRawBufferPointer, from: Int, limit: Int) throws(RESPError) -> Int? {
        let count = buffer.count
        var j = from
        let stop = min(count, from &+ limit &+ 1)
        while j < stop {
            let b = buffer[j]
            if b == 0x0D {
                guard j + 1 < count else { return nil }
                guard buffer[j + 1] == 0x0A else { throw RESPError(kind: .badTerminator, offset: j) }
                return j
            }
            if b == 0x0A { throw RESPError(kind: .badTerminator, offset: j) }
            j += 1
        }
        if j - from > limit { throw RESPError(kind: .lineTooLong, offset: from) }
        return nil
    }

    /// A decimal Int64: an optional sign, then 1-19 digits, overflow-checked.
    static func parseInteger(_ line: UnsafeRawBufferPointer) -> Int64? {
        var i = 0
        var negative = false
        if let first = line.first, first == UInt8(ascii: "-") || first == UInt8(ascii: "+") {
            negative = first == UInt8(ascii: "-")
            i = 1
        }
        guard i < line.count else { return nil }
        var value: Int64 = 0
        while i < line.count {
            let d = line[i] &- UInt8(ascii: "0")
            guard d <= 9 else { return nil }
            let (m, o1) = value.multipliedReportingOverflow(by: 10)
            let (s, o2) = negative ? m.subtractingReportingOverflow(Int64(d)) : m.addingReportingOverflow(Int64(d))
            guard !o1, !o2 else { return nil }
            value = s
            i += 1
        }
        return value
    }

    /// A RESP3 double: `inf`, `-inf`, `nan`, or a decimal with optional fraction and exponent.
    static func parseDouble(_ line: UnsafeRawBufferPointer) -> Double? {
        guard !line.isEmpty, line.count <= 64 else { return nil }
        let text = String(decoding: line, as: UTF8.self)
        switch text {
        case "inf", "+inf": return .infinity
        case "-inf": return -.infinity
        case "nan", "-nan": return .nan
        default: break
        }
        // Digits, one sign at the start or after the exponent, one dot, one exponent: no hex, no "infinity".
        var sawDigit = false, sawDot = false, sawExp = false
        for (k, b) in line.enumerated() {
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): sawDigit = true
            case UInt8(ascii: "+"), UInt8(ascii: "-"):
                guard k == 0 || line[k - 1] == UInt8(ascii: "e") || line[k - 1] == UInt8(ascii: "E") else { return nil }
            case UInt8(ascii: "."):
                guard !sawDot, !sawExp else { return nil }
                sawDot = true
            case UInt8(ascii: "e"), UInt8(ascii: "E"):
                guard !sawExp, sawDigit else { return nil }
                sawExp = true
            default: return nil
            }
        }
        guard sawDigit else { return nil }
        return Double(text)
    }

    /// A RESP3 big number: an optional sign and at least one digit.
    static func isBigNumber(_ line: UnsafeRawBufferPointer) -> Bool {
        var digits = line[...]
        if let first = digits.first, first == UInt8(ascii: "-") || first == UInt8(ascii: "+") { digits = digits.dropFirst() }
        return !digits.isEmpty && digits.allSatisfy { $0 &- UInt8(ascii: "0") <= 9 }
    }
}

/// RESP requests: a command is an array of bulk strings. Appends to a caller's buffer (pipelining is appending
/// several commands before one write), with no intermediate strings.
public enum RESPEncoder {
    /// `*count\r\n`: the header of a command of `count` arguments, which the caller then appends.
    public static func appendArrayHeader(_ count: Int, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "*"))
        appendDecimal(count, to: &out)
        out.append(0x0D); out.append(0x0A)
    }

    public static func appendBulk(_ bytes: UnsafeRawBufferPointer, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "$"))
        appendDecimal(bytes.count, to: &out)
        out.append(0x0D); out.append(0x0A)
        out.append(contentsOf: bytes)
        out.append(0x0D); out.append(0x0A)
    }

    public static func appendBulk(_ bytes: [UInt8], to out: inout [UInt8]) {
        bytes.withUnsafeBytes { appendBulk($0, to: &out) }
    }

    public static func appendBulk(_ string: String, to out: inout [UInt8]) {
        var s = string
        s.withUTF8 { appendBulk(UnsafeRawBufferPointer($0), to: &out) }
    }

    public static func appendBulk(_ n: Int, to out: inout [UInt8]) {
        appendBulk(String(n), to: &out)
    }

    /// A whole command of string arguments (`["XRANGE", key, "-", "+"]`).
    public static func appendCommand(_ arguments: [String], to out: inout [UInt8]) {
        appendArrayHeader(arguments.count, to: &out)
        for argument in arguments { appendBulk(argument, to: &out) }
    }

    public static func command(_ arguments: [String]) -> [UInt8] {
        var out: [UInt8] = []
        appendCommand(arguments, to: &out)
        return out
    }

    /// Decimal digits; up to 15 of them fit in a small string, so no allocation for any realistic count.
    static func appendDecimal(_ n: Int, to out: inout [UInt8]) {
        out.append(contentsOf: String(n).utf8)
    }
}
