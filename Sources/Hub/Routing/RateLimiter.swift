/// A token bucket for client messages: `limit` messages per `period`, refilled continuously, starting full.
/// Time is passed in (monotonic nanoseconds) so the rules are testable without clocks.
public struct RateLimiter: Sendable {
    public enum Decision: Equatable, Sendable {
        case allowed
        /// Rejected; a message will be accepted again in `retryAfter` seconds (rounded up, at least 1).
        case limited(retryAfter: Int)
        /// Rejected, and the client has now sent more than twice the limit within one period: close it (1008).
        case abusive
    }

    private let capacity: Double
    private let refillPerNanosecond: Double
    private var tokens: Double
    private var last: UInt64
    private var rejectedInPeriod = 0
    private var periodStart: UInt64
    private let periodNanoseconds: UInt64

    public init(limit: Int, periodSeconds: Int = 60, now: UInt64) {
        capacity = Double(limit)
        periodNanoseconds = UInt64(periodSeconds) * 1_000_000_000
        refillPerNanosecond = Double(limit) / Double(periodNanoseconds)
        tokens = Double(limit)
        last = now
        periodStart = now
    }

    public mutating func consume(now: UInt64) -> Decision {
        if now > last {
            tokens = min(capacity, tokens + Double(now - last) * refillPerNanosecond)
            last = now
        }
        if now &- periodStart >= periodNanoseconds {
            periodStart = now
            rejectedInPeriod = 0
        }
        if tokens >= 1 {
            tokens -= 1
            return .allowed
        }
        rejectedInPeriod += 1
        if Double(rejectedInPeriod) > capacity { return .abusive }
        let missing = 1 - tokens
        let seconds = missing / refillPerNanosecond / 1_000_000_000
        return .limited(retryAfter: max(1, Int(seconds.rounded(.up))))
    }
}
