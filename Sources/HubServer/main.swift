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
    StandardStream.error.writeLine("\(utcTimestamp()) hub: \(line)")
}

/// The log lines' time, `2026-11-26T05:04:21Z` (UTC, what Foundation's `Date().formatted(.iso8601)` printed), from
/// `gmtime_r`: Foundation's formatting looks up the time zone in ICU's data at the first line, which alone kept
/// ~2.5 MiB of that data and its code resident for the life of the process (docs/OPERATIONS.md, "Memory").
@Sendable func utcTimestamp() -> String {
    var now = time_t()
    time(&now)
    var t = tm()
    guard gmtime_r(&now, &t) != nil else { return "?" }
    func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
    return "\(t.tm_year + 1900)-\(two(t.tm_mon + 1))-\(two(t.tm_mday))T\(two(t.tm_hour)):\(two(t.tm_min)):\(two(t.tm_sec))Z"
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
