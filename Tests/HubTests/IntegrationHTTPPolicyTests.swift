import Foundation
import Glibc
import Testing
import WSProtocol
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// The HTTP-level observations of the red-team report (issue 14): Host, absolute-form targets, duplicate
/// Authorization, Origin, per-account connection limits, and the cost of a handshake that never completes.
@Suite struct IntegrationHTTPPolicyTests {
    static func upgradeRequest(target: String = "/ws", host: String? = "127.0.0.1", extra: [String] = []) -> String {
        var lines = ["GET \(target) HTTP/1.1"]
        if let host { lines.append("Host: \(host)") }
        lines += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                  "Sec-WebSocket-Version: 13"] + extra
        return lines.joined(separator: "\r\n") + "\r\n\r\n"
    }

    @Test func http11WithoutHostIs400OnEveryPath() throws {
        let hub = try HubProcess()
        for path in ["/healthz", "/metrics", "/nope"] {
            let r = try rawHTTP(port: hub.port, "GET \(path) HTTP/1.1\r\n\r\n")
            #expect(r.status == 400 && r.errorCode == "BAD_REQUEST", "\(path): \(r)")
        }
        let twoHosts = try rawHTTP(port: hub.port, "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
        #expect(twoHosts.status == 400)
        // HTTP/1.0 may omit Host.
        #expect(try rawHTTP(port: hub.port, "GET /healthz HTTP/1.0\r\n\r\n").status == 200)
        let token = try hub.token("acc_1")
        let ws = try rawHTTP(port: hub.port, Self.upgradeRequest(host: nil, extra: ["Authorization: Bearer \(token)"]))
        #expect(ws.status == 400 && ws.errorCode == "BAD_REQUEST")
    }

    @Test func absoluteFormTargetsAreAccepted() throws {
        let hub = try HubProcess()
        let health = try rawHTTP(port: hub.port, "GET http://127.0.0.1:\(hub.port)/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        #expect(health.status == 200, "\(health)")
        let token = try hub.token("acc_1")
        let fd = try TestWebSocket.tcpConnect(port: hub.port)
        defer { close(fd) }
        try TestWebSocket.writeAll(fd, Array(Self.upgradeRequest(target: "HTTP://127.0.0.1:\(hub.port)/ws?access_token=\(token)").utf8))
        var buffer = [UInt8](repeating: 0, count: 4096)
        #expect(try TestWebSocket.waitReadable(fd, timeout: 5))
        let n = read(fd, &buffer, buffer.count)
        #expect(n > 0 && String(decoding: buffer[0..<max(0, n)], as: UTF8.self).hasPrefix("HTTP/1.1 101 "))
        let unknown = try rawHTTP(port: hub.port, "GET https://example.com/other HTTP/1.1\r\nHost: example.com\r\n\r\n")
        #expect(unknown.status == 404)
    }

    @Test func duplicateAuthorizationHeadersAre400() throws {
        let hub = try HubProcess()
        let token = try hub.token("acc_1")
        let r = try rawHTTP(port: hub.port, Self.upgradeRequest(extra: ["Authorization: Bearer \(token)", "Authorization: Bearer \(token)"]))
        #expect(r.status == 400 && r.errorCode == "BAD_REQUEST", "\(r)")
        #expect(r.body.contains("Authorization"))
    }

    @Test func allowedOriginsRefuseOtherBrowserOrigins() throws {
        let hub = try HubProcess(["--allowed-origins", "https://app.example.com, https://*.example.org"])
        let token = try hub.token("acc_1")
        func status(_ origin: String?) throws -> Int {
            let extra = ["Authorization: Bearer \(token)"] + (origin.map { ["Origin: \($0)"] } ?? [])
            let fd = try TestWebSocket.tcpConnect(port: hub.port)
            defer { close(fd) }
            try TestWebSocket.writeAll(fd, Array(Self.upgradeRequest(extra: extra).utf8))
            var buffer = [UInt8](repeating: 0, count: 4096)
            guard try TestWebSocket.waitReadable(fd, timeout: 5) else { return -1 }
            let n = read(fd, &buffer, buffer.count)
            let line = String(decoding: buffer[0..<max(0, n)], as: UTF8.self)
            if !line.hasPrefix("HTTP/1.1 101") { #expect(line.contains("\"FORBIDDEN\""), "\(line)") }
            return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
        }
        #expect(try status(nil) == 101, "native apps send no Origin")
        #expect(try status("https://app.example.com") == 101)
        #expect(try status("HTTPS://APP.EXAMPLE.COM") == 101)
        #expect(try status("https://eu.example.org") == 101)
        #expect(try status("https://example.org") == 403)
        #expect(try status("https://evil.example") == 403)
        #expect(try status("http://app.example.com") == 403)
        #expect(try status("null") == 403)
    }

    @Test func originsAreUncheckedByDefault() throws {
        let hub = try HubProcess()
        _ = try hub.client("acc_1", headers: [("Origin", "https://anywhere.example")])
    }

    @Test func badAllowedOriginsAreAStartError() throws {
        #expect(throws: (any Error).self) { try HubProcess(["--allowed-origins", "app.example.com"]) }
    }

    @Test func connectionsPerAccountAreCapped() throws {
        let hub = try HubProcess(["--max-connections-per-account", "2"])
        let a = try hub.client("acc_1")
        let b = try hub.client("acc_1")
        let other = try hub.client("acc_2")  // another account is not affected
        defer { withExtendedLifetime((b, other)) {} }
        do {
            _ = try hub.client("acc_1")
            Issue.record("a third connection for acc_1 was accepted")
        } catch let refused as TestWebSocket.Refused {
            #expect(refused.status == 429 && refused.errorCode == "RATE_LIMITED", "\(refused)")
            #expect(refused.headers[first: "Retry-After"] != nil)
        }
        // When one closes, its slot is free again.
        _ = try a.completeClose()
        #expect(eventually { (try? hub.client("acc_1")) != nil })
    }

    /// A handshake that never completes holds its slot for at most the handshake timeout: the 408 goes out and the
    /// descriptor is closed at once (it used to take timeout + a 1 s tick + a 2 s linger waiting for the peer).
    @Test func stalledHandshakeCostsNoMoreThanTheTimeout() throws {
        let hub = try HubProcess(["--handshake-timeout", "2s"])
        let fd = try TestWebSocket.tcpConnect(port: hub.port)
        defer { close(fd) }
        let started = Date()
        try TestWebSocket.writeAll(fd, Array("GET /ws HTTP/1.1\r\nHost: x\r\n".utf8))
        // The client neither reads nor closes: the hub must not wait for it.
        #expect(eventually(timeout: 5) { ((try? hub.stats()["connections"] as? [String: Any])?["handshaking"] as? Int) == 0 })
        let freed = Date().timeIntervalSince(started)
        #expect(freed >= 1.8 && freed <= 2.3, "slot freed after \(freed) s")
        let response = try readHTTPResponse(fd, timeout: 2)
        #expect(response.status == 408 && response.closed)
    }
}
