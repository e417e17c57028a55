import COpenSSL

/// JWS algorithms the hub accepts. The configured key decides which one is allowed; the token's
/// `alg` header is only checked against it, never used to pick a key or an algorithm.
public enum JWTAlgorithm: String, Sendable, CaseIterable {
    case hs256 = "HS256"
    case rs256 = "RS256"
    case es256 = "ES256"
}

/// Why a key could not be loaded.
public struct JWTKeyError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String
    init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// Minimum HMAC key length: RFC 7518 §3.2 requires a key at least as long as the hash output.
let minimumHMACSecretBytes = 32
/// Minimum RSA modulus size (RFC 7518 §3.3 requires 2048 bits).
let minimumRSABits: Int32 = 2048

/// Owns an `EVP_PKEY`. The key is never mutated after loading; OpenSSL 3 allows concurrent
/// verify/sign operations on a shared `EVP_PKEY` as long as each uses its own `EVP_MD_CTX`.
final class OpenSSLKey: @unchecked Sendable {
    let pointer: OpaquePointer
    let algorithm: JWTAlgorithm

    private init(pointer: OpaquePointer, algorithm: JWTAlgorithm) {
        self.pointer = pointer
        self.algorithm = algorithm
    }

    deinit { EVP_PKEY_free(pointer) }

    /// Loads an SPKI `-----BEGIN PUBLIC KEY-----` PEM (RSA ≥ 2048 bits → RS256, P-256 EC → ES256).
    static func publicKey(pem: String) throws(JWTKeyError) -> OpenSSLKey {
        try load(pem: pem, isPrivate: false)
    }

    /// Loads an unencrypted private key PEM (PKCS#8 `PRIVATE KEY`, or traditional RSA/EC).
    static func privateKey(pem: String) throws(JWTKeyError) -> OpenSSLKey {
        try load(pem: pem, isPrivate: true)
    }

    private static func load(pem: String, isPrivate: Bool) throws(JWTKeyError) -> OpenSSLKey {
        defer { ERR_clear_error() }
        let bytes = Array(pem.utf8)
        guard !bytes.isEmpty, bytes.count < 1 << 20 else { throw JWTKeyError("key PEM is empty or too large") }
        let loaded: OpaquePointer? = bytes.withUnsafeBytes { raw -> OpaquePointer? in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            // A password callback that refuses: never prompt on the terminal for an encrypted key.
            let refuse: @convention(c) (UnsafeMutablePointer<CChar>?, Int32, Int32, UnsafeMutableRawPointer?) -> Int32 = { _, _, _, _ in 0 }
            return isPrivate ? PEM_read_bio_PrivateKey(bio, nil, refuse, nil)
                             : PEM_read_bio_PUBKEY(bio, nil, refuse, nil)
        }
        guard let key = loaded else {
            throw JWTKeyError(isPrivate
                ? "could not read an unencrypted private key from the PEM"
                : "could not read a public key from the PEM (expected -----BEGIN PUBLIC KEY-----)")
        }
        switch EVP_PKEY_get_base_id(key) {
        case EVP_PKEY_RSA:
            let bits = EVP_PKEY_get_bits(key)
            guard bits >= minimumRSABits else {
                EVP_PKEY_free(key)
                throw JWTKeyError("RSA key is \(bits) bits; at least \(minimumRSABits) are required")
            }
            return OpenSSLKey(pointer: key, algorithm: .rs256)
        case EVP_PKEY_EC:
            var name = [CChar](repeating: 0, count: 64)
            var length = 0
            let ok = EVP_PKEY_get_group_name(key, &name, name.count, &length)
            let group = ok == 1 ? String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
            guard group == "prime256v1" || group == "P-256" || group == "secp256r1" else {
                EVP_PKEY_free(key)
                throw JWTKeyError("EC key is not on curve P-256 (only ES256 is supported)")
            }
            return OpenSSLKey(pointer: key, algorithm: .es256)
        default:
            EVP_PKEY_free(key)
            throw JWTKeyError("unsupported key type (only RSA for RS256 and P-256 EC for ES256)")
        }
    }

    /// Verifies a JOSE signature (`RS256`: PKCS#1 v1.5 bytes; `ES256`: raw r||s, 64 bytes).
    func verify(signature: [UInt8], over message: ArraySlice<UInt8>) -> Bool {
        defer { ERR_clear_error() }
        let derOrRaw: [UInt8]
        switch algorithm {
        case .es256:
            guard signature.count == 64, let der = ECDSASignature.der(fromRaw: signature) else { return false }
            derOrRaw = der
        case .rs256:
            guard signature.count == Int(EVP_PKEY_get_size(pointer)) else { return false }
            derOrRaw = signature
        case .hs256:
            return false
        }
        guard let ctx = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestVerifyInit(ctx, nil, EVP_sha256(), nil, pointer) == 1 else { return false }
        let result = derOrRaw.withUnsafeBufferPointer { sig in
            message.withUnsafeBufferPointer { msg in
                EVP_DigestVerify(ctx, sig.baseAddress, sig.count, msg.baseAddress, msg.count)
            }
        }
        return result == 1
    }

    /// Signs and returns the JOSE form of the signature (`ES256` converted from DER to raw r||s).
    func sign(_ message: [UInt8]) -> [UInt8]? {
        defer { ERR_clear_error() }
        guard let ctx = EVP_MD_CTX_new() else { return nil }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, pointer) == 1 else { return nil }
        var length = 0
        let sized = message.withUnsafeBufferPointer { msg in
            EVP_DigestSign(ctx, nil, &length, msg.baseAddress, msg.count)
        }
        guard sized == 1, length > 0 else { return nil }
        var signature = [UInt8](repeating: 0, count: length)
        let signed = signature.withUnsafeMutableBufferPointer { sig in
            message.withUnsafeBufferPointer { msg in
                EVP_DigestSign(ctx, sig.baseAddress, &length, msg.baseAddress, msg.count)
            }
        }
        guard signed == 1 else { return nil }
        signature.removeLast(signature.count - length)
        switch algorithm {
        case .es256: return ECDSASignature.raw(fromDER: signature)
        default: return signature
        }
    }
}

/// Conversions between JOSE raw ECDSA signatures (r||s, fixed width) and DER `ECDSA-Sig-Value`.
enum ECDSASignature {
    static let componentBytes = 32

    static func der(fromRaw raw: [UInt8]) -> [UInt8]? {
        guard raw.count == 2 * componentBytes, let sig = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(sig) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, Int32(componentBytes), nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + componentBytes, Int32(componentBytes), nil) }
        guard let r, let s else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        guard ECDSA_SIG_set0(sig, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        let length = i2d_ECDSA_SIG(sig, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            return i2d_ECDSA_SIG(sig, &cursor)
        }
        return written == length ? der : nil
    }

    static func raw(fromDER der: [UInt8]) -> [UInt8]? {
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        guard let sig = parsed else { return nil }
        defer { ECDSA_SIG_free(sig) }
        var r: OpaquePointer?
        var s: OpaquePointer?
        ECDSA_SIG_get0(sig, &r, &s)
        guard let r, let s else { return nil }
        var raw = [UInt8](repeating: 0, count: 2 * componentBytes)
        let ok = raw.withUnsafeMutableBufferPointer { buffer -> Bool in
            BN_bn2binpad(r, buffer.baseAddress, Int32(componentBytes)) == Int32(componentBytes)
                && BN_bn2binpad(s, buffer.baseAddress! + componentBytes, Int32(componentBytes)) == Int32(componentBytes)
        }
        return ok ? raw : nil
    }
}

/// One-shot HMAC-SHA256 (OpenSSL's `HMAC()`): the reference the keyed `HMACSHA256Key` is tested against.
enum HMACSHA256 {
    static func mac(key: [UInt8], message: ArraySlice<UInt8>) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let result = key.withUnsafeBufferPointer { k in
            message.withUnsafeBufferPointer { m in
                out.withUnsafeMutableBufferPointer { o in
                    HMAC(EVP_sha256(), k.baseAddress, Int32(k.count), m.baseAddress, m.count, o.baseAddress, &length)
                }
            }
        }
        guard result != nil, length == 32 else { return nil }
        return out
    }
}

/// An HS256 secret keyed once (`hub_hmac_sha256_key_init`: the inner and outer SHA-256 states after the padded
/// key). Each MAC copies the two states instead of re-keying. Immutable after `init`; the states are only read,
/// from any thread. Wiped when freed.
final class HMACSHA256Key: @unchecked Sendable {
    private let key: UnsafeMutablePointer<hub_hmac_sha256_key>

    init?(secret: [UInt8]) {
        key = .allocate(capacity: 1)
        guard secret.withUnsafeBufferPointer({ hub_hmac_sha256_key_init(key, $0.baseAddress, $0.count) }) == 1 else {
            OPENSSL_cleanse(key, MemoryLayout<hub_hmac_sha256_key>.size)
            key.deallocate()
            ERR_clear_error()
            return nil
        }
    }

    deinit {
        OPENSSL_cleanse(key, MemoryLayout<hub_hmac_sha256_key>.size)
        key.deallocate()
    }

    /// HMAC-SHA256 of `message` (32 bytes), nil if OpenSSL fails.
    func mac(_ message: ArraySlice<UInt8>) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: 32)
        let ok = message.withUnsafeBufferPointer { m in
            out.withUnsafeMutableBufferPointer { o in hub_hmac_sha256(key, m.baseAddress, m.count, o.baseAddress) }
        }
        guard ok == 1 else {
            ERR_clear_error()
            return nil
        }
        return out
    }

    /// Whether `signature` is the HMAC-SHA256 of `message`, compared in constant time; the MAC stays on the stack.
    func isMAC(_ signature: UnsafeRawBufferPointer, of message: UnsafeBufferPointer<UInt8>) -> Bool {
        guard signature.count == 32 else { return false }
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 32) { out in
            guard hub_hmac_sha256(key, message.baseAddress, message.count, out.baseAddress) == 1 else {
                ERR_clear_error()
                return false
            }
            return CRYPTO_memcmp(signature.baseAddress, out.baseAddress, 32) == 0
        }
    }
}

/// A signer's or verifier's key, and the one algorithm it allows (a key decides its algorithm: no confusion).
enum JWTKeyMaterial: Sendable {
    case secret(HMACSHA256Key)
    case asymmetric(OpenSSLKey)

    /// An HS256 secret, refused under `minimumHMACSecretBytes` (RFC 7518 section 3.2).
    static func hmac(_ secret: [UInt8]) throws(JWTKeyError) -> JWTKeyMaterial {
        guard secret.count >= minimumHMACSecretBytes else {
            throw JWTKeyError("HMAC secret is \(secret.count) bytes; at least \(minimumHMACSecretBytes) are required")
        }
        guard let key = HMACSHA256Key(secret: secret) else { throw JWTKeyError("OpenSSL could not key HMAC-SHA256") }
        return .secret(key)
    }

    var algorithm: JWTAlgorithm {
        switch self {
        case .secret: return .hs256
        case .asymmetric(let key): return key.algorithm
        }
    }
}
