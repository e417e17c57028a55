import Foundation
import Glibc
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// Plays the service manager for socket activation: binds the client port and the Unix socket once, keeps them for
/// the whole test, and starts `hub` processes that get them as descriptors 3 and 4 (`LISTEN_FDS`, `LISTEN_PID`,
/// `LISTEN_FDNAMES`), the way systemd does.
final class SocketHolder: @unchecked Sendable {
    let directory: String
    let socketPath: String
    let stateDirectory: String
    let port: Int
    /// The held sockets, at descriptors well above 3, 4 and 5 (close-on-exec: only the dup2'ed copies reach a hub).
    private let tcpFD: Int32
    private let unixFD: Int32
    /// A second TCP socket, for a `wss` listener (passed as descriptor 5 when `start` names three).
    private let wssFD: Int32
    private(set) var wssPort = 0
    private(set) var pid: pid_t = 0
    private var runs = 0
    let secret = Array("socket-activation-test-secret-0123456789".utf8)

    /// A listening TCP socket on 127.0.0.1 (any port), moved above 500; the descriptor and its port.
    static func tcpListener() throws -> (fd: Int32, port: Int) {
        let tcp = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(tcp, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(tcp, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0, listen(tcp, 1024) == 0 else { throw HubTestError("tcp bind/listen: errno \(errno)") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(tcp, $0, &length) } }
        let high = fcntl(tcp, F_DUPFD_CLOEXEC, 500)
        close(tcp)
        guard high >= 500 else { throw HubTestError("dup: errno \(errno)") }
        return (high, Int(UInt16(bigEndian: address.sin_port)))
    }

    init() throws {
        directory = NSTemporaryDirectory() + "hubtest-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        socketPath = directory + "/hub.sock"
        stateDirectory = directory + "/state"
        (tcpFD, port) = try Self.tcpListener()
        (wssFD, wssPort) = try Self.tcpListener()

        let unix = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var sun = sockaddr_un()
        sun.sun_family = sa_family_t(AF_UNIX)
        let path = Array(socketPath.utf8) + [0]
        withUnsafeMutableBytes(of: &sun.sun_path) { $0.copyBytes(from: path) }
        let unixBound = withUnsafePointer(to: &sun) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(unix, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        guard unixBound == 0, listen(unix, 1024) == 0 else { throw HubTestError("unix bind/listen: errno \(errno)") }
        unixFD = fcntl(unix, F_DUPFD_CLOEXEC, 500)
        close(unix)
        guard unixFD >= 500 else { throw HubTestError("dup: errno \(errno)") }
    }

    deinit {
        stop()
        close(tcpFD)
        close(unixFD)
        close(wssFD)
        try? FileManager.default.removeItem(atPath: directory)
    }

    func logPath(_ run: Int) -> String { directory + "/hub-\(run).log" }
    var log: String { (1...max(1, runs)).map { (try? String(contentsOfFile: logPath($0), encoding: .utf8)) ?? "" }.joined() }

    /// Starts a hub on the held sockets and waits (bounded) until its start is complete.
    func start(names: String = "ws:publish", extra: [String] = []) throws {
        runs += 1
        let log = logPath(runs)
        let arguments = ["/bin/sh", "-c", #"export LISTEN_PID=$$; exec "$0" "$@""#, HubProcess.executablePath,
                         "--listen", "127.0.0.1:1", "--socket", directory + "/unused.sock", "--state-dir", stateDirectory,
                         "--threads", "2", "--shutdown-timeout", "2s", "--history-size", "1000", "--recovery-max", "1000"] + extra
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("HUB_") && !$0.key.hasPrefix("LISTEN_") }
        let count = names.split(separator: ":", omittingEmptySubsequences: false).count
        environment["LISTEN_FDS"] = String(count)
        environment["LISTEN_FDNAMES"] = names
        environment["HUB_LOG_FORMAT"] = "text"
        environment["HUB_JWT_SECRET"] = String(decoding: secret, as: UTF8.self)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, log, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        posix_spawn_file_actions_adddup2(&actions, tcpFD, 3)
        posix_spawn_file_actions_adddup2(&actions, unixFD, 4)
        if count > 2 { posix_spawn_file_actions_adddup2(&actions, wssFD, 5) }
        let cArguments = arguments.map { strdup($0) } + [nil]
        let cEnvironment = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { (cArguments + cEnvironment).forEach { free($0) } }
        var child: pid_t = 0
        guard posix_spawn(&child, "/bin/sh", &actions, nil, cArguments, cEnvironment) == 0 else { throw HubTestError("posix_spawn: errno \(errno)") }
        pid = child
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            if HubProcess.lastStartLines.contains(where: { text.contains($0) }) { return }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid { pid = 0; throw HubTestError("hub exited at start (status \(status)): \(text)") }
            usleep(10_000)
        }
        throw HubTestError("hub did not start: \(self.log)")
    }

    /// Sends `signal` to the running hub without waiting.
    func send(signal: Int32) { if pid > 0 { kill(pid, signal) } }

    /// SIGTERM and wait (bounded) for the exit; the exit status, or nil if it had to be killed.
    @discardableResult
    func stop(timeout: Double = 10) -> Int32? {
        guard pid > 0 else { return nil }
        defer { pid = 0 }
        kill(pid, SIGTERM)
        var status: Int32 = 0
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if waitpid(pid, &status, WNOHANG) == pid { return (status & 0x7f) == 0 ? (status >> 8) & 0xff : nil }
            usleep(5_000)
        }
        kill(pid, SIGKILL)
        waitpid(pid, &status, 0)
        return nil
    }

    func token(_ account: String) throws -> String {
        let now = Int64(time(nil))
        return try JWTSigner(key: .hmacSecret(secret)).sign(JWTClaims(sub: account, exp: now + 900, iat: now))
    }
}

@Suite(.serialized) struct SocketActivationTests {
    /// The environment rules (sd_listen_fds): whose descriptors, how many, which name goes where.
    @Test func passedDescriptorsAreNamedOrPlacedByKind() throws {
        let kinds: [Int32: SocketActivation.Kind] = [3: .tcp, 4: .unix, 5: .tcp, 6: .other("not a socket")]
        func parse(_ fds: String?, _ pid: String?, _ names: String?) throws(SocketActivation.ActivationError) -> SocketActivation? {
            try SocketActivation.parse(fds: fds, pid: pid, names: names, ownPID: 42) { kinds[$0] ?? .other("closed") }
        }
        #expect(try parse(nil, "42", nil) == nil)
        #expect(try parse("2", "41", "ws:publish") == nil)  // for another process
        #expect(try parse("2", nil, "ws:publish") == nil)
        #expect(try parse("2", "42", "ws:publish") == SocketActivation(ws: 3, publish: 4))
        #expect(try parse("2", "42", nil) == SocketActivation(ws: 3, publish: 4))  // unnamed: by kind
        #expect(try parse("2", "42", "hub.socket:hub.socket") == SocketActivation(ws: 3, publish: 4))  // systemd's default names
        #expect(try parse("3", "42", "ws:publish:wss") == SocketActivation(ws: 3, wss: 5, publish: 4))
        let refused: [(String, String?, String)] = [
            ("x", nil, "LISTEN_FDS must be a count of 1 to 16 descriptors, got 'x'"),
            ("2", "ws", "LISTEN_FDNAMES names 1 descriptors but LISTEN_FDS is 2"),
            ("2", "publish:ws", "descriptor 3 named 'publish' must be a listening Unix stream socket (a listening TCP socket)"),
            ("3", nil, "TCP descriptors 3,5 have no name: name them ws and wss (FileDescriptorName=)"),
            ("4", "ws:publish:wss:x", "descriptor 6 ('x') is not a listening TCP or Unix stream socket (not a socket)"),
            ("3", "ws:publish:ws", "two descriptors are named 'ws'"),
        ]
        for (fds, names, message) in refused {
            #expect(throws: SocketActivation.ActivationError(description: message)) { try parse(fds, "42", names) }
        }
    }

    /// The real binary on held sockets: it serves them, does not bind its own --listen or --socket, and leaves the
    /// socket file in place when it stops (the manager owns it).
    @Test func theHubServesThePassedSockets() throws {
        let holder = try SocketHolder()
        try holder.start()
        #expect(holder.log.contains("listening on ws://127.0.0.1:\(holder.port)/ws"), "\(holder.log)")
        #expect(holder.log.contains("socket \(holder.socketPath) (sockets from the service manager)"), "\(holder.log)")
        let reply = try AdminClient(socketPath: holder.socketPath).request(#"{"op":"publish","channel":"wallet_updates","account":"a","type":"t"}"#)
        #expect(String(decoding: reply, as: UTF8.self).hasPrefix(#"{"ok":true"#))
        let ws = try TestWebSocket.connect(port: holder.port, headers: [("Authorization", "Bearer \(try holder.token("a"))")])
        try ws.send(json: ["type": "ping", "id": 1])
        #expect(try ws.nextJSON()["type"] as? String == "pong")
        #expect(access(holder.directory + "/unused.sock", F_OK) != 0)
        _ = try? ws.completeClose()
        #expect(holder.stop() == 0)
        #expect(access(holder.socketPath, F_OK) == 0, "the hub removed the manager's socket file")
    }

    /// A third socket named wss becomes the TLS listener: TLS there, plain HTTP on ws.
    @Test func aWSSSocketServesTLS() throws {
        let holder = try SocketHolder()
        let ca = try TestCA()
        let (cert, key) = try ca.issue("server", organization: "one")
        try holder.start(names: "ws:publish:wss", extra: ["--tls-cert", cert, "--tls-key", key])
        #expect(holder.log.contains("listening on ws://127.0.0.1:\(holder.port)/ws and wss://127.0.0.1:\(holder.wssPort)/ws"), "\(holder.log)")
        let secure = try TestTLSClient(port: holder.wssPort, caFile: ca.caFile)
        try secure.write("GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        let answer = String(decoding: secure.read(), as: UTF8.self)
        #expect(answer.hasPrefix("HTTP/1.1 200") && answer.contains(#"{"status":"ready"}"#), "\(answer)")
        #expect(try IntegrationDrainTests.get(holder.port, "/readyz").status == 200)
        #expect(holder.stop() == 0)
    }

    @Test func aWSSSocketWithoutACertificateIsAClearError() throws {
        let holder = try SocketHolder()
        #expect(throws: (any Error).self) { try holder.start(names: "wss:publish") }
        #expect(holder.log.contains("the service manager passed a socket named wss, but no --tls-cert and --tls-key are configured"), "\(holder.log)")
    }

    /// Under activation a stopping hub keeps taking publishes on connections already open (new ones wait for the
    /// next process): they are in the saved state, and a client that resumes on the next process gets them. Without
    /// activation the same publish is answered SHUTTING_DOWN (IntegrationEdgeTests).
    @Test func publishesDuringAnActivatedShutdownAreKeptForTheNextProcess() throws {
        let holder = try SocketHolder()
        try holder.start()
        let ws = try TestWebSocket.connect(port: holder.port, headers: [("Authorization", "Bearer \(try holder.token("kept"))")])
        try ws.send(json: ["type": "subscribe", "channels": ["wallet_updates"], "id": "s"])
        let position = try #require((try ws.nextJSON()["positions"] as? [String: Any])?["wallet_updates"] as? [String: Any])
        let admin = try AdminClient(socketPath: holder.socketPath)
        holder.send(signal: SIGTERM)
        #expect(try ws.expectClose().code == 1001)  // not answered yet: the old hub keeps running meanwhile
        let reply = String(decoding: try admin.request(#"{"op":"publish","channel":"wallet_updates","account":"kept","type":"late","data":{"n":1}}"#), as: UTF8.self)
        #expect(reply.hasPrefix(#"{"ok":true,"seq":1"#), "\(reply)")
        try ws.sendClose(code: 1001)
        #expect(holder.stop() == 0)
        try holder.start()
        let again = try TestWebSocket.connect(port: holder.port, headers: [("Authorization", "Bearer \(try holder.token("kept"))")])
        try again.send(json: ["type": "subscribe", "channels": ["wallet_updates"], "id": "s2",
                              "since": ["wallet_updates": ["epoch": position["epoch"] ?? "", "seq": 0, "broadcastSeq": position["broadcastSeq"] ?? 0]]])
        let replayed = try again.nextJSON()
        #expect(replayed["type"] as? String == "late" && replayed["seq"] as? Int == 1, "\(replayed)")
        let resumed = try again.nextJSON()
        #expect(((resumed["positions"] as? [String: Any])?["wallet_updates"] as? [String: Any])?["recovered"] as? Bool == true, "\(resumed)")
    }

    /// Restarts that refuse no one: clients stay subscribed and a publisher keeps publishing while the hub process
    /// is replaced three times on the same held sockets. No connection or publish is refused, every client resumes
    /// with `recovered:true` from the state file, and every event reaches its account once, in order.
    @Test func repeatedRestartsRefuseNothingAndLoseNothing() throws {
        let holder = try SocketHolder()
        try holder.start()
        let accounts = (0..<4).map { "restart_\($0)" }
        struct Tally { var refused = 0, gaps = 0, duplicates = 0, notRecovered = 0, resumes = 0, received: [String: [Int]] = [:], errors: [String] = [] }
        let tally = Mutex(Tally())
        let stop = Atomic<Bool>(false)
        let stopClients = Atomic<Bool>(false)
        let subscribed = Atomic<Int>(0)
        let published = Mutex([String: Int]())

        var threads: [Thread] = []
        for account in accounts {
            let token = try holder.token(account)
            threads.append(Thread { [port = holder.port] in
                var position: (epoch: String, seq: Int, broadcastSeq: Int)? = nil
                var first = true
                while !stopClients.load(ordering: .relaxed) {
                    let ws: TestWebSocket
                    do {
                        ws = try TestWebSocket.connect(port: port, headers: [("Authorization", "Bearer \(token)")])
                    } catch {
                        tally.withLock { $0.refused += 1; $0.errors.append("connect \(account): \(error)") }
                        usleep(20_000)
                        continue
                    }
                    var subscribe: [String: Any] = ["type": "subscribe", "channels": ["wallet_updates"], "id": "s"]
                    if let p = position {
                        subscribe["since"] = ["wallet_updates": ["epoch": p.epoch, "seq": p.seq, "broadcastSeq": p.broadcastSeq]]
                    }
                    guard (try? ws.send(json: subscribe)) != nil else { continue }
                    // Replayed events, the reply, then live events, until the hub closes (1001) or the test ends.
                    while true {
                        let received: TestWebSocket.Received?
                        do { received = try ws.receive(timeout: 0.2) } catch { break }
                        guard let message = received else {
                            if ws.closedByPeer || stopClients.load(ordering: .relaxed) { break }
                            continue
                        }
                        guard case .text(let text) = message else {
                            if case .close = message { _ = try? ws.completeClose(code: 1001, timeout: 1); break }
                            continue
                        }
                        guard let object = try? parseObject(text) else { continue }
                        if object["type"] as? String == "subscribed" {
                            let p = (object["positions"] as? [String: Any])?["wallet_updates"] as? [String: Any] ?? [:]
                            if position != nil {
                                tally.withLock { $0.resumes += 1; if p["recovered"] as? Bool != true { $0.notRecovered += 1; $0.errors.append("\(account): \(text)") } }
                            }
                            position = (p["epoch"] as? String ?? "", p["seq"] as? Int ?? 0, p["broadcastSeq"] as? Int ?? 0)
                            if first { first = false; subscribed.add(1, ordering: .relaxed) }
                        } else if let seq = object["seq"] as? Int, let n = (object["data"] as? [String: Any])?["n"] as? Int {
                            let last = position?.seq ?? 0
                            tally.withLock {
                                if seq <= last { $0.duplicates += 1 } else if seq != last + 1 { $0.gaps += 1; $0.errors.append("\(account): seq \(last) -> \(seq)") }
                                $0.received[account, default: []].append(n)
                            }
                            if let p = position, seq > p.seq { position = (p.epoch, seq, p.broadcastSeq) }
                        }
                    }
                }
            })
        }
        threads.forEach { $0.start() }
        #expect(eventually(timeout: 10) { subscribed.load(ordering: .relaxed) == accounts.count })

        // The publisher: one connection per publish, each with an idempotency key; a connection that ends without a
        // reply (the hub stopped under it) is retried with the same key, so nothing is lost and nothing doubled.
        let publisherDone = Atomic<Bool>(false)
        let publisher = Thread { [socketPath = holder.socketPath] in
            var n = 0
            while !stop.load(ordering: .relaxed) {
                let account = accounts[n % accounts.count]
                let line = #"{"op":"publish","channel":"wallet_updates","account":"\#(account)","type":"t","data":{"n":\#(n)},"idempotencyKey":"k\#(n)"}"#
                do {
                    let reply = String(decoding: try AdminClient(socketPath: socketPath, readTimeout: 10).request(line), as: UTF8.self)
                    if reply.hasPrefix(#"{"ok":true"#) {
                        published.withLock { $0[account, default: 0] += 1 }
                        n += 1
                    } else {
                        tally.withLock { $0.refused += 1; $0.errors.append("publish \(n): \(reply)") }
                    }
                } catch AdminClientError.connectionClosed {
                    continue  // retried with the same key
                } catch {
                    tally.withLock { $0.refused += 1; $0.errors.append("publish \(n): \(error)") }
                    usleep(20_000)
                }
                usleep(3_000)
            }
            publisherDone.store(true, ordering: .relaxed)
        }
        publisher.start()

        for _ in 0..<3 {
            usleep(500_000)
            #expect(holder.stop() == 0, "\(holder.log)")
            try holder.start()
        }
        usleep(500_000)
        // Stop publishing, then give the clients time to receive the last events.
        let total = published.withLock { $0.values.reduce(0, +) }
        stop.store(true, ordering: .relaxed)
        #expect(eventually(timeout: 10) { publisherDone.load(ordering: .relaxed) })
        let expected = published.withLock { $0 }
        _ = eventually(timeout: 5) {
            tally.withLock { t in accounts.allSatisfy { (t.received[$0]?.count ?? 0) >= (expected[$0] ?? 0) } }
        }
        stopClients.store(true, ordering: .relaxed)
        let t = tally.withLock { $0 }
        #expect(total > 50, "too few publishes to mean anything: \(total)")
        #expect(t.refused == 0, "\(t.errors)")
        #expect(t.gaps == 0 && t.duplicates == 0, "\(t.errors)")
        #expect(t.notRecovered == 0, "\(t.errors)")
        #expect(t.resumes >= 3 * accounts.count, "resumes: \(t.resumes)")
        for account in accounts {
            let received = t.received[account] ?? []
            #expect(received.count == expected[account] ?? 0, "\(account): \(received.count) of \(expected[account] ?? 0)")
            #expect(received == received.sorted() && Set(received).count == received.count, "\(account): out of order or doubled")
        }
        #expect(holder.log.components(separatedBy: "recovery: resumed epoch").count - 1 == 3, "\(holder.log)")
        // The client threads end once `stopClients` is set and their socket is quiet.
        #expect(eventually(timeout: 5) { threads.allSatisfy { $0.isFinished } })
        holder.stop()
    }
}
