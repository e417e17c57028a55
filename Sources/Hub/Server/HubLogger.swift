import COpenSSL
import Glibc
import HubJSON
import Synchronization

/// How serious a log line is; `--log-level` drops everything below it.
public enum LogLevel: UInt8, Sendable, Comparable, CaseIterable {
    case debug, info, warn, error

    public var name: String {
        switch self {
        case .debug: "debug"
        case .info: "info"
        case .warn: "warn"
        case .error: "error"
        }
    }

    public init?(name: String) {
        guard let level = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = level
    }

    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }
}

/// `--log-format`: `text` for a person at a terminal, `json` (one object per line) for a log shipper.
public enum LogFormat: String, Sendable, CaseIterable {
    case text, json

    /// The default when `--log-format` is not given: JSON unless stderr is a terminal (a person reads it).
    public static func automatic(stderrIsTerminal: Bool = isatty(STDERR_FILENO) == 1) -> LogFormat {
        stderrIsTerminal ? .text : .json
    }
}

/// `--log-accounts`: whether a line about a connection names its account. Account ids can be personal data
/// (an email, a user id), so the default leaves them out.
public enum AccountLogging: String, Sendable, CaseIterable {
    /// No `account` field.
    case omit
    /// `account` is the first 16 hex digits of the id's SHA-256: lines of one account can be correlated, the id is
    /// not written. Short, guessable ids can still be found by hashing candidates: this is pseudonymisation only.
    case hash
    /// `account` is the id as the token's `sub` gives it.
    case plain
}

/// One `key=value` of a log line. Values are numbers or text, never a token or a secret: call sites pass only
/// connection ids, peer addresses, close codes, reasons and (through `--log-accounts`) account ids.
public struct LogField: Sendable, Equatable {
    public enum Value: Sendable, Equatable { case text(String), number(Int) }
    public let key: String
    public let value: Value

    public static func conn(_ id: String) -> LogField { LogField(key: "conn", value: .text(id)) }
    public static func remote(_ address: String) -> LogField { LogField(key: "remote", value: .text(address)) }
    public static func code(_ code: Int) -> LogField { LogField(key: "code", value: .number(code)) }
    public static func reason(_ reason: String) -> LogField { LogField(key: "reason", value: .text(reason)) }
    public static func text(_ key: String, _ value: String) -> LogField { LogField(key: key, value: .text(value)) }
    public static func number(_ key: String, _ value: Int) -> LogField { LogField(key: key, value: .number(value)) }
}

/// The hub's one logger: every line the server writes goes through `log`, in the configured format, and lines
/// below the level are dropped before anything is formatted. The level can change while the hub runs (SIGHUP);
/// the format cannot (a shipper parses one format).
public final class HubLogger: Sendable {
    public let format: LogFormat
    public let accounts: AccountLogging
    private let minimum: Atomic<UInt8>
    /// Where finished lines go (stderr in the server; a closure in tests and embedding).
    private let sink: @Sendable (String) -> Void
    /// True when the sink takes bare messages (`init(lines:)`): no timestamp, level or fields are added.
    private let bare: Bool

    /// A logger that writes to stderr through `StandardStream` (whole lines, never traps).
    public convenience init(format: LogFormat, level: LogLevel, accounts: AccountLogging = .omit) {
        self.init(format: format, level: level, accounts: accounts) { StandardStream.error.writeLine($0) }
    }

    /// A logger that hands finished lines (timestamp, level and fields included) to `sink`.
    public init(format: LogFormat, level: LogLevel, accounts: AccountLogging = .omit, sink: @escaping @Sendable (String) -> Void) {
        self.format = format
        self.accounts = accounts
        minimum = Atomic(level.rawValue)
        self.sink = sink
        bare = false
    }

    /// A logger that hands each message, as text without timestamp or fields, to `lines` (tests, embedding).
    public init(lines: @escaping @Sendable (String) -> Void, level: LogLevel = .info) {
        format = .text
        accounts = .omit
        minimum = Atomic(level.rawValue)
        sink = lines
        bare = true
    }

    public var level: LogLevel {
        get { LogLevel(rawValue: minimum.load(ordering: .relaxed)) ?? .info }
    }

    /// Changes the level (SIGHUP reload).
    public func setLevel(_ level: LogLevel) { minimum.store(level.rawValue, ordering: .relaxed) }

    /// Whether a line at `level` would be written: check it before building costly fields.
    @inline(__always)
    public func enabled(_ level: LogLevel) -> Bool { level.rawValue >= minimum.load(ordering: .relaxed) }

    public func log(_ level: LogLevel, _ message: String, _ fields: [LogField] = []) {
        guard enabled(level) else { return }
        if bare {
            sink(fields.isEmpty ? message : message + " " + Self.textFields(fields))
            return
        }
        sink(render(level, message, fields, now: Self.now()))
    }

    public func debug(_ message: String, _ fields: [LogField] = []) { log(.debug, message, fields) }
    public func info(_ message: String, _ fields: [LogField] = []) { log(.info, message, fields) }
    public func warn(_ message: String, _ fields: [LogField] = []) { log(.warn, message, fields) }
    public func error(_ message: String, _ fields: [LogField] = []) { log(.error, message, fields) }

    /// An info-level `(String) -> Void` for code that logs plain lines (the Redis broker, the state file).
    public var lines: @Sendable (String) -> Void { { [self] in self.info($0) } }

    /// The `account` field for `id` under `--log-accounts`, or nil when accounts are omitted.
    public func accountField(_ id: String) -> LogField? {
        switch accounts {
        case .omit: nil
        case .plain: LogField(key: "account", value: .text(id))
        case .hash: LogField(key: "account", value: .text(Self.accountHash(id)))
        }
    }

    /// The first 16 hex digits of SHA-256(`id`).
    static func accountHash(_ id: String) -> String {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let bytes = Array(id.utf8)
        let ok = bytes.withUnsafeBufferPointer { b in
            digest.withUnsafeMutableBufferPointer { d in EVP_Digest(b.baseAddress, b.count, d.baseAddress, &length, EVP_sha256(), nil) }
        }
        guard ok == 1 else { return "?" }
        let hex = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for byte in digest.prefix(8) {
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// One finished line without its newline.
    /// - text: `2026-11-29T00:47:13Z hub: MESSAGE key=value ...` (the format the hub always wrote, fields appended;
    ///   warn and error lines also say so after `hub:`).
    /// - json: `{"ts":"2026-11-29T00:47:13.123Z","level":"info","msg":"MESSAGE","conn":"0-7",...}`. Strings are
    ///   escaped only where JSON requires (`"`, `\`, control characters), so `/` stays `/` and a grep for a
    ///   message's text (`listening on ws://127.0.0.1:8080/ws`) finds it in either format.
    func render(_ level: LogLevel, _ message: String, _ fields: [LogField], now: timespec) -> String {
        switch format {
        case .text:
            let tag = level >= .warn ? "\(level.name): " : ""
            let head = "\(Self.timestamp(now, milliseconds: false)) hub: \(tag)\(message)"
            return fields.isEmpty ? head : head + " " + Self.textFields(fields)
        case .json:
            var w = JSONWriter(capacity: 128 + message.utf8.count)
            w.beginObject()
            w.key("ts")
            w.string(Self.timestamp(now, milliseconds: true))
            w.key("level")
            w.string(level.name)
            w.key("msg")
            w.string(message)
            for field in fields {
                w.key(field.key)
                switch field.value {
                case .text(let s): w.string(s)
                case .number(let n): w.int(n)
                }
            }
            w.endObject()
            return String(decoding: w.bytes, as: UTF8.self)
        }
    }

    /// `key=value` pairs; a value with a space, `=` or `"` is quoted (and its `"` and `\` escaped).
    static func textFields(_ fields: [LogField]) -> String {
        fields.map { field in
            switch field.value {
            case .number(let n):
                return "\(field.key)=\(n)"
            case .text(let s):
                guard s.isEmpty || s.utf8.contains(where: { $0 <= 0x20 || $0 == 0x3D || $0 == 0x22 || $0 == 0x5C }) else {
                    return "\(field.key)=\(s)"
                }
                var quoted = "\""
                for c in s.unicodeScalars {
                    switch c {
                    case "\"": quoted += "\\\""
                    case "\\": quoted += "\\\\"
                    case "\n": quoted += "\\n"
                    default: quoted.unicodeScalars.append(c)
                    }
                }
                return "\(field.key)=\(quoted)\""
            }
        }.joined(separator: " ")
    }

    static func now() -> timespec {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return ts
    }

    /// RFC 3339 UTC: `2026-11-29T00:47:13Z`, or `2026-11-29T00:47:13.123Z` with milliseconds. From `gmtime_r`:
    /// Foundation's date formatting loads ICU's time-zone data at the first line and keeps ~2.5 MiB of it resident
    /// for the life of the process (docs/OPERATIONS.md, "Memory").
    public static func timestamp(_ ts: timespec, milliseconds: Bool) -> String {
        var seconds = ts.tv_sec
        var t = tm()
        guard gmtime_r(&seconds, &t) != nil else { return "?" }
        func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
        let base = "\(t.tm_year + 1900)-\(two(t.tm_mon + 1))-\(two(t.tm_mday))T\(two(t.tm_hour)):\(two(t.tm_min)):\(two(t.tm_sec))"
        guard milliseconds else { return base + "Z" }
        let ms = Int(ts.tv_nsec / 1_000_000)
        return base + "." + (ms < 10 ? "00" : ms < 100 ? "0" : "") + "\(ms)Z"
    }
}
