import COpenSSL
import Foundation
import Glibc
import Testing
@testable import HubEngine

/// The hub's TLS 1.3 record layer against OpenSSL's own: an OpenSSL client and an OpenSSL server finish a handshake
/// in memory, the server's key log gives the two traffic secrets, and from then on every record either OpenSSL side
/// writes must be byte-identical to what the hub's layer seals with the same secrets, sequence numbers, content and
/// padding, and each side must open the other's.
@Suite(.serialized) struct TLSRecordDifferentialTests {
    /// Two OpenSSL endpoints joined by memory BIOs that the test pumps by hand, so every record can be looked at.
    final class OpenSSLPair {
        let clientContext: OpaquePointer, serverContext: OpaquePointer
        let client: OpaquePointer, server: OpaquePointer
        let secrets = UnsafeMutablePointer<hub_tls13_secrets>.allocate(capacity: 1)

        init(ciphersuite: String, certificate: String, key: String) throws {
            secrets.initialize(to: hub_tls13_secrets())
            guard let sc = SSL_CTX_new(TLS_server_method()), let cc = SSL_CTX_new(TLS_client_method()) else {
                throw HubTestError("SSL_CTX_new failed")
            }
            (serverContext, clientContext) = (sc, cc)
            for ctx in [sc, cc] {
                _ = hub_SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION)
                _ = SSL_CTX_set_ciphersuites(ctx, ciphersuite)
            }
            _ = SSL_CTX_set_num_tickets(sc, 0)  // the server's first application record is then its seq 0
            hub_SSL_CTX_capture_tls13_secrets(sc)
            guard SSL_CTX_use_certificate_chain_file(sc, certificate) == 1,
                  SSL_CTX_use_PrivateKey_file(sc, key, SSL_FILETYPE_PEM) == 1 else { throw HubTestError("the test certificate did not load") }
            SSL_CTX_set_verify(cc, SSL_VERIFY_NONE, nil)
            guard let s = SSL_new(sc), let c = SSL_new(cc) else { throw HubTestError("SSL_new failed") }
            (server, client) = (s, c)
            _ = hub_SSL_set_secrets(s, secrets)
            for ssl in [s, c] { SSL_set_bio(ssl, BIO_new(BIO_s_mem()), BIO_new(BIO_s_mem())) }
            SSL_set_accept_state(s)
            SSL_set_connect_state(c)
            for _ in 0..<10 {
                let doneClient = SSL_do_handshake(c) == 1
                deliver(written(by: c), to: s)
                let doneServer = SSL_do_handshake(s) == 1
                deliver(written(by: s), to: c)
                if doneClient && doneServer { break }
            }
            guard SSL_is_init_finished(s) == 1, SSL_is_init_finished(c) == 1 else { throw HubTestError("the handshake did not finish") }
        }

        deinit {
            SSL_free(client)
            SSL_free(server)
            SSL_CTX_free(clientContext)
            SSL_CTX_free(serverContext)
            secrets.deallocate()
        }

        /// What `ssl` has written and nobody has read yet.
        func written(by ssl: OpaquePointer) -> [UInt8] {
            guard let bio = SSL_get_wbio(ssl) else { return [] }
            return Self.drain { BIO_read(bio, $0, $1) }
        }

        /// Bytes for `ssl` to read.
        func deliver(_ bytes: [UInt8], to ssl: OpaquePointer) {
            guard !bytes.isEmpty, let bio = SSL_get_rbio(ssl) else { return }
            _ = bytes.withUnsafeBytes { BIO_write(bio, $0.baseAddress, Int32($0.count)) }
        }

        /// Everything `ssl` can read from what was delivered to it.
        func read(_ ssl: OpaquePointer) -> [UInt8] {
            defer { ERR_clear_error() }
            return Self.drain { SSL_read(ssl, $0, $1) }
        }

        /// Calls `readInto(buffer, capacity)` until it returns 0 or less; what it read.
        static func drain(_ readInto: (UnsafeMutableRawPointer, Int32) -> Int32) -> [UInt8] {
            var out: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 32 * 1024)
            while true {
                let n = chunk.withUnsafeMutableBytes { readInto($0.baseAddress!, Int32($0.count)) }
                if n <= 0 { return out }
                out += chunk.prefix(Int(n))
            }
        }

        /// OpenSSL's records for `content` written by `ssl` (one `SSL_write`).
        func write(_ content: [UInt8], by ssl: OpaquePointer) -> [UInt8] {
            _ = content.withUnsafeBytes { SSL_write(ssl, $0.baseAddress, Int32($0.count)) }
            return written(by: ssl)
        }
    }

    /// The hub's layers from the captured secrets: the server's (what `takeOver` makes) and the client's mirror image.
    struct HubLayers {
        let server: TLSRecordLayer, client: TLSRecordLayer
        let crypto = TLSRecordCrypto()
        var fds: [Int32] = [0, 0]

        init(_ pair: OpenSSLPair, suite: TLSRecordLayer.Suite) throws {
            let s = pair.secrets.pointee
            try #require(Int(s.clientLength) == suite.hashLength && Int(s.serverLength) == suite.hashLength)
            server = try #require(TLSRecordLayer(suite: suite, readSecret: hub_secrets_client(pair.secrets),
                                                 writeSecret: hub_secrets_server(pair.secrets), writeSeq: 0))
            client = try #require(TLSRecordLayer(suite: suite, readSecret: hub_secrets_server(pair.secrets),
                                                 writeSecret: hub_secrets_client(pair.secrets), writeSeq: 0))
            try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
            for fd in fds { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        }

        func close() { Glibc.close(fds[0]); Glibc.close(fds[1]) }

        /// A record sealed by `layer`: content, type, then `padding` zeros.
        func seal(_ layer: TLSRecordLayer, _ content: [UInt8], type: UInt8 = 23, padding: Int = 0) -> [UInt8] {
            let inner = content + [type] + [UInt8](repeating: 0, count: padding)
            guard layer.beginRecord(length: inner.count - 1, crypto: crypto),
                  inner.withUnsafeBytes({ layer.sealMore($0.baseAddress!, $0.count, crypto: crypto) }),
                  let length = layer.sealTag(crypto: crypto) else { return [] }
            return Array(UnsafeRawBufferPointer(start: crypto.record.baseAddress!, count: length))
        }

        /// What the hub's server layer opens from `records`, read from a socket as a connection reads them.
        func serverOpens(_ records: [UInt8]) throws -> [UInt8] {
            _ = records.withUnsafeBytes { send(fds[1], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            let room = TLSRecordLayer.maxRecord * 2
            let out = UnsafeMutableRawPointer.allocate(byteCount: room, alignment: 16)
            defer { out.deallocate() }
            var opened: [UInt8] = []
            while case .processed(let n) = try server.read(fd: fds[0], into: out, room: room, crypto: crypto), n > 0 {
                opened += UnsafeRawBufferPointer(start: out, count: n)
            }
            return opened
        }
    }

    static let suites: [(String, TLSRecordLayer.Suite)] = [
        ("TLS_AES_128_GCM_SHA256", .aes128GCM), ("TLS_AES_256_GCM_SHA384", .aes256GCM),
        ("TLS_CHACHA20_POLY1305_SHA256", .chacha20Poly1305),
    ]
    static let sizes = [1, 50, 1000, 4096, TLSRecordLayer.maxPlaintext]

    static func content(_ n: Int, seed: Int) -> [UInt8] { (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ seed) } }

    /// Where two records first differ (nil when they are the same), so a failure says where instead of printing both.
    static func difference(_ a: [UInt8], _ b: [UInt8]) -> String? {
        if a == b { return nil }
        let at = (0..<min(a.count, b.count)).first { a[$0] != b[$0] } ?? min(a.count, b.count)
        return "\(a.count) vs \(b.count) bytes, first difference at byte \(at)"
    }

    /// The record's padding, from its length (OpenSSL chose it; the hub's seal must match it byte for byte).
    static func padding(of record: [UInt8], content: Int) -> Int {
        record.count < 5 ? 0 : (Int(record[3]) << 8 | Int(record[4])) - 16 - 1 - content
    }

    /// An OpenSSL pair after its handshake in suite `index`, and the hub's layers from the secrets it logged.
    static func connected(_ index: Int) throws -> (name: String, pair: OpenSSLPair, hub: HubLayers) {
        let (name, suite) = suites[index]
        let ca = try TestCA()
        let (cert, key) = try ca.issue("server", organization: "Differential")
        let pair = try OpenSSLPair(ciphersuite: name, certificate: cert, key: key)
        return (name, pair, try HubLayers(pair, suite: suite))
    }

    @Test(arguments: suites.indices)
    func clientRecordsAreByteIdenticalAndOpenBothWays(_ index: Int) throws {
        let (name, pair, hub) = try Self.connected(index)
        defer { hub.close() }
        for (i, size) in Self.sizes.enumerated() {
            // Without padding, then with OpenSSL's block padding (records rounded up to 256 bytes).
            for block in [0, 256] {
                _ = SSL_set_block_padding(pair.client, block == 0 ? 1 : block)
                let data = Self.content(size, seed: i * 2 + block)
                let theirs = pair.write(data, by: pair.client)
                try #require(theirs.count == 5 + size + 1 + Self.padding(of: theirs, content: size) + 16, "\(name): not one record")
                let pad = Self.padding(of: theirs, content: size)
                // OpenSSL pads the inner plaintext to a multiple of the block, within the record limit.
                let rounded = block == 0 ? size + 1 : min((size + 1 + block - 1) / block * block, TLSRecordLayer.maxInnerPlaintext)
                #expect(size + 1 + pad == rounded, "\(name) \(size): padding \(pad)")
                let ours = hub.seal(hub.client, data, padding: max(0, pad))
                #expect(Self.difference(ours, theirs) == nil, "\(name): a \(size)-byte record (padding \(pad)) differs from OpenSSL's")
                #expect(Self.difference(try hub.serverOpens(theirs), data) == nil, "\(name): the hub did not open OpenSSL's \(size)-byte record")
                pair.deliver(ours, to: pair.server)
                #expect(Self.difference(pair.read(pair.server), data) == nil, "\(name): OpenSSL did not open the hub's \(size)-byte record")
            }
        }
        // A KeyUpdate, then data under the next keys: both records identical, both sides follow.
        _ = SSL_set_block_padding(pair.client, 1)
        #expect(SSL_key_update(pair.client, SSL_KEY_UPDATE_NOT_REQUESTED) == 1)
        let data = Self.content(300, seed: 7)
        let theirs = pair.write(data, by: pair.client)
        var ours = hub.seal(hub.client, [24, 0, 0, 1, 0], type: 22)
        #expect(hub.client.keyUpdateSent())
        ours += hub.seal(hub.client, data)
        #expect(Self.difference(ours, theirs) == nil, "\(name): the KeyUpdate and the record after it differ from OpenSSL's")
        #expect(Self.difference(try hub.serverOpens(theirs), data) == nil)
        #expect(hub.server.keyUpdatesReceived == 1)
        pair.deliver(ours, to: pair.server)
        #expect(Self.difference(pair.read(pair.server), data) == nil)
    }

    @Test(arguments: suites.indices)
    func serverRecordsAreByteIdenticalAndOpenBothWays(_ index: Int) throws {
        let (name, pair, hub) = try Self.connected(index)
        defer { hub.close() }
        for (i, size) in Self.sizes.enumerated() {
            let data = Self.content(size, seed: 100 + i)
            let theirs = pair.write(data, by: pair.server)
            try #require(theirs.count == 5 + size + 1 + 16, "\(name): not one record")
            let ours = hub.seal(hub.server, data)
            #expect(Self.difference(ours, theirs) == nil, "\(name): the hub's \(size)-byte server record differs from OpenSSL's")
            // The OpenSSL client reads the hub's record; the hub's client mirror reads OpenSSL's (through its own read).
            pair.deliver(ours, to: pair.client)
            #expect(Self.difference(pair.read(pair.client), data) == nil, "\(name): OpenSSL did not open the hub's \(size)-byte record")
        }
        // The hub's close_notify: OpenSSL's client reads it as the end of the stream.
        hub.server.sendCloseNotify(fd: hub.fds[0], crypto: hub.crypto)
        var alert = [UInt8](repeating: 0, count: 64)
        let n = recv(hub.fds[1], &alert, alert.count, Int32(MSG_DONTWAIT))
        try #require(n > 0)
        pair.deliver(Array(alert.prefix(n)), to: pair.client)
        var byte: UInt8 = 0
        #expect(SSL_read(pair.client, &byte, 1) == 0 && SSL_get_error(pair.client, 0) == SSL_ERROR_ZERO_RETURN)
        ERR_clear_error()
    }
}
