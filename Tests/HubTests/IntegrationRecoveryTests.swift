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

/// Recovery through the real binary: positions, resume with `since` under load, the failure reasons, graceful
/// restarts, kill -9, idempotent publishes, the history's memory cap, the state file, and the operator views.
@Suite struct IntegrationRecoveryTests {
    struct Position: Equatable {
        var epoch: String
        var seq: Int
        var broadcastSeq: Int
        var recovered: Bool?
        var reason: String?
    }

    /// The channel's entry in a `subscribed` reply.
    static func position(_ reply: [String: Any], _ channel: String = "wallet_updates") throws -> Position {
        guard reply["type"] as? String == "subscribed", let p = (reply["positions"] as? [String: Any])?[channel] as? [String: Any],
              let epoch = p["epoch"] as? String, let seq = p["seq"] as? Int, let broadcastSeq = p["broadcastSeq"] as? Int else {
            throw HubTestError("no position for \(channel) in \(reply)")
        }
        return Position(epoch: epoch, seq: seq, broadcastSeq: broadcastSeq, recovered: p["recovered"] as? Bool, reason: p["reason"] as? String)
    }

    static func subscribe(_ ws: TestWebSocket, _ channel: String = "wallet_updates", since: Position? = nil) throws {
        var message = #"{"type":"subscribe","channels":["\#(channel)"],"id":"s""#
        if let since {
            message += #","since":{"\#(channel)":{"epoch":"\#(since.epoch)","seq":\#(since.seq),"broadcastSeq":\#(since.broadcastSeq)}}"#
        }
        try ws.send(text: message + "}")
    }

    /// Reads until the `subscribed` reply: the events before it (the replay), and the reply.
    static func readReplay(_ ws: TestWebSocket) throws -> (events: [String], reply: [String: Any]) {
        var events: [String] = []
        while true {
            let text = try ws.nextText()
            if text.hasPrefix(#"{"type":"subscribed""#) { return (events, try parseObject(text)) }
            events.append(text)
        }
    }

    /// (seq, broadcast) of an event frame, without a JSON parser (the load test reads 20k of them a second).
    static func seqOf(_ text: String) -> (seq: Int, broadcast: Bool)? {
        guard let r = text.range(of: #""seq":"#) else { return nil }
        let digits = text[r.upperBound...].prefix { $0.isNumber }
        guard let seq = Int(digits) else { return nil }
        return (seq, text.contains(#""broadcast":true"#))
    }

    static func connect(_ hub: HubProcess, _ account: String, token: String? = nil) throws -> TestWebSocket {
        try TestWebSocket.connect(port: hub.port, headers: [("Authorization", "Bearer \(try token ?? hub.token(account))")])
    }

    // MARK: Under load

    /// A client is cut (no close frame) while a publisher pipelines ~20 000 events/s on the Unix socket (nine in ten
    /// to the client's account, one in ten broadcast). It reconnects with `since`, three times over, and gets every
    /// seq of both streams exactly once, in order: each replay ends at its reply's positions, live events follow.
    @Test func aClientCutMidStreamResumesWithEverySeqExactlyOnce() throws {
        let hub = try HubProcess(["--history-size", "200000", "--recovery-max", "200000", "--max-queued-bytes", String(64 << 20)])
        var ws = try Self.connect(hub, "acc_r")
        try Self.subscribe(ws)
        let start = try Self.position(try parseObject(try ws.nextText()))
        #expect(start.seq == 0 && start.broadcastSeq == 0 && start.recovered == nil)

        let publisher = try PacedPublisher(socketPath: hub.socketPath, total: 50_000, perTick: 200, tickMicros: 10_000) { i in
            i % 10 == 9
                ? #"{"op":"publish","channel":"wallet_updates","broadcast":true,"type":"load","data":{"i":\#(i)}}"#
                : #"{"op":"publish","channel":"wallet_updates","account":"acc_r","type":"load","data":{"i":\#(i)}}"#
        }
        var account: [Int] = [], broadcast: [Int] = []
        func record(_ text: String) throws {
            guard let (seq, isBroadcast) = Self.seqOf(text) else { throw HubTestError("not an event: \(text)") }
            if isBroadcast { broadcast.append(seq) } else { account.append(seq) }
        }
        var replayedTotal = 0
        for _ in 1...3 {
            let cutAt = Date().addingTimeInterval(0.4)
            while Date() < cutAt { try record(try ws.nextText()) }
            ws.shutdownTCP()  // cut mid-stream: the hub just sees the connection go
            usleep(150_000)   // events go on while it is away
            #expect(!publisher.isFinished, "the publisher must still run when the client comes back")

            ws = try Self.connect(hub, "acc_r")
            try Self.subscribe(ws, since: Position(epoch: start.epoch, seq: account.last ?? 0, broadcastSeq: broadcast.last ?? 0))
            let (replayed, reply) = try Self.readReplay(ws)
            for text in replayed { try record(text) }
            let resumed = try Self.position(reply)
            #expect(resumed.recovered == true && resumed.epoch == start.epoch, "\(reply)")
            #expect(resumed.seq == account.last ?? 0 && resumed.broadcastSeq == broadcast.last ?? 0, "the replay ends at the reply's positions")
            #expect(replayed.count > 100, "the client missed events while away: \(replayed.count)")
            replayedTotal += replayed.count
        }
        try publisher.wait(timeout: 60)
        while let text = try? ws.nextText(timeout: 2) { try record(text) }
        let (accountPublished, broadcastPublished) = publisher.okCounts
        #expect(publisher.failures.isEmpty, "\(publisher.failures.prefix(3))")
        #expect(accountPublished + broadcastPublished == 50_000)
        #expect(Self.sequenceProblem(account, through: accountPublished) == nil)
        #expect(Self.sequenceProblem(broadcast, through: broadcastPublished) == nil)
        print("recovery under load: \(publisher.achievedRate) events/s published, \(replayedTotal) replayed over 3 resumes")
    }

    /// nil when `seqs` is exactly 1...n; else where it first goes wrong (short, unlike printing both arrays).
    static func sequenceProblem(_ seqs: [Int], through n: Int) -> String? {
        for (i, seq) in seqs.enumerated() where seq != i + 1 {
            return "at index \(i): \(seqs[max(0, i - 2)..<min(seqs.count, i + 3)]) (expected \(i + 1)); \(seqs.count) received of \(n)"
        }
        return seqs.count == n ? nil : "\(seqs.count) received of \(n)"
    }

    // MARK: Failure reasons

    @Test func aResumeThatCannotBeHonouredReplaysNothingAndSaysWhy() throws {
        let hub = try HubProcess(["--history-size", "5", "--recovery-max", "3"])
        let ws = try Self.connect(hub, "acc_1")
        try Self.subscribe(ws)
        let start = try Self.position(try parseObject(try ws.nextText()))
        for i in 1...4 { #expect(try hub.publish(channel: "wallet_updates", account: "acc_1", data: "\(i)")["seq"] as? Int == i) }
        #expect(try ws.drainTexts(quiet: 0.2).count == 4)

        func resume(_ since: Position) throws -> (events: [String], position: Position) {
            let c = try Self.connect(hub, "acc_1")
            try Self.subscribe(c, since: since)
            let (events, reply) = try Self.readReplay(c)
            return (events, try Self.position(reply))
        }
        // Within history and the cap: exactly the missing events.
        var r = try resume(Position(epoch: start.epoch, seq: 1, broadcastSeq: 0))
        #expect(r.events.compactMap { Self.seqOf($0)?.seq } == [2, 3, 4] && r.position.recovered == true)
        #expect(r.position.seq == 4 && r.position.broadcastSeq == 0)
        // Up to date: nothing to replay, recovered.
        r = try resume(Position(epoch: start.epoch, seq: 4, broadcastSeq: 0))
        #expect(r.events.isEmpty && r.position.recovered == true)
        // More than --recovery-max missing.
        r = try resume(Position(epoch: start.epoch, seq: 0, broadcastSeq: 0))
        #expect(r.events.isEmpty && r.position == Position(epoch: start.epoch, seq: 4, broadcastSeq: 0, recovered: false, reason: "too_many"))
        // Evicted from history (size 5): seq 1 and 2 are gone after 3 more.
        for _ in 1...3 { _ = try hub.publish(channel: "wallet_updates", account: "acc_1") }
        r = try resume(Position(epoch: start.epoch, seq: 1, broadcastSeq: 0))
        #expect(r.events.isEmpty && r.position.recovered == false && r.position.reason == "too_old", "\(r.position)")
        // All or nothing per channel: the account stream is fine but the broadcast position is ahead of its stream.
        r = try resume(Position(epoch: start.epoch, seq: 6, broadcastSeq: 9))
        #expect(r.events.isEmpty && r.position.reason == "epoch_changed")
        // An epoch from elsewhere.
        r = try resume(Position(epoch: "AAAAAAAAAAA.1.2", seq: 6, broadcastSeq: 0))
        #expect(r.events.isEmpty && r.position.reason == "epoch_changed" && r.position.epoch == start.epoch)
        // A malformed since is a validation error, and nothing changes.
        let c = try Self.connect(hub, "acc_1")
        try c.send(text: #"{"type":"subscribe","channels":["wallet_updates"],"since":{"profile_updates":{"epoch":"x","seq":1,"broadcastSeq":0}},"id":"v"}"#)
        let error = try parseObject(try c.nextText())
        #expect((error["error"] as? [String: Any])?["code"] as? String == "VALIDATION_ERROR" && error["id"] as? String == "v", "\(error)")
        try c.send(text: #"{"type":"subscribe","channels":["wallet_updates"],"since":{"wallet_updates":{"epoch":"x","seq":-1,"broadcastSeq":0}}}"#)
        #expect(try c.nextText().contains("VALIDATION_ERROR"))

        let history = try hub.stats()["history"] as? [String: Any] ?? [:]
        let recoveries = history["recoveries"] as? [String: Int] ?? [:]
        #expect(recoveries == ["recovered": 2, "too_many": 1, "too_old": 1, "epoch_changed": 2], "\(history)")
        #expect(history["replayedEvents"] as? Int == 3)
    }

    // MARK: Restarts

    /// SIGTERM writes the state; the next start resumes the same epoch and numbering, replays what a client missed,
    /// remembers idempotency keys, and deletes the file, so a kill -9 after that means a new epoch.
    @Test func aGracefulRestartResumesAndAKill9ChangesTheEpoch() throws {
        let first = try HubProcess()
        let token = try first.token("acc_1", ttl: 3600)
        let ws = try Self.connect(first, "acc_1", token: token)
        try Self.subscribe(ws)
        let start = try Self.position(try parseObject(try ws.nextText()))
        let keyed = #"{"op":"publish","channel":"wallet_updates","account":"acc_1","type":"order","data":{"n":1},"idempotencyKey":"order-1"}"#
        #expect(try first.request(keyed)["seq"] as? Int == 1)
        _ = try first.publish(channel: "wallet_updates", account: nil, type: "news")
        #expect(try ws.drainTexts(quiet: 0.2).count == 2)
        ws.shutdownTCP()
        for i in 2...4 { #expect(try first.publish(channel: "wallet_updates", account: "acc_1", data: "\(i)")["seq"] as? Int == i) }
        #expect(first.stop() == 0)
        let stateFile = first.stateDirectory + "/recovery.state"
        #expect(access(stateFile, F_OK) == 0, "\(first.log)")
        #expect(first.logLines(containing: "recovery: saved epoch \(start.epoch.split(separator: ".")[0])").count == 1, "\(first.log)")

        let second = try HubProcess(["--state-dir", first.stateDirectory])
        #expect(second.logLines(containing: "recovery: resumed epoch").count == 1, "\(second.log)")
        #expect(access(stateFile, F_OK) != 0, "the state file is deleted once loaded")
        let back = try Self.connect(second, "acc_1", token: token)
        try Self.subscribe(back, since: Position(epoch: start.epoch, seq: 1, broadcastSeq: 1))
        let (replayed, reply) = try Self.readReplay(back)
        #expect(try Self.position(reply) == Position(epoch: start.epoch, seq: 4, broadcastSeq: 1, recovered: true))
        #expect(replayed == (2...4).map { #"{"type":"test_event","channel":"wallet_updates","seq":\#($0),"data":\#($0)}"# })
        // Numbering goes on; the key is remembered across the restart.
        #expect(try second.publish(channel: "wallet_updates", account: "acc_1")["seq"] as? Int == 5)
        let repeated = try second.request(keyed)
        #expect(repeated["seq"] as? Int == 1 && repeated["duplicate"] as? Bool == true, "\(repeated)")
        #expect(try back.drainTexts(quiet: 0.2).count == 1)
        back.shutdownTCP()

        // A crash: no state is written, and the file loaded at start is gone, so the next start is a new epoch.
        _ = second.stop(signal: SIGKILL)
        let third = try HubProcess(["--state-dir", first.stateDirectory])
        #expect(third.logLines(containing: "recovery: new epoch").count == 1, "\(third.log)")
        let again = try Self.connect(third, "acc_1", token: token)
        try Self.subscribe(again, since: Position(epoch: start.epoch, seq: 5, broadcastSeq: 1))
        let (none, failed) = try Self.readReplay(again)
        let position = try Self.position(failed)
        #expect(none.isEmpty && position.recovered == false && position.reason == "epoch_changed" && position.epoch != start.epoch)
        #expect(position.seq == 0, "numbering restarted")
        again.shutdownTCP()
        withExtendedLifetime(first) {}
    }

    @Test func aCorruptStateFileIsReportedAndIgnored() throws {
        let directory = NSTemporaryDirectory() + "hubstate-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var bytes = StateFile.encode(SavedBrokerState(hubEpoch: "zzzzzzzzzzz", nextGeneration: 5, savedAt: 0, channelNames: ["wallet_updates"]))
        bytes[bytes.count - 1] ^= 0xFF
        #expect(FileManager.default.createFile(atPath: directory + "/recovery.state", contents: Data(bytes)))
        let hub = try HubProcess(["--state-dir", directory])
        let line = hub.logLines(containing: "recovery: ignoring the state file").first ?? ""
        #expect(line.contains("checksum") && line.contains(".rejected"), "\(hub.log)")
        #expect(hub.logLines(containing: "recovery: new epoch").count == 1, "\(hub.log)")
        #expect(access(directory + "/recovery.state.rejected", F_OK) == 0 && access(directory + "/recovery.state", F_OK) != 0)
        let ws = try Self.connect(hub, "acc_1", token: try JWTSigner(key: .hmacSecret(SecretFile.read(path: directory + "/jwt-secret").secret))
            .sign(JWTClaims(sub: "acc_1", exp: Int64(time(nil)) + 600, iat: Int64(time(nil)))))
        try Self.subscribe(ws)
        #expect(!(try Self.position(try parseObject(try ws.nextText())).epoch.hasPrefix("zzzzzzzzzzz")))
    }

    // MARK: Idempotent publishing

    /// The backend's connection drops before it reads the reply; it retries with the same key and gets the first
    /// publish's seq and delivered, marked duplicate, and the app receives the event once.
    @Test func aRetriedPublishIsDeliveredOnce() throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let line = #"{"op":"publish","channel":"wallet_updates","account":"acc_1","type":"paid","data":{"order":7},"idempotencyKey":"pay-7"}"#
        let fd = try unixConnect(hub.socketPath)
        try TestWebSocket.writeAll(fd, Array((line + "\n").utf8))
        close(fd)  // gone before the reply
        #expect(try ws.nextText() == #"{"type":"paid","channel":"wallet_updates","seq":1,"data":{"order":7}}"#)
        let retry = try hub.request(line)
        #expect(retry["seq"] as? Int == 1 && retry["delivered"] as? Int == 1 && retry["duplicate"] as? Bool == true, "\(retry)")
        // Two in one write: the second waits for the first's outcome.
        let client = try hub.admin()
        let other = line.replacingOccurrences(of: "pay-7", with: "pay-8")
        let replies = try client.requests([other, other]).map { try parseObject($0) }
        #expect(replies[0]["seq"] as? Int == 2 && replies[0]["duplicate"] == nil, "\(replies)")
        #expect(replies[1]["seq"] as? Int == 2 && replies[1]["delivered"] as? Int == 1 && replies[1]["duplicate"] as? Bool == true)
        // The same key on another account is another publish.
        #expect(try hub.request(line.replacingOccurrences(of: "acc_1", with: "acc_2"))["duplicate"] == nil)
        #expect(try ws.drainTexts(quiet: 0.3).map { Self.seqOf($0)?.seq } == [2])
        let bad = try hub.request(#"{"op":"publish","channel":"wallet_updates","account":"a","type":"t","idempotencyKey":""}"#)
        #expect((bad["error"] as? [String: Any])?["code"] as? String == "INVALID_REQUEST")
        #expect((try hub.stats()["history"] as? [String: Any])?["duplicates"] as? Int == 2)
    }

    // MARK: Memory

    /// 100 000 streams, one event each, with a 4 MiB cap: the counted history stays under the cap (oldest evicted,
    /// with a metric), and the process stays small.
    @Test func historyMemoryStaysUnderItsCapWith100kStreams() throws {
        let cap = 4 << 20
        let hub = try HubProcess(["--history-memory", "4m"])
        let rssBefore = try Self.rss(hub)
        let client = try hub.admin()
        var published = 0
        for chunk in stride(from: 0, to: 100_000, by: 2000) {
            let lines = (chunk..<(chunk + 2000)).map {
                #"{"op":"publish","channel":"wallet_updates","account":"acc_\#($0)","type":"balance","data":{"balance":"\#($0).00","currency":"EUR"}}"#
            }
            published += try client.requests(lines).filter { String(decoding: $0, as: UTF8.self).hasPrefix(#"{"ok":true"#) }.count
        }
        #expect(published == 100_000)
        let history = try hub.stats()["history"] as? [String: Any] ?? [:]
        let bytes = history["bytes"] as? Int ?? -1, events = history["events"] as? Int ?? -1
        #expect(bytes > cap * 9 / 10 && bytes <= cap, "\(history)")
        #expect(history["limitBytes"] as? Int == cap && history["streams"] as? Int == 100_000)
        #expect(history["evictions"] as? Int == 100_000 - events)
        let metrics = try rawHTTP(port: hub.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").body
        #expect(metrics.contains("hub_history_bytes \(bytes)\n") && metrics.contains("hub_history_evictions_total \(100_000 - events)\n"))
        let rssAfter = try Self.rss(hub)
        print("100k streams: \(events) events retained in \(bytes) counted bytes; RSS \(rssBefore >> 10) -> \(rssAfter >> 10) KiB")
        // Against a sanitizer-built hub (scripts/sanitize) RSS measures the sanitizer (ASan's quarantine alone keeps
        // up to 256 MiB of freed memory), not the hub: the counted bytes above are still checked there.
        if !HubProcess.isExternalBinary {
            #expect(rssAfter - rssBefore < 96 << 20, "RSS grew by \(rssAfter - rssBefore) bytes")
        }
    }

    static func rss(_ hub: HubProcess) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(hub.process.processIdentifier)/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kb = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else {
            throw HubTestError("no VmRSS")
        }
        return kb << 10
    }

    // MARK: Operators

    @Test func hubctlHistoryAndStatusShowTheRetainedEvents() throws {
        let hub = try HubProcess()
        for i in 1...3 { _ = try hub.publish(channel: "wallet_updates", account: "acc_1", type: "balance_\(i)", data: "{}") }
        _ = try hub.publish(channel: "wallet_updates", account: nil, type: "news")
        let run = try LiveHub.hubctl(["--socket", hub.socketPath, "--no-color", "history", "wallet_updates", "--account", "acc_1", "--since", "1"])
        #expect(run.status == 0, "\(run.summary)")
        let lines = run.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix("history wallet_updates account acc_1  epoch ") == true && lines.first?.hasSuffix("last seq 3") == true, "\(run.stdout)")
        #expect(lines.dropFirst().first?.split(separator: " ", omittingEmptySubsequences: true) == ["SEQ", "TYPE", "AGE", "SIZE"], "\(run.stdout)")
        #expect(lines.count == 4 && lines[2].contains("balance_2") && lines[3].contains("balance_3") && lines[3].contains(" B"), "\(run.stdout)")
        let json = try LiveHub.hubctl(["--socket", hub.socketPath, "--json", "history", "wallet_updates", "--broadcast"])
        let history = try parseObject(json.stdout)["history"] as? [String: Any] ?? [:]
        #expect(history["broadcast"] as? Bool == true && history["seq"] as? Int == 1 && (history["events"] as? [Any])?.count == 1, "\(json.summary)")
        let usage = try LiveHub.hubctl(["--socket", hub.socketPath, "history", "wallet_updates"])
        #expect(usage.status == 2 && usage.stderr.contains("exactly one of --account A or --broadcast"), "\(usage.summary)")
        let unknown = try LiveHub.hubctl(["--socket", hub.socketPath, "history", "wallet_updates", "--account", "nobody"])
        #expect(unknown.status == 0 && unknown.stdout.contains("no such stream"), "\(unknown.summary)")

        let status = try LiveHub.hubctl(["--socket", hub.socketPath, "--no-color", "status"])
        let epoch = history["epoch"] as? String ?? "?"
        #expect(status.stdout.contains("epoch          \(epoch.split(separator: ".")[0])"), "\(status.stdout)")
        #expect(status.stdout.contains("history        4 events in 2 streams"), "\(status.stdout)")
        let metrics = try rawHTTP(port: hub.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").body
        for name in ["hub_recoveries_total{outcome=\"too_old\"} 0", "hub_replayed_events_total 0", "hub_history_events 4",
                     "hub_idempotent_duplicates_total 0", "hub_history_evictions_total 0"] {
            #expect(metrics.contains(name + "\n"), "\(name)")
        }
    }
}

/// A blocking connection to a Unix socket.
func unixConnect(_ path: String) throws -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (i, b) in path.utf8.prefix(raw.count - 1).enumerated() { raw[i] = b }
    }
    let rc = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard rc == 0 else { close(fd); throw HubTestError("cannot connect to \(path): errno \(errno)") }
    return fd
}

/// Publishes `total` lines on one Unix-socket connection at a steady pace (`perTick` lines every `tickMicros`),
/// pipelined, reading the replies on another thread.
final class PacedPublisher: Sendable {
    private struct State {
        var replies = 0
        var accountOK = 0
        var broadcastOK = 0
        var failures: [String] = []
        var finishedAt: Date?
    }
    private let state = Mutex(State())
    private let fd: Int32
    private let total: Int
    private let startedAt = Date()

    init(socketPath: String, total: Int, perTick: Int, tickMicros: UInt32, line: @escaping @Sendable (Int) -> String) throws {
        fd = try unixConnect(socketPath)
        self.total = total
        let fd = self.fd
        Thread.detachNewThread {
            var i = 0
            while i < total {
                let next = min(total, i + perTick)
                let chunk = (i..<next).map { line($0) + "\n" }.joined()
                if (try? TestWebSocket.writeAll(fd, Array(chunk.utf8))) == nil { return }
                i = next
                usleep(tickMicros)
            }
        }
        Thread.detachNewThread { [self] in readReplies() }
    }

    deinit { close(fd) }

    private func readReplies() {
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var line: [UInt8] = []
        while state.withLock({ $0.replies }) < total {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { break }
            for b in buffer[0..<n] {
                guard b == 0x0A else { line.append(b); continue }
                let text = String(decoding: line, as: UTF8.self)
                line.removeAll(keepingCapacity: true)
                state.withLock { s in
                    s.replies += 1
                    if !text.hasPrefix(#"{"ok":true"#) { s.failures.append(text) }
                    else if (s.replies - 1) % 10 == 9 { s.broadcastOK += 1 } else { s.accountOK += 1 }
                }
            }
        }
        state.withLock { $0.finishedAt = Date() }
    }

    var isFinished: Bool { state.withLock { $0.finishedAt != nil } }
    var failures: [String] { state.withLock { $0.failures } }
    var okCounts: (account: Int, broadcast: Int) { state.withLock { ($0.accountOK, $0.broadcastOK) } }
    var achievedRate: Int {
        state.withLock { s in
            let end = s.finishedAt ?? Date()
            return Int(Double(s.replies) / max(0.001, end.timeIntervalSince(startedAt)))
        }
    }

    func wait(timeout: Double) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while !isFinished && Date() < deadline { usleep(10_000) }
        guard isFinished else { throw HubTestError("publisher did not finish: \(state.withLock { $0.replies }) replies") }
    }
}
