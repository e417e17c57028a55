/// The seam between the frame/message layer and a compression extension (permessage-deflate).
///
/// The message reader owns RSV1 only when a decompressor is installed. When a compressed message
/// (RSV1 on its first frame) is complete, the reader hands the compressed bytes to the decompressor,
/// which appends the inflated bytes to `output` and must throw
/// ``ProtocolViolation/Kind/decompressedTooLarge(_:)`` as soon as the output would exceed `limit`
/// (a zip bomb gets 1009, never an out-of-memory), or ``ProtocolViolation/Kind/invalidCompressedData``.
public protocol MessageDecompressor {
    mutating func decompressMessage(_ compressed: UnsafeRawBufferPointer, into output: inout [UInt8], limit: Int) throws(ProtocolViolation)
}

/// The sending side of a compression extension.
public protocol MessageCompressor {
    /// Compresses one whole message payload; the result is sent with RSV1 set on its first frame.
    mutating func compressMessage(_ payload: UnsafeRawBufferPointer) -> [UInt8]
}
