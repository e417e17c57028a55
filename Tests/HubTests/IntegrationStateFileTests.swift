import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The state file and the secret file against the real binary, as an operator's machine can leave them: a state
/// directory the hub cannot write, a FIFO, a sparse file, loose owners and modes, a symlink, numbering at the edge,
/// and a start that fails after the state was consumed. The unprivileged cases run the hub as `nobody` through
/// setpriv(1): root ignores directory permissions.
@Suite(.serialized) struct IntegrationStateFileTests {
    static let nobody: uid_t = 65534

    /// A state file of epoch `epoch` with one stream (acc_1 on wallet_updates) at `lastSeq`.
    static func stateBytes(epoch: String, lastSeq: UInt64 = 7) -> [UInt8] {
        var saved = SavedBrokerState(hubEpoch: epoch, nextGeneration: 5, savedAt: Double(time(nil)), channelNames: ["wallet_updates"])
        saved.streams = [.init(channel: 0, account: "acc_1", generation: 3, lastSeq: lastSeq)]
        return StateFile.encode(saved)
    }

    static func write(_ bytes: [UInt8], to path: String, mode: mode_t = 0o600, owner: uid_t? = nil) throws {
        #expect(FileManager.default.createFile(atPath: path, contents: Data(bytes)))
        #expect(chmod(path, mode) == 0)
        if let owner { #expect(chown(path, owner, gid_t(owner)) == 0) }
    }

    /// A fresh secret (64 hex characters), written to `path`.
    static func writeSecret(to path: String, owner: uid_t? = nil) throws -> [UInt8] {
        let secret = Array((0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined().utf8)
        try write(secret + [0x0A], to: path, owner: owner)
        return secret
    }

    static func token(_ secret: [UInt8], _ account: String) throws -> String {
        try JWTSigner(key: .hmacSecret(secret)).sign(JWTClaims(sub: account, exp: Int64(time(nil)) + 600, iat: Int64(time(nil))))
    }

    /// The epoch a fresh subscriber of wallet_updates is told.
    static func epoch(_ hub: HubProcess, secret: [UInt8]) throws -> String {
        let ws = try TestWebSocket.connect(port: hub.port, headers: [("Authorization", "Bearer \(try token(secret, "acc_1"))")])
        try IntegrationRecoveryTests.subscribe(ws)
        return try IntegrationRecoveryTests.position(try parseObject(try ws.nextText())).epoch
    }

    static var canDropPrivileges: Bool { geteuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") }
    static let asNobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

    /// Break 1 of the second red team: the hub can read its state directory but not write it. It must not resume a
    /// file it cannot remove (a kill -9 would resume it again and repeat seqs): it starts a new epoch and says why,
    /// every time, with a different epoch each time.
    @Test(.enabled(if: canDropPrivileges, "needs root and setpriv(1) to run the hub as nobody"))
    func aStateFileTheHubCannotRemoveIsNotResumed() throws {
        var secret: [UInt8] = []
        func prepare(_ directory: String) throws {
            #expect(chmod(directory, 0o777) == 0)  // the socket and the log, as nobody
            let state = directory + "/state"
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: false)
            #expect(chmod(state, 0o755) == 0)  // root's: nobody reads it and cannot change it
            secret = try Self.writeSecret(to: state + "/jwt-secret", owner: Self.nobody)
            try Self.write(Self.stateBytes(epoch: "rotest"), to: state + "/recovery.state", owner: Self.nobody)
        }
        var epochs: [String] = []
        var directory = ""
        var hubs: [HubProcess] = []  // the first one's directory lives as long as it does
        for run in 0..<2 {
            let hub: HubProcess
            if run == 0 {
                hub = try HubProcess(launcher: Self.asNobody, beforeStart: prepare)
                directory = hub.directory
            } else {
                hub = try HubProcess(["--state-dir", directory + "/state"], launcher: Self.asNobody) { #expect(chmod($0, 0o777) == 0) }
            }
            let refusal = hub.logLines(containing: "recovery: not resuming").first ?? ""
            #expect(refusal.contains("cannot be removed") && refusal.contains("new epoch"), "\(hub.log)")
            #expect(hub.logLines(containing: "recovery: new epoch").count == 1, "\(hub.log)")
            let epoch = try Self.epoch(hub, secret: secret)
            #expect(!epoch.hasPrefix("rotest"), "run \(run) resumed the file it could not remove")
            // Numbering starts over in the new epoch.
            #expect(try hub.publish(channel: "wallet_updates", account: "acc_1")["seq"] as? Int == 1)
            epochs.append(epoch)
            // A crash: the next start must not find a state to resume either.
            hub.stop(signal: SIGKILL)
            #expect(access(directory + "/state/recovery.state", F_OK) == 0)
            hubs.append(hub)
        }
        #expect(epochs.count == 2 && epochs[0] != epochs[1], "\(epochs)")
    }

    /// A writable state directory, as the hub's own user: the file is consumed at start, so a kill -9 after it means
    /// a new epoch (the same rule as root's, which the recovery tests check).
    @Test(.enabled(if: canDropPrivileges, "needs root and setpriv(1) to run the hub as nobody"))
    func aStateFileItsOwnUserCanRemoveIsResumedOnce() throws {
        var secret: [UInt8] = []
        let hub = try HubProcess(launcher: Self.asNobody) { directory in
            #expect(chmod(directory, 0o777) == 0)
            let state = directory + "/state"
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: false)
            #expect(chown(state, Self.nobody, gid_t(Self.nobody)) == 0 && chmod(state, 0o700) == 0)
            secret = try Self.writeSecret(to: state + "/jwt-secret", owner: Self.nobody)
            try Self.write(Self.stateBytes(epoch: "rwtest"), to: state + "/recovery.state", owner: Self.nobody)
        }
        #expect(hub.logLines(containing: "recovery: resumed epoch rwtest").count == 1, "\(hub.log)")
        #expect(access(hub.stateDirectory + "/recovery.state", F_OK) != 0, "consumed at start")
        #expect(try Self.epoch(hub, secret: secret).hasPrefix("rwtest"))
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1")["seq"] as? Int == 8)
        hub.stop(signal: SIGKILL)
        let again = try HubProcess(["--state-dir", hub.stateDirectory], launcher: Self.asNobody) { #expect(chmod($0, 0o777) == 0) }
        #expect(again.logLines(containing: "recovery: new epoch").count == 1, "\(again.log)")
        withExtendedLifetime(hub) {}
    }

    /// Break 2: a FIFO where the state file belongs hung the start (open without O_NONBLOCK) before the hub listened
    /// or logged. It is refused and moved aside; a FIFO as the secret file stops the start with a clear error.
    @Test func aFIFOInPlaceOfTheStateOrSecretFileDoesNotHangTheStart() throws {
        let hub = try HubProcess { directory in
            try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: false)
            #expect(mkfifo(directory + "/state/recovery.state", 0o600) == 0)
        }
        let line = hub.logLines(containing: "recovery: ignoring the state file").first ?? ""
        #expect(line.contains("not a regular file") && line.contains(".rejected"), "\(hub.log)")
        #expect(hub.logLines(containing: "recovery: new epoch").count == 1)
        var info = stat()
        #expect(lstat(hub.stateDirectory + "/recovery.state.rejected", &info) == 0 && info.st_mode & S_IFMT == S_IFIFO)

        let fifo = hub.directory + "/mine.fifo"
        #expect(mkfifo(fifo, 0o600) == 0)
        do {
            _ = try HubProcess(["--jwt-secret-file", fifo])
            Issue.record("a hub started with a FIFO as its secret file")
        } catch {
            #expect("\(error)".contains("is not a regular file"), "\(error)")
        }
    }

    /// A 1 GiB sparse file behind a valid header was read whole (1.07 GB peak RSS) before its length was checked.
    /// The header's length is now compared with the file's size first: refused, and the hub never holds it.
    @Test func aSparseStateFileIsRefusedWithoutReadingIt() throws {
        let hub = try HubProcess { directory in
            let state = directory + "/state"
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: false)
            try Self.write(Self.stateBytes(epoch: "sparse"), to: state + "/recovery.state")
            #expect(truncate(state + "/recovery.state", 1 << 30) == 0)
        }
        let line = hub.logLines(containing: "recovery: ignoring the state file").first ?? ""
        #expect(line.contains("does not match the file"), "\(hub.log)")
        let status = try String(contentsOfFile: "/proc/\(hub.process.processIdentifier)/status", encoding: .utf8)
        let peak = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }
            .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true)[1]) } ?? Int.max
        #expect(peak < 512 * 1024, "peak RSS \(peak) KiB: the file was read")
    }

    /// Observations: a state file that others can write, that another user owns, or that is a symlink is refused
    /// (as ssh refuses a loose key), with the reason in the log; so is a secret file others can write.
    @Test func looseStateAndSecretFilesAreRefused() throws {
        let cases: [(String, (String) throws -> Void, String)] = [
            ("mode 0666", { try Self.write(Self.stateBytes(epoch: "loose"), to: $0, mode: 0o666) }, "group or others may write"),
            ("group-writable", { try Self.write(Self.stateBytes(epoch: "loose"), to: $0, mode: 0o620) }, "group or others may write"),
            ("owned by nobody", { try Self.write(Self.stateBytes(epoch: "loose"), to: $0, owner: Self.nobody) }, "owned by uid 65534"),
            ("a symlink", { path in
                try Self.write(Self.stateBytes(epoch: "loose"), to: path + ".real")
                #expect(symlink(path + ".real", path) == 0)
            }, "symbolic link"),
        ]
        for (name, make, reason) in cases where geteuid() == 0 || name != "owned by nobody" {
            let hub = try HubProcess { directory in
                try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: false)
                try make(directory + "/state/recovery.state")
            }
            let line = hub.logLines(containing: "recovery: ignoring the state file").first ?? ""
            #expect(line.contains(reason), "\(name): \(hub.log)")
            #expect(hub.logLines(containing: "recovery: new epoch").count == 1, "\(name): \(hub.log)")
            #expect(!(try Self.epoch(hub, secret: try hub.secret()).hasPrefix("loose")), "\(name)")
        }

        let directory = NSTemporaryDirectory() + "hubsecret-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        _ = try Self.writeSecret(to: directory + "/secret")
        #expect(chmod(directory + "/secret", 0o666) == 0)
        do {
            _ = try HubProcess(["--jwt-secret-file", directory + "/secret"])
            Issue.record("a hub started with a world-writable secret")
        } catch {
            #expect("\(error)".contains("group or others may write"), "\(error)")
        }
        #expect(chmod(directory + "/secret", 0o640) == 0)  // readable by the group is a warning, not a refusal
        let hub = try HubProcess(["--jwt-secret-file", directory + "/secret"])
        #expect(hub.logLines(containing: "is readable by other users").count == 1, "\(hub.log)")
    }

    /// A crafted file with a stream at seq 2^64 - 1 made the next publish get seq 0. Numbering at or past 2^53 (what
    /// every JSON client holds exactly) is refused; just below it, it resumes and goes on.
    @Test func aStreamAtTheEdgeOfNumberingIsRefused() throws {
        for (lastSeq, accepted) in [(UInt64.max, false), (UInt64(1) << 53, false), ((UInt64(1) << 53) - 2, true)] {
            let hub = try HubProcess { directory in
                try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: false)
                try Self.write(Self.stateBytes(epoch: "edge", lastSeq: lastSeq), to: directory + "/state/recovery.state")
            }
            if accepted {
                #expect(hub.logLines(containing: "recovery: resumed epoch edge").count == 1, "\(hub.log)")
                #expect(try hub.publish(channel: "wallet_updates", account: "acc_1")["seq"] as? Int == Int(lastSeq + 1))
            } else {
                let line = hub.logLines(containing: "recovery: ignoring the state file").first ?? ""
                #expect(line.contains("numbering is out of range"), "\(lastSeq): \(hub.log)")
                #expect(try hub.publish(channel: "wallet_updates", account: "acc_1")["seq"] as? Int == 1)
            }
        }
    }

    /// The state file is consumed when it is loaded; a start that then fails (the Unix socket's path is a regular
    /// file, refused) writes it back, so the next start still resumes the same epoch. A start refused at its client
    /// port fails before it loads anything (the ports are bound first): the file is left as it was.
    @Test func aStartThatFailsAfterLoadingKeepsTheState() throws {
        let first = try HubProcess()
        #expect(try first.publish(channel: "wallet_updates", account: "acc_1")["seq"] as? Int == 1)
        #expect(first.stop() == 0)
        let saved = first.logLines(containing: "recovery: saved epoch ").first ?? ""
        let epoch = saved.split(separator: "recovery: saved epoch ").last?.split(separator: ":").first.map(String.init) ?? ""
        #expect(!epoch.isEmpty, "\(first.log)")

        // Refused at the port: nothing loaded, nothing written.
        let taken = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(taken) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(taken, $0, length) == 0 && listen(taken, 4) == 0 && getsockname(taken, $0, &length) == 0 }
        }
        try #require(bound)
        let port = Int(UInt16(bigEndian: address.sin_port))
        do {
            _ = try HubProcess(["--state-dir", first.stateDirectory, "--listen", "127.0.0.1:\(port)"])
            Issue.record("a hub started on a taken port")
        } catch {
            #expect("\(error)".contains("127.0.0.1:\(port) is already in use") && !"\(error)".contains("recovery:"), "\(error)")
        }
        #expect(access(first.stateDirectory + "/recovery.state", F_OK) == 0)

        // Refused after loading: the state is written back.
        let blocked = first.stateDirectory + "/not-a-socket"
        try "".write(toFile: blocked, atomically: true, encoding: .utf8)
        do {
            _ = try HubProcess(["--state-dir", first.stateDirectory, "--socket", blocked])
            Issue.record("a hub started with a regular file as its socket")
        } catch {
            #expect("\(error)".contains("is not a socket") && "\(error)".contains("recovery: saved epoch \(epoch)"), "\(error)")
        }
        #expect(access(first.stateDirectory + "/recovery.state", F_OK) == 0)
        let third = try HubProcess(["--state-dir", first.stateDirectory])
        #expect(third.logLines(containing: "recovery: resumed epoch \(epoch)").count == 1, "\(third.log)")
        #expect(try third.publish(channel: "wallet_updates", account: "acc_1")["seq"] as? Int == 2)
    }
}
