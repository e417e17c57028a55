/// Turns a stream of WebSocket frames into messages (RFC 6455 sections 5.4-5.6 and 7).
///
/// Built on ``FrameDecoder``; adds the message rules: continuation sequencing (control frames may
/// arrive between fragments; there is no limit on the number of fragments other than the message
/// size), the message size limit checked before each fragment is appended (1009), incremental UTF-8
/// validation of text as its bytes arrive so an invalid byte fails at once (1007; compressed text
/// is validated after decompression), close-body rules, and "no frame after close".
///
/// A single-frame message that lies entirely inside the buffer given to ``read(_:_:)`` is handed over
/// in place (zero copy, unmasked in the caller's buffer); fragmented or split messages are assembled
/// in the reader's own reusable buffer. After a thrown violation the reader is poisoned: every later
/// ``read(_:_:)`` throws the same violation and consumes nothing. Send a close frame with
/// ``ProtocolViolation/closeCode`` and close the connection; never feed it more input.
public struct MessageReader {
    public let configuration: MessageReaderConfiguration
    private var decoder: FrameDecoder
    private var decompressor: (any MessageDecompressor)?

    // Current frame.
    private var frameOpcode: Opcode = .continuation
    private var frameFin = false
    private var frameStarted = false  // a payload chunk of the current frame was already seen
    // Current data message.
    private var inMessage = false
    private var messageIsText = false
    private var messageCompressed = false
    private var messageSize = 0
    private var utf8 = UTF8Validator()
    private var assembly: [UInt8] = []
    private var inflated: [UInt8] = []
    // Control frame split across reads.
    private var control: [UInt8] = []
    private var closeReceived = false
    /// The violation that failed the stream; once set, ``read(_:_:)`` only rethrows it.
    private var failure: ProtocolViolation?

    /// - Parameters:
    ///   - configuration: role and limits.
    ///   - decompressor: installed when permessage-deflate was negotiated; RSV1 is then accepted on the
    ///     first frame of a data message and the message is inflated before delivery.
    public init(configuration: MessageReaderConfiguration, decompressor: (any MessageDecompressor)? = nil) {
        self.configuration = configuration
        self.decompressor = decompressor
        self.decoder = FrameDecoder(role: configuration.role,
                                    maxFrameSize: UInt64(min(configuration.maxFrameSize, max(configuration.maxMessageSize, 125))),
                                    allowRSV1: decompressor != nil)
    }

    /// True once a close frame has been received (any further frame is a violation).
    public var hasReceivedClose: Bool { closeReceived }

    /// Decodes `bytes` (unmasking in place), calling `body` for every complete message or control frame.
    ///
    /// - Returns: the number of bytes consumed: all of them, unless `body` returned `.stop`, in which
    ///   case the caller passes the unconsumed rest (and later bytes) to the next call.
    /// - Throws: the first ``ProtocolViolation`` met; its `closeCode` is the answer to send.
    public mutating func read(_ bytes: UnsafeMutableRawBufferPointer,
                              _ body: (InboundMessage) -> ReadDecision) throws(ProtocolViolation) -> Int {
        if let failure { throw failure }
        do {
            return try readFrames(bytes, body)
        } catch {
            failure = error
            throw error
        }
    }

    /// The violation this reader met, if any (it is then poisoned).
    public var violation: ProtocolViolation? { failure }

    /// True between messages with nothing pending: no partial frame, message or control frame, no close received,
    /// no violation, and no decompressor (whose window outlives a message). A reader at rest can be dropped and a
    /// fresh one with the same configuration made for the next bytes: it would read them exactly the same.
    public var isAtRest: Bool {
        failure == nil && !closeReceived && !inMessage && control.isEmpty && decompressor == nil && decoder.isAtFrameBoundary
    }

    private mutating func readFrames(_ bytes: UnsafeMutableRawBufferPointer,
                                     _ body: (InboundMessage) -> ReadDecision) throws(ProtocolViolation) -> Int {
        var offset = 0
        while true {
            switch try decoder.next(bytes, at: &offset) {
            case .needMoreData:
                return offset
            case .header(let header):
                try beginFrame(header)
            case .payload(let chunk, let complete):
                let decision: ReadDecision
                if frameOpcode.isControl {
                    decision = try controlPayload(UnsafeRawBufferPointer(chunk), complete: complete, body)
                } else {
                    decision = try dataPayload(UnsafeRawBufferPointer(chunk), complete: complete, body)
                }
                frameStarted = !complete
                if decision == .stop { return offset }
            }
        }
    }

    private mutating func beginFrame(_ header: FrameHeader) throws(ProtocolViolation) {
        if closeReceived { throw ProtocolViolation(.frameAfterClose) }
        frameOpcode = header.opcode
        frameFin = header.fin
        frameStarted = false
        switch header.opcode {
        case .close, .ping, .pong:
            if header.rsv1 { throw ProtocolViolation(.reservedBitsSet) }
            if !control.isEmpty { control.removeAll(keepingCapacity: true) }
        case .continuation:
            if !inMessage { throw ProtocolViolation(.unexpectedContinuation) }
            if header.rsv1 { throw ProtocolViolation(.reservedBitsSet) }
            try checkSize(adding: header.payloadLength)
        case .text, .binary:
            if inMessage { throw ProtocolViolation(.expectedContinuation) }
            inMessage = true
            messageIsText = header.opcode == .text
            messageCompressed = header.rsv1
            messageSize = 0
            utf8.reset()
            if !assembly.isEmpty { assembly.removeAll(keepingCapacity: true) }
            try checkSize(adding: header.payloadLength)
        }
    }

    @inline(__always)
    private func checkSize(adding length: UInt64) throws(ProtocolViolation) {
        let limit = configuration.maxMessageSize
        if length > UInt64(limit &- messageSize) {
            throw ProtocolViolation(.messageTooLarge(messageSize &+ Int(clamping: length)))
        }
    }

    private mutating func dataPayload(_ chunk: UnsafeRawBufferPointer, complete: Bool,
                                      _ body: (InboundMessage) -> ReadDecision) throws(ProtocolViolation) -> ReadDecision {
        let messageComplete = complete && frameFin
        if messageComplete && !frameStarted && messageSize == 0 {
            // Zero-copy: the whole message is this one chunk of the caller's buffer.
            inMessage = false
            if messageCompressed { return try deliverCompressed(chunk, body) }
            if messageIsText && !UTF8Validator.isValid(chunk) { throw ProtocolViolation(.invalidUTF8) }
            return body(messageIsText ? .text(chunk) : .binary(chunk))
        }
        // The size was checked against the whole frame at its header, so no check is needed here.
        if messageIsText && !messageCompressed && !utf8.validate(chunk) { throw ProtocolViolation(.invalidUTF8) }
        assembly.append(contentsOf: chunk)
        messageSize &+= chunk.count
        guard messageComplete else { return .continue }
        inMessage = false
        if messageCompressed {
            let compressed = assembly
            return try compressed.withUnsafeBytes { raw in
                Result { () throws(ProtocolViolation) -> ReadDecision in try deliverCompressed(raw, body) }
            }.get()
        }
        if messageIsText && !utf8.isComplete { throw ProtocolViolation(.invalidUTF8) }
        return assembly.withUnsafeBytes { raw in body(messageIsText ? .text(raw) : .binary(raw)) }
    }

    private mutating func deliverCompressed(_ compressed: UnsafeRawBufferPointer,
                                            _ body: (InboundMessage) -> ReadDecision) throws(ProtocolViolation) -> ReadDecision {
        inflated.removeAll(keepingCapacity: true)
        // The decoder accepts RSV1 only when a decompressor is installed; the guard keeps that a thrown error.
        guard var decompressor else { throw ProtocolViolation(.reservedBitsSet) }
        defer { self.decompressor = decompressor }  // a value-type decompressor keeps its stream state
        try decompressor.decompressMessage(compressed, into: &inflated, limit: configuration.maxMessageSize)
        if inflated.count > configuration.maxMessageSize {
            throw ProtocolViolation(.decompressedTooLarge(inflated.count))
        }
        let isText = messageIsText
        return try inflated.withUnsafeBytes { raw in
            Result { () throws(ProtocolViolation) -> ReadDecision in
                if isText && !UTF8Validator.isValid(raw) { throw ProtocolViolation(.invalidUTF8) }
                return body(isText ? .text(raw) : .binary(raw))
            }
        }.get()
    }

    private mutating func controlPayload(_ chunk: UnsafeRawBufferPointer, complete: Bool,
                                         _ body: (InboundMessage) -> ReadDecision) throws(ProtocolViolation) -> ReadDecision {
        if complete && !frameStarted {
            return try deliverControl(chunk, body)  // zero-copy
        }
        control.append(contentsOf: chunk)
        guard complete else { return .continue }
        let assembled = control
        return try assembled.withUnsafeBytes { raw in
            Result { () throws(ProtocolViolation) -> ReadDecision in try deliverControl(raw, body) }
        }.get()
    }

    private mutating func deliverControl(_ payload: UnsafeRawBufferPointer,
                                         _ body: (InboundMessage) -> ReadDecision) throws(ProtocolViolation) -> ReadDecision {
        switch frameOpcode {
        case .ping: return body(.ping(payload))
        case .pong: return body(.pong(payload))
        default:
            let parsed = try Self.parseCloseBody(payload)
            closeReceived = true
            return body(.close(code: parsed.code, reason: parsed.reason))
        }
    }

    /// Checks a close frame body (RFC 6455 section 5.5.1, 7.4): empty, or a valid code plus a UTF-8 reason.
    public static func parseCloseBody(_ payload: UnsafeRawBufferPointer) throws(ProtocolViolation)
        -> (code: UInt16?, reason: UnsafeRawBufferPointer) {
        if payload.isEmpty { return (nil, payload) }
        if payload.count == 1 { throw ProtocolViolation(.invalidCloseBodyLength) }
        let code = UInt16(payload[0]) << 8 | UInt16(payload[1])
        if !CloseCode.isValidOnWire(code) { throw ProtocolViolation(.invalidCloseCode(code)) }
        let reason = UnsafeRawBufferPointer(rebasing: payload[2...])
        if !UTF8Validator.isValid(reason) { throw ProtocolViolation(.invalidUTF8) }
        return (code, reason)
    }
}
