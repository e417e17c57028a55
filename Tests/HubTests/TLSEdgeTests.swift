import COpenSSL
import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// TLS at its edges, against the real binary: a wss:// client at a plain port, a TLS client at the connection
/// limit, and records a TLS stack would not send (over 2^14 + 1 bytes inside, KeyUpdates bundled or in a flood),
/// each answered as docs/PROTOCOL.md and docs/OPERATIONS.md say while another client is served.
@Suite(.serialized) struct TLSEdgeTests {
    /// A TLS 1.3 client whose handshake is OpenSSL's and whose records after it are sealed by a `TLSRecordLayer`
    /// with the client's traffic keys (captured through the key-log callback): it can send what OpenSSL would
    /// refuse to, and reads the hub's answers (a response, an alert) with OpenSSL.
    final class RawRecordClient {
        let fd: Int32
        let ctx: OpaquePointer
        let ssl: OpaquePointer
        let secrets = UnsafeMutablePointer<hub_tls13_secrets>.allocate(capacity: 1)
        let layer: TLSRecordLayer
        let crypto = TLSRecordCrypto(recordCapacity: TLSRecordLayer.maxRecord + 512)

        init(port: Int) throws {
            guard let ctx = SSL_CTX_new(TLS_client_method()) else { throw HubTestError("SSL_CTX_new failed") }
            self.ctx = ctx
            _ = hub_SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION)
            SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nil)
            hub_SSL_CTX_capture_tls13_secrets(ctx)
            secrets.initialize(to: hub_tls13_secrets())
            fd = try TestWebSocket.tcpConnect(port: port)
            var tv = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            guard let ssl = SSL_new(ctx) else { throw HubTestError("SSL_new failed") }
            self.ssl = ssl
            SSL_set_fd(ssl, fd)
            _ = hub_SSL_set_secrets(ssl, secrets)
            ERR_clear_error()
            guard SSL_connect(ssl) == 1 else { throw HubTestError("handshake failed: \(openSSLErrors())") }
            guard let cipher = SSL_get_current_cipher(ssl), let suite = TLSRecordLayer.Suite(protocolID: SSL_CIPHER_get_protocol_id(cipher)),
                  let layer = TLSRecordLayer(suite: suite, readSecret: hub_secrets_server(secrets), writeSecret: hub_secrets_client(secrets),
                                             writeSeq: 0) else { throw HubTestError("no TLS 1.3 keys captured") }
            self.layer = layer
        }

        deinit {
            SSL_free(ssl)
            SSL_CTX_free(ctx)
            Glibc.close(fd)
            secrets.deallocate()
        }

        /// Seals one record (content, its type, zero padding) with our keys and writes it.
        func send(_ content: [UInt8], type: UInt8 = 23, padding: Int = 0) throws {
            let inner = content + [type] + [UInt8](repeating: 0, count: padding)
            guard layer.beginRecord(length: inner.count - 1, crypto: crypto, maxLength: .max),
                  inner.withUnsafeBytes({ layer.sealMore($0.baseAddress!, $0.count, crypto: crypto) }),
                  let length = layer.sealTag(crypto: crypto) else { throw HubTestError("could not seal") }
            try TestWebSocket.writeAll(fd, Array(UnsafeRawBufferPointer(start: crypto.record.baseAddress!, count: length)))
        }

        func keyUpdate() throws {
            try send([24, 0, 0, 1, 0], type: 22)
            _ = layer.keyUpdateSent()
        }

        /// What OpenSSL reads from the hub: the plaintext until EOF, or the error (an alert) that ended it.
        func read() -> (text: String, error: String) {
            var result: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 16384)
            ERR_clear_error()
            while true {
                var n = 0
                guard SSL_read_ex(ssl, &buffer, buffer.count, &n) == 1 else { break }
                result += buffer[0..<n]
            }
            return (String(decoding: result, as: UTF8.self), openSSLErrors())
        }
    }

    static let health = Array("GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".utf8)

    /// RFC 8446 §5.4 at the hub: an inner plaintext of exactly 2^14 + 1 bytes is a record (a request padded to it is
    /// answered), one byte more is record_overflow, whether the bytes are content or padding.
    @Test func recordsOverTheInnerLimitGetRecordOverflow() throws {
        let ca = try TestCA()
        let (hub, _, _) = try TLSTests.tlsHub(ca)
        let steady = try TLSTests.subscribedClient(hub, ca: ca, account: "steady")

        let atLimit = try RawRecordClient(port: hub.port)
        try atLimit.send(Self.health, padding: TLSRecordLayer.maxInnerPlaintext - 1 - Self.health.count)
        let answer = atLimit.read()
        #expect(answer.text.hasPrefix("HTTP/1.1 200"), "\(answer)")

        for (index, (content, padding)) in [([UInt8](repeating: 0x41, count: TLSRecordLayer.maxPlaintext + 1), 0),
                                            (Self.health, TLSRecordLayer.maxInnerPlaintext - Self.health.count)].enumerated() {
            let client = try RawRecordClient(port: hub.port)
            try client.send(content, padding: padding)
            let (text, error) = client.read()
            #expect(text.isEmpty && error.contains("record overflow"), "case \(index): \(text) \(error)")
            _ = try hub.publish(channel: "wallet_updates", account: "steady", type: "still_here", data: #"{"case":\#(index)}"#)
            #expect(steady.readTexts(1).first?.contains(#""case":\#(index)"#) == true)
        }
    }

    /// The KeyUpdate lever (29× CPU for one record): a KeyUpdate must end its record (unexpected_message otherwise,
    /// RFC 8446 §5.1), and a client gets 32 before it must send data again. 32 in a row leave the session working.
    @Test func keyUpdatesAreOnePerRecordAndBudgeted() throws {
        let ca = try TestCA()
        let (hub, _, _) = try TLSTests.tlsHub(ca)
        let steady = try TLSTests.subscribedClient(hub, ca: ca, account: "steady")

        let bundled = try RawRecordClient(port: hub.port)
        try bundled.send([UInt8](repeating: 0, count: 0) + (0..<100).flatMap { _ in [24, 0, 0, 1, 0] as [UInt8] }, type: 22)
        let (text, error) = bundled.read()
        #expect(text.isEmpty && error.contains("unexpected message"), "\(text) \(error)")

        let withinBudget = try RawRecordClient(port: hub.port)
        for _ in 0..<TLSRecordLayer.keyUpdateBurst { try withinBudget.keyUpdate() }
        try withinBudget.send(Self.health)
        #expect(withinBudget.read().text.hasPrefix("HTTP/1.1 200"))

        let flood = try RawRecordClient(port: hub.port)
        for _ in 0...TLSRecordLayer.keyUpdateBurst { try flood.keyUpdate() }
        try? flood.send(Self.health)  // the hub may have closed already
        let cut = flood.read()
        #expect(!cut.text.contains("HTTP/1.1") && cut.error.contains("unexpected message"), "\(cut)")

        _ = try hub.publish(channel: "wallet_updates", account: "steady", type: "still_here", data: "{}")
        #expect(steady.readTexts(1).first?.contains("still_here") == true)
        #expect(hub.process.isRunning)
    }

    /// A wss:// client at a plain port waited for the handshake timeout (10 s): its ClientHello has no line end.
    /// The hub recognises the TLS record and answers 400 TLS_NOT_ENABLED at once, in the clear.
    @Test func aClientHelloAtAPlainPortIsAnsweredAtOnce() throws {
        let hub = try HubProcess()
        let fd = try TestWebSocket.tcpConnect(port: hub.port)
        defer { close(fd) }
        try TestWebSocket.writeAll(fd, legacyClientHello(version: 0x0303))
        let answer = String(decoding: try readUntilEOF(fd, timeout: 5), as: UTF8.self)
        #expect(answer.hasPrefix("HTTP/1.1 400 Bad Request\r\n") && answer.contains(#""code":"TLS_NOT_ENABLED""#), "\(answer)")
        // OpenSSL's client fails at once too (it reads the answer as a record of an unknown version).
        let ca = try TestCA()
        do {
            _ = try TestTLSClient(port: hub.port, caFile: ca.caFile, timeout: 5)
            Issue.record("a TLS handshake succeeded at a plain port")
        } catch {
            #expect(!"\(error)".isEmpty)
        }
        #expect((try hub.stats()["tls"] as? [String: Any])?["helloOnPlainPort"] as? Int == 2)
        // A request that merely starts with another byte is still plain HTTP's to answer.
        #expect(try rawHTTP(port: hub.port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status == 200)
    }

    /// With `--max-connections` at its default (the open-file limit minus the reserve) no descriptor is left for an
    /// answer inside TLS: a TLS client over the limit gets the `internal_error` alert at once, and the Unix socket
    /// (the backend's publishes) still has its descriptors.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/prlimit")))
    func atTheDefaultLimitATLSClientGetsTheAlert() throws {
        let ca = try TestCA()
        let (cert, key) = try ca.issue("server", organization: "one")
        let hub = try HubProcess(["--tls-cert", cert, "--tls-key", key], threads: 1, launcher: ["/usr/bin/prlimit", "--nofile=64:64"])
        let limit = try #require((try hub.stats()["connections"] as? [String: Any])?["limit"] as? Int)
        #expect(limit < 40, "limit \(limit)")
        let held = try (0..<limit).map { _ in try TestTLSClient(port: hub.port, caFile: ca.caFile) }
        do {
            _ = try TestTLSClient(port: hub.port, caFile: ca.caFile)
            Issue.record("a handshake completed over the default limit")
        } catch {
            #expect("\(error)".contains("internal error"), "\(error)")
        }
        #expect(try hub.publish(channel: "wallet_updates", account: "acc_1")["ok"] as? Bool == true, "the Unix socket still works")
        #expect((try hub.stats()["tls"] as? [String: Any])?["refusingInTLS"] as? Int == 0)
        withExtendedLifetime(held) {}
    }

    /// At the connection limit a TLS port used to answer a ClientHello with a plaintext 503, which a TLS client
    /// reads as garbage. Now a TLS client completes its handshake and reads the 503 and its Retry-After inside TLS;
    /// past 64 such answers in progress on a loop, the refusal is a TLS alert (internal_error), which TLS clients
    /// report at once. The client within the limit is served throughout.
    @Test func aTLSClientAtTheConnectionLimitIsRefusedInTLS() throws {
        let ca = try TestCA()
        let (hub, _, _) = try TLSTests.tlsHub(ca, extra: ["--max-connections", "1", "--threads", "1", "--handshake-timeout", "8s"])
        let steady = try TLSTests.subscribedClient(hub, ca: ca, account: "steady")

        do {
            let busy = try TestTLSClient(port: hub.port, caFile: ca.caFile)
            let (head, _) = try busy.upgrade(headers: ["Authorization: Bearer \(try hub.token("acc_2"))"])
            #expect(head.hasPrefix("HTTP/1.1 503") && head.contains("Retry-After: 5"), "\(head)")
            // The rest of the answer (its body, then close_notify) read through TLS, then the TCP close itself: a
            // raw read of the socket would see the close_notify record whenever it came in a later segment.
            _ = busy.read(timeout: 5)
            var byte: UInt8 = 0
            #expect(try TestWebSocket.waitReadable(busy.fd, timeout: 5) && recv(busy.fd, &byte, 1, Int32(MSG_DONTWAIT)) == 0,
                    "the hub closes after its answer")
        }

        func refusing() -> Int? { (try? hub.stats()["tls"] as? [String: Any])?["refusingInTLS"] as? Int }
        #expect(eventually { refusing() == 0 }, "the answered client's slot was not released")
        // 64 connections that never finish their handshake hold every in-TLS answer of the loop.
        var holders: [Int32] = []
        defer { holders.forEach { close($0) } }
        for _ in 0..<ClientAcceptor.maxBusyTLSAnswers {
            let fd = try TestWebSocket.tcpConnect(port: hub.port)
            try TestWebSocket.writeAll(fd, [22])
            holders.append(fd)
        }
        var handshaking = -1
        #expect(eventually(timeout: 7) {
            handshaking = (try? hub.stats()["connections"] as? [String: Any])?["handshaking"] as? Int ?? -1
            return handshaking == ClientAcceptor.maxBusyTLSAnswers
        }, "handshaking: \(handshaking)")
        #expect(refusing() == ClientAcceptor.maxBusyTLSAnswers)
        do {
            _ = try TestTLSClient(port: hub.port, caFile: ca.caFile)
            Issue.record("a handshake completed with every in-TLS answer taken")
        } catch {
            #expect("\(error)".contains("internal error"), "\(error)")
        }
        _ = try hub.publish(channel: "wallet_updates", account: "steady", type: "still_here", data: "{}")
        #expect(steady.readTexts(1).first?.contains("still_here") == true)

        // The holders time out; in-TLS answers are available again, and none of them counted as a connection.
        #expect(eventually(timeout: 20) { (try? hub.stats()["connections"] as? [String: Any])?["handshaking"] as? Int == 0 })
        let again = try TestTLSClient(port: hub.port, caFile: ca.caFile)
        #expect(try again.upgrade().head.hasPrefix("HTTP/1.1 503"))
        #expect((try hub.stats()["connections"] as? [String: Any])?["open"] as? Int == 1)
    }
}
