import Foundation
import Glibc
import Hub

// Before anything opens a descriptor: a closed stdin/stdout/stderr becomes /dev/null, so no socket gets fd 2.
StandardStream.reserveStandardDescriptors()
// Before any thread exists: the operator signals are taken by the main thread below, SIGPIPE is ignored.
HubServer.blockOperatorSignals()

/// Every log line goes through the shared writer: a closed stderr or a log reader that went away loses lines,
/// never the hub.
let log: @Sendable (String) -> Void = { line in
    let stamp = Date().formatted(.iso8601)
    StandardStream.error.writeLine("\(stamp) hub: \(line)")
}

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
    case .run(let c):
        configuration = c
    }
} catch {
    StandardStream.error.writeLine("hub: \(error.message)")
    exit(2)
}

let server: HubServer
do {
    server = try HubServer.start(configuration: configuration, log: log)
} catch {
    log("cannot start: \(error)")
    exit(1)
}

let received = server.serveSignals()
log("received \(HubServer.name(of: received)): closing connections with 1001")
server.shutdown()
exit(0)
