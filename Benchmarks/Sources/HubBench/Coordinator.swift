import Foundation
import Glibc
import HubEngine

struct WorkerLine: Codable {
    var ev: String
    var snap: WorkerSnap
}

/// `reconnect-storm`: `control` of the clients stay connected; the others drop on `storm` and come back after
/// `awayMs` at `rate` reconnects/s in total (0: as fast as `--max-pending` allows).
struct StormSpec {
    var control: Int
    var awayMs: Int
    var rate: Double
}

/// A worker process and what it last said.
final class WorkerProc: @unchecked Sendable {
    let index: Int
    let process = Process()
    let input = Pipe()
    let output = Pipe()
    private let lock = NSLock()
    private var latestSnap = WorkerSnap()
    private var replies: [WorkerSnap] = []
    private let replyReady = DispatchSemaphore(value: 0)

    init(index: Int, config: WorkerConfig) throws {
        self.index = index
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        process.arguments = ["worker", encodeLine(config)]
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        let handle = output.fileHandleForReading
        let t = Thread { [self] in
            var pending = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let nl = pending.firstIndex(of: 0x0A) {
                    let line = pending[pending.startIndex..<nl]
                    pending = pending[(nl + 1)...]
                    guard let parsed = try? JSONDecoder().decode(WorkerLine.self, from: Data(line)) else { continue }
                    lock.lock()
                    latestSnap = parsed.snap
                    if parsed.ev != "progress" { replies.append(parsed.snap) }
                    lock.unlock()
                    if parsed.ev != "progress" { replyReady.signal() }
                }
            }
            replyReady.signal()
        }
        t.start()
    }

    var latest: WorkerSnap { lock.lock(); defer { lock.unlock() }; return latestSnap }

    func send(_ command: String) {
        try? input.fileHandleForWriting.write(contentsOf: Data((command + "\n").utf8))
    }

    func awaitReply(timeout: Double = 30) -> WorkerSnap? {
        _ = replyReady.wait(timeout: .now() + timeout)
        lock.lock(); defer { lock.unlock() }
        return replies.isEmpty ? nil : replies.removeFirst()
    }
}

/// Sum of worker snapshots.
struct Totals {
    var attempted = 0, open = 0, everEstablished = 0, slowOpen = 0
    var failed: [String: Int] = [:], closed: [String: Int] = [:]
    var received: UInt64 = 0, receivedSlow: UInt64 = 0, other: UInt64 = 0
    var churnAttempted = 0, churnEstablished = 0
    var rampDone = true
    var cpuSeconds = 0.0
    var latency = Histogram(), handshake = Histogram(), recovery = Histogram()
    var events: [UInt64: (UInt64, UInt64)] = [:]
    var stormDropped = 0, reconnected = 0, recovered = 0, reconnectFailed = 0
    var notRecovered: [String: Int] = [:]
    var replayed: UInt64 = 0, duplicates: UInt64 = 0, gaps: UInt64 = 0
    var notRecoveredTotal: Int { notRecovered.values.reduce(0, +) }

    init(_ snaps: [WorkerSnap]) {
        for s in snaps {
            attempted += s.attempted; open += s.open; everEstablished += s.everEstablished; slowOpen += s.slowOpen
            for (k, v) in s.failed { failed[k, default: 0] += v }
            for (k, v) in s.closed { closed[k, default: 0] += v }
            received += s.received; receivedSlow += s.receivedSlow; other += s.otherMessages
            churnAttempted += s.churnAttempted; churnEstablished += s.churnEstablished
            rampDone = rampDone && s.rampDone
            cpuSeconds += s.cpuSeconds
            if let h = s.latency { latency.merge(h) }
            if let h = s.handshake { handshake.merge(h) }
            if let h = s.recovery { recovery.merge(h) }
            stormDropped += s.stormDropped; reconnected += s.reconnected; recovered += s.recovered; reconnectFailed += s.reconnectFailed
            for (k, v) in s.notRecovered { notRecovered[k, default: 0] += v }
            replayed += s.replayed; duplicates += s.duplicates; gaps += s.gaps
            for e in s.events ?? [] where e.count == 3 {
                let old = events[e[0]] ?? (0, 0)
                events[e[0]] = (max(old.0, e[1]), old.1 + e[2])
            }
        }
    }

    var failedTotal: Int { failed.values.reduce(0, +) }
}

/// Runs one scenario against one server: spawns workers, drives the publisher, samples the server's /proc.
final class Coordinator {
    let options: Options
    let target: TargetSpec
    /// The server's processes (`--server-pid A,B`: a cluster's nodes, and its Redis): CPU and RSS are summed.
    let serverPIDs: [Int32]
    /// A cluster's Redis (`--redis-pid`): its CPU per published event, over the measured phases only.
    let redisPID: Int32?
    let scenario: String
    var workers: [WorkerProc] = []
    var result: [String: Any] = [:]
    /// The server's RSS before the last ramp (bytes).
    var rssBeforeRamp = 0
    let started = monotonicNanos()
    let selfPID = getpid()
    /// The whole run's start, for the machine's load during it (`machine` in the result).
    private var runStart = (machine: MachineSample(), server: 0.0, generator: 0.0)
    var publisherGroup: EventLoopGroup?

    init(scenario: String, options: Options) {
        self.scenario = scenario
        self.options = options
        let kind = options.string("kind", "hub")
        let ports = options.string("port", "8080").split(separator: ",").compactMap { Int($0) }
        let port = ports.first ?? 8080
        var spec = TargetSpec(name: options.string("server", kind), kind: kind, host: options.string("host", "127.0.0.1"),
                              port: port,
                              publish: options.string("publish", kind == "hub" ? "unix:./hub.sock" : "http://127.0.0.1:\(port)/publish"),
                              channel: options.string("channel", "wallet_updates"))
        if ports.count > 1 { spec.ports = ports }
        if options.flag("tls") { spec.tls = true }
        target = spec
        serverPIDs = (options.optional("server-pid") ?? "").split(separator: ",").compactMap { Int32($0) }
        redisPID = options.optional("redis-pid").flatMap { Int32($0) }
        result["scenario"] = scenario
        result["server"] = target.name
        result["kind"] = target.kind
        result["command"] = CommandLine.arguments.joined(separator: " ")
        result["loadavg"] = (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?
            .split(separator: " ").prefix(3).joined(separator: " ") ?? ""
        result["date"] = Date().formatted(.iso8601)
        runStart = (MachineSample.now(), server().cpuSeconds, generatorCPU())
    }

    /// The machine during the whole run (start to `finish`): every core's busy time, split into the server's, the
    /// generator's (this process and its workers) and everyone else's, in % of one core; and the load average at the
    /// end. "others" is what the shared machine's other tenants took from the run.
    func machineDuringRun() -> [String: Any] {
        let dt = max(seconds(since: started), 0.001)
        let busy = MachineSample.busyPercent(runStart.machine, MachineSample.now())
        let server = (self.server().cpuSeconds - runStart.server) / dt * 100
        let generator = (generatorCPU() - runStart.generator) / dt * 100
        return [
            "busy_percent": busy,
            "server_percent": r(server),
            "generator_percent": r(generator),
            "others_percent": r(max(0, busy - server - generator)),
            "cores": Int(max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN)))),
            "loadavg_end": (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?
                .split(separator: " ").prefix(3).joined(separator: " ") ?? "",
        ]
    }

    // MARK: Server and generator samples

    func server() -> ProcSample {
        var s = ProcSample()
        for pid in serverPIDs {
            let t = ProcSample.tree(pid)
            s.cpuSeconds += t.cpuSeconds
            s.rssBytes += t.rssBytes
            s.processes += t.processes
        }
        s.machine = .now()
        return s
    }
    /// Each server process's CPU seconds (with its children), in `--server-pid` order: a cluster's nodes one by one.
    func serverCPUByProcess() -> [Double] { serverPIDs.map { ProcSample.tree($0).cpuSeconds } }
    func redisCPU() -> Double { redisPID.flatMap { ProcSample.single($0)?.cpuSeconds } ?? 0 }

    func generatorCPU(_ snaps: [WorkerSnap]? = nil) -> Double {
        let own = ProcSample.single(selfPID)?.cpuSeconds ?? 0
        let w = (snaps ?? workers.map { $0.latest }).reduce(0) { $0 + $1.cpuSeconds }
        return own + w
    }

    // MARK: Workers

    /// Spawns workers for `count` connections of accounts `prefix0…`, opening `rate` per second in total.
    func spawn(count: Int, rate: Double, slowShare: Double = 0, churnRate: Double = 0, churnLifetimeMs: Int = 1000,
               trackEvents: Bool = false, prefix: String = "acc_", storm: StormSpec? = nil) {
        // The workers mint the tokens; without the secret each would fail on its own while this waited for the ramp.
        if target.usesToken { _ = TokenMint(required: true) }
        let limit = TCPListener.raiseDescriptorLimit().soft
        let perWorker = min(options.int("per-worker", 18_000), max(100, limit - 200))
        let k = max(options.int("workers", 2), (count + perWorker - 1) / perWorker)
        result["workers"] = k
        result["per_worker_limit"] = perWorker
        var start = 0
        for i in 0..<k {
            let n = count / k + (i < count % k ? 1 : 0)
            let config = WorkerConfig(index: i, source: "127.0.\(i / 250).\(2 + i % 250)", target: target, accountPrefix: prefix,
                                      accountStart: start, count: n, rate: rate / Double(k), maxPending: max(64, options.int("max-pending", 2000) / k),
                                      slowShare: slowShare, churnRate: churnRate / Double(k), churnLifetimeMs: churnLifetimeMs,
                                      trackEvents: trackEvents, handshakeTimeoutMs: options.int("handshake-timeout-ms", 15_000),
                                      storm: storm != nil, controlCount: storm.map { $0.control / k + (i < $0.control % k ? 1 : 0) } ?? 0,
                                      awayMs: storm?.awayMs ?? 0, stormRate: (storm?.rate ?? 0) / Double(k))
            do { workers.append(try WorkerProc(index: i, config: config)) } catch { fail("cannot start worker: \(error)") }
            start += n
        }
    }

    func progressTotals() -> Totals { Totals(workers.map { $0.latest }) }

    /// Waits until every worker has tried all its connections and each attempt ended; returns seconds taken
    /// and the time at which `count` connections were open (nil if never).
    func waitRamp(count: Int, rate: Double) -> (seconds: Double, reachedAt: Double?) {
        let t0 = monotonicNanos()
        let deadline = Double(count) / rate + 30
        var reached: Double? = nil
        var lastPrint = 0.0
        while true {
            usleep(50_000)
            let t = progressTotals()
            let elapsed = seconds(since: t0)
            if reached == nil && t.open >= count { reached = elapsed }
            if elapsed - lastPrint >= 1 {
                lastPrint = elapsed
                note(String(format: "  [%@ %@] ramp %.1fs: %d open, %d failed of %d attempted", scenario, target.name, elapsed, t.open, t.failedTotal, t.attempted))
            }
            if t.rampDone && t.attempted >= count { return (elapsed, reached) }
            if elapsed > deadline {
                note("  ramp did not finish in \(Int(deadline)) s")
                return (elapsed, reached)
            }
        }
    }

    func snapAll() -> [WorkerSnap] {
        for w in workers { w.send("snap") }
        return workers.compactMap { $0.awaitReply() }
    }

    func stopAll() -> [WorkerSnap] {
        for w in workers { w.send("stop") }
        let snaps = workers.compactMap { $0.awaitReply() }
        for w in workers {
            let deadline = Date().addingTimeInterval(5)
            while w.process.isRunning && Date() < deadline { usleep(20_000) }
            if w.process.isRunning { kill(w.process.processIdentifier, SIGKILL) }
        }
        return snaps
    }

    // MARK: Publisher

    func makePublisher(connections: Int = 4, window: Int = 16_384) -> PublishDriver {
        var config = EventLoop.Configuration()
        config.timerTickNanos = 1_000_000
        do {
            let group = try EventLoopGroup(loopCount: 1, configuration: config)
            publisherGroup = group
            return try PublishDriver(loop: group.loops[0], target: target, connections: connections, window: window)
        } catch {
            fail("publisher: cannot connect to \(target.publish): \(error)")
        }
    }

    /// After the last publish: waits until receivers have received nothing for 1 s, at most `max` s. What has not
    /// arrived by then counts as lost.
    func drain(max: Double = 5) {
        let t0 = monotonicNanos()
        var last = progressTotals().received
        var quietSince = monotonicNanos()
        while seconds(since: t0) < max {
            usleep(250_000)
            let now = progressTotals().received
            if now != last { last = now; quietSince = monotonicNanos() }
            if seconds(since: quietSince) >= 1 { return }
        }
    }

    /// Live line while a phase runs.
    func watch(seconds total: Double, publisher: PublishDriver?, label: String) {
        let t0 = monotonicNanos()
        var prev = progressTotals().received
        var prevT = 0.0
        while seconds(since: t0) < total {
            usleep(UInt32(min(1.0, total - seconds(since: t0)) * 1_000_000))
            let t = progressTotals()
            let now = seconds(since: t0)
            let p = publisher?.snapshot()
            let dt = max(now - prevT, 0.001)
            note(String(format: "  [%@ %@] %@ %.1fs: %d open, received %.0f/s, published %llu (acked %llu, errors %llu)",
                        scenario, target.name, label, now, t.open, Double(t.received - prev) / dt,
                        p?.sent ?? 0, p?.acked ?? 0, p?.errors ?? 0))
            prev = t.received
            prevT = now
        }
    }

    // MARK: Results

    static func summary(_ h: Histogram) -> [String: Any] { h.summary() }

    func record(failed: [String: Int], closed: [String: Int]) {
        result["failed_by_reason"] = failed
        result["closed_by_reason"] = closed
    }

    func finish() {
        publisherGroup?.shutdown()
        result["wall_seconds"] = seconds(since: started)
        result["machine"] = machineDuringRun()
        let data = try! JSONSerialization.data(withJSONObject: result, options: [.prettyPrinted, .sortedKeys])
        if let out = options.optional("out") {
            _ = FileManager.default.createFile(atPath: out, contents: data)
        }
        FileHandle.standardOutput.write(data)
        FileHandle.standardOutput.write(Data("\n".utf8))
    }
}
