import Hub

enum StatusCommand {
    static let spec = CommandSpec("status")
    static let help = """
        usage: hubctl status [--json]

        Show the hub's health: version, uptime, threads and their load, connections, subscriptions, message and
        byte rates, publishes, drops, auth failures by reason, file descriptors, and recovery: the epoch, history
        memory, evictions, resumes by outcome, idempotent duplicates.

        examples:
          hubctl status
          hubctl status --json | jq .stats.connections
        """

    static func run(_ context: Context) throws(CLIError) {
        let session = try context.connect()
        let reply = try session.call(RequestLine(op: "stats").text, context: context)
        if context.json { writeStdout(bytes: reply.raw); return }
        let stats = reply.json["stats"]
        guard stats.object != nil else { throw .unexpected("\"stats\" is missing or not an object") }
        print(render(stats, style: context.style).joined(separator: "\n"))
    }

    /// The epoch, history memory and evictions, resumes by outcome (absent from hubs without recovery).
    static func historyLines(_ h: JSON) -> [(String, String)] {
        guard h.object != nil else { return [] }
        var memory = "\(Units.bytes(h["bytes"].int)) / \(Units.bytes(h["limitBytes"].int))"
        if let bytes = h["bytes"].int, let limit = h["limitBytes"].int, limit > 0 {
            memory += " (\(Units.percent(Double(bytes) / Double(limit))))"
        }
        let r = h["recoveries"]
        return [
            ("epoch", h["epoch"].string ?? "-"),
            ("history", "\(Units.count(h["events"].int)) events in \(Units.count(h["streams"].int)) streams, \(memory)"
                + ", evictions \(Units.count(h["evictions"].int)), expired \(Units.count(h["expirations"].int))"),
            ("resumes", "recovered \(Units.count(r["recovered"].int)), epoch_changed \(Units.count(r["epoch_changed"].int))"
                + ", too_old \(Units.count(r["too_old"].int)), too_many \(Units.count(r["too_many"].int))"
                + "; replayed \(Units.count(h["replayedEvents"].int)) events"),
            ("idempotency", "\(Units.count(h["idempotencyKeys"].int)) keys, \(Units.count(h["duplicates"].int)) duplicates"),
        ]
    }

    /// Cluster mode: this node, its Redis connections, and what its fan-out saw (absent without --broker).
    static func clusterLines(_ c: JSON, style: Style) -> [(String, String)] {
        guard c.object != nil else { return [] }
        let up = c["connected"].bool == true && c["subscribed"].bool == true
        var redis = up ? "up" : style.yellow("DOWN (publishes and new subscribes fail with BROKER_UNAVAILABLE)")
        if !up, let error = c["lastError"].text { redis += ": \(error)" }
        return [
            ("cluster", "node \(c["node"].text ?? "?"), Redis \(redis), reconnects \(Units.count(c["reconnects"].int))"
                + (c["nodes"].int.map { "; \($0) live nodes with \(Units.count(c["clusterConnections"].int)) connections" } ?? "")),
            ("fan-out", "\(Units.count(c["received"].int)) messages from Redis (\(Units.count(c["ignored"].int)) for streams not followed here)"
                + ", gaps \(Units.count(c["gaps"].int)) filled with \(Units.count(c["filledEvents"].int)) events"
                + ", lost \(Units.count(c["unfillable"].int)); publishes \(Units.count(c["published"].int))"
                + ", refused \(Units.count(c["publishFailures"].int))"),
        ]
    }

    static func render(_ stats: JSON, style: Style) -> [String] {
        var lines: [String] = []
        var head = style.bold("hub \(stats["version"].text ?? "?")")
        if let pid = stats["pid"].int { head += "  pid \(pid)" }
        head += "  up \(Units.duration(stats["uptimeSeconds"].double))"
        lines.append(head)
        var where_: [String] = []
        if let listen = stats["listen"].text { where_.append("listen \(listen)") }
        if let socket = stats["socket"].text { where_.append("socket \(socket)") }
        if let auth = stats["auth"].text { where_.append("auth \(auth)") }
        if !where_.isEmpty { lines.append(where_.joined(separator: "  ")) }
        lines.append("")

        let c = stats["connections"]
        var connections = "\(Units.count(c["open"].int)) open, \(Units.count(c["handshaking"].int)) handshaking"
        if let limit = c["limit"].int {
            connections += ", limit \(limit)"
            if let open = c["open"].int, limit > 0 { connections += " (\(Units.percent(Double(open) / Double(limit))))" }
        }
        let m = stats["messages"], b = stats["bytes"], p = stats["publishes"], d = stats["drops"]
        let failures = (stats["authFailures"].object ?? [:]).keys.sorted().map { reason in
            "\(reason) \(Units.count(stats["authFailures"][reason].int))"
        }
        var descriptors = "\(Units.count(stats["descriptors"]["open"].int)) / \(Units.count(stats["descriptors"]["limit"].int))"
        if let open = stats["descriptors"]["open"].int, let limit = stats["descriptors"]["limit"].int, limit > 0 {
            descriptors += " (\(Units.percent(Double(open) / Double(limit))))"
        }
        let slow = d["slowConsumerCloses"].int ?? 0
        let slowText = "slow-consumer closes \(Units.count(d["slowConsumerCloses"].int))"
        lines += keyValueLines([
            ("connections", connections),
            ("subscriptions", Units.count(stats["subscriptions"].int)),
            ("messages", "in \(Units.count(m["in"].int)) (\(Units.rate(m["inPerSecond"].double))/s)"
                + "  out \(Units.count(m["out"].int)) (\(Units.rate(m["outPerSecond"].double))/s)"),
            ("bytes", "in \(Units.bytes(b["in"].int)) (\(Units.byteRate(b["inPerSecond"].double)))"
                + "  out \(Units.bytes(b["out"].int)) (\(Units.byteRate(b["outPerSecond"].double)))"),
            ("publishes", "\(Units.count(p["total"].int)) (\(Units.rate(p["perSecond"].double))/s)"
                + ", delivered \(Units.count(p["delivered"].int))"),
            ("drops", (slow > 0 ? style.yellow(slowText) : slowText)
                + ", rate-limited \(Units.count(d["rateLimited"].int))"
                + ", rejected connections \(Units.count(d["rejectedConnections"].int))"),
            ("auth failures", failures.isEmpty ? "none" : failures.joined(separator: ", ")),
            ("descriptors", descriptors),
        ] + historyLines(stats["history"]) + clusterLines(stats["cluster"], style: style), style: style)

        if let threads = stats["threads"].array, !threads.isEmpty {
            lines.append("")
            var table = Table([("THREAD", .right), ("CONNECTIONS", .right), ("BUSY", .right)])
            for (i, thread) in threads.enumerated() {
                table.add([String(thread["index"].int ?? i), Units.count(thread["connections"].int),
                           Units.percent(thread["busy"].double)])
            }
            lines += table.render(style)
        }
        return lines
    }
}
