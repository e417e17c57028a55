import Hub

enum DisconnectCommand {
    static let spec = CommandSpec("disconnect", valueFlags: ["conn", "account", "code", "reason", "node"])
    static let help = """
        usage: hubctl disconnect (--conn ID | --account A) [--node NODE] [--code N] [--reason TEXT] [--json]

        Close one connection (by the id `hubctl connections` shows) or every connection of an account, with a
        WebSocket close code (default 1000; 1000 or 3000-4999) and reason (at most 123 bytes; default
        "disconnected by operator"). Prints how many connections were closed.
        In cluster mode (--broker) an account's connections are closed on every live node, and the count is the
        cluster's. Connection ids are per node: --conn closes the connection of the node asked, or of --node NODE
        (the node `hubctl connections` lists it under); --node with --account closes that node's only.

        examples:
          hubctl disconnect --conn 0-17
          hubctl disconnect --conn 0-17 --node 3vQx9kLm
          hubctl disconnect --account acc_1 --code 4000 --reason "account suspended"
        """

    static func run(_ context: Context) throws(CLIError) {
        let conn = context.value("conn")
        let account = context.value("account")
        guard (conn != nil) != (account != nil) else { throw context.usage("give exactly one of --conn ID or --account A") }
        var request = RequestLine(op: "disconnect")
        request.add("conn", string: conn)
        request.add("account", string: account)
        let node = context.value("node")
        request.add("node", string: node)
        if let code = try context.intValue("code") {
            guard code == 1000 || (3000...4999).contains(code) else {
                throw context.usage("--code must be 1000 or 3000-4999, got \(code)")
            }
            request.add("code", raw: String(code))
        }
        if let reason = context.value("reason") {
            guard reason.utf8.count <= 123 else {
                throw context.usage("--reason is \(reason.utf8.count) bytes; a close reason is at most 123")
            }
            request.add("reason", string: reason)
        }
        let session = try context.connect()
        let reply = try session.call(request.text, context: context)
        guard let count = reply.json["disconnected"].int else {
            throw .unexpected("disconnect reply without integer \"disconnected\": \(HubSession.snippet(reply.raw))")
        }
        if context.json { writeStdout(bytes: reply.raw); return }
        var line = "disconnected \(count) connection\(count == 1 ? "" : "s")"
        let cluster = reply.json["cluster"]
        if let node = reply.json["node"].text {
            line += " on node \(TerminalText.escape(node))"
        } else if let nodes = cluster["nodes"].array {
            line += " on \(nodes.count + 1) node\(nodes.isEmpty ? "" : "s")"
        }
        if count == 0, let account { line += " (\(TerminalText.escape(account)) has no open connection)" }
        print(line)
        let missing = (cluster["missing"].array ?? []).compactMap(\.text)
        if !missing.isEmpty {
            print(context.style.yellow("no answer within 2 s from: \(missing.map(TerminalText.escape).joined(separator: ", ")) (their connections may still be open)"))
        }
    }
}
