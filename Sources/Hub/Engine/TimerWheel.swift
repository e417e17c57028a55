import Glibc

/// Identifies one scheduled timer. Stale handles (the timer fired or was cancelled and its slot
/// reused) are detected by the generation and ignored, so cancelling twice is always safe.
public struct TimerHandle: Hashable, Sendable {
    let index: UInt32
    let generation: UInt32

    /// A handle that refers to no timer; `cancel` and `reschedule` on it do nothing.
    public static let none = TimerHandle(index: .max, generation: 0)
}

/// Reads CLOCK_MONOTONIC in nanoseconds. Deadlines never follow wall-clock jumps.
@inline(__always)
public func monotonicNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}

/// A coarse hashed timer wheel for per-connection deadlines (handshake, idle, ping, pong, token
/// expiry) and loop-wide repeating jobs.
///
/// Why a wheel: a hub has ~100k connections each with 1–3 deadlines that are pushed back on almost
/// every message. A heap costs O(log n) per push-back; here schedule, reschedule and cancel are O(1)
/// (entries sit in intrusive doubly linked lists, one per slot, addressed by index), and a tick only
/// visits the one slot whose time has come. Precision is one tick: a timer never fires early
/// (relative to the loop's cached "now") and fires at most one tick late.
///
/// The wheel has no clock of its own: `advance(toNanos:)` is fed the time, so tests use a fake clock.
public final class TimerWheel {
    /// 40 bytes (56 before): a connection's one timer is part of its idle memory. The slot is `dueTick`'s
    /// low bits; a repeating timer's period is in `periods`.
    private struct Entry {
        var next: Int32 = -1
        var prev: Int32 = -1
        var generation: UInt32 = 1
        var linked = false            // in a slot's list (not free, and not being fired)
        var repeats = false
        var dueTick: UInt64 = 0
        var action: (() -> Void)?
    }

    /// Length of one tick in nanoseconds.
    public let tickNanos: UInt64
    private let slotMask: Int

    /// The wheel's mutable state, behind a pointer rather than in stored properties, for the reason given at
    /// `EventLoop.LoopState`: the loop advances the wheel every iteration and reschedules a connection's timer on
    /// every message, and each in-place access to a stored `var` would cost a run-time exclusivity check. No access
    /// lasts across a timer's action (`fireDue` copies the batch and the action out before calling it).
    private struct WheelState {
        var heads: [Int32]
        var entries: [Entry] = []
        var free: [Int32] = []
        /// Periods (in ticks) of repeating timers, the loop's few housekeeping jobs, by entry index.
        var periods: [Int32: UInt64] = [:]
        var firing: [(Int32, UInt32)] = []
        var currentTick: UInt64
        var nowNanos: UInt64
        var count = 0
    }
    private let state: UnsafeMutablePointer<WheelState>

    private var heads: [Int32] {
        _read { yield state.pointee.heads }
        _modify { yield &state.pointee.heads }
    }
    private var entries: [Entry] {
        _read { yield state.pointee.entries }
        _modify { yield &state.pointee.entries }
    }
    private var free: [Int32] {
        _read { yield state.pointee.free }
        _modify { yield &state.pointee.free }
    }
    private var periods: [Int32: UInt64] {
        _read { yield state.pointee.periods }
        _modify { yield &state.pointee.periods }
    }
    private var firing: [(Int32, UInt32)] {
        _read { yield state.pointee.firing }
        _modify { yield &state.pointee.firing }
    }
    /// The last tick processed; timers due at or before it have fired.
    public private(set) var currentTick: UInt64 {
        get { state.pointee.currentTick }
        _modify { yield &state.pointee.currentTick }
    }
    /// The time passed to the last `advance`; new deadlines are measured from it.
    public private(set) var nowNanos: UInt64 {
        get { state.pointee.nowNanos }
        _modify { yield &state.pointee.nowNanos }
    }
    /// Number of scheduled timers.
    public private(set) var count: Int {
        get { state.pointee.count }
        _modify { yield &state.pointee.count }
    }

    /// - Parameters:
    ///   - tickNanos: resolution (the hub uses 100 ms; tests use less).
    ///   - slots: rounded up to a power of two; deadlines further than `slots` ticks away cost one
    ///     extra visit per wheel revolution.
    ///   - nowNanos: the starting time.
    public init(tickNanos: UInt64 = 1_000_000_000, slots: Int = 1024, nowNanos: UInt64 = monotonicNanos()) {
        precondition(tickNanos > 0 && slots > 0)
        var n = 1
        while n < slots { n <<= 1 }
        self.tickNanos = tickNanos
        slotMask = n - 1
        state = .allocate(capacity: 1)
        state.initialize(to: WheelState(heads: Array(repeating: -1, count: n), currentTick: nowNanos / tickNanos,
                                        nowNanos: nowNanos))
    }

    deinit {
        state.deinitialize(count: 1)
        state.deallocate()
    }

    private func ticks(forDelay nanos: UInt64) -> UInt64 {
        // Round the deadline up to a tick boundary so it never fires early.
        let due = (nowNanos &+ nanos &+ tickNanos &- 1) / tickNanos
        return max(due, currentTick &+ 1)
    }

    private func link(_ i: Int32, dueTick: UInt64) {
        let slot = Int(dueTick & UInt64(slotMask))
        entries[Int(i)].dueTick = dueTick
        entries[Int(i)].linked = true
        entries[Int(i)].prev = -1
        let head = heads[slot]
        entries[Int(i)].next = head
        if head >= 0 { entries[Int(head)].prev = i }
        heads[slot] = i
    }

    private func unlink(_ i: Int32) {
        let e = entries[Int(i)]
        guard e.linked else { return }
        if e.prev >= 0 { entries[Int(e.prev)].next = e.next } else { heads[Int(e.dueTick & UInt64(slotMask))] = e.next }
        if e.next >= 0 { entries[Int(e.next)].prev = e.prev }
        entries[Int(i)].linked = false
        entries[Int(i)].next = -1
        entries[Int(i)].prev = -1
    }

    private func release(_ i: Int32) {
        entries[Int(i)].generation &+= 1
        if entries[Int(i)].generation == 0 { entries[Int(i)].generation = 1 }
        entries[Int(i)].action = nil
        if entries[Int(i)].repeats {
            entries[Int(i)].repeats = false
            periods[i] = nil
        }
        free.append(i)
        count -= 1
    }

    private func valid(_ h: TimerHandle) -> Bool {
        h.index < entries.count && entries[Int(h.index)].generation == h.generation
    }

    /// Runs `action` once, `afterNanos` from the wheel's current time. O(1).
    @discardableResult
    public func schedule(afterNanos: UInt64, _ action: @escaping () -> Void) -> TimerHandle {
        let i: Int32
        if let reused = free.popLast() { i = reused } else { i = Int32(entries.count); entries.append(Entry()) }
        entries[Int(i)].action = action
        link(i, dueTick: ticks(forDelay: afterNanos))
        count += 1
        return TimerHandle(index: UInt32(i), generation: entries[Int(i)].generation)
    }

    /// Runs `action` every `everyNanos` (rounded to whole ticks, at least one) until cancelled.
    @discardableResult
    public func scheduleRepeating(everyNanos: UInt64, _ action: @escaping () -> Void) -> TimerHandle {
        let h = schedule(afterNanos: everyNanos, action)
        entries[Int(h.index)].repeats = true
        periods[Int32(h.index)] = max(1, (everyNanos + tickNanos - 1) / tickNanos)
        return h
    }

    /// Moves a pending timer to fire `afterNanos` from now, keeping its action. O(1), no allocation.
    /// Returns false if the handle is stale (already fired or cancelled).
    @discardableResult
    public func reschedule(_ h: TimerHandle, afterNanos: UInt64) -> Bool {
        guard valid(h) else { return false }
        unlink(Int32(h.index))
        link(Int32(h.index), dueTick: ticks(forDelay: afterNanos))
        return true
    }

    /// Cancels a timer. O(1). Returns false if it already fired or was cancelled.
    @discardableResult
    public func cancel(_ h: TimerHandle) -> Bool {
        guard valid(h) else { return false }
        unlink(Int32(h.index))
        release(Int32(h.index))
        return true
    }

    /// Whether the handle refers to a timer that has not fired or been cancelled.
    public func isPending(_ h: TimerHandle) -> Bool { valid(h) }

    /// Nanoseconds from `now` until the next tick boundary, or nil when no timer is scheduled
    /// (so the loop may sleep indefinitely).
    public func nanosUntilNextTick(now: UInt64) -> UInt64? {
        guard count > 0 else { return nil }
        let next = (currentTick &+ 1) &* tickNanos
        return next > now ? next - now : 0
    }

    /// Moves the wheel's notion of "now" forward without firing anything, so deadlines scheduled
    /// after a long sleep are measured from the wake-up, not from the last tick.
    public func updateNow(_ now: UInt64) {
        if now > nowNanos { nowNanos = now }
    }

    /// Advances the wheel to `now`, firing every timer whose tick has passed. Returns how many fired.
    /// Actions may schedule, reschedule or cancel any timer, including themselves.
    @discardableResult
    public func advance(toNanos now: UInt64) -> Int {
        if now > nowNanos { nowNanos = now }
        let target = nowNanos / tickNanos
        guard target > currentTick else { return 0 }
        var fired = 0
        if target - currentTick > UInt64(slotMask + 1) {
            // A long stall (suspend, debugger): one sweep of every slot catches everything due.
            currentTick = target
            for slot in 0...slotMask { fired += fireDue(slot: slot) }
            return fired
        }
        while currentTick < target {
            currentTick &+= 1
            fired += fireDue(slot: Int(currentTick & UInt64(slotMask)))
        }
        return fired
    }

    private func fireDue(slot: Int) -> Int {
        firing.removeAll(keepingCapacity: true)
        var i = heads[slot]
        while i >= 0 {
            let next = entries[Int(i)].next
            if entries[Int(i)].dueTick <= currentTick {
                unlink(i)
                firing.append((i, entries[Int(i)].generation))
            }
            i = next
        }
        guard !firing.isEmpty else { return 0 }
        let batch = firing
        var fired = 0
        for (index, generation) in batch {
            // An earlier action in this batch may have cancelled or rescheduled this one.
            guard entries[Int(index)].generation == generation, !entries[Int(index)].linked,
                  let action = entries[Int(index)].action else { continue }
            fired += 1
            action()
            guard entries[Int(index)].generation == generation, !entries[Int(index)].linked else { continue }
            if entries[Int(index)].repeats, let every = periods[index] {
                link(index, dueTick: currentTick &+ every)
            } else {
                release(index)
            }
        }
        return fired
    }
}

@available(*, unavailable)
extension TimerWheel: Sendable {}

/// Seconds since the Unix epoch, with sub-second precision.
package func wallClockSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
