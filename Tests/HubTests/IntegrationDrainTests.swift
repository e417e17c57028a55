import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubRouting
import WSProtocol

/// SIGTERM drains instead of dropping everyone at once: `/readyz` turns 503 at once, `/healthz` stays 200, new
/// clients get 503 with `Retry-After`, and the connected clients get 1001 spread over `--drain-duration`.
@Suite struct IntegrationDrainTests {
    static func get(_ port: Int, _ path: String) throws -> RawHTTPResponse {
        try rawHTTP(port: port, "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    }

    /// Waits until each descriptor turns readable (the close frame is the only thing the hub sends an idle client);
    /// when each did, in seconds after `start`, or nil for those still silent at `timeout`.
    static func firstReadable(_ fds: [Int32], since start: Date, timeout: Double) -> [Double?] {
        var times = [Double?](repeating: nil, count: fds.count)
        let deadline = start.addingTimeInterval(timeout)
        while times.contains(where: { $0 == nil }) && Date() < deadline {
            let waiting = fds.indices.filter { times[$0] == nil }
            var polls = waiting.map { pollfd(fd: fds[$0], events: Int16(POLLIN), revents: 0) }
            guard poll(&polls, nfds_t(polls.count), 50) > 0 else { continue }
            let now = Date().timeIntervalSince(start)
            for (k, p) in polls.enumerated() where p.revents != 0 { times[waiting[k]] = now }
        }
        return times
    }

    @Test func closesAreSpreadOverTheDrainDuration() throws {
        let hub = try HubProcess(["--drain-duration", "2s", "--shutdown-timeout", "3s"])
        #expect(try Self.get(hub.port, "/readyz").status == 200)
        let clients = try (0..<300).map { try hub.client("drain_\($0 % 10)") }
        #expect(eventually { (try? hub.stats()["connections"] as? [String: Any])?["open"] as? Int == 300 })

        let start = Date()
        hub.send(signal: SIGTERM)
        // At once: not ready, still alive, and new clients are turned away with a hint when to retry.
        #expect(eventually(timeout: 0.5) { (try? Self.get(hub.port, "/readyz"))?.status == 503 })
        let ready = try Self.get(hub.port, "/readyz")
        #expect(ready.headers["retry-after"] == "5" && ready.errorCode == "SHUTTING_DOWN", "\(ready)")
        #expect(try Self.get(hub.port, "/healthz").status == 200)
        do {
            _ = try hub.client("late")
            Issue.record("a new client was let in during the drain")
        } catch let refused as TestWebSocket.Refused {
            #expect(refused.status == 503 && refused.headers[first: "Retry-After"] == "5", "\(refused)")
        }

        let times = Self.firstReadable(clients.map(\.fd), since: start, timeout: 6)
        let closed = times.compactMap { $0 }.sorted()
        #expect(closed.count == 300, "\(closed.count) of 300 clients got their close")
        guard let first = closed.first, let last = closed.last else { return }
        // 300 over 2 s: 150 a second, about 30 in any 200 ms. All at once would put them within a few ms. The
        // bounds leave room for a test thread that a loaded machine runs late (it then sees several steps at once).
        #expect(last - first >= 1.4 && last <= 3.5, "closes from \(first) s to \(last) s")
        let firstHalf = closed.filter { $0 < 1.0 }.count
        #expect((75...225).contains(firstHalf), "\(firstHalf) of 300 closed in the first second")
        var busiest = 0
        for t in closed { busiest = max(busiest, closed.filter { $0 >= t && $0 < t + 0.2 }.count) }
        #expect(busiest <= 120, "\(busiest) closes within 200 ms (an even spread gives about 30)")

        for ws in clients {
            #expect(try ws.expectClose(timeout: 1).code == 1001)
            try? ws.sendClose(code: 1001)
        }
        #expect(hub.waitForExit(timeout: 8) == 0, "\(hub.log)")
        // 300, or one more when a probe above was still connected as the drain began.
        #expect(hub.log.contains(#/shutdown: draining 30[01] connections over 2\.0s/#), "\(hub.log)")
    }

    /// The default rate (10 000 per 2 s) closes a handful of clients at once: a small hub's shutdown does not wait.
    @Test func theDefaultRateClosesAFewClientsAtOnce() throws {
        let hub = try HubProcess()
        let clients = try (0..<5).map { try hub.client("quick_\($0)") }
        let start = Date()
        hub.send(signal: SIGTERM)
        let times = Self.firstReadable(clients.map(\.fd), since: start, timeout: 3).compactMap { $0 }
        #expect(times.count == 5 && times.allSatisfy { $0 < 0.5 }, "\(times)")
        for ws in clients { _ = try? ws.completeClose(code: 1001) }
        #expect(hub.waitForExit(timeout: 8) == 0)
        #expect(!hub.log.contains("draining"), "\(hub.log)")
    }

    @Test func drainDurationParses() throws {
        func parsed(_ value: String) throws -> Int?? {
            guard case .run(let c) = try HubConfiguration.parse(arguments: ["--drain-duration", value], environment: [:]) else { return nil }
            return .some(c.drainDurationSeconds)
        }
        #expect(try parsed("auto") == .some(nil))
        #expect(try parsed("0") == .some(0))
        #expect(try parsed("2m") == .some(120))
        #expect(throws: HubConfiguration.ConfigurationError(message: "--drain-duration: expected a duration like 30s, 5m or 1h, got 'soon'")) {
            try HubConfiguration.parse(arguments: ["--drain-duration", "soon"], environment: [:])
        }
    }
}
