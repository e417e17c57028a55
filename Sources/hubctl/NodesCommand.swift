import Hub

enum NodesCommand {
    static let spec = CommandSpec("nodes")
    static let help = """
        usage: hubctl nodes [--json]

        Cluster mode (hub --broker redis://...): the live nodes in the Redis registry, one row each: node id,
        last heartbeat, where it listens, its Unix socket, connections, version, and which one you asked (*).
        A node that has not sent a heartbeat for 5 s is gone from the list. A hub without --broker says so.

        examples:
          hubctl nodes
          hubctl nodes --json | jq '[.nodes[].info.connections] | add'
        """

    static func run(_ context: Context) throws(CLIError) {
        let session = try context.connect()
        let reply = try session.call(RequestLine(op: "nodes").text, context: context)
        if context.json { writeStdout(bytes: reply.raw); return }
        if reply.json["cluster"].bool == false {
            print("single node: this hub runs without --broker (no cluster)")
            return
        }
        guard let nodes = reply.json["nodes"].array else { throw .unexpected("\"nodes\" is missing or not an array") }
        print(render(nodes, style: context.style).joined(separator: "\n"))
    }

    static func render(_ nodes: [JSON], style: Style) -> [String] {
        if nodes.isEmpty { return ["no live nodes in the registry"] }
        var table = Table([("NODE", .left), ("HEARTBEAT", .right), ("LISTEN", .left), ("SOCKET", .left),
                           ("CONNECTIONS", .right), ("VERSION", .left)])
        var total = 0
        for node in nodes {
            let info = node["info"]
            let mark = node["self"].bool == true ? " *" : ""
            let age = node["ageMillis"].int.map { "\($0) ms ago" } ?? "-"
            total += info["connections"].int ?? 0
            table.add([(node["id"].text ?? "?") + mark, age, info["listen"].text ?? "-", info["socket"].text ?? "-",
                       Units.count(info["connections"].int), info["version"].text ?? "-"])
        }
        return table.render(style) + ["\(nodes.count) nodes, \(Units.count(total)) connections"]
    }
}
