import COpenSSL

/// SHA-1 from libcrypto: its low-level one-shot (`hub_sha1`), which skips the EVP route's context and provider
/// dispatch. Used for `Sec-WebSocket-Accept`, where SHA-1 is what RFC 6455 prescribes, and by the hub to name Redis
/// scripts.
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
        let ok = hub_sha1(input.baseAddress?.assumingMemoryBound(to: UInt8.self), input.count,
                          digest.baseAddress?.assumingMemoryBound(to: UInt8.self))
        precondition(ok == 1, "libcrypto SHA-1 failed")
    }
}
