/// The error codes of the Unix-socket protocol.
public enum SocketErrorCode: String, Sendable, Hashable {
    case invalidJSON = "INVALID_JSON"
    case invalidRequest = "INVALID_REQUEST"
    case unknownOp = "UNKNOWN_OP"
    case unknownChannel = "UNKNOWN_CHANNEL"
    case reservedType = "RESERVED_TYPE"
    case eventTooLarge = "EVENT_TOO_LARGE"
    case lineTooLong = "LINE_TOO_LONG"
    case notFound = "NOT_FOUND"
    case shuttingDown = "SHUTTING_DOWN"
    /// Cluster mode: Redis is unreachable, so the event could not be numbered; nothing was published. Retry (with
    /// the same idempotency key).
    case brokerUnavailable = "BROKER_UNAVAILABLE"
    /// Cluster mode: the publish reached Redis (or may have), and the connection was lost before its answer: the
    /// event may or may not be numbered and delivered. Retry with the same idempotency key only: a first publish
    /// that did run is then answered as a duplicate, with its seq.
    case publishOutcomeUnknown = "PUBLISH_OUTCOME_UNKNOWN"
}
