import Foundation
import Glibc

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes on one machine (publish stamp → receive).
@inline(__always)
func monotonicNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}

func seconds(since start: UInt64) -> Double { Double(monotonicNanos() &- start) / 1e9 }

/// Writes one line to stderr (progress, diagnostics).
func note(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

func fail(_ text: String) -> Never {
    note("hubbench: \(text)")
    exit(2)
}

/// What /proc says about a process (and, for servers made of several processes like nginx, its descendants).
struct ProcSample: Codable {
    /// utime + stime, seconds.
    var cpuSeconds: Double = 0
    /// VmRSS, bytes.
    var rssBytes: Int = 0
    var processes: Int = 0
    /// The whole machine at the same moment.
    var machine = MachineSample()

    static let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))

    /// `pid` and every descendant (nginx master + workers).
    static func tree(_ pid: Int32) -> ProcSample {
        var pids = [pid]
        var parents: [Int32: [Int32]] = [:]
        if let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") {
            for e in entries {
                guard let p = Int32(e), let stat = statFields(p), stat.count > 1, let ppid = Int32(stat[1]) else { continue }
                parents[ppid, default: []].append(p)
            }
        }
        var i = 0
        while i < pids.count {
            pids.append(contentsOf: parents[pids[i]] ?? [])
            i += 1
        }
        var sample = ProcSample()
        for p in pids {
            guard let s = single(p) else { continue }
            sample.cpuSeconds += s.cpuSeconds
            sample.rssBytes += s.rssBytes
            sample.processes += 1
        }
        return sample
    }

    /// Fields of /proc/PID/stat after the `(comm)`: index 0 = state, 1 = ppid, 11 = utime, 12 = stime.
    static func statFields(_ pid: Int32) -> [Substring]? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return nil }
        return text[text.index(after: close)...].split(separator: " ")
    }

    static func single(_ pid: Int32) -> ProcSample? {
        guard let f = statFields(pid), f.count > 12, let u = Double(f[11]), let s = Double(f[12]) else { return nil }
        var sample = ProcSample(cpuSeconds: (u + s) / ticksPerSecond, rssBytes: 0, processes: 1)
        if let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) {
            for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
                let kb = line.split(separator: " ").compactMap { Int($0) }.first ?? 0
                sample.rssBytes = kb * 1024
            }
        }
        return sample
    }
}

/// Log-linear latency histogram (HDR-style): 32 sub-buckets per power of two from 1 µs, so any value is
/// reported within ~3 %. Mergeable; serialised sparsely for the worker → coordinator pipe.
struct Histogram: Codable {
    static let sub = 32
    static let minShift = 10  // 1.024 µs
    static let octaves = 34
    var counts: [UInt64]
    var total: UInt64 = 0
    var sum: Double = 0
    var max: UInt64 = 0

    init() { counts = Array(repeating: 0, count: Self.octaves * Self.sub + 1) }

    @inline(__always)
    static func bucket(_ v: UInt64) -> Int {
        if v < (1 << minShift) { return 0 }
        let octave = 63 - v.leadingZeroBitCount
        let fraction = Int((v >> UInt64(octave - 5)) & 31)
        return Swift.min(1 + (octave - minShift) * sub + fraction, octaves * sub)
    }

    static func upper(_ i: Int) -> UInt64 {
        if i == 0 { return 1 << minShift }
        let octave = (i - 1) / sub + minShift
        let fraction = UInt64((i - 1) % sub)
        let base = UInt64(1) << UInt64(octave)
        return base + (base / UInt64(sub)) * (fraction + 1)
    }

    @inline(__always)
    mutating func record(_ v: UInt64) {
        counts[Self.bucket(v)] &+= 1
        total &+= 1
        sum += Double(v)
        if v > max { max = v }
    }

    mutating func merge(_ o: Histogram) {
        for i in o.counts.indices where o.counts[i] != 0 { counts[i] &+= o.counts[i] }
        total &+= o.total
        sum += o.sum
        max = Swift.max(max, o.max)
    }

    mutating func reset() { self = Histogram() }

    func quantile(_ q: Double) -> UInt64 {
        guard total > 0 else { return 0 }
        let rank = Swift.max(UInt64((q * Double(total)).rounded(.up)), 1)
        var seen: UInt64 = 0
        for (i, c) in counts.enumerated() {
            seen &+= c
            if seen >= rank { return Swift.min(Self.upper(i), max) }
        }
        return max
    }

    /// Milliseconds summary.
    func summary() -> [String: Double] {
        func ms(_ v: UInt64) -> Double { (Double(v) / 1e6 * 1000).rounded() / 1000 }
        return ["count": Double(total), "mean_ms": total == 0 ? 0 : ((sum / Double(total)) / 1e6 * 1000).rounded() / 1000,
                "p50_ms": ms(quantile(0.5)), "p90_ms": ms(quantile(0.9)), "p99_ms": ms(quantile(0.99)),
                "p999_ms": ms(quantile(0.999)), "max_ms": ms(max)]
    }

    // Sparse form: [[index, count], ...].
    enum CodingKeys: String, CodingKey { case b, total, sum, max }
    init(from decoder: Decoder) throws {
        self.init()
        let c = try decoder.container(keyedBy: CodingKeys.self)
        for pair in try c.decode([[UInt64]].self, forKey: .b) where pair.count == 2 { counts[Int(pair[0])] = pair[1] }
        total = try c.decode(UInt64.self, forKey: .total)
        sum = try c.decode(Double.self, forKey: .sum)
        max = try c.decode(UInt64.self, forKey: .max)
    }
    func encode(to encoder: Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        var pairs: [[UInt64]] = []
        for (i, n) in counts.enumerated() where n != 0 { pairs.append([UInt64(i), n]) }
        try c.encode(pairs, forKey: .b)
        try c.encode(total, forKey: .total)
        try c.encode(sum, forKey: .sum)
        try c.encode(max, forKey: .max)
    }
}

/// `--name value` / `--name=value` / `--flag` options.
struct Options {
    var values: [String: String] = [:]
    var positional: [String] = []

    init(_ args: [String]) {
        var i = 0
        while i < args.count {
            let a = args[i]
            if a.hasPrefix("--") {
                let body = String(a.dropFirst(2))
                if let eq = body.firstIndex(of: "=") {
                    values[String(body[..<eq])] = String(body[body.index(after: eq)...])
                } else if i + 1 < args.count && !args[i + 1].hasPrefix("--") {
                    values[body] = args[i + 1]
                    i += 1
                } else {
                    values[body] = "true"
                }
            } else {
                positional.append(a)
            }
            i += 1
        }
    }

    func string(_ k: String, _ d: String) -> String { values[k] ?? d }
    func optional(_ k: String) -> String? { values[k] }
    func int(_ k: String, _ d: Int) -> Int {
        guard let v = values[k] else { return d }
        guard let n = Int(v.replacingOccurrences(of: "_", with: "").replacingOccurrences(of: "k", with: "000")) else { fail("--\(k): not an integer: \(v)") }
        return n
    }
    func double(_ k: String, _ d: Double) -> Double {
        guard let v = values[k] else { return d }
        guard let d = Double(v.replacingOccurrences(of: "/s", with: "").replacingOccurrences(of: "ms", with: "").replacingOccurrences(of: "k", with: "000")) else { fail("--\(k): not a number: \(v)") }
        return d
    }
    func flag(_ k: String) -> Bool { values[k] == "true" }
}

let jsonEncoder: JSONEncoder = {
    let e = JSONEncoder()
    e.outputFormatting = [.sortedKeys]
    return e
}()

func encodeLine<T: Encodable>(_ value: T) -> String {
    String(decoding: try! jsonEncoder.encode(value), as: UTF8.self)
}


/// Whole-machine CPU from /proc/stat: busy and total jiffies (to show how much of the box was in use).
struct MachineSample: Codable {
    var busy: Double = 0
    var total: Double = 0

    static func now() -> MachineSample {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
              let line = text.split(separator: "\n").first else { return MachineSample() }
        let v = line.split(separator: " ").dropFirst().compactMap { Double($0) }
        guard v.count >= 5 else { return MachineSample() }
        let total = v.prefix(8).reduce(0, +)
        return MachineSample(busy: total - v[3] - v[4], total: total)
    }

    /// Busy share of all cores between two samples, in percent of one core (200 = both cores of two).
    static func busyPercent(_ a: MachineSample, _ b: MachineSample) -> Double {
        let cores = Double(max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        guard b.total > a.total else { return 0 }
        return ((b.busy - a.busy) / (b.total - a.total) * cores * 1000).rounded() / 10
    }
}
