/// The rule of a token bucket: `limit` messages per `period`. One per hub, shared by every connection's
/// `RateLimiter`, which keeps only its own state (24 bytes less per connection than carrying the rule).
public struct RateLimit: Sendable {
    let capacity: Double
    let refillPerNanosecond: Double
    let periodNanoseconds: UInt64

    public init(limit: Int, periodSeconds: Int = 60) {
        capacity = Double(limit)
        periodNanoseconds = UInt64(periodSeconds) * 1_000_000_000
        refillPerNanosecond = Double(limit) / Double(periodNanoseconds)
    }
}

/// A token bucket for client messages under a `RateLimit`, refilled continuously, starting full.
/// Time is passed in (monotonic nanoseconds) so the rules are testable without clocks.
public struct RateLimiter: Sendable {
    public enum Decision: Equatable, Sendable {
        case allowed
        /// Rejected; a message will be accepted again in `retryAfter` seconds (rounded up, at least 1).
        case limited(retryAfter: Int)
        /// Rejected, and the client has now sent more than twice the limit within one period: close it (1008).
        case abusive
    }

    private var tokens: Double
    private var last: UInt64
    private var periodStart: UInt64
    private var rejectedInPeriod: Int32 = 0

    public init(_ rule: RateLimit, now: UInt64) {
        tokens = rule.capacity
        last = now
        periodStart = now
    }

    public mutating func consume(now: UInt64, _ rule: RateLimit) -> Decision {
        if now > last {
            tokens = min(rule.capacity, tokens + Double(now - last) * rule.refillPerNanosecond)
            last = now
        }
        if now &- periodStart >= rule.periodNanoseconds {
            periodStart = now
            rejectedInPeriod = 0
        }
        if tokens >= 1 {
            tokens -= 1
            return .allowed
        }
        if rejectedInPeriod < Int32.max { rejectedInPeriod += 1 }
        if Double(rejectedInPeriod) > rule.capacity { return .abusive }
        let missing = 1 - tokens
        let seconds = missing / rule.refillPerNanosecond / 1_000_000_000
        return .limited(retryAfter: max(1, Int(seconds.rounded(.up))))
    }
}
