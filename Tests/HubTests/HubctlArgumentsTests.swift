import Testing
@testable import Hub
@testable import HubEngine

/// The parser with a command table shaped like hubctl's.
@Suite struct HubctlArgumentsTests {
    static let parser = ArgumentParser(
        globalValueFlags: ["socket"], globalBoolFlags: ["json", "no-color", "help", "version"],
        commands: [
            CommandSpec("status"),
            CommandSpec("channel", valueFlags: ["account"], positionals: ["NAME"]),
            CommandSpec("publish", valueFlags: ["account", "type", "data-file"], boolFlags: ["broadcast"],
                        positionals: ["CHANNEL", "DATA"], optionalPositionals: 1),
            CommandSpec("disconnect", valueFlags: ["conn", "account", "code", "reason"]),
        ])

    @Test(arguments: [
        (["status"], ParsedArguments(command: "status")),
        (["--json", "status"], ParsedArguments(command: "status", flags: ["json"])),
        (["status", "--json", "--no-color"], ParsedArguments(command: "status", flags: ["json", "no-color"])),
        (["--socket", "/run/hub.sock", "status"], ParsedArguments(command: "status", values: ["socket": "/run/hub.sock"])),
        (["status", "--socket=/a=b"], ParsedArguments(command: "status", values: ["socket": "/a=b"])),
        (["channel", "wallet", "--account", "acc_1"],
         ParsedArguments(command: "channel", values: ["account": "acc_1"], positionals: ["wallet"])),
        (["channel", "--account=acc_1", "wallet"],
         ParsedArguments(command: "channel", values: ["account": "acc_1"], positionals: ["wallet"])),
        (["channel", "--account", "a", "--account", "b", "w"],
         ParsedArguments(command: "channel", values: ["account": "b"], positionals: ["w"])),
        (["publish", "c", "--broadcast", "--type", "t", "-"],
         ParsedArguments(command: "publish", values: ["type": "t"], flags: ["broadcast"], positionals: ["c", "-"])),
        (["publish", "c", "--account", "a", "--type", "t", "--", "--not-a-flag"],
         ParsedArguments(command: "publish", values: ["account": "a", "type": "t"], positionals: ["c", "--not-a-flag"])),
        (["publish", "--type", "t", "--account", "a", "--", "c", "-1"],
         ParsedArguments(command: "publish", values: ["type": "t", "account": "a"], positionals: ["c", "-1"])),
        (["disconnect", "--conn", "0-1", "--code", "-5", "--reason="],
         ParsedArguments(command: "disconnect", values: ["conn": "0-1", "code": "-5", "reason": ""])),
        (["publish", "c", "--account", "a", "-2.5"],
         ParsedArguments(command: "publish", values: ["account": "a"], positionals: ["c", "-2.5"])),
        (["channel", "-h"], ParsedArguments(command: "channel", flags: ["help"])),
        (["--version"], ParsedArguments(flags: ["version"])),
        ([], ParsedArguments()),
    ])
    func parses(arguments: [String], expected: ParsedArguments) throws {
        #expect(try Self.parser.parse(arguments) == expected)
    }

    @Test(arguments: [
        (["nope"], ArgumentError.unknownCommand("nope")),
        (["status", "--nope"], .unknownFlag("--nope")),
        (["--account", "a", "channel", "c"], .unknownFlag("--account")),
        (["status", "-x"], .unknownFlag("-x")),
        (["channel", "c", "--account"], .missingValue("--account")),
        (["channel", "c", "--account", "--json"], .missingValue("--account")),
        (["status", "--json=1"], .unexpectedValue("--json")),
        (["publish", "c", "--broadcast=false"], .unexpectedValue("--broadcast")),
        (["channel"], .missingArgument("NAME")),
        (["publish"], .missingArgument("CHANNEL")),
        (["channel", "a", "b"], .unexpectedArgument("b")),
        (["publish", "c", "d", "e"], .unexpectedArgument("e")),
        (["status", "--broadcast"], .unknownFlag("--broadcast")),
    ])
    func rejects(arguments: [String], error: ArgumentError) {
        #expect(throws: error) { try Self.parser.parse(arguments) }
    }
}
