import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// The Unix socket's memory bound, against the real binary (issue 14, break 2): a peer that floods requests and
/// never reads its replies costs the hub a bounded amount of memory, and other socket connections keep publishing.
@Suite(.serialized) struct SocketBoundsTests {
    /// The flood of the issue: 0.5 MiB of one admin request, with 100 clients connected (so `connections` replies
    /// are ~25 KB each), from a peer that never reads.
    static let floodBytes = 512 << 10
    static let floodSeconds = 5.0
    /// The target: the hub grows by at most this much during the flood.
    static let maxGrowth = 16 << 20

    /// The hub's resident set (VmRSS of /proc/PID/status), in bytes.
    static func residentBytes(_ pid: Int32) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
        for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            if fields.count >= 2, let kilobytes = Int(fields[1]) { return kilobytes * 1024 }
        }
        return 0
    }

    /// A raw non-blocking connection to the hub's Unix socket.
    static func unixConnect(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HubTestError("socket: errno \(errno)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            let utf8 = Array(path.utf8)
            raw.copyBytes(from: utf8)
            raw[utf8.count] = 0
        }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else { let e = errno; close(fd); throw HubTestError("connect \(path): errno \(e)") }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        return fd
    }

    /// A hub with `clients` connected WebSocket clients, warmed up (every admin view answered once, so their code
    /// is resident before the baseline is taken).
    static func hubWithClients(_ clients: Int) throws -> (HubProcess, [TestWebSocket]) {
        let hub = try HubProcess()
        let sockets = try (0..<clients).map { i in try hub.client("acc_\(i % 10)", channels: ["wallet_updates"]) }
        let warm = try hub.admin()
        _ = try warm.requests([#"{"op":"stats"}"#, #"{"op":"connections"}"#, #"{"op":"channels"}"#,
                               #"{"op":"publish","channel":"wallet_updates","account":"nobody","type":"t"}"#])
        warm.close()
        usleep(300_000)
        return (hub, sockets)
    }

    struct Flood {
        var baseline = 0
        var peak = 0
        var sent = 0
        var growth: Int { peak - baseline }
    }

    /// Sends up to `floodBytes` of `line` without ever reading, for `floodSeconds`, sampling the hub's RSS; `during`
    /// runs once, a second into the flood, on this thread (the flood keeps its bytes queued in the kernel meanwhile).
    static func flood(_ hub: HubProcess, line: String, during: (() throws -> Void)? = nil) throws -> (Flood, Int32) {
        let pid = hub.process.processIdentifier
        var result = Flood()
        result.baseline = residentBytes(pid)
        result.peak = result.baseline
        let fd = try unixConnect(hub.socketPath)
        let request = Array(line.utf8) + [0x0A]
        var payload: [UInt8] = []
        while payload.count + request.count <= floodBytes { payload += request }
        let start = Date()
        var ranDuring = during == nil
        while Date().timeIntervalSince(start) < floodSeconds {
            if result.sent < payload.count {
                let n = payload.withUnsafeBytes { send(fd, $0.baseAddress! + result.sent, $0.count - result.sent, Int32(MSG_NOSIGNAL)) }
                if n > 0 { result.sent += n }
            }
            result.peak = max(result.peak, residentBytes(pid))
            if !ranDuring && Date().timeIntervalSince(start) > 1 {
                ranDuring = true
                try during?()
            }
            usleep(10_000)
        }
        result.peak = max(result.peak, residentBytes(pid))
        return (result, fd)
    }

    static func megabytes(_ bytes: Int) -> String { String(format: "%.1f MiB", Double(bytes) / 1_048_576) }

    /// The attack of the issue: +1.1 GiB for `connections`, +60-90 MiB for `stats` before the fix.
    @Test(arguments: [#"{"op":"connections"}"#, #"{"op":"stats"}"#])
    func unreadAdminFloodKeepsMemoryBounded(line: String) throws {
        let (hub, clients) = try Self.hubWithClients(100)
        let (flood, fd) = try Self.flood(hub, line: line)
        let pid = hub.process.processIdentifier
        print("flood \(line): sent \(flood.sent) of \(Self.floodBytes) bytes; RSS \(Self.megabytes(flood.baseline)) → peak "
              + "\(Self.megabytes(flood.peak)) (+\(Self.megabytes(flood.growth)))")
        #expect(flood.growth <= Self.maxGrowth, "RSS grew by \(Self.megabytes(flood.growth)) during the flood")
        // The flooding peer leaves; the hub serves on, and the memory was never taken.
        close(fd)
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1")["delivered"] as? Int == 10)
        usleep(300_000)
        let after = Self.residentBytes(pid)
        print("flood \(line): RSS after the peer left \(Self.megabytes(after)) (+\(Self.megabytes(after - flood.baseline)))")
        #expect(after - flood.baseline <= Self.maxGrowth)
        withExtendedLifetime(clients) {}
    }

    /// While one peer floods `connections` and reads nothing, another socket connection's publishes are answered
    /// promptly, and delivered.
    @Test func publishesOnAnotherConnectionAreAnsweredDuringAFlood() throws {
        let (hub, clients) = try Self.hubWithClients(100)
        let publisher = try hub.admin()
        publisher.readTimeout = 10
        var slowest = 0.0
        var answered = 0
        let (_, fd) = try Self.flood(hub, line: #"{"op":"connections"}"#) {
            for i in 0..<50 {
                let started = Date()
                let reply = try parseObject(publisher.request(
                    #"{"op":"publish","channel":"wallet_updates","account":"acc_3","type":"t","data":"# + "\(i)}"))
                slowest = max(slowest, Date().timeIntervalSince(started))
                if reply["ok"] as? Bool == true && reply["delivered"] as? Int == 10 { answered += 1 }
            }
        }
        defer { close(fd) }
        print("publishes during a connections flood: \(answered)/50 answered, slowest \(Int(slowest * 1000)) ms")
        #expect(answered == 50)
        #expect(slowest < 0.5, "slowest publish round trip \(slowest) s")
        // Every client of acc_3 got all 50, in order.
        for (i, client) in clients.enumerated() where i % 10 == 3 {
            let texts = try client.drainTexts(quiet: 0.3)
            #expect(texts.count == 50 && texts.last?.hasSuffix(#""data":49}"#) == true, "client \(i): \(texts.count) events")
        }
    }

    final class Writer: @unchecked Sendable {
        let admin: AdminClient
        let lock = NSLock()
        var error: String?
        init(_ admin: AdminClient) { self.admin = admin }
    }

    /// Far more requests than the bound admits, in one write, then nothing more: the hub stops between two lines,
    /// and once replies drain it takes up the rest it left unread (the socket brings nothing new to wake it).
    /// Then big publishes, pipelined from another thread: each counts its line until its reply, all are answered
    /// in order and delivered.
    @Test func requestsLeftUnreadAreAllAnsweredInOrder() throws {
        // The client reads its events only at the end: let the hub queue all of them.
        let hub = try HubProcess(["--max-queued-bytes", String(16 << 20)])
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let admin = try hub.admin()
        admin.readTimeout = 20
        // 2000 admin views (more than are gathered at once, and 2.4 MB of replies) in one 32 KB write.
        let views = try admin.requests((0..<2000).map { #"{"op":"stats","id":"# + "\($0)}" }).map { try parseObject($0) }
        #expect(views.count == 2000)
        #expect((0..<2000).allSatisfy { views[$0]["id"] as? Int == $0 && views[$0]["stats"] != nil })

        // 40 publishes of 100 KiB (4 MiB: more than the bound on reply bytes owed), then 2000 small ones.
        let big = "\"" + String(repeating: "b", count: 100 << 10) + "\""
        let lines = (0..<40).map { _ in #"{"op":"publish","channel":"wallet_updates","account":"acc_1","type":"big","data":"# + big + "}" }
            + (0..<2000).map { #"{"op":"publish","channel":"wallet_updates","account":"n","type":"t","data":"# + "\($0)}" }
        let writer = Writer(admin)
        let thread = Thread {
            for line in lines {
                do { try writer.admin.send(Array(line.utf8)) } catch { writer.lock.withLock { writer.error = "\(error)" }; return }
            }
        }
        thread.start()
        var replies: [[String: Any]] = []
        for _ in lines { replies.append(try parseObject(try #require(try admin.readLine()))) }
        #expect(writer.lock.withLock { writer.error } == nil)
        #expect((0..<40).allSatisfy { replies[$0]["seq"] as? Int == $0 + 1 && replies[$0]["delivered"] as? Int == 1 })
        #expect((0..<2000).allSatisfy { replies[40 + $0]["seq"] as? Int == $0 + 1 })
        var received = 0
        while received < 40, let message = try ws.receive(timeout: 5), case .text(let text) = message {
            #expect(text.contains("\"seq\":\(received + 1),"))
            received += 1
        }
        #expect(received == 40)
    }

    /// A reply larger than a socket connection's outbound queue (1 MiB) goes out in pieces as the peer reads, whole
    /// and in order with the replies around it.
    @Test func aReplyLargerThanTheOutboundQueueArrivesWhole() throws {
        let hub = try HubProcess(["--max-connections-per-account", "1000"])
        // 600 connections of an account with a 4000-byte id: a `connections` reply of about 2.6 MB.
        let account = "a" + String(repeating: "x", count: 4000)
        let clients = try (0..<600).map { _ in try hub.client(account) }
        let admin = try hub.admin()
        let replies = try admin.requests([#"{"op":"stats","id":1}"#, #"{"op":"connections","limit":1000,"id":2}"#,
                                          #"{"op":"publish","channel":"wallet_updates","broadcast":true,"type":"t","id":3}"#])
        #expect(replies[1].count > 2 << 20, "\(replies[1].count) bytes")
        let objects = try replies.map { try parseObject($0) }
        #expect(objects.map { $0["id"] as? Int } == [1, 2, 3])
        let listed = objects[1]["connections"] as? [[String: Any]] ?? []
        #expect(objects[1]["total"] as? Int == 600 && listed.count == 600)
        #expect(listed.allSatisfy { $0["account"] as? String == account })
        #expect(objects[2]["ok"] as? Bool == true)
        withExtendedLifetime(clients) {}
    }
}
