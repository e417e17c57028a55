import Foundation
import Hub

enum PublishCommand {
    static let spec = CommandSpec("publish", valueFlags: ["account", "type", "data-file", "idempotency-key"], boolFlags: ["broadcast"],
                                  positionals: ["CHANNEL", "DATA"], optionalPositionals: 1)
    static let help = """
        usage: hubctl publish CHANNEL (--account A | --broadcast) --type T [DATA | --data-file F | -]
                              [--idempotency-key K] [--json]

        Publish one event. DATA is JSON text (any value; omitted means null), given inline, read from a file
        with --data-file, or from stdin with -. It is checked locally first and then sent as typed, byte for
        byte: only surrounding whitespace is trimmed and line breaks between tokens become spaces, because a
        request is one line. Prints the event's sequence number and how many connections it was handed to.
        With --idempotency-key, a repeat of the same key on the same stream within the hub's window is not
        delivered again: the hub answers with the first publish's seq, marked as a duplicate.

        examples:
          hubctl publish wallet_updates --account acc_1 --type wallet_balance_changed '{"balance":"1.5"}'
          hubctl publish profile_updates --broadcast --type maintenance '{}'
          jq -c . event.json | hubctl publish wallet_updates --account acc_1 --type wallet_balance_changed -
        """

    static func run(_ context: Context) throws(CLIError) {
        let channel = context.args.positionals[0]
        let account = context.value("account")
        let broadcast = context.flag("broadcast")
        guard (account != nil) != broadcast else {
            throw context.usage("give exactly one of --account A or --broadcast")
        }
        if let account, account.isEmpty { throw context.usage("--account must not be empty") }
        guard let type = context.value("type"), !type.isEmpty else { throw context.usage("missing --type T") }

        let data = try readData(context)
        var request = RequestLine(op: "publish")
        request.add("channel", string: channel)
        request.add("account", string: account)
        if broadcast { request.add("broadcast", raw: "true") }
        request.add("type", string: type)
        if let data { request.add("data", raw: String(decoding: data, as: UTF8.self)) }
        request.add("idempotencyKey", string: context.value("idempotency-key"))

        let session = try context.connect()
        let reply = try session.call(request.text, context: context)
        guard let seq = reply.json["seq"].int, let delivered = reply.json["delivered"].int else {
            throw .unexpected("publish reply without integer \"seq\" and \"delivered\": \(HubSession.snippet(reply.raw))")
        }
        if context.json { writeStdout(bytes: reply.raw); return }
        if reply.json["duplicate"].bool == true {
            print("duplicate of seq \(seq) (delivered to \(delivered) connection\(delivered == 1 ? "" : "s") then): not delivered again")
            return
        }
        print("published seq \(seq), delivered to \(delivered) connection\(delivered == 1 ? "" : "s")")
        if delivered == 0 {
            let hint = account.map { "no subscribed connection for \(TerminalText.escape($0)): fall back to push" }
                ?? "no connection is subscribed to \(TerminalText.escape(channel))"
            print(context.style.yellow("hint: " + hint))
        }
    }

    /// The data bytes to embed, or nil when no data was given.
    static func readData(_ context: Context) throws(CLIError) -> [UInt8]? {
        let inline = context.args.positionals.count > 1 ? context.args.positionals[1] : nil
        let file = context.value("data-file")
        if inline != nil && file != nil { throw context.usage("give DATA, --data-file F or -, not several") }
        let bytes: [UInt8]
        let source: String
        if let file {
            guard let contents = FileManager.default.contents(atPath: file) else {
                let reason = FileManager.default.fileExists(atPath: file) ? "cannot read" : "no such file"
                throw .input("\(reason): --data-file \(file)")
            }
            bytes = Array(contents)
            source = file
        } else if inline == "-" {
            do { bytes = try StandardStream.readInput() } catch { throw .input("cannot read stdin: \(error)") }
            source = "stdin"
        } else if let inline {
            bytes = Array(inline.utf8)
            source = "DATA"
        } else {
            return nil
        }
        if let problem = JSONCheck.problem(in: bytes) { throw .input("invalid JSON in \(source): \(problem)") }
        return JSONCheck.oneLine(bytes)
    }
}

/// Local validation of JSON text, with the position of the first problem.
enum JSONCheck {
    /// nil when `bytes` is one valid JSON value (any type), else "line 2, column 7 (byte 14): Invalid value".
    static func problem(in bytes: [UInt8]) -> String? {
        if JSONCheck.oneLine(bytes).isEmpty { return "it is empty" }
        do {
            _ = try JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed])
            return nil
        } catch {
            let detail = ((error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String) ?? "\(error)"
            var offset: Int?
            if let range = detail.range(of: "character ") {
                offset = Int(detail[range.upperBound...].prefix(while: \.isNumber))
            } else if detail.lowercased().contains("end of file") || detail.lowercased().contains("unexpected end") {
                offset = bytes.count
            }
            var reason = detail
            if let around = reason.range(of: " around ") { reason = String(reason[..<around.lowerBound]) }
            if reason.hasSuffix(".") { reason.removeLast() }
            guard let offset else { return reason }
            return position(offset, in: bytes) + ": " + reason
        }
    }

    /// "line L, column C (byte B)", all 1-based except the 0-based byte offset.
    static func position(_ offset: Int, in bytes: [UInt8]) -> String {
        let clamped = min(max(0, offset), bytes.count)
        let before = bytes[..<clamped]
        let line = before.filter { $0 == 0x0A }.count + 1
        let lineStart = before.lastIndex(of: 0x0A).map { $0 + 1 } ?? 0
        let column = String(decoding: bytes[lineStart..<clamped], as: UTF8.self).count + 1
        return "line \(line), column \(column) (byte \(clamped))"
    }

    /// Trims surrounding whitespace and turns CR/LF (only possible between tokens in valid JSON) into spaces.
    static func oneLine(_ bytes: [UInt8]) -> [UInt8] {
        let isSpace: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }
        guard let first = bytes.firstIndex(where: { !isSpace($0) }),
              let last = bytes.lastIndex(where: { !isSpace($0) }) else { return [] }
        return bytes[first...last].map { $0 == 0x0A || $0 == 0x0D ? 0x20 : $0 }
    }
}
