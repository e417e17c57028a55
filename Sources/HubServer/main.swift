import Foundation
import Glibc
import Hub

// Before anything opens a descriptor: a closed stdin/stdout/stderr becomes /dev/null, so no socket gets fd 2.
StandardStream.reserveStandardDescriptors()
// Before any thread exists: the operator signals are taken by the main thread below, SIGPIPE is ignored.
HubServer.blockOperatorSignals()

let configuration: HubConfiguration
do {
    switch try HubConfiguration.parse(arguments: Array(CommandLine.arguments.dropFirst()),
                                      environment: ProcessInfo.processInfo.environment) {
    case .help(let text):
        StandardStream.output.writeLine(text)
        exit(0)
    case .version:
        StandardStream.output.writeLine("hub \(HubVersion.string)")
        exit(0)
    case .checkConfig(let c):
        StandardStream.output.writeLine(HubConfiguration.effectiveText(c))
        exit(0)
    case .defaultConfig(let text):
        StandardStream.output.writeLine(text)
        exit(0)
    case .run(let c):
        configuration = c
    }
} catch {
    StandardStream.error.writeLine("hub: \(error.message)")
    // check-config answers 0 or 1 (valid or not); a hub that cannot run with its options exits 2.
    exit(CommandLine.arguments.dropFirst().first == "check-config" ? 1 : 2)
}

// Every line the hub writes from here on goes through this logger (a closed stderr or a log reader that went away
// loses lines, never the hub: StandardStream).
let logger = HubLogger(format: configuration.logFormat ?? .automatic(), level: configuration.logLevel,
                       accounts: configuration.logAccounts)

let server: HubServer
do {
    // Listening sockets from the service manager (LISTEN_FDS), read and removed from the environment first.
    let activation = try SocketActivation.take()
    // SIGHUP reads the configuration the same way again: the file anew, the same environment and flags on top.
    let reload = HubConfiguration.reloader(arguments: Array(CommandLine.arguments.dropFirst()),
                                           environment: ProcessInfo.processInfo.environment)
    server = try HubServer.start(configuration: configuration, logger: logger, activation: activation, reload: reload)
} catch {
    logger.error("cannot start: \(error)")
    exit(1)
}

let received = server.serveSignals()
logger.info("received \(HubServer.name(of: received)): closing connections with 1001")
server.shutdown()
exit(0)
