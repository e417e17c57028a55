#if canImport(Glibc)
import Glibc
#endif
import Hub

/// Runs hubctl with `arguments` (without the program name) and returns the exit code.
func runHubctl(_ arguments: [String]) -> Int32 {
    // Before anything opens a descriptor: a closed stdin/stdout/stderr becomes /dev/null (StandardStream).
    StandardStream.reserveStandardDescriptors()
    // A parent (a test runner, a supervisor) may hand us a blocked signal mask; Ctrl-C and SIGTERM must work.
    var unblock = sigset_t()
    sigemptyset(&unblock)
    sigaddset(&unblock, SIGINT)
    sigaddset(&unblock, SIGTERM)
    sigprocmask(SIG_UNBLOCK, &unblock, nil)
    // A vanished reader of stdout or stderr is an error return (StandardStream drops the line), not a signal.
    // `tail` restores the default so that `hubctl tail ... | head` ends quietly.
    signal(SIGPIPE, SIG_IGN)
    let parsed: ParsedArguments
    do {
        parsed = try Arguments.parser.parse(arguments)
    } catch {
        let command = arguments.first { Arguments.command(named: $0) != nil }
        writeStderr("error: \(error.description)")
        writeStderr("see hubctl \(command.map { $0 + " " } ?? "")--help")
        return ExitCode.usage
    }
    if parsed.flags.contains("version") {
        print("hubctl \(HubVersion.string)")
        return ExitCode.ok
    }
    guard let name = parsed.command else {
        if parsed.flags.contains("help") {
            print(Arguments.toolHelp)
            return ExitCode.ok
        }
        writeStderr(Arguments.toolHelp)
        return ExitCode.usage
    }
    if name == "help" {
        guard let topic = parsed.positionals.first else { print(Arguments.toolHelp); return ExitCode.ok }
        guard let command = Arguments.command(named: topic) else {
            writeStderr("error: unknown command \"\(topic)\"")
            writeStderr("see hubctl --help")
            return ExitCode.usage
        }
        print(Arguments.commandHelp(command))
        return ExitCode.ok
    }
    guard let command = Arguments.command(named: name) else { return ExitCode.usage }
    if parsed.flags.contains("help") {
        print(Arguments.commandHelp(command))
        return ExitCode.ok
    }
    do {
        try command.run(Context(args: parsed, command: name))
        return ExitCode.ok
    } catch {
        writeStderr("error: \(error.message)")
        if let hint = error.hint { writeStderr(hint) }
        return error.exitCode
    }
}

exit(runHubctl(Array(CommandLine.arguments.dropFirst())))
