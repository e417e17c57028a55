import COpenSSL
import Foundation
import Glibc
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// A throwaway certificate authority and server certificates for 127.0.0.1 and localhost, made with the `openssl`
/// command-line tool (what an operator would use), in a temporary directory removed on deinit.
final class TestCA: @unchecked Sendable {
    let directory: String
    var caFile: String { directory + "/ca.pem" }

    init() throws {
        directory = NSTemporaryDirectory() + "hubtls-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try Self.openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                          "-keyout", directory + "/ca.key", "-out", caFile, "-days", "2", "-subj", "/CN=Hub Test CA"])
        try "subjectAltName=DNS:localhost,IP:127.0.0.1\n".write(toFile: directory + "/ext", atomically: true, encoding: .utf8)
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }

    /// Issues a certificate for localhost/127.0.0.1 with `organization` in its subject (so tests can tell two apart);
    /// returns the paths of the certificate and its new key.
    func issue(_ name: String, organization: String) throws -> (cert: String, key: String) {
        let key = "\(directory)/\(name).key", csr = "\(directory)/\(name).csr", cert = "\(directory)/\(name).pem"
        try Self.openssl(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
                          "-out", csr, "-subj", "/O=\(organization)/CN=localhost"])
        try Self.openssl(["x509", "-req", "-in", csr, "-CA", caFile, "-CAkey", directory + "/ca.key", "-CAcreateserial",
                          "-out", cert, "-days", "2", "-extfile", directory + "/ext"])
        return (cert, key)
    }

    static func openssl(_ arguments: [String]) throws {
        let p = try InteropProcess("/usr/bin/env", ["openssl"] + arguments)
        guard let status = p.wait(timeout: 30), status == 0 else { throw HubTestError("openssl \(arguments.joined(separator: " ")) failed: \(p.stderr)") }
    }
}

/// A blocking TLS client for tests, made with the engine's own client context (the hub's test CA trusted).
final class TestTLSClient {
    let fd: Int32
    let ssl: OpaquePointer
    private let context: TLSContext

    /// Connects and completes the handshake. - Throws: when the handshake fails (with OpenSSL's reason).
    init(port: Int, caFile: String, serverName: String = "localhost", receiveBuffer: Int32? = nil, timeout: Double = 5) throws {
        context = try TLSContext.client(caFile: caFile, serverName: serverName)
        fd = try TestWebSocket.tcpConnect(port: port, receiveBuffer: receiveBuffer)
        var tv = timeval(tv_sec: Int(timeout), tv_usec: Int(timeout.truncatingRemainder(dividingBy: 1) * 1_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        guard let session = context.makeSession(fd: fd) else {
            Glibc.close(fd)
            throw HubTestError("SSL_new failed")
        }
        ssl = session
        ERR_clear_error()
        guard SSL_do_handshake(ssl) == 1 else {
            // Every stored property is set, so deinit frees the session and closes the socket (freeing them here
            // too was a double free, which aborted the test process on the first failed handshake).
            throw HubTestError("TLS handshake failed: \(openSSLErrors())")
        }
    }

    deinit {
        SSL_free(ssl)
        Glibc.close(fd)
    }

    /// The server certificate's subject, e.g. "/O=one/CN=localhost".
    var peerSubject: String {
        guard let cert = SSL_get1_peer_certificate(ssl) else { return "" }
        defer { X509_free(cert) }
        var buffer = [CChar](repeating: 0, count: 256)
        X509_NAME_oneline(X509_get_subject_name(cert), &buffer, Int32(buffer.count))
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    var protocolVersion: String { String(cString: SSL_get_version(ssl)) }
    var alpn: String {
        var data: UnsafePointer<UInt8>? = nil
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data else { return "" }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            var n = 0
            let ok = bytes.withUnsafeBytes { SSL_write_ex(ssl, $0.baseAddress! + offset, $0.count - offset, &n) }
            guard ok == 1 else { throw HubTestError("SSL_write failed: \(openSSLErrors())") }
            offset += n
        }
    }

    func write(_ text: String) throws { try write(Array(text.utf8)) }

    /// Reads what arrives, until the peer closes or `timeout` passes without a byte (or `until` holds).
    func read(timeout: Double = 5, until: ([UInt8]) -> Bool = { _ in false }) -> [UInt8] {
        var result: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline && !until(result) {
            var n = 0
            let ok = buffer.withUnsafeMutableBytes { SSL_read_ex(ssl, $0.baseAddress, $0.count, &n) }
            if ok != 1 { break }  // EOF, close_notify, error, or the receive timeout
            result += buffer[0..<n]
        }
        return result
    }

    /// A WebSocket upgrade of `path` (with these extra header lines); returns the response head and any bytes after it.
    func upgrade(path: String = "/ws", headers: [String] = []) throws -> (head: String, rest: [UInt8]) {
        let request = "GET \(path) HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + headers.map { $0 + "\r\n" }.joined() + "\r\n"
        try write(request)
        let bytes = read { $0.count >= 4 && $0.firstRange(of: Array("\r\n\r\n".utf8)) != nil }
        guard let end = bytes.firstRange(of: Array("\r\n\r\n".utf8)) else {
            throw HubTestError("no HTTP response head: \(String(decoding: bytes, as: UTF8.self))")
        }
        return (String(decoding: bytes[..<end.upperBound], as: UTF8.self), Array(bytes[end.upperBound...]))
    }

    /// Sends one masked text frame.
    func sendText(_ text: String) throws {
        let payload = Array(text.utf8)
        var frame: [UInt8] = [0x81]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else {
            frame += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        }
        let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        try write(frame)
    }

    /// Reads server frames until `count` text messages arrived (or `timeout`); returns their texts.
    func readTexts(_ count: Int, timeout: Double = 5, pending: [UInt8] = []) -> [String] {
        var buffer = pending
        var texts: [String] = []
        let deadline = Date().addingTimeInterval(timeout)
        while texts.count < count && Date() < deadline {
            while let (opcode, payload, used) = Self.frame(in: buffer) {
                buffer.removeFirst(used)
                if opcode == 1 { texts.append(String(decoding: payload, as: UTF8.self)) }
            }
            if texts.count >= count { break }
            let more = read(timeout: max(0.05, deadline.timeIntervalSinceNow), until: { !$0.isEmpty })
            if more.isEmpty { break }
            buffer += more
        }
        return texts
    }

    /// One unmasked server frame at the start of `bytes`: opcode, payload, bytes used.
    static func frame(in bytes: [UInt8]) -> (UInt8, [UInt8], Int)? {
        guard bytes.count >= 2 else { return nil }
        var length = Int(bytes[1] & 0x7F)
        var offset = 2
        if length == 126 {
            guard bytes.count >= 4 else { return nil }
            length = Int(bytes[2]) << 8 | Int(bytes[3])
            offset = 4
        } else if length == 127 {
            guard bytes.count >= 10 else { return nil }
            length = bytes[2..<10].reduce(0) { $0 << 8 | Int($1) }
            offset = 10
        }
        guard bytes.count >= offset + length else { return nil }
        return (bytes[0] & 0x0F, Array(bytes[offset..<offset + length]), offset + length)
    }
}

/// A ClientHello that offers only `version` (0x0300 SSLv3, 0x0301 TLS 1.0, 0x0302 TLS 1.1) with one old cipher and no
/// extensions, as a client of that era sends it.
func legacyClientHello(version: UInt16) -> [UInt8] {
    var body: [UInt8] = [UInt8(version >> 8), UInt8(version & 0xFF)]
    body += (0..<32).map { UInt8($0) }            // random
    body += [0]                                   // session id
    body += [0, 4, 0x00, 0x2F, 0x00, 0xFF]        // TLS_RSA_WITH_AES_128_CBC_SHA, renegotiation SCSV
    body += [1, 0]                                // compression: null
    let handshake: [UInt8] = [1, 0, UInt8(body.count >> 8), UInt8(body.count & 0xFF)] + body
    return [22, UInt8(version >> 8), UInt8(version & 0xFF), UInt8(handshake.count >> 8), UInt8(handshake.count & 0xFF)] + handshake
}
