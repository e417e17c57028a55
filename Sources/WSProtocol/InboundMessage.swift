/// One complete message or control frame delivered by ``MessageReader``.
/// The pointers are valid only during the callback that receives them.
public enum InboundMessage {
    case text(UnsafeRawBufferPointer)
    case binary(UnsafeRawBufferPointer)
    case ping(UnsafeRawBufferPointer)
    case pong(UnsafeRawBufferPointer)
    /// `code` is nil for an empty close body; `reason` is valid UTF-8 (possibly empty).
    case close(code: UInt16?, reason: UnsafeRawBufferPointer)
}

/// What the ``MessageReader`` callback wants next.
public enum ReadDecision: Sendable {
    /// Keep decoding the rest of the buffer.
    case `continue`
    /// Return now; `read` reports how many bytes were consumed so the caller can resume later.
    case stop
}
