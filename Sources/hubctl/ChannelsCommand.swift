import Hub

enum ChannelsCommand {
    static let spec = CommandSpec("channels")
    static let help = """
        usage: hubctl channels [--json]

        One row per configured channel: subscribers, distinct accounts, events published (total and per
        second), deliveries, and when the last event was published.

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
        var table = Table([("CHANNEL", .left), ("SUBSCRIBERS", .right), ("ACCOUNTS", .right),
                           ("PUBLISHED", .right), ("/S", .right), ("DELIVERED", .right), ("LAST EVENT", .left)])
        for channel in channels {
            table.add([channel["name"].text ?? "?", Units.count(channel["subscribers"].int),
                       Units.count(channel["accounts"].int), Units.count(channel["published"].int),
                       Units.rate(channel["publishedPerSecond"].double), Units.count(channel["delivered"].int),
                       Units.ago(channel["lastEventAt"].double, now: now)])
        }
        return table.render(style)
    }
}
