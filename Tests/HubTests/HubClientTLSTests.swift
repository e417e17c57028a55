import Foundation
import Glibc
@testable import HubClient
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// `POSIXTransport` over `wss://` (OpenSSL), against the real hub binary's TLS listener with certificates from a test
/// CA made with the `openssl` CLI: `HubClient` delivers exact bytes by DNS name and by IP address; a certificate from
/// another CA, or one that does not name the host, is refused as a retryable failure (not a configuration error)
/// naming the verify result; concurrent sends and reads share one `SSL` safely; and `close` leaves no socket behind,
/// also against a hub that does not answer.
@Suite(.serialized) struct HubClientTLSTests {
    typealias Recorder = HubClientTests.Recorder

    /// A hub whose --listen port speaks TLS with `cert` and `key`.
    static func tlsHub(cert: String, key: String, extra: [String] = []) throws -> HubProcess {
        try HubProcess(["--tls-cert", cert, "--tls-key", key] + extra)
    }

    /// A certificate from `ca` whose subjectAltName is exactly `san` (e.g. "DNS:otherhost"); its paths.
    static func issue(_ ca: TestCA, _ name: String, san: String) throws -> (cert: String, key: String) {
        let dir = ca.directory
        let key = "\(dir)/\(name).key", csr = "\(dir)/\(name).csr", cert = "\(dir)/\(name).pem", ext = "\(dir)/\(name).ext"
        try "subjectAltName=\(san)\n".write(toFile: ext, atomically: true, encoding: .utf8)
        try TestCA.openssl(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
                            "-out", csr, "-subj", "/O=\(name)/CN=\(name)"])
        try TestCA.openssl(["x509", "-req", "-in", csr, "-CA", ca.caFile, "-CAkey", dir + "/ca.key", "-CAcreateserial",
                            "-out", cert, "-days", "2", "-extfile", ext])
        return (cert, key)
    }

    /// Connects a bare transport; the error it throws, or nil when it connected (then closed).
    static func connectError(_ url: String, caFile: String?) async -> HubTransportError? {
        guard let parsed = URL(string: url) else { return HubTransportError("the test's URL does not parse: \(url)") }
        let transport = POSIXTransport(connectTimeout: 5, tls: .init(caFile: caFile))
        do {
            try await transport.connect(url: parsed, protocols: ["hub.v1"])
            await transport.close(code: 1000, reason: "test")
            return nil
        } catch let error as HubTransportError {
            return error
        } catch {
            return HubTransportError("unexpected error type: \(error)", isConfigurationError: true)
        }
    }

    /// This process's sockets connected to `port`: the descriptors /proc/self/fd lists as sockets whose peer
    /// (`getpeername`) has that port. Counting only these, not every descriptor, keeps the check exact while other
    /// suites open and close descriptors in parallel (and /proc/self/net/tcp does not list every connection here).
    static func socketsTo(port: Int) -> Int {
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        var count = 0
        for name in fds {
            guard let fd = Int32(name),
                  let link = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(name)"),
                  link.hasPrefix("socket:") else { continue }
            var address = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let ok = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) == 0 }
            }
            guard ok else { continue }
            let peerPort: UInt16
            switch Int32(address.ss_family) {
            case AF_INET: peerPort = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_port } }
            case AF_INET6: peerPort = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_port } }
            default: continue
            }
            if Int(UInt16(bigEndian: peerPort)) == port { count += 1 }
        }
        return count
    }

    /// Whether process `pid` is stopped (state `T` in /proc/PID/stat, after the parenthesised command name).
    static func isStopped(_ pid: Int32) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return false }
        return stat[close...].dropFirst().trimmingCharacters(in: .whitespaces).hasPrefix("T")
    }

    static let trickyData = #"{"z":1,"a":10.50,"s":"a/b","caf\u00e9":1,"cafe\u0301":2,"n":[1e2,-0.0,{"x":"}"}]}"#

    /// (1) `HubClient` over wss:// trusting the test CA: authenticated, subscribed, and each event's `data` is the
    /// published bytes, a small one and one of ~400 KB (many TLS records, more than the reader decrypts per lock),
    /// by DNS name and by IP address.
    @Test(arguments: ["localhost", "127.0.0.1"])
    func hubClientOverWSSGetsExactEvents(host: String) async throws {
        let ca = try TestCA()
        let (cert, key) = try ca.issue("server", organization: "one")
        let hub = try Self.tlsHub(cert: cert, key: key, extra: ["--max-event-bytes", "1048576"])
        let mint = try HubClientTests.minter(hub)
        let r = Recorder()
        let caFile = ca.caFile
        let client = HubClient(url: URL(string: "wss://\(host):\(hub.port)/ws")!, configuration: HubClientTests.fast,
                               transport: { POSIXTransport(tls: .init(caFile: caFile)) }) { reason in
            r.asked(reason)
            return mint("acc_tls", 900)
        }
        await r.follow(client, ["wallet_updates"])
        await client.start()
        #expect(await HubClientTests.subscribed(client), "\(r.states)")
        _ = try hub.publish(channel: "wallet_updates", account: "acc_tls", data: Self.trickyData)
        let big = #"{"s":""# + String(repeating: "0123456789abcdef", count: 25_000) + #"","t":"é"}"#
        _ = try hub.publish(channel: "wallet_updates", account: "acc_tls", data: big)
        #expect(await HubClientTests.until(10) { r.events.count == 2 }, "\(r.events.count) events, states \(r.states)")
        #expect(r.events.map { String(decoding: $0.data, as: UTF8.self) } == [Self.trickyData, big])
        #expect(r.events.map(\.seq) == [1, 2])
        #expect(r.states == [.connecting, .connected], "\(r.states)")
        #expect(r.reasons == [.connect], "\(r.reasons)")
        let tls = try hub.stats()["tls"] as? [String: Any] ?? [:]
        #expect(tls["handshakes"] as? Int == 1, "\(tls)")
        await client.stop()
        #expect(await HubClientTests.until(5) { HubClientLifecycleTests.openConnections(hub) == 0 }, "stop() left a connection")
        #expect(Self.socketsTo(port: hub.port) == 0)
    }

    /// (2) A certificate from another CA (and from the system store, which does not hold the test CA): the connect
    /// throws, naming the verify result, as a retryable failure; `HubClient` reports it and tries again.
    @Test func aCertificateFromAnotherCAIsRefusedAndRetried() async throws {
        let ca = try TestCA()
        let other = try TestCA()
        let (cert, key) = try ca.issue("server", organization: "one")
        let hub = try Self.tlsHub(cert: cert, key: key)
        for caFile in [other.caFile, nil] {
            let error = await Self.connectError("wss://localhost:\(hub.port)/ws", caFile: caFile)
            #expect(error?.description.contains("unable to get local issuer certificate") == true, "\(String(describing: error))")
            #expect(error?.isConfigurationError == false)
            #expect(error?.httpStatus == nil)
        }
        // The control: the right CA connects; an upgrade the hub refuses over TLS carries its HTTP status.
        let right = await Self.connectError("wss://localhost:\(hub.port)/ws", caFile: ca.caFile)
        #expect(right == nil, "\(String(describing: right))")
        let notFound = await Self.connectError("wss://localhost:\(hub.port)/nope", caFile: ca.caFile)
        #expect(notFound?.httpStatus == 404 && notFound?.isConfigurationError == false, "\(String(describing: notFound))")

        let r = Recorder()
        let otherFile = other.caFile
        let client = HubClient(url: URL(string: "wss://localhost:\(hub.port)/ws")!, configuration: HubClientTests.fast,
                               transport: { POSIXTransport(tls: .init(caFile: otherFile)) }) { reason in
            r.asked(reason)
            return "token"
        }
        await r.follow(client, ["wallet_updates"])
        await client.start()
        #expect(await HubClientTests.until(5) { r.states.filter { $0 == .connecting }.count >= 3 }, "\(r.states)")
        await client.stop()
        // Each failure is a network failure retried, reported with the verify result, and followed by another
        // attempt (the `.connecting`s above).
        let refusals = r.states.compactMap(\.disconnect).filter {
            $0.reason == .network && $0.willRetry && $0.message.contains("unable to get local issuer certificate")
        }
        #expect(refusals.count >= 2, "\(r.states)")
        #expect(r.reasons.isEmpty, "a token was asked before the TLS connection was up: \(r.reasons)")
        // stop() may return while a connect is still in its handshake (as over ws://): that one closes its own
        // socket when it fails, a moment later.
        #expect(await HubClientTests.until(2) { Self.socketsTo(port: hub.port) == 0 }, "a refused connection left a socket")
    }

    /// (3) A certificate that does not name the host asked for: one for `otherhost` only, by name and by address;
    /// one for `localhost` only (no IP address), by address. The same certificate by its own name connects.
    @Test func aCertificateWithoutTheRequestedNameIsRefused() async throws {
        let ca = try TestCA()
        let other = try Self.issue(ca, "otherhost", san: "DNS:otherhost")
        let otherHub = try Self.tlsHub(cert: other.cert, key: other.key)
        let byName = await Self.connectError("wss://localhost:\(otherHub.port)/ws", caFile: ca.caFile)
        #expect(byName?.description.contains("hostname mismatch") == true, "\(String(describing: byName))")
        #expect(byName?.isConfigurationError == false)
        let byAddress = await Self.connectError("wss://127.0.0.1:\(otherHub.port)/ws", caFile: ca.caFile)
        #expect(byAddress?.description.contains("IP address mismatch") == true, "\(String(describing: byAddress))")
        #expect(byAddress?.isConfigurationError == false)

        let dnsOnly = try Self.issue(ca, "localonly", san: "DNS:localhost")
        let dnsHub = try Self.tlsHub(cert: dnsOnly.cert, key: dnsOnly.key)
        let ip = await Self.connectError("wss://127.0.0.1:\(dnsHub.port)/ws", caFile: ca.caFile)
        #expect(ip?.description.contains("IP address mismatch") == true, "\(String(describing: ip))")
        #expect(ip?.isConfigurationError == false)
        let name = await Self.connectError("wss://localhost:\(dnsHub.port)/ws", caFile: ca.caFile)
        #expect(name == nil, "\(String(describing: name))")
        #expect(Self.socketsTo(port: otherHub.port) == 0 && Self.socketsTo(port: dnsHub.port) == 0)
    }

    /// Schemes other than ws:// and wss:// are still configuration errors; a CA file that cannot be read is one too.
    @Test func otherSchemesAndAMissingCAFileAreConfigurationErrors() async throws {
        let http = await Self.connectError("http://127.0.0.1:1/ws", caFile: nil)
        #expect(http?.isConfigurationError == true, "\(String(describing: http))")
        let none = await Self.connectError("//127.0.0.1:1/ws", caFile: nil)
        #expect(none?.isConfigurationError == true, "\(String(describing: none))")
        let missing = await Self.connectError("wss://127.0.0.1:1/ws", caFile: "/nonexistent/ca.pem")
        #expect(missing?.isConfigurationError == true && missing?.description.contains("/nonexistent/ca.pem") == true,
                "\(String(describing: missing))")
        // wss:// itself is not: nothing listens on port 1, a failure to retry.
        let refused = await Self.connectError("wss://127.0.0.1:1/ws", caFile: nil)
        #expect(refused?.isConfigurationError == false, "\(String(describing: refused))")
    }

    /// One `SSL` shared by the reader thread and senders on several tasks: 4 × 100 pings sent concurrently while
    /// ~1 MB of events arrive; every pong and every event comes back whole.
    @Test func concurrentSendsAndReadsOverOneTLSConnection() async throws {
        let ca = try TestCA()
        let (cert, key) = try ca.issue("server", organization: "one")
        let hub = try Self.tlsHub(cert: cert, key: key, extra: ["--rate-limit", "100000"])
        let transport = POSIXTransport(tls: .init(caFile: ca.caFile))
        try await transport.connect(url: URL(string: "wss://localhost:\(hub.port)/ws")!, protocols: ["hub.v1"])
        try await transport.send(text: #"{"type":"auth","token":"\#(try hub.token("acc_c"))","id":"a"}"#)
        try await transport.send(text: #"{"type":"subscribe","channels":["wallet_updates"],"id":"s"}"#)
        var texts: [String] = []
        while !texts.contains(where: { $0.contains(#""type":"subscribed""#) }) {
            guard case .text(let t) = await transport.receive() else { break }
            texts.append(t)
        }
        try #require(texts.contains { $0.contains(#""type":"subscribed""#) }, "\(texts)")

        let senders = Task {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for sender in 0..<4 {
                    group.addTask {
                        for i in 0..<100 { try await transport.send(text: #"{"type":"ping","id":"p\#(sender)-\#(i)"}"#) }
                    }
                }
                try await group.waitForAll()
            }
        }
        let payload = String(repeating: "x", count: 10_000)
        for i in 0..<100 { _ = try hub.publish(channel: "wallet_updates", account: "acc_c", data: #"{"i":\#(i),"p":"\#(payload)"}"#) }
        try await senders.value
        var pongs = Set<String>()
        var events = 0
        let deadline = ContinuousClock.now + .seconds(20)
        while (pongs.count < 400 || events < 100) && ContinuousClock.now < deadline {
            guard case .text(let t) = await transport.receive() else { break }
            if t.contains(#""type":"pong""#), let range = t.range(of: #""id":"p"#) {
                pongs.insert(String(t[range.upperBound...].prefix { $0 != "\"" }))
            } else if t.contains(payload) {
                events += 1
            }
        }
        #expect(pongs.count == 400, "\(pongs.count) pongs")
        #expect(events == 100, "\(events) events")
        await transport.close(code: 1000, reason: "done")
        #expect(transport.isFinished)
    }

    /// (4) The transport alone: after `close` returns, its reader has ended and its socket is closed, over several
    /// connect/close cycles (this process's sockets to the hub counted before, while open, and after); and `close`
    /// returns within the close timeout and a little against a hub stopped with SIGSTOP.
    @Test func closeLeavesNoSocketOrThreadBehind() async throws {
        let ca = try TestCA()
        let (cert, key) = try ca.issue("server", organization: "one")
        let hub = try Self.tlsHub(cert: cert, key: key)
        #expect(Self.socketsTo(port: hub.port) == 0)
        for _ in 0..<5 {
            let transport = POSIXTransport(closeTimeout: .milliseconds(500), tls: .init(caFile: ca.caFile))
            try await transport.connect(url: URL(string: "wss://127.0.0.1:\(hub.port)/ws")!, protocols: ["hub.v1"])
            #expect(Self.socketsTo(port: hub.port) == 1, "the count does not see the open connection")
            #expect(!transport.isFinished)
            await transport.close(code: 1000, reason: "bye")
            #expect(transport.isFinished, "the reader or the socket outlived close()")
            #expect(Self.socketsTo(port: hub.port) == 0, "close() left a socket")
        }

        let transport = POSIXTransport(closeTimeout: .milliseconds(500), tls: .init(caFile: ca.caFile))
        try await transport.connect(url: URL(string: "wss://127.0.0.1:\(hub.port)/ws")!, protocols: ["hub.v1"])
        let pid = hub.process.processIdentifier
        #expect(kill(pid, SIGSTOP) == 0)
        // kill returns before the hub has stopped: until it has, it may still answer the close frame.
        #expect(await HubClientTests.until(2) { Self.isStopped(pid) }, "the hub did not stop")
        let started = ContinuousClock.now
        await transport.close(code: 1000, reason: "bye")
        let took = ContinuousClock.now - started
        let finished = transport.isFinished
        let sockets = Self.socketsTo(port: hub.port)
        #expect(kill(pid, SIGCONT) == 0)
        // It waited the close timeout for an answer that did not come, then cut the connection (no close code).
        #expect(took >= .milliseconds(450) && took < .seconds(3), "close() took \(took)")
        #expect(await transport.receive() == .closed(code: 1006, reason: ""))
        #expect(finished, "the reader and the socket outlived close() against a stopped hub")
        #expect(sockets == 0, "close() left a socket against a stopped hub")
    }
}
