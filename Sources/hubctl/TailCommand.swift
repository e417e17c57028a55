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
                guard let event = JSON.parse(line)?["event"], event.object != nil else {
                    throw .unexpected(HubSession.snippet(line))
                }
                print(format(event, style: style))
            }
            flushOutput()
        }
    }

    static func format(_ event: JSON, style: Style) -> String {
        let who = event["broadcast"].bool == true ? "broadcast" : (event["account"].text ?? "?")
        var data = event["data"].compact
        if data.count > 500 { data = String(data.prefix(500)) + "..." }
        data = TerminalText.escape(data)
        return [style.dim(Units.clock(event["at"].double)), style.bold(event["type"].text ?? "?"), who,
                "seq \(event["seq"].int.map(String.init) ?? "-")",
                "delivered \(event["delivered"].int.map(String.init) ?? "-")", data].joined(separator: "  ")
    }
}
