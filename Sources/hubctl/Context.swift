import Foundation
import Hub

/// hubctl's exit codes (docs/HUBCTL.md).
enum ExitCode {
    static let ok: Int32 = 0
    static let hubError: Int32 = 1
    static let usage: Int32 = 2
    static let unreachable: Int32 = 3
    static let localInput: Int32 = 4
}

/// A failure that ends the command: the message goes to stderr as "error: ...", then the exit code.
struct CLIError: Error {
    var exitCode: Int32
    var message: String
    var hint: String?

    static func usage(_ message: String, command: String?) -> CLIError {
        CLIError(exitCode: ExitCode.usage, message: message,
                 hint: "see hubctl \(command.map { $0 + " " } ?? "")--help")
    }
    static func input(_ message: String, hint: String? = nil) -> CLIError {
        CLIError(exitCode: ExitCode.localInput, message: message, hint: hint)
    }
    static func unexpected(_ what: String) -> CLIError {
        CLIError(exitCode: ExitCode.hubError, message: "unexpected reply from hub: \(what)")
    }
}

/// Read-only navigation over a JSONSerialization result.
struct JSON {
    let value: Any?

    init(_ value: Any?) { self.value = value }

    static func parse(_ bytes: [UInt8]) -> JSON? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed])
        else { return nil }
        return JSON(object)
    }

    subscript(key: String) -> JSON { JSON((value as? [String: Any])?[key]) }

    var object: [String: Any]? { value as? [String: Any] }
    var array: [JSON]? { (value as? [Any])?.map { JSON($0) } }
    /// The string as received: for logic and `--json`, never for human output.
    var string: String? { value as? String }
    /// The string for human output: control characters made visible (`TerminalText.escape`). Every string a
    /// client, a backend or the hub supplied reaches the terminal through this or
    /// `TerminalText.escape` itself (`tail`'s data: JSONSerialization escapes C0 inside strings, not DEL or C1).
    var text: String? { string.map(TerminalText.escape) }
    var isNull: Bool { value == nil || value is NSNull }
    /// True for JSON `true`/`false` only: on Linux every NSNumber bridges to Bool, so look at the class.
    private var isBoolean: Bool {
        guard let value else { return false }
        return type(of: value) == Bool.self || String(describing: type(of: value)).contains("Boolean")
    }
    var bool: Bool? { isBoolean ? value as? Bool : nil }
    var double: Double? {
        if isBoolean { return nil }
        if let n = value as? NSNumber { return n.doubleValue }
        return nil
    }
    var int: Int? {
        guard let d = double, d.isFinite, d == d.rounded(), abs(d) < 9e18 else { return nil }
        return Int(d)
    }
    /// Compact text: strings as JSON strings, objects with sorted keys.
    var compact: String {
        guard let value, !(value is NSNull) else { return "null" }
        guard let data = try? JSONSerialization.data(
            withJSONObject: value, options: [.fragmentsAllowed, .sortedKeys, .withoutEscapingSlashes]),
              let text = String(data: data, encoding: .utf8) else { return "?" }
        return text
    }
}

/// What every command gets: parsed arguments and the global options.
struct Context {
    let args: ParsedArguments
    let command: String
    let environment: [String: String]
    let style: Style

    init(args: ParsedArguments, command: String) {
        self.args = args
        self.command = command
        self.environment = ProcessInfo.processInfo.environment
        self.style = Style.detect(noColorFlag: args.flags.contains("no-color"))
    }

    var json: Bool { args.flags.contains("json") }
    var socketPath: String { args.values["socket"] ?? environment["HUB_SOCKET"].flatMap { $0.isEmpty ? nil : $0 } ?? "./hub.sock" }
    func value(_ name: String) -> String? { args.values[name] }
    func flag(_ name: String) -> Bool { args.flags.contains(name) }

    func usage(_ message: String) -> CLIError { .usage(message, command: command) }

    func intValue(_ name: String) throws(CLIError) -> Int? {
        guard let text = value(name) else { return nil }
        guard let number = Int(text) else { throw usage("--\(name) needs a whole number, got \"\(text)\"") }
        return number
    }

    func connect(readTimeout: Double? = 10) throws(CLIError) -> HubSession {
        do {
            return HubSession(client: try AdminClient(socketPath: socketPath, readTimeout: readTimeout))
        } catch {
            throw HubSession.map(error, socketPath: socketPath)
        }
    }
}

/// One connection to the hub, with the reply checks every command shares.
struct HubSession {
    let client: AdminClient

    struct Reply {
        let raw: [UInt8]
        let json: JSON
    }

    static func map(_ error: AdminClientError, socketPath: String) -> CLIError {
        switch error {
        case .hubNotRunning:
            return CLIError(exitCode: ExitCode.unreachable, message: error.description,
                            hint: "hubctl uses --socket, else $HUB_SOCKET, else ./hub.sock")
        case .lineTooLong:
            return .unexpected(error.description)
        case .timedOut, .connectionClosed:
            return CLIError(exitCode: ExitCode.unreachable, message: "\(error.description) (socket \(socketPath))")
        default:
            return CLIError(exitCode: ExitCode.unreachable, message: error.description)
        }
    }

    /// Sends one request and returns the reply once it is known to be `{"ok":true,...}`.
    /// `{"ok":false}` becomes exit 1 with the hub's code and message (with `--json`, the reply is printed first).
    func call(_ line: String, context: Context) throws(CLIError) -> Reply {
        let raw: [UInt8]
        do { raw = try client.request(line) } catch { throw HubSession.map(error, socketPath: client.socketPath) }
        return try HubSession.check(raw, context: context)
    }

    static func check(_ raw: [UInt8], context: Context) throws(CLIError) -> Reply {
        guard let json = JSON.parse(raw), json.object != nil else { throw .unexpected(snippet(raw)) }
        if json["ok"].bool == true { return Reply(raw: raw, json: json) }
        guard json["ok"].bool == false, let code = json["error"]["code"].string else {
            throw .unexpected(snippet(raw))
        }
        if context.json { writeStdout(bytes: raw) }
        let message = json["error"]["message"].text ?? "(no message)"
        throw CLIError(exitCode: ExitCode.hubError, message: "\(TerminalText.escape(code)): \(message)")
    }

    /// The start of a reply line for an error message, control characters made visible.
    static func snippet(_ raw: [UInt8]) -> String {
        let text = TerminalText.escape(String(decoding: raw.prefix(300), as: UTF8.self))
        if raw.isEmpty { return "(an empty line)" }
        return raw.count > 300 ? text + "..." : text
    }
}

/// A request line built by hand, so values appear in a stable order and raw JSON can be embedded as is.
struct RequestLine {
    private var fields: [String] = []

    init(op: String) { add("op", string: op) }

    mutating func add(_ key: String, string: String?) {
        guard let string else { return }
        fields.append(AdminClient.jsonString(key) + ":" + AdminClient.jsonString(string))
    }
    mutating func add(_ key: String, raw: String?) {
        guard let raw else { return }
        fields.append(AdminClient.jsonString(key) + ":" + raw)
    }
    var text: String { "{" + fields.joined(separator: ",") + "}" }
}
