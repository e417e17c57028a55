import CZlib

/// The 4 bytes a `Z_SYNC_FLUSH` ends with; RFC 7692 section 7.2.1 strips them on send and
/// section 7.2.2 appends them on receive.
let deflateSyncTail: [UInt8] = [0x00, 0x00, 0xFF, 0xFF]

/// Output is produced through a stack buffer of this size, so neither side ever allocates in
/// proportion to a limit or to a claimed size.
private let chunkSize = 16 * 1024

/// permessage-deflate compressor for one connection (zlib raw deflate, RFC 7692 section 7.2.1).
///
/// The `z_stream` lives at a fixed heap address for the object's lifetime (zlib keeps a pointer
/// back to it). Owned by one connection on one loop thread: not Sendable.
public final class PerMessageDeflater: MessageCompressor {
    private let stream: UnsafeMutablePointer<z_stream>
    /// Reset the stream after every message (this side's `*_no_context_takeover`).
    public let noContextTakeover: Bool
    /// The negotiated window (8...15); zlib is run with max(9, windowBits).
    public let windowBits: Int
    public let minimumSizeToCompress: Int

    /// - Parameters:
    ///   - parameters: the negotiated parameters.
    ///   - role: our role. A server compresses with the `server_*` parameters, a client with the `client_*` ones.
    ///   - configuration: level, memLevel and the minimum size come from it.
    public convenience init(parameters: PerMessageDeflateParameters, role: PerMessageDeflate.Role,
                            configuration: PerMessageDeflateConfiguration = PerMessageDeflateConfiguration()) {
        switch role {
        case .server:
            self.init(windowBits: parameters.serverMaxWindowBits, noContextTakeover: parameters.serverNoContextTakeover,
                      level: configuration.compressionLevel, memLevel: configuration.memLevel,
                      minimumSizeToCompress: configuration.minimumSizeToCompress)
        case .client:
            self.init(windowBits: parameters.clientMaxWindowBits, noContextTakeover: parameters.clientNoContextTakeover,
                      level: configuration.compressionLevel, memLevel: configuration.memLevel,
                      minimumSizeToCompress: configuration.minimumSizeToCompress)
        }
    }

    public init(windowBits: Int, noContextTakeover: Bool, level: Int32 = 6, memLevel: Int32 = 8, minimumSizeToCompress: Int = 0) {
        precondition((8...15).contains(windowBits), "window bits must be 8...15")
        self.windowBits = windowBits
        self.noContextTakeover = noContextTakeover
        self.minimumSizeToCompress = minimumSizeToCompress
        stream = .allocate(capacity: 1)
        stream.initialize(to: z_stream())
        // Raw deflate (negative windowBits). zlib refuses 8 for raw streams; 9 still never emits a
        // distance above 2^9 - 262 = 250, so it honours a negotiated window of 8.
        let rc = deflateInit2_(stream, level, Z_DEFLATED, -Int32(max(9, windowBits)), memLevel, Z_DEFAULT_STRATEGY,
                               zlibVersion(), Int32(MemoryLayout<z_stream>.size))
        precondition(rc == Z_OK, "deflateInit2 failed: \(rc)")
    }

    deinit {
        deflateEnd(stream)
        stream.deinitialize(count: 1)
        stream.deallocate()
    }

    /// Whether a payload of `count` bytes is worth compressing (RSV1 set) under this policy.
    public func shouldCompress(_ count: Int) -> Bool { count >= minimumSizeToCompress }

    /// Compresses one whole message: deflate with `Z_SYNC_FLUSH`, then strip the trailing `00 00 ff ff`.
    public func compressMessage(_ payload: UnsafeRawBufferPointer) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(payload.count / 2 + 16)
        stream.pointee.next_in = UnsafeMutablePointer(mutating: payload.baseAddress?.assumingMemoryBound(to: Bytef.self))
        stream.pointee.avail_in = uInt(payload.count)
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: chunkSize) { chunk in
            repeat {
                stream.pointee.next_out = chunk.baseAddress
                stream.pointee.avail_out = uInt(chunkSize)
                let rc = deflate(stream, Z_SYNC_FLUSH)
                precondition(rc == Z_OK || rc == Z_BUF_ERROR, "deflate failed: \(rc)")
                output.append(contentsOf: UnsafeBufferPointer(rebasing: chunk[..<(chunkSize - Int(stream.pointee.avail_out))]))
            } while stream.pointee.avail_out == 0
        }
        stream.pointee.next_in = nil
        stream.pointee.avail_in = 0
        if output.count >= 4 && output[(output.count - 4)...].elementsEqual(deflateSyncTail) {
            output.removeLast(4)
        }
        if output.isEmpty {
            // zlib emits nothing for an empty input right after a flush; an empty payload plus the
            // appended tail would not be a complete block, so send RFC 7692 7.2.3.6's single 0x00.
            output = [0x00]
        }
        if noContextTakeover { deflateReset(stream) }
        return output
    }

    /// Convenience for `[UInt8]` payloads.
    public func compressMessage(_ payload: [UInt8]) -> [UInt8] {
        payload.withUnsafeBytes { compressMessage($0) }
    }
}

@available(*, unavailable) extension PerMessageDeflater: Sendable {}

/// permessage-deflate decompressor for one connection (RFC 7692 section 7.2.2).
///
/// Inflates with windowBits 15 whatever the peer's negotiated window: a larger inflate window
/// always decodes a stream made with a smaller one, and zlib rejects 8 for raw inflate on some versions.
public final class PerMessageInflater: MessageDecompressor {
    private let stream: UnsafeMutablePointer<z_stream>
    /// Reset the stream before every message (the peer's `*_no_context_takeover`).
    public let noContextTakeover: Bool

    /// - Parameters:
    ///   - parameters: the negotiated parameters.
    ///   - role: our role. A server inflates what the client sent, so it follows the `client_*` parameters.
    public convenience init(parameters: PerMessageDeflateParameters, role: PerMessageDeflate.Role) {
        switch role {
        case .server: self.init(noContextTakeover: parameters.clientNoContextTakeover)
        case .client: self.init(noContextTakeover: parameters.serverNoContextTakeover)
        }
    }

    public init(noContextTakeover: Bool) {
        self.noContextTakeover = noContextTakeover
        stream = .allocate(capacity: 1)
        stream.initialize(to: z_stream())
        let rc = inflateInit2_(stream, -15, zlibVersion(), Int32(MemoryLayout<z_stream>.size))
        precondition(rc == Z_OK, "inflateInit2 failed: \(rc)")
    }

    deinit {
        inflateEnd(stream)
        stream.deinitialize(count: 1)
        stream.deallocate()
    }

    /// Appends the inflated message to `output`. Throws `decompressedTooLarge` as soon as `output.count`
    /// would pass `limit` (output grows by at most one 16 KiB chunk at a time and never beyond
    /// `limit + 1`), and `invalidCompressedData` on any zlib error. After a throw the context is reset;
    /// the connection is expected to close.
    public func decompressMessage(_ compressed: UnsafeRawBufferPointer, into output: inout [UInt8], limit: Int) throws(ProtocolViolation) {
        if noContextTakeover { inflateReset(stream) }
        // An empty payload with RSV1 is taken as an empty message. Appending the tail to nothing would
        // leave half a stored block in the context and corrupt the next message.
        if compressed.isEmpty { return }
        var outcome = inflate(compressed, into: &output, limit: limit)
        if case .more = outcome {
            outcome = deflateSyncTail.withUnsafeBytes { inflate($0, into: &output, limit: limit) }
        }
        switch outcome {
        case .more, .ended:
            return
        case .failed(let violation):
            inflateReset(stream)
            throw violation
        }
    }

    /// Convenience for `[UInt8]` input.
    public func decompressMessage(_ compressed: [UInt8], limit: Int) throws(ProtocolViolation) -> [UInt8] {
        var output: [UInt8] = []
        let result: Result<Void, ProtocolViolation> = compressed.withUnsafeBytes { raw in
            do throws(ProtocolViolation) {
                try decompressMessage(raw, into: &output, limit: limit)
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        try result.get()
        return output
    }

    private enum Outcome {
        /// All input consumed, the stream goes on.
        case more
        /// The deflate stream ended (a block with BFINAL set, RFC 7692 section 7.2.3.3); it was reset.
        case ended
        case failed(ProtocolViolation)
    }

    /// Runs `input` through inflate, appending to `output` chunk by chunk.
    private func inflate(_ input: UnsafeRawBufferPointer, into output: inout [UInt8], limit: Int) -> Outcome {
        stream.pointee.next_in = UnsafeMutablePointer(mutating: input.baseAddress?.assumingMemoryBound(to: Bytef.self))
        stream.pointee.avail_in = uInt(input.count)
        defer {
            stream.pointee.next_in = nil
            stream.pointee.avail_in = 0
        }
        var rc: Int32 = Z_OK
        var exceeded = false
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: chunkSize) { chunk in
            repeat {
                // Room for at most limit + 1 bytes in total: producing that extra byte proves the excess.
                let room = min(chunkSize, max(0, limit - output.count) + 1)
                stream.pointee.next_out = chunk.baseAddress
                stream.pointee.avail_out = uInt(room)
                rc = CZlib.inflate(stream, Z_SYNC_FLUSH)
                let produced = room - Int(stream.pointee.avail_out)
                output.append(contentsOf: UnsafeBufferPointer(rebasing: chunk[..<produced]))
                if output.count > limit { exceeded = true; return }
                if rc != Z_OK { return }
            } while stream.pointee.avail_out == 0
        }
        if exceeded { return .failed(ProtocolViolation(.decompressedTooLarge(output.count))) }
        switch rc {
        case Z_OK, Z_BUF_ERROR:
            return .more
        case Z_STREAM_END:
            // Anything but our own appended tail after the final block is garbage.
            let leftover = Int(stream.pointee.avail_in)
            inflateReset(stream)
            if leftover > 0 && !(input.count == 4 && input.elementsEqual(deflateSyncTail)) {
                return .failed(ProtocolViolation(.invalidCompressedData))
            }
            return .ended
        default:
            return .failed(ProtocolViolation(.invalidCompressedData))
        }
    }
}

@available(*, unavailable) extension PerMessageInflater: Sendable {}
