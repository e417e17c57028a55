import COpenSSL
import Glibc
import HubSupport
import Synchronization

/// A TLS configuration (OpenSSL's `SSL_CTX`) that connections are made from: a server identity (certificate chain
/// and key), or a client's trust (a CA file, or none for benchmarks against a test certificate).
///
/// Why these settings:
/// - TLS 1.2 and 1.3 only; TLS 1.2 with ECDHE and AEAD ciphers only (Mozilla's "intermediate"); no renegotiation
///   (a client-initiated renegotiation is a CPU lever for an attacker); no compression.
/// - `SSL_MODE_RELEASE_BUFFERS`: an idle connection keeps no 16 KiB read or write buffer (OpenSSL frees them when
///   empty), which is most of what an idle TLS connection would cost.
/// - `SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER`: the connection hands OpenSSL up to 16 KiB
///   of queued frames at a time (one record), either straight from a frame or gathered into the loop's staging
///   buffer, so a retry after WANT_WRITE may come from another address with the same bytes.
/// - Read-ahead: one `read` fetches as many records as the kernel has (fewer syscalls); the connection asks
///   `SSL_has_pending` before it believes the socket drained.
/// - No server-side session cache (memory stays bounded); TLS 1.3 resumption still works through one stateless ticket,
///   issued after the handshake (see `TLSRecordLayer`, which then runs the connection's records).
///
/// Records after a TLS 1.3 server handshake: the hub's own layer by default (`TLSRecordLayer`, ~0.3 KiB per idle
/// connection), or OpenSSL's throughout (`.openssl`: ~15 KiB more per connection, no record of ours on the wire).
///
/// Reload: `ServerTLS.reload` builds a new context and swaps it in; connections keep the context they were made from
/// (OpenSSL counts references), new ones get the new pair. A pair that fails to load leaves the old one in place.
public final class TLSContext: @unchecked Sendable {
    /// Who seals and opens a TLS 1.3 server connection's records once its handshake is done.
    public enum Records: String, Sendable, CaseIterable {
        /// The hub's record layer (`TLSRecordLayer`); TLS 1.2 connections stay with OpenSSL.
        case hub
        /// OpenSSL's, for every connection.
        case openssl
    }

    /// The current `SSL_CTX`; swapped under the lock on reload.
    private let current: LockedValue<OpaquePointer>
    let isServer: Bool
    /// Written, in the clear, to a peer that speaks plain HTTP to a TLS port (servers only).
    let plaintextAnswer: [UInt8]
    /// SNI to send (clients only).
    let serverName: String?
    /// Servers: who runs the records after a TLS 1.3 handshake.
    let records: Records

    private init(ctx: OpaquePointer, isServer: Bool, plaintextAnswer: [UInt8], serverName: String?, records: Records) {
        current = LockedValue(ctx)
        self.isServer = isServer
        self.plaintextAnswer = plaintextAnswer
        self.serverName = serverName
        self.records = records
    }

    /// Whether a server connection captures its traffic secrets for the hub's record layer.
    var handsOffRecords: Bool { isServer && records == .hub }

    deinit { current.withLock { SSL_CTX_free($0) } }

    /// A server context from PEM files: `certificateFile` holds the leaf first, then the intermediates.
    /// - Parameter plaintextAnswer: bytes written in the clear to a peer that sends plain HTTP instead of a TLS hello
    ///   (an HTTP 400 explaining that the port speaks TLS), then the connection is closed.
    /// - Throws: `TLSError` naming the file and OpenSSL's reason (unreadable, not PEM, key does not match).
    /// - Parameter records: who runs a TLS 1.3 connection's records after its handshake.
    public static func server(certificateFile: String, keyFile: String, plaintextAnswer: [UInt8] = [],
                              records: Records = .hub) throws(TLSError) -> TLSContext {
        let ctx = try makeServerContext(certificateFile: certificateFile, keyFile: keyFile, records: records)
        return TLSContext(ctx: ctx, isServer: true, plaintextAnswer: plaintextAnswer, serverName: nil, records: records)
    }

    /// A client context. `caFile` nil with `verify` false trusts any certificate (benchmarks against a test CA).
    public static func client(caFile: String? = nil, verify: Bool = true, serverName: String? = nil) throws(TLSError) -> TLSContext {
        guard let ctx = SSL_CTX_new(TLS_client_method()) else { throw TLSError("SSL_CTX_new failed: \(openSSLErrors())") }
        configureCommon(ctx)
        if verify {
            let loaded = caFile.map { SSL_CTX_load_verify_locations(ctx, $0, nil) } ?? SSL_CTX_set_default_verify_paths(ctx)
            guard loaded == 1 else {
                SSL_CTX_free(ctx)
                throw TLSError("cannot load the CA file \(caFile ?? "(system)"): \(openSSLErrors())")
            }
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        } else {
            SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nil)
        }
        let alpn: [UInt8] = [8] + Array("http/1.1".utf8)
        _ = SSL_CTX_set_alpn_protos(ctx, alpn, UInt32(alpn.count))
        return TLSContext(ctx: ctx, isServer: false, plaintextAnswer: [], serverName: serverName, records: .openssl)
    }

    /// Loads a new certificate and key and makes new connections use them; on failure nothing changes.
    public func reload(certificateFile: String, keyFile: String) throws(TLSError) {
        precondition(isServer)
        let fresh = try Self.makeServerContext(certificateFile: certificateFile, keyFile: keyFile, records: records)
        let old = current.withLock { ctx -> OpaquePointer in
            let old = ctx
            ctx = fresh
            return old
        }
        SSL_CTX_free(old)  // connections made from it hold their own references
    }

    /// A new `SSL` in the right role, reading and writing `fd` through the MSG_NOSIGNAL BIO.
    func makeSession(fd: Int32) -> OpaquePointer? {
        guard let method = Self.bioMethod.value else { return nil }
        let ssl = current.withLock { SSL_new($0) }
        guard let ssl else { return nil }
        guard let bio = hub_bio_new(method, fd) else {
            SSL_free(ssl)
            return nil
        }
        SSL_set_bio(ssl, bio, bio)  // one BIO for both directions: SSL_free frees it once
        if isServer {
            SSL_set_accept_state(ssl)
            // No read-ahead during the handshake: the socket is read record by record, so that nothing after the
            // client's Finished is in OpenSSL's hands when `TLSRecordLayer` takes over (turned on again for
            // connections OpenSSL keeps).
            SSL_set_read_ahead(ssl, 0)
        } else {
            SSL_set_connect_state(ssl)
            if let serverName {
                _ = hub_SSL_set_tlsext_host_name(ssl, serverName)
                _ = SSL_set1_host(ssl, serverName)
            }
        }
        return ssl
    }

    private struct Method: @unchecked Sendable { let value: OpaquePointer? }
    /// The BIO method, made once per process.
    private static let bioMethod = Method(value: hub_bio_method_new())

    private static func configureCommon(_ ctx: OpaquePointer) {
        _ = hub_SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION)
        _ = hub_SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION)
        _ = hub_SSL_CTX_set_mode(ctx, Int(SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
        // IGNORE_UNEXPECTED_EOF: a peer that closes TCP without close_notify reads as EOF (WebSocket has its own close).
        _ = SSL_CTX_set_options(ctx, hub_SSL_OP_defaults())
        _ = SSL_CTX_set_cipher_list(ctx, "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
                                    + "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305")
        hub_SSL_CTX_set_read_ahead(ctx, 1)
    }

    private static func makeServerContext(certificateFile: String, keyFile: String, records: Records) throws(TLSError) -> OpaquePointer {
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_server_method()) else { throw TLSError("SSL_CTX_new failed: \(openSSLErrors())") }
        configureCommon(ctx)
        _ = hub_SSL_CTX_set_session_cache_mode(ctx, Int(SSL_SESS_CACHE_OFF))
        switch records {
        case .hub:
            // No ticket inside the handshake: `TLSRecordLayer.takeOver` issues it once the handshake is done, into a
            // memory BIO, so that it knows how many records went out under the new keys.
            _ = SSL_CTX_set_num_tickets(ctx, 0)
            hub_SSL_CTX_capture_tls13_secrets(ctx)
        case .openssl:
            _ = SSL_CTX_set_num_tickets(ctx, 1)  // the one stateless ticket the hub's layer would issue
        }
        hub_SSL_CTX_use_alpn_http11(ctx)
        guard access(certificateFile, R_OK) == 0 else {
            SSL_CTX_free(ctx)
            throw TLSError("cannot read the TLS certificate file \(certificateFile): \(String(cString: strerror(errno)))")
        }
        guard access(keyFile, R_OK) == 0 else {
            SSL_CTX_free(ctx)
            throw TLSError("cannot read the TLS key file \(keyFile): \(String(cString: strerror(errno)))")
        }
        guard SSL_CTX_use_certificate_chain_file(ctx, certificateFile) == 1 else {
            SSL_CTX_free(ctx)
            throw TLSError("the TLS certificate file \(certificateFile) holds no usable PEM certificate chain: \(openSSLErrors())")
        }
        // Read the key first, so that "not a key" and "not this certificate's key" are told apart.
        guard let file = BIO_new_file(keyFile, "r") else {
            SSL_CTX_free(ctx)
            throw TLSError("cannot read the TLS key file \(keyFile): \(openSSLErrors())")
        }
        let key = PEM_read_bio_PrivateKey(file, nil, nil, nil)
        BIO_free(file)
        guard let key else {
            SSL_CTX_free(ctx)
            throw TLSError("the TLS key file \(keyFile) holds no usable PEM private key (or it is encrypted): \(openSSLErrors())")
        }
        defer { EVP_PKEY_free(key) }
        guard SSL_CTX_use_PrivateKey(ctx, key) == 1, SSL_CTX_check_private_key(ctx) == 1 else {
            SSL_CTX_free(ctx)
            throw TLSError("the TLS key in \(keyFile) does not match the certificate in \(certificateFile): \(openSSLErrors())")
        }
        return ctx
    }
}

/// Why a TLS context could not be made.
public struct TLSError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// OpenSSL's error queue as one line (and cleared).
func openSSLErrors() -> String {
    var parts: [String] = []
    while true {
        let code = ERR_get_error()
        if code == 0 { break }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        parts.append(String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }
    return parts.isEmpty ? "no detail from OpenSSL" : parts.joined(separator: "; ")
}
