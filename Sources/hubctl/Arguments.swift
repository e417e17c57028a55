import Hub

/// hubctl's command table: the flags each command takes, its help text, and what runs it.
struct Command: Sendable {
    let spec: CommandSpec
    let summary: String
    let help: String
    let run: @Sendable (Context) throws(CLIError) -> Void
}

enum Arguments {
    static let globalValueFlags: Set<String> = ["socket"]
    static let globalBoolFlags: Set<String> = ["json", "no-color", "help", "version"]

    static let commands: [Command] = [
        Command(spec: StatusCommand.spec, summary: "hub health: connections, rates, drops, auth failures",
                help: StatusCommand.help, run: StatusCommand.run),
        Command(spec: ChannelsCommand.spec, summary: "one row per channel", help: ChannelsCommand.help,
                run: ChannelsCommand.run),
        Command(spec: ChannelCommand.spec, summary: "one channel: counts, top accounts, recent events",
                help: ChannelCommand.help, run: ChannelCommand.run),
        Command(spec: ConnectionsCommand.spec, summary: "open client connections", help: ConnectionsCommand.help,
                run: ConnectionsCommand.run),
        Command(spec: PublishCommand.spec, summary: "publish an event to an account or as a broadcast",
                help: PublishCommand.help, run: PublishCommand.run),
        Command(spec: TailCommand.spec, summary: "stream a channel's events", help: TailCommand.help,
                run: TailCommand.run),
        Command(spec: HistoryCommand.spec, summary: "one stream's retained events (what a resuming client gets)",
                help: HistoryCommand.help, run: HistoryCommand.run),
        Command(spec: NodesCommand.spec, summary: "cluster mode: the live nodes sharing this hub's Redis",
                help: NodesCommand.help, run: NodesCommand.run),
        Command(spec: DisconnectCommand.spec, summary: "close a connection or all of an account's",
                help: DisconnectCommand.help, run: DisconnectCommand.run),
        Command(spec: TokenCommand.spec, summary: "mint an HS256 test token (no hub needed)",
                help: TokenCommand.help, run: TokenCommand.run),
        Command(spec: TopCommand.spec, summary: "live view of the hub", help: TopCommand.help, run: TopCommand.run),
    ]

    static let helpSpec = CommandSpec("help", positionals: ["COMMAND"], optionalPositionals: 1)

    static var parser: ArgumentParser {
        ArgumentParser(globalValueFlags: globalValueFlags, globalBoolFlags: globalBoolFlags,
                       commands: commands.map(\.spec) + [helpSpec])
    }

    static func command(named name: String) -> Command? { commands.first { $0.spec.name == name } }

    static var toolHelp: String {
        let width = commands.map(\.spec.name.count).max() ?? 0
        let list = commands.map { command in
            "  " + command.spec.name + String(repeating: " ", count: width - command.spec.name.count) + "  "
                + command.summary
        }.joined(separator: "\n")
        return """
            usage: hubctl [--socket PATH] [--json] [--no-color] COMMAND [ARGS]

            Operate a running hub over its Unix socket.

            commands:
            \(list)

            global flags:
              --socket PATH  the hub's Unix socket (default: $HUB_SOCKET, else ./hub.sock)
              --json         print the hub's reply JSON instead of tables
              --no-color     no ANSI colour (also off when $NO_COLOR is set or stdout is not a terminal)
              --help, -h     help for hubctl or a command (hubctl COMMAND --help)
              --version      print the version

            exit codes:
              0  ok
              1  the hub answered with an error, or with a reply hubctl does not understand
              2  usage error (unknown command or flag, missing argument)
              3  hub not reachable (not running, permission denied on the socket, connection lost)
              4  local input error (invalid JSON data, unreadable data file, missing secret file)

            examples:
              hubctl status
              hubctl publish wallet_updates --account acc_1 --type wallet_balance_changed '{"balance":"1.5"}'
              hubctl tail wallet_updates
              TOKEN=$(hubctl token acc_1 --ttl 1h)
            """
    }

    static func commandHelp(_ command: Command) -> String {
        command.help + "\n\nglobal flags: --socket PATH, --json, --no-color (see hubctl --help)\n"
            + "exit codes: 0 ok, 1 hub error, 2 usage, 3 hub not reachable, 4 local input"
    }
}
