import Hub

enum ConnectionsCommand {
    static let spec = CommandSpec("connections", valueFlags: ["account", "channel", "limit"])
    static let help = """
        usage: hubctl connections [--account A] [--channel C] [--limit N] [--json]

        Open client connections: id, account, remote address, platform, app version, channels, time since
        connecting, queued outbound bytes, messages in/out. The filters combine; --limit defaults to 100.
        In cluster mode (--broker) every other live node's connections follow, under "node ID" (each node applies
        the filters and the limit to its own).

        examples:
          hubctl connections --account acc_1
          hubctl connections --channel wallet_updates --limit 20
        """

    static func run(_ context: Context) throws(CLIError) {
        var request = RequestLine(op: "connections")
        request.add("account", string: context.value("account"))
        request.add("channel", string: context.value("channel"))
        if let limit = try context.intValue("limit") {
            guard limit > 0 else { throw context.usage("--limit must be at least 1") }
            request.add("limit", raw: String(limit))
        }
        let session = try context.connect()
        let reply = try session.call(request.text, context: context)
        if context.json { writeStdout(bytes: reply.raw); return }
        guard let connections = reply.json["connections"].array else {
            throw .unexpected("\"connections\" is missing or not an array")
        }
        let total = reply.json["total"].int ?? connections.count
        let clock = now()
        var lines = render(connections, total: total, style: context.style, now: clock)
        lines += otherNodesLines(reply.json, style: context.style) { answer in
            render(answer["connections"].array ?? [], total: answer["total"].int ?? 0, style: context.style, now: clock)
        }
        print(lines.joined(separator: "\n"))
    }

    static func render(_ connections: [JSON], total: Int, style: Style, now: Double) -> [String] {
        if connections.isEmpty { return ["no matching connections"] }
        var table = Table([("ID", .left), ("ACCOUNT", .left), ("REMOTE", .left), ("PLATFORM", .left),
                           ("APP", .left), ("CHANNELS", .left), ("SINCE", .right), ("QUEUED", .right),
                           ("IN", .right), ("OUT", .right)])
        for c in connections {
            let channels = (c["channels"].array ?? []).compactMap(\.text).joined(separator: ",")
            let connectedAt = c["connectedAt"].double
            table.add([c["id"].text ?? "?", c["account"].text ?? "?", c["remote"].text ?? "-",
                       c["platform"].text ?? "-", c["appVersion"].text ?? "-",
                       channels.isEmpty ? "-" : channels,
                       connectedAt.map { Units.duration(now - $0) } ?? "-",
                       Units.bytes(c["queuedBytes"].int), Units.count(c["messagesIn"].int),
                       Units.count(c["messagesOut"].int)])
        }
        var lines = table.render(style)
        if total > connections.count {
            lines.append(style.dim("showing \(connections.count) of \(total) connections (raise --limit to see more)"))
        }
        return lines
    }
}
