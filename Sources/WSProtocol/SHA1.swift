import COpenSSL

/// SHA-1 fetched from OpenSSL's default provider once. `EVP_sha1()` is a legacy handle that OpenSSL 3 re-fetches by
/// name inside every `EVP_Digest` (about 2 600 of the 6 000 instructions of a handshake's hash under callgrind). An
/// `EVP_MD` is immutable and may be used from any thread; nil only if the provider has no SHA-1, and then the
/// legacy handle is used.
nonisolated(unsafe) private let fetchedSHA1: OpaquePointer? = EVP_MD_fetch(nil, "SHA1", nil)

/// SHA-1 from libcrypto (EVP one-shot API; the low-level `SHA1()` is deprecated in OpenSSL 3).
/// Used for `Sec-WebSocket-Accept`, where SHA-1 is what RFC 6455 prescribes, and by the hub to name Redis scripts.
public enum SHA1 {
    public static func hash(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 20)
        bytes.withUnsafeBytes { input in
            digest.withUnsafeMutableBytes { hash(input, into: $0) }
        }
        return digest
    }

    /// Writes the 20-byte digest of `input` to the start of `digest` (at least 20 bytes).
    static func hash(_ input: UnsafeRawBufferPointer, into digest: UnsafeMutableRawBufferPointer) {
        precondition(digest.count >= 20, "a SHA-1 digest is 20 bytes")
        var length: UInt32 = 0
        let ok = EVP_Digest(input.baseAddress, input.count, digest.baseAddress, &length, fetchedSHA1 ?? EVP_sha1(), nil)
        precondition(ok == 1 && length == 20, "libcrypto SHA-1 failed")
    }
}
