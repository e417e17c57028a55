import COpenSSL
import Foundation
import Glibc
import HubEngine
import HubJSON
import HubRouting
import HubSupport
import Synchronization
import WSProtocol

/// Counters of one loop. Plain integers: only the loop's own thread writes them; admin views read them
/// through `EventLoop.execute` snapshots.
struct LoopCounters: Sendable {
    var messagesIn = 0
    var messagesOut = 0
    var handshaking = 0
    var upgraded = 0
    var slowConsumerCloses = 0
    var rateLimited = 0
    var rejectedConnections = 0
    var protocolErrors = 0
    var authFailures: [String: Int] = [:]
    var httpRequests = 0
    /// Resumes by outcome, in `RecoveryOutcome.labels` order.
    var recoveries = [0, 0, 0, 0]
    var replayedEvents = 0
    /// A TLS ClientHello at a plain port (answered 400 TLS_NOT_ENABLED in the clear).
    var tlsHelloOnPlainPort = 0
    /// Now: TLS connections over the connection limit being answered 503 inside TLS (`ClientAcceptor`).
    var busyTLSAnswers = 0
}

/// The outcomes of a resume, as counted and labelled in `stats` and `/metrics`.
enum RecoveryOutcome {
    static let labels = ["recovered", RecoveryFailure.epochChanged.rawValue, RecoveryFailure.tooOld.rawValue, RecoveryFailure.tooMany.rawValue]

    static func index(of failure: RecoveryFailure) -> Int {
        switch failure {
        case .epochChanged: return 1
        case .tooOld: return 2
        case .tooMany: return 3
        }
    }
}

/// What a SIGHUP can change while clients stay connected. Each loop keeps its own copy (`LoopContext.reloaded`),
/// replaced on its thread, so reading it costs no lock.
struct ReloadableSettings: Sendable {
    let rateLimit: RateLimit
    let rateLimitPerMinute: Int
    let allowedOrigins: OriginPolicy
    let recoveryMax: Int

    init(_ c: HubConfiguration) {
        rateLimit = RateLimit(limit: c.rateLimitPerMinute, periodSeconds: 60)
        rateLimitPerMinute = c.rateLimitPerMinute
        allowedOrigins = c.allowedOrigins
        recoveryMax = c.recoveryMax
    }
}

/// Everything one event loop owns: its client connections, its subscription registry, its counters.
/// Only ever touched on its loop's thread (that is what makes the `@unchecked Sendable` sound: other threads
/// only pass the reference into `loop.execute`).
final class LoopContext: @unchecked Sendable {
    let loop: EventLoop
    unowned(unsafe) var hub: HubCore!
    /// The settings a SIGHUP reloaded, as this loop last heard of them; nil: the start configuration's.
    var reloaded: ReloadableSettings?

    /// `--rate-limit`, as reloaded.
    var rateLimit: RateLimit { reloaded?.rateLimit ?? hub.rateLimit }
    var rateLimitPerMinute: Int { reloaded?.rateLimitPerMinute ?? hub.configuration.rateLimitPerMinute }
    /// `--allowed-origins`, as reloaded.
    var allowedOrigins: OriginPolicy { reloaded?.allowedOrigins ?? hub.configuration.allowedOrigins }
    /// `--recovery-max`, as reloaded.
    var recoveryMax: Int { reloaded?.recoveryMax ?? hub.configuration.recoveryMax }

    /// What fan-out touches for every event (the registry, the counters, the latency histogram), behind a pointer
    /// rather than in stored properties, so the accesses skip Swift's run-time exclusivity checks (docs/ENGINE.md,
    /// as `EventLoop.LoopState`). None of these accesses calls back into the context while it lasts.
    private struct HotState {
        var registry: LocalRegistry<ClientConnection>
        var counters = LoopCounters()
        var latency = LatencyHistogram()
    }
    private let hot: UnsafeMutablePointer<HotState>

    var registry: LocalRegistry<ClientConnection> {
        _read { yield hot.pointee.registry }
        _modify { yield &hot.pointee.registry }
    }
    var counters: LoopCounters {
        _read { yield hot.pointee.counters }
        _modify { yield &hot.pointee.counters }
    }
    var latency: LatencyHistogram {
        _read { yield hot.pointee.latency }
        _modify { yield &hot.pointee.latency }
    }
    /// Every client connection of this loop, from accept to close, by serial.
    var clients: [Int: ClientConnection] = [:]
    /// Loop 0 only: what was published, and the tails.
    var ledger: PublishLedger?
    var nextSerial = 1
    /// The last token handed to a client's subscribe (its floors carry it); only grows.
    var nextFloorToken = 0
    /// Rates over the last 10 s: one sample per second.
    var rateSamples: [RateSample] = []
    var busyFraction = 0.0
    private var lastCPU: UInt64 = 0
    private var lastCPUWall: UInt64 = 0
    /// A reusable JSON buffer for replies on this loop.
    var writer = JSONWriter(reusing: [])
    /// Precomputed control frames shared by every connection of the hub.
    let pingFrame = SharedBytes(FrameEncoder.frame(opcode: .ping, payload: []))

    init(loop: EventLoop, channelCount: Int) {
        self.loop = loop
        hot = .allocate(capacity: 1)
        hot.initialize(to: HotState(registry: LocalRegistry(channelCount: channelCount)))
    }

    deinit {
        hot.deinitialize(count: 1)
        hot.deallocate()
    }

    /// Called once on the loop thread after start: the 1-second housekeeping tick.
    func startHousekeeping() {
        lastCPU = threadCPUNanos()
        lastCPUWall = monotonicNanos()
        _ = loop.scheduleRepeating(every: .seconds(1)) { [self] in
            let now = monotonicNanos()
            let cpu = threadCPUNanos()
            if now > lastCPUWall { busyFraction = min(1, Double(cpu &- lastCPU) / Double(now - lastCPUWall)) }
            lastCPU = cpu
            lastCPUWall = now
            let engine = loop.metrics
            rateSamples.append(RateSample(at: now, messagesIn: counters.messagesIn, messagesOut: counters.messagesOut,
                                          bytesIn: engine.bytesIn, bytesOut: engine.bytesOut))
            if rateSamples.count > 11 { rateSamples.removeFirst(rateSamples.count - 11) }
            ledger?.sample(now: now)
            if ledger != nil { hub.broker.maintain() }  // loop 0 only: expire history, forget idle streams
            trimAfterBurst(opened: engine.connectionsOpened)
        }
    }

    /// Connections opened at the last housekeeping tick, and at the last trim.
    private var openedAtLastTick = 0
    private var openedAtLastTrim = 0

    /// After a burst of new connections is over, gives the allocator's free pages back to the kernel
    /// (`malloc_trim`). A burst leaves the heap full of holes where handshakes' transient memory was (a TLS handshake
    /// allocates and frees ~50 KiB; OpenSSL's `SSL` object ~15 KiB more) between the small objects that stay; glibc
    /// keeps those pages resident until trimmed. Measured with 19 000 TLS connections: RSS per connection 4.4-4.8 KiB
    /// without the trim (Benchmarks/README.md, TLS). Cheap: at most once per burst, a walk of the free lists.
    private func trimAfterBurst(opened: Int) {
        let lastSecond = opened - openedAtLastTick
        openedAtLastTick = opened
        guard opened - openedAtLastTrim >= 512, lastSecond < 64 else { return }
        openedAtLastTrim = opened
        _ = hub_malloc_trim()
    }

    /// Frames `writer`'s JSON as one text frame and writes it to `connection`.
    func sendWriterText(to connection: Connection) -> Connection.WriteResult {
        // Framed straight from the writer's storage: `writer.bytes` made a copy of every reply first.
        writer.withBytes { sendText($0, to: connection) }
    }

    func sendText(_ payload: UnsafeRawBufferPointer, to connection: Connection) -> Connection.WriteResult {
        connection.write(SharedBytes.frame(opcode: .text, payload))
    }

    // MARK: Fan-out

    /// Hands each event to this loop's subscribers. Returns, per event, how many connections accepted it.
    func deliver(_ batch: EventBatch) -> [Int] {
        var counts = Array(filledWith: 0, count: batch.events.count)
        var now: UInt64 = 0
        let index = loop.index
        for (i, event) in batch.events.enumerated() where batch.reaches(i, loop: index) {
            let subscribers = event.account.map { registry.subscribers(channel: event.channel, account: $0) }
                ?? registry.subscribers(channel: event.channel)
            guard !subscribers.isEmpty else { continue }
            var n = 0
            for subscriber in subscribers where subscriber.deliver(event) { n += 1 }
            counts[i] = n
            if n > 0 {
                if now == 0 { now = monotonicNanos() }
                latency.record(now &- event.acceptedAt)
            }
        }
        return counts
    }
}

struct RateSample: Sendable {
    var at: UInt64
    var messagesIn: Int
    var messagesOut: Int
    var bytesIn: Int
    var bytesOut: Int
}

/// A loop's fan-out shard: hops to the loop thread, delivers, reports.
struct LoopShard: FanoutShard {
    let context: LoopContext

    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void) {
        let context = self.context
        let job: @Sendable () -> Void = { done(context.deliver(batch)) }
        // A few events for single accounts reach a few connections each: another loop with time to spare may run
        // the delivery rather than wake this one (`EventLoop.executeBorrowable`). A channel-wide event may reach
        // thousands: this loop's own thread delivers it, in parallel with the others.
        if batch.events.count <= LoopShard.borrowableEvents && batch.events.allSatisfy({ $0.account != nil }) {
            context.loop.executeBorrowable(job)
        } else {
            context.loop.execute(job)
        }
    }

    static let borrowableEvents = 64

    func numberingRestarted(_ stream: StreamKey) {
        let context = self.context
        context.loop.execute {
            let subscribers = stream.account.map { context.registry.subscribers(channel: stream.channel, account: $0) }
                ?? context.registry.subscribers(channel: stream.channel)
            for subscriber in subscribers {
                subscriber.close(code: CloseCode(1012), reason: "stream numbering restarted: resubscribe")
            }
        }
    }
}

/// CPU time of the calling thread.
func threadCPUNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

/// Builds one reply line with a fresh writer.
func replyLine(_ build: (inout JSONWriter) -> Void) -> [UInt8] {
    var w = JSONWriter(capacity: 128)
    build(&w)
    return w.takeBytes()
}
