import Dispatch
import Glibc
import Synchronization
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubRouting
@testable import HubSupport

@Suite("Event loop and timers")
struct EngineLoopTests {
    @Test func executeFromManyThreadsRunsEachJobOnceOnTheLoop() throws {
        let loop = try EventLoop()
        defer { loop.stop(); loop.join() }
        let threads = 8, perThread = 5_000
        let seen = LoopBox([Int](repeating: 0, count: threads * perThread))
        let offLoop = LoopBox(0)
        DispatchQueue.concurrentPerform(iterations: threads) { t in
            for j in 0..<perThread {
                let id = t * perThread + j
                loop.execute {
                    if !loop.inEventLoop { offLoop.value += 1 }
                    seen.value[id] += 1
                }
            }
        }
        let counts = try loop.submitAndWait { seen.value }
        #expect(counts.allSatisfy { $0 == 1 })
        #expect(try loop.submitAndWait { offLoop.value } == 0)
        #expect(!loop.inEventLoop)
    }

    /// A job posted by a job of the same inbox run waits for no `epoll_wait`: the next iteration runs it without
    /// polling (counted in `pollsSkipped`), and the sockets are polled again the iteration after.
    @Test func jobPostedDuringTheInboxRunsWithoutAPoll() throws {
        let loop = try EventLoop()
        defer { loop.stop(); loop.join() }
        let before = loop.metricsSnapshot().pollsSkipped
        // The snapshot's job ran in an inbox run: a job posted before that run ends would itself skip a poll.
        for _ in 0..<400 where !loop.isAsleep { usleep(1_000) }
        let ran = Atomic(0)
        // J1 is posted while the inbox runs: the next iteration runs it without polling. J1 posts J2: the iteration
        // after that polls first (never two skips in a row), then runs it.
        loop.execute {
            loop.execute {
                ran.add(1, ordering: .relaxed)
                loop.execute { ran.add(1, ordering: .relaxed) }
            }
        }
        for _ in 0..<400 where ran.load(ordering: .relaxed) < 2 { usleep(5_000) }
        #expect(ran.load(ordering: .relaxed) == 2)
        for _ in 0..<400 where !loop.isAsleep { usleep(1_000) }  // the snapshot's own job is polled for, not skipped to
        #expect(loop.metricsSnapshot().pollsSkipped - before == 1)
    }

    /// Where a job posted from loop `a`'s thread to a sleeping loop `b` ran, and what `inEventLoop` said there.
    private struct Ran: Sendable, Equatable {
        var thread: UInt
        var inB: Bool
    }

    /// What jobs recorded, from any thread.
    private final class Record: Sendable {
        private let entries = Synchronization.Mutex<[Ran]>([])
        /// Records where the calling job runs and whether `loop.inEventLoop` is true there.
        func append(_ loop: EventLoop) {
            let entry = Ran(thread: UInt(pthread_self()), inB: loop.inEventLoop)
            entries.withLock { $0.append(entry) }
        }
        var all: [Ran] { entries.withLock { $0 } }
    }

    /// Posts `post` from a job on `a` once `b` sleeps; returns `a`'s thread and what the jobs recorded.
    private func fromLoop(_ a: EventLoop, to b: EventLoop, jobs: Int,
                          _ post: @escaping @Sendable (Record) -> Void) throws -> (a: UInt, ran: [Ran]) {
        let ran = Record()
        let aThread = try a.submitAndWait { UInt(pthread_self()) }
        for _ in 0..<400 where !b.isAsleep { usleep(1_000) }
        a.execute { post(ran) }
        for _ in 0..<400 where ran.all.count < jobs { usleep(5_000) }
        return (aThread, ran.all)
    }

    /// A short job posted from another loop's thread while its loop sleeps runs on that thread at the end of its
    /// iteration, as its own loop (`inEventLoop`), and the sleeping loop is not woken for it.
    @Test func borrowableJobRunsOnThePostingLoopsThread() throws {
        let a = try EventLoop(index: 0), b = try EventLoop(index: 1)
        defer { a.stop(); b.stop(); a.join(); b.join() }
        let bThread = try b.submitAndWait { UInt(pthread_self()) }
        let before = b.metricsSnapshot().borrowedRuns
        let (aThread, ran) = try fromLoop(a, to: b, jobs: 2) { ran in
            b.executeBorrowable { ran.append(b) }
            b.executeBorrowable { ran.append(b) }
        }
        #expect(ran == [Ran(thread: aThread, inB: true), Ran(thread: aThread, inB: true)])
        #expect(aThread != bThread)
        #expect(b.metricsSnapshot().borrowedRuns - before == 1)
        #expect(!b.inEventLoop)
    }

    /// A job that must run on its own loop, posted with borrowable ones or from a thread that is no loop's, wakes it.
    @Test func otherJobsRunOnTheirLoopsThread() throws {
        let a = try EventLoop(index: 0), b = try EventLoop(index: 1)
        defer { a.stop(); b.stop(); a.join(); b.join() }
        let bThread = try b.submitAndWait { UInt(pthread_self()) }
        let (_, mixed) = try fromLoop(a, to: b, jobs: 2) { ran in
            b.executeBorrowable { ran.append(b) }
            b.execute { ran.append(b) }
        }
        #expect(mixed == [Ran(thread: bThread, inB: true), Ran(thread: bThread, inB: true)])
        let offLoop = Record()
        for _ in 0..<400 where !b.isAsleep { usleep(1_000) }
        b.executeBorrowable { offLoop.append(b) }
        for _ in 0..<400 where offLoop.all.isEmpty { usleep(5_000) }
        #expect(offLoop.all == [Ran(thread: bThread, inB: true)])
        #expect(b.metricsSnapshot().borrowedRuns == 0)
    }

    /// A borrowed job that arms the first timer of a loop sleeping without a timeout wakes it, so the timer fires.
    @Test func timerArmedByABorrowedJobFires() throws {
        let a = try EventLoop(index: 0), b = try EventLoop(index: 1)
        defer { a.stop(); b.stop(); a.join(); b.join() }
        let (aThread, ran) = try fromLoop(a, to: b, jobs: 2) { ran in
            b.executeBorrowable {
                ran.append(b)
                b.schedule(after: .milliseconds(150)) {
                    ran.append(b)
                }
            }
        }
        let bThread = try b.submitAndWait { UInt(pthread_self()) }
        #expect(ran == [Ran(thread: aThread, inB: true), Ran(thread: bThread, inB: true)])
    }

    /// Four loops post borrowable jobs to one another from their own threads, and plain ones that wake them: a
    /// loop's jobs never run on two threads at once, every job runs once, and each runs where `inEventLoop` is
    /// true for its loop.
    @Test func loopsRunningEachOthersJobsNeverOverlap() throws {
        let loops = try (0..<4).map { try EventLoop(index: $0) }
        defer { for l in loops { l.stop() }; for l in loops { l.join() } }
        final class Busy: Sendable { let running = Atomic(0) }
        let busy = (0..<4).map { _ in Busy() }
        let overlaps = Atomic(0), offLoop = Atomic(0), ran = Atomic(0)
        let rounds = 300, perRound = 6  // each other loop twice; the last one plain
        @Sendable func job(_ target: Int) {
            if busy[target].running.add(1, ordering: .acquiringAndReleasing).newValue != 1 {
                overlaps.add(1, ordering: .relaxed)
            }
            if !loops[target].inEventLoop { offLoop.add(1, ordering: .relaxed) }
            for _ in 0..<5_000 { _ = overlaps.load(ordering: .relaxed) }  // a while, so an overlap would be seen
            ran.add(1, ordering: .relaxed)
            busy[target].running.subtract(1, ordering: .acquiringAndReleasing)
        }
        for round in 0..<rounds {
            let from = round % 4
            loops[from].execute {
                for k in 0..<perRound {
                    let target = (from + 1 + k % 3) % 4
                    if k == perRound - 1 {
                        loops[target].execute { job(target) }
                    } else {
                        loops[target].executeBorrowable { job(target) }
                    }
                }
            }
            usleep(round % 3 == 0 ? 300 : 50)  // the loops often asleep when a round's jobs are posted
        }
        let expected = rounds * perRound
        for _ in 0..<1_000 where ran.load(ordering: .relaxed) < expected { usleep(5_000) }
        #expect(ran.load(ordering: .relaxed) == expected)
        #expect(overlaps.load(ordering: .relaxed) == 0)
        #expect(offLoop.load(ordering: .relaxed) == 0)
        // The loops did run one another's jobs (about 500 of the 1 800 here), so the above was tested.
        #expect(loops.map { $0.metricsSnapshot().borrowedRuns }.reduce(0, +) > 0)
    }

    @Test func stoppedLoopRejectsWork() throws {
        let loop = try EventLoop()
        loop.stop()
        loop.join()
        #expect(throws: EngineError.self) { try loop.submitAndWait { 1 } }
    }

    @Test func wheelScheduleRescheduleCancel() {
        let second: UInt64 = 1_000_000_000
        let wheel = TimerWheel(tickNanos: second, slots: 8, nowNanos: 100 * second)
        var fired: [String] = []
        let a = wheel.schedule(afterNanos: 2 * second + second / 2) { fired.append("a") }  // due at 102.5 → tick 103
        let b = wheel.schedule(afterNanos: 1 * second) { fired.append("b") }
        let c = wheel.schedule(afterNanos: 1 * second) { fired.append("c") }
        #expect(wheel.count == 3)
        #expect(wheel.cancel(c))
        #expect(!wheel.cancel(c), "second cancel is a no-op")
        wheel.advance(toNanos: 100 * second + second - 1)
        #expect(fired.isEmpty, "never early")
        wheel.advance(toNanos: 101 * second)
        #expect(fired == ["b"])
        #expect(!wheel.isPending(b) && !wheel.cancel(b))
        wheel.advance(toNanos: 102 * second + second / 2)
        #expect(fired == ["b"])
        #expect(wheel.reschedule(a, afterNanos: 20 * second))  // more than one revolution (8 slots) away
        wheel.advance(toNanos: 110 * second)
        #expect(fired == ["b"], "a revolution later the rescheduled timer is still pending")
        wheel.advance(toNanos: 123 * second)
        #expect(fired == ["b", "a"])
        #expect(wheel.count == 0)
        #expect(wheel.nanosUntilNextTick(now: 123 * second) == nil)
    }

    @Test func wheelStaleHandleDoesNotTouchReusedEntry() {
        let wheel = TimerWheel(tickNanos: 10, slots: 4, nowNanos: 0)
        var fired = 0
        let old = wheel.schedule(afterNanos: 10) { fired += 100 }
        wheel.cancel(old)
        let new = wheel.schedule(afterNanos: 10) { fired += 1 }  // reuses old's entry
        #expect(new.index == old.index && new.generation != old.generation)
        #expect(!wheel.cancel(old))
        #expect(!wheel.reschedule(old, afterNanos: 1000))
        wheel.advance(toNanos: 10)
        #expect(fired == 1)
    }

    @Test func wheelRepeatingAndSelfCancel() {
        let wheel = TimerWheel(tickNanos: 10, slots: 16, nowNanos: 0)
        var ticks: [UInt64] = []
        var handle = TimerHandle.none
        handle = wheel.scheduleRepeating(everyNanos: 20) {
            ticks.append(wheel.currentTick)
            if ticks.count == 3 { wheel.cancel(handle) }
        }
        for t in stride(from: UInt64(0), through: 200, by: 5) { wheel.advance(toNanos: t) }
        #expect(ticks == [2, 4, 6])
        #expect(wheel.count == 0)
        // Actions scheduled from an action, and a long stall past many revolutions.
        var order: [Int] = []
        wheel.schedule(afterNanos: 10) {
            order.append(1)
            wheel.schedule(afterNanos: 10) { order.append(2) }
        }
        wheel.schedule(afterNanos: 5000) { order.append(3) }
        wheel.advance(toNanos: 1_000_000)  // a stall of many revolutions: one sweep fires all that is due
        #expect(Set(order) == [1, 3] && order.first == 1)
        wheel.advance(toNanos: 1_000_010)  // the timer scheduled during the sweep fires a tick later
        #expect(order.count == 3 && order.last == 2)
        #expect(wheel.count == 0)
    }

    /// Thousands of timers (freed entries reused, the entry array grown while actions run) with
    /// random delays, cancels and reschedules, some made by firing actions: each fires exactly once, at the tick a
    /// model computes, and the cancelled ones never.
    @Test func wheelManyTimersMatchAModel() {
        let tick: UInt64 = 10
        let wheel = TimerWheel(tickNanos: tick, slots: 64, nowNanos: 0)
        var rng = SplitMix64(seed: 0x71AE)
        final class Log { var firedAt: [Int: [UInt64]] = [:] }
        let log = Log()
        var expected: [Int: UInt64] = [:]    // timer id -> the tick it must fire at
        var handles: [Int: TimerHandle] = [:]
        var nextID = 0
        func due(_ delay: UInt64) -> UInt64 { max((wheel.nowNanos + delay + tick - 1) / tick, wheel.currentTick + 1) }
        func add(_ delay: UInt64, spawning: Bool) {
            let id = nextID
            nextID += 1
            expected[id] = due(delay)
            handles[id] = wheel.schedule(afterNanos: delay) {
                log.firedAt[id, default: []].append(wheel.currentTick)
                if spawning {
                    // An action that makes a timer: the new one is due a tick or more later.
                    let child = nextID
                    nextID += 1
                    expected[child] = due(25)
                    handles[child] = wheel.schedule(afterNanos: 25) { log.firedAt[child, default: []].append(wheel.currentTick) }
                }
            }
        }
        var now: UInt64 = 0
        for round in 0..<40 {
            for _ in 0..<150 { add(1 + rng.next() % 3000, spawning: rng.next() % 10 == 0) }
            // Cancel or move some pending ones.
            for (id, handle) in handles where log.firedAt[id] == nil && expected[id] != nil {
                switch rng.next() % 8 {
                case 0:
                    #expect(wheel.cancel(handle))
                    expected[id] = nil
                case 1:
                    let delay = 1 + rng.next() % 6000
                    let at = due(delay)
                    #expect(wheel.reschedule(handle, afterNanos: delay))
                    expected[id] = at
                default: break
                }
            }
            now += 1 + rng.next() % (round < 30 ? 300 : 2000)
            // Advance in steps short of a revolution, so every timer fires at its own tick.
            while wheel.nowNanos < now { wheel.advance(toNanos: min(now, wheel.nowNanos + 1 + rng.next() % (40 * tick))) }
        }
        wheel.advance(toNanos: now + 100_000 * tick)  // a long stall: everything left fires in one sweep
        wheel.advance(toNanos: now + 100_100 * tick)  // and the children that sweep's actions made
        #expect(wheel.count == 0)
        for (id, at) in expected {
            guard let fired = log.firedAt[id] else { Issue.record("timer \(id) never fired"); continue }
            #expect(fired.count == 1, "timer \(id) fired \(fired.count) times")
            // Those left for the final stall fire at the sweep's tick, later than due; all others exactly when due.
            #expect(fired[0] == at || (fired[0] > at && at > now / tick), "timer \(id) due at tick \(at) fired at \(fired[0])")
        }
        let cancelled = Set(handles.keys).subtracting(expected.keys)
        #expect(!cancelled.isEmpty && cancelled.allSatisfy { log.firedAt[$0] == nil })
        #expect(nextID > 6000)
    }

    @Test func realTimerFiresOnTheLoop() throws {
        let loop = try EventLoop(configuration: testLoopConfiguration(tickMillis: 10))
        defer { loop.stop(); loop.join() }
        let done = DispatchSemaphore(value: 0)
        let start = Mutex<UInt64>(0)
        let firedAt = Mutex<UInt64>(0)
        let repeats = LoopBox(0)
        loop.execute {
            start.withLock { $0 = monotonicNanos() }
            loop.schedule(after: .milliseconds(50)) {
                firedAt.withLock { $0 = monotonicNanos() }
                done.signal()
            }
            loop.scheduleRepeating(every: .milliseconds(10)) { repeats.value += 1 }
        }
        #expect(done.wait(timeout: .now() + 5) == .success)
        let elapsed = firedAt.withLock { $0 } - start.withLock { $0 }
        #expect(elapsed >= 50_000_000 && elapsed < 2_000_000_000)
        #expect(try loop.submitAndWait { repeats.value } >= 2)
    }
}

@Suite("Timer clock")
struct EngineTimerClockTests {
    @Test func deadlineAfterLongSleepCountsFromWakeUp() throws {
        let loop = try EventLoop(configuration: testLoopConfiguration(tickMillis: 10))
        defer { loop.stop(); loop.join() }
        usleep(300_000)  // the loop sleeps in epoll_wait with no timers: its cached time goes stale
        let scheduledAt = Mutex<UInt64>(0)
        let firedAt = Mutex<UInt64>(0)
        let done = DispatchSemaphore(value: 0)
        loop.execute {
            scheduledAt.withLock { $0 = monotonicNanos() }
            loop.schedule(after: .milliseconds(100)) {
                firedAt.withLock { $0 = monotonicNanos() }
                done.signal()
            }
        }
        #expect(done.wait(timeout: .now() + 5) == .success)
        let elapsed = firedAt.withLock { $0 } - scheduledAt.withLock { $0 }
        #expect(elapsed >= 100_000_000, "fired \(elapsed / 1_000_000) ms after scheduling")
    }
}
