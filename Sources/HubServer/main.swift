import Foundation
import Glibc
import Hub

// Before any thread exists: SIGTERM/SIGINT are taken by the main thread below, SIGPIPE is ignored.
HubServer.blockTerminationSignals()

let log: @Sendable (String) -> Void = { line in
    let stamp = Date().formatted(.iso8601)
    FileHandle.standardError.write(Data("\(stamp) hub: \(line)\n".utf8))
}

let configuration: HubConfiguration
do {
    switch try HubConfiguration.parse(arguments: Array(CommandLine.arguments.dropFirst()),
                                      environment: ProcessInfo.processInfo.environment) {
    case .help(let text):
        print(text)
        exit(0)
    case .version:
        print("hub \(HubVersion.string)")
        exit(0)
    case .run(let c):
        configuration = c
    }
} catch {
    FileHandle.standardError.write(Data("hub: \(error.message)\n".utf8))
    exit(2)
}

let server: HubServer
do {
    server = try HubServer.start(configuration: configuration, log: log)
} catch {
    log("cannot start: \(error)")
    exit(1)
}

let received = server.waitForTerminationSignal()
log("received \(received == SIGTERM ? "SIGTERM" : "SIGINT"): closing connections with 1001")
server.shutdown()
exit(0)
