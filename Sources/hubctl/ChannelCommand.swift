import Hub

enum ChannelCommand {
    static let spec = CommandSpec("channel", valueFlags: ["account"], positionals: ["NAME"])
    static let help = """
        usage: hubctl channel NAME [--account A] [--json]

        Detail of one channel: counts, the accounts with the most subscribed connections (at most 10), and the
        last 20 events, newest first. --account restricts both lists to one account. In cluster mode (--broker)
        every other live node's view of the channel follows, under "node ID".

        examples:
          hubctl channel wallet_updates
          hubctl channel wallet_updates --account acc_1
        """

    static func run(_ context: Context) throws(CLIError) {
        var request = RequestLine(op: "channel")
        request.add("channel", string: context.args.positionals[0])
        request.add("account", string: context.value("account"))
        let session = try context.connect()
        let reply = try session.call(request.text, context: context)
        if context.json { writeStdout(bytes: reply.raw); return }
        let channel = reply.json["channel"]
        guard channel.object != nil else { throw .unexpected("\"channel\" is missing or not an object") }
        let clock = now()
        var lines = render(channel, style: context.style, now: clock)
        lines += otherNodesLines(reply.json, style: context.style) { answer in render(answer["channel"], style: context.style, now: clock) }
        print(lines.joined(separator: "\n"))
    }

    static func render(_ channel: JSON, style: Style, now: Double) -> [String] {
        var lines = [style.bold("channel \(channel["name"].text ?? "?")")]
        lines += keyValueLines([
            ("subscribers", Units.count(channel["subscribers"].int)),
            ("accounts", Units.count(channel["accounts"].int)),
            ("published", Units.count(channel["published"].int)),
            ("delivered", Units.count(channel["delivered"].int)),
            ("last event", Units.ago(channel["lastEventAt"].double, now: now)),
        ], style: style)

        lines.append("")
        lines.append(style.bold("top accounts"))
        let accounts = channel["topAccounts"].array ?? []
        if accounts.isEmpty {
            lines.append("  (no subscribed connections)")
        } else {
            var table = Table([("ACCOUNT", .left), ("SUBSCRIBERS", .right)])
            for account in accounts {
                table.add([account["account"].text ?? "?", Units.count(account["subscribers"].int)])
            }
            lines += table.render(style, indent: "  ")
        }

        lines.append("")
        lines.append(style.bold("recent events"))
        let events = channel["recentEvents"].array ?? []
        if events.isEmpty {
            lines.append("  (no events yet)")
        } else {
            var table = Table([("TYPE", .left), ("ACCOUNT", .left), ("SEQ", .right), ("SIZE", .right),
                               ("DELIVERED", .right), ("WHEN", .left)])
            for event in events {
                let account = event["broadcast"].bool == true ? "broadcast" : (event["account"].text ?? "?")
                table.add([event["type"].text ?? "?", account, event["seq"].int.map(String.init) ?? "-",
                           Units.bytes(event["size"].int), Units.count(event["delivered"].int),
                           Units.ago(event["at"].double, now: now)])
            }
            lines += table.render(style, indent: "  ")
        }
        return lines
    }
}
