import Hub

enum ChannelsCommand {
    static let spec = CommandSpec("channels")
    static let help = """
        usage: hubctl channels [--json]

        One row per configured channel: subscribers, distinct accounts, events published (total and per
        second), deliveries, and when the last event was published. In cluster mode (--broker) a CLUSTER column
        adds every live node's subscribers (from the node registry, at most a second old).

        examples:
          hubctl channels
          hubctl channels --json | jq '.channels[].name'
        """

    static func run(_ context: Context) throws(CLIError) {
        let session = try context.connect()
        let reply = try session.call(RequestLine(op: "channels").text, context: context)
        if context.json { writeStdout(bytes: reply.raw); return }
        guard let channels = reply.json["channels"].array else {
            throw .unexpected("\"channels\" is missing or not an array")
        }
        print(render(channels, style: context.style, now: now()).joined(separator: "\n"))
    }

    static func render(_ channels: [JSON], style: Style, now: Double) -> [String] {
        if channels.isEmpty { return ["no channels configured"] }
        // Cluster mode: the whole cluster's subscribers beside this node's (from the node registry).
        let cluster = channels.contains { $0["clusterSubscribers"].int != nil }
        var columns: [(String, Align)] = [("CHANNEL", .left), ("SUBSCRIBERS", .right)]
        if cluster { columns.append(("CLUSTER", .right)) }
        columns += [("ACCOUNTS", .right), ("PUBLISHED", .right), ("/S", .right), ("DELIVERED", .right), ("LAST EVENT", .left)]
        var table = Table(columns)
        for channel in channels {
            var row = [channel["name"].text ?? "?", Units.count(channel["subscribers"].int)]
            if cluster { row.append(Units.count(channel["clusterSubscribers"].int)) }
            row += [Units.count(channel["accounts"].int), Units.count(channel["published"].int),
                    Units.rate(channel["publishedPerSecond"].double), Units.count(channel["delivered"].int),
                    Units.ago(channel["lastEventAt"].double, now: now)]
            table.add(row)
        }
        return table.render(style) + (cluster ? ["SUBSCRIBERS, ACCOUNTS, PUBLISHED and DELIVERED are this node's; CLUSTER: every live node's subscribers"] : [])
    }
}
