import Hub

enum HistoryCommand {
    static let spec = CommandSpec("history", valueFlags: ["account", "since"], boolFlags: ["broadcast"], positionals: ["CHANNEL"])
    static let help = """
        usage: hubctl history CHANNEL (--account A | --broadcast) [--since SEQ] [--json]

        The events a resuming client could be replayed: one stream's retained history (an account's events on
        the channel, or the channel's broadcasts), oldest first, after --since (default 0): seq, type, age and
        framed size. The first line says the stream's epoch and last seq. At most 1000 events per call; when
        more are retained, a last line says which --since shows the next ones.

        examples:
          hubctl history wallet_updates --account acc_1
          hubctl history wallet_updates --broadcast --since 40
        """

    static func run(_ context: Context) throws(CLIError) {
        let account = context.value("account")
        let broadcast = context.flag("broadcast")
        guard (account != nil) != broadcast else { throw context.usage("give exactly one of --account A or --broadcast") }
        var request = RequestLine(op: "history")
        request.add("channel", string: context.args.positionals[0])
        request.add("account", string: account)
        if broadcast { request.add("broadcast", raw: "true") }
        if let since = try context.intValue("since") {
            guard since >= 0 else { throw context.usage("--since must be 0 or more, got \(since)") }
            request.add("since", raw: String(since))
        }
        let session = try context.connect()
        let reply = try session.call(request.text, context: context)
        if context.json { writeStdout(bytes: reply.raw); return }
        let history = reply.json["history"]
        guard history.object != nil else { throw .unexpected("\"history\" is missing or not an object") }
        print(render(history, style: context.style, now: now()).joined(separator: "\n"))
    }

    static func render(_ history: JSON, style: Style, now: Double) -> [String] {
        let stream = history["broadcast"].bool == true ? "broadcast" : "account \(history["account"].string ?? "?")"
        var head = style.bold("history \(history["channel"].string ?? "?") \(stream)")
        if let epoch = history["epoch"].string {
            head += "  epoch \(epoch)  last seq \(history["seq"].int.map(String.init) ?? "-")"
        } else {
            head += "  (no such stream: nothing published recently, nobody subscribed)"
        }
        var lines = [head]
        let events = history["events"].array ?? []
        if events.isEmpty {
            if history["epoch"].string != nil { lines.append("(no retained events after this seq)") }
            return lines
        }
        var table = Table([("SEQ", .right), ("TYPE", .left), ("AGE", .left), ("SIZE", .right)])
        for event in events {
            table.add([event["seq"].int.map(String.init) ?? "-", event["type"].string ?? "?",
                       Units.ago(event["at"].double, now: now), Units.bytes(event["size"].int)])
        }
        lines += table.render(style)
        if history["more"].bool == true, let last = events.last?["seq"].int {
            lines.append("more retained: hubctl history ... --since \(last)")
        }
        return lines
    }
}
