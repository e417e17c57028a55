#if canImport(Glibc)
import Glibc
#endif
import Hub

enum TailCommand {
    static let spec = CommandSpec("tail", valueFlags: ["account"], positionals: ["CHANNEL"])
    static let help = """
        usage: hubctl tail CHANNEL [--account A] [--json]

        Stream the events published on a channel (only one account's with --account), one line each: time,
        type, account (or "broadcast"), seq, connections delivered to, and the data. Runs until Ctrl-C (exit 0)
        or until the hub closes the connection (exit 0; a tail that falls 1 MiB behind is closed by the hub).
        With --json each line is the hub's event line as received: {"event":{...}}.
        In cluster mode (--broker) the events published on every live node are shown, each with its node (another
        node forwards at most 1 000 events a second to a tail; it reports how many it skipped beyond that).

        examples:
          hubctl tail wallet_updates
          hubctl tail wallet_updates --account acc_1 --json | jq -c .event.data
        """

    static func run(_ context: Context) throws(CLIError) {
        var request = RequestLine(op: "tail")
        request.add("channel", string: context.args.positionals[0])
        request.add("account", string: context.value("account"))
        // Ctrl-C ends a tail normally: every printed line has been flushed already.
        signal(SIGINT) { _ in _exit(0) }
        signal(SIGPIPE, SIG_DFL)
        let session = try context.connect()
        _ = try session.call(request.text, context: context)
        session.client.readTimeout = nil
        let style = context.style
        while true {
            let line: [UInt8]?
            do { line = try session.client.readLine() } catch {
                throw HubSession.map(error, socketPath: context.socketPath)
            }
            guard let line else {
                writeStderr("tail ended: the hub closed the connection")
                return
            }
            if line.isEmpty { continue }
            if context.json {
                writeStdout(bytes: line)
            } else {
                guard let parsed = JSON.parse(line) else { throw .unexpected(HubSession.snippet(line)) }
                if parsed["event"].object != nil {
                    print(format(parsed["event"], style: style))
                } else if parsed["skipped"].object != nil {
                    let skipped = parsed["skipped"]
                    print(style.yellow("node \(TerminalText.escape(skipped["node"].text ?? "?")) skipped \(skipped["events"].int ?? 0) events (over \(skipped["perSecond"].int ?? 0)/s)"))
                } else {
                    throw .unexpected(HubSession.snippet(line))
                }
            }
            flushOutput()
        }
    }

    static func format(_ event: JSON, style: Style) -> String {
        let who = event["broadcast"].bool == true ? "broadcast" : (event["account"].text ?? "?")
        var data = event["data"].compact
        if data.count > 500 { data = String(data.prefix(500)) + "..." }
        data = TerminalText.escape(data)
        var fields = [style.dim(Units.clock(event["at"].double)), style.bold(event["type"].text ?? "?"), who,
                      "seq \(event["seq"].int.map(String.init) ?? "-")",
                      "delivered \(event["delivered"].int.map(String.init) ?? "-")"]
        if let node = event["node"].text { fields.append("node \(TerminalText.escape(node))") }
        return (fields + [data]).joined(separator: "  ")
    }
}
