import Foundation
import Hummingbird
import Logging

// HummingbirdPeer --port N [--host 127.0.0.1] [--threads 2]; env PEER_JWT_SECRET (HS256 secret).
var host = "127.0.0.1"
var port = 8080
var threads = 2
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    switch argument {
    case "--port": port = arguments.next().flatMap(Int.init) ?? port
    case "--host": host = arguments.next() ?? host
    case "--threads": threads = arguments.next().flatMap(Int.init) ?? threads
    case "-h", "--help":
        print("usage: HummingbirdPeer --port N [--host ADDR] [--threads N]   (env PEER_JWT_SECRET)")
        exit(0)
    default:
        FileHandle.standardError.write(Data("unknown argument \(argument)\n".utf8))
        exit(2)
    }
}
guard let secret = ProcessInfo.processInfo.environment["PEER_JWT_SECRET"], !secret.isEmpty else {
    FileHandle.standardError.write(Data("PEER_JWT_SECRET is not set\n".utf8))
    exit(2)
}
var logger = Logger(label: "HummingbirdPeer")
logger.logLevel = .warning
let app = buildApplication(host: host, port: port, threads: threads, secret: secret, logger: logger)
try await app.runService()
