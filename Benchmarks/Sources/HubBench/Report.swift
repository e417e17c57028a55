import Foundation

/// `hubbench report --results RAWDIR --charts DIR --out RESULTS.md`: one table per scenario with every server side
/// by side (medians over repeats), the ratio hub/peer per metric, and a gnuplot chart per scenario.
enum Report {
    typealias Run = [String: Any]

    struct Metric {
        let label: String
        let path: String
        /// "higher", "lower" or "" (informational).
        let better: String
        var scale: Double = 1
    }

    static let serverOrder = ["hub", "uws", "socketify", "nchan", "hummingbird", "python"]

    static let scenarios: [(name: String, title: String, what: String, metrics: [Metric])] = [
        ("connections", "1. connections: ramp to N idle subscribed connections",
         "N clients open at a bounded rate (each authenticated with its own JWT and subscribed), then stay idle; RSS from /proc/PID/status (VmRSS) before and after the ramp.",
         [Metric(label: "target connections", path: "target_connections", better: ""),
          Metric(label: "attempted", path: "attempted", better: ""),
          Metric(label: "established", path: "established", better: "higher"),
          Metric(label: "failed", path: "failed", better: "lower"),
          Metric(label: "handshakes/s (ramp, paced)", path: "handshakes_per_second", better: "higher"),
          Metric(label: "time to reach N (s)", path: "time_to_n_seconds", better: "lower"),
          Metric(label: "handshake p50 (ms)", path: "handshake_latency.p50_ms", better: "lower"),
          Metric(label: "handshake p99 (ms)", path: "handshake_latency.p99_ms", better: "lower"),
          Metric(label: "server RSS before (MiB)", path: "server_rss_before_mb", better: ""),
          Metric(label: "server RSS with N open (MiB)", path: "server_rss_after_ramp_mb", better: "lower"),
          Metric(label: "RSS per connection (KiB)", path: "rss_per_connection_bytes", better: "lower", scale: 1.0 / 1024),
          Metric(label: "RSS per idle connection, after the hold (KiB)", path: "rss_per_idle_connection_bytes", better: "lower", scale: 1.0 / 1024),
          Metric(label: "server CPU per handshake (µs)", path: "server_cpu_us_per_handshake", better: "lower"),
          Metric(label: "server CPU while idle (% of a core)", path: "server_cpu_idle_percent", better: "lower"),
          Metric(label: "generator CPU during ramp (s)", path: "generator_cpu_ramp_seconds", better: "")]),
        ("broadcast", "2. broadcast: one channel, N subscribers, one event every T ms",
         "Every event goes to all N subscribers; latency is publish (CLOCK_MONOTONIC stamp in the event) to receive, over every delivery; \"last subscriber\" is per event the time until the last subscriber had it.",
         [Metric(label: "subscribers", path: "recipients", better: ""),
          Metric(label: "events published (replied)", path: "published", better: ""),
          Metric(label: "events not sent in time (publisher waiting on the server)", path: "publish_skipped", better: "lower"),
          Metric(label: "deliveries expected", path: "expected_deliveries", better: ""),
          Metric(label: "deliveries missing (not received within 5 s after the last publish)", path: "lost", better: "lower"),
          Metric(label: "deliveries/s", path: "deliveries_per_second", better: "higher"),
          Metric(label: "server CPU per delivery (µs)", path: "server_cpu_us_per_delivery", better: "lower"),
          Metric(label: "server CPU (% of a core)", path: "server_cpu_percent", better: "lower"),
          Metric(label: "latency p50 (ms)", path: "latency.p50_ms", better: "lower"),
          Metric(label: "latency p90 (ms)", path: "latency.p90_ms", better: "lower"),
          Metric(label: "latency p99 (ms)", path: "latency.p99_ms", better: "lower"),
          Metric(label: "latency p99.9 (ms)", path: "latency.p999_ms", better: "lower"),
          Metric(label: "latency max (ms)", path: "latency.max_ms", better: "lower"),
          Metric(label: "last subscriber p50 (ms)", path: "last_subscriber_latency.p50_ms", better: "lower"),
          Metric(label: "last subscriber p99 (ms)", path: "last_subscriber_latency.p99_ms", better: "lower"),
          Metric(label: "server RSS (MiB)", path: "server_rss_end_mb", better: "lower"),
          Metric(label: "generator CPU (% of a core)", path: "generator_cpu_percent", better: ""),
          Metric(label: "machine CPU busy (% of a core, all processes)", path: "machine_cpu_percent", better: "")]),
        ("per-account", "3. per-account: N accounts with one connection each, events to random accounts at rising rates",
         "Each step runs a few seconds at the offered rate; the best rate is the highest step with p99 < 10 ms that was published and delivered at ≥ 90 % of the offered rate.",
         [Metric(label: "accounts (connections)", path: "recipients", better: ""),
          Metric(label: "best rate with p99 < 10 ms (events/s)", path: "best_rate_p99_under_10ms", better: "higher"),
          Metric(label: "events published (all steps)", path: "published", better: ""),
          Metric(label: "deliveries missing, all steps (≤ 5 s after the last publish)", path: "lost", better: "lower")]),
        ("churn", "4. churn: clients connecting and disconnecting while events flow",
         "N stable clients receive per-account events at a fixed rate while extra clients connect (JWT, subscribe) and leave after a short lifetime; latency is the stable clients'.",
         [Metric(label: "churn connects offered (/s)", path: "churn_rate_offered", better: ""),
          Metric(label: "churn handshakes completed (/s)", path: "churn_handshakes_per_second", better: "higher"),
          Metric(label: "connection failures", path: "failed", better: "lower"),
          Metric(label: "events published", path: "published", better: ""),
          Metric(label: "events not sent in time", path: "publish_skipped", better: "lower"),
          Metric(label: "deliveries missing (not received within 5 s after the last publish)", path: "lost", better: "lower"),
          Metric(label: "deliveries/s", path: "deliveries_per_second", better: "higher"),
          Metric(label: "stable clients' latency p50 (ms)", path: "latency.p50_ms", better: "lower"),
          Metric(label: "stable clients' latency p99 (ms)", path: "latency.p99_ms", better: "lower"),
          Metric(label: "stable clients' latency p99.9 (ms)", path: "latency.p999_ms", better: "lower"),
          Metric(label: "stable clients' latency max (ms)", path: "latency.max_ms", better: "lower"),
          Metric(label: "handshake p99 (ms)", path: "handshake_latency.p99_ms", better: "lower"),
          Metric(label: "server CPU (% of a core)", path: "server_cpu_percent", better: "lower"),
          Metric(label: "server CPU per delivery (µs, incl. churn)", path: "server_cpu_us_per_delivery", better: "lower"),
          Metric(label: "generator CPU (% of a core)", path: "generator_cpu_percent", better: "")]),
        ("slow", "5. slow: a share of subscribers stops reading",
         "Broadcasts with a padded payload; 10 % of the subscribers stop reading (receive buffer 4 KiB) right after subscribing. The hub closes a subscriber with 4008 once 1 MiB is queued for it; the peers may buffer without bound.",
         [Metric(label: "subscribers (reading)", path: "recipients", better: ""),
          Metric(label: "slow subscribers", path: "slow_at_start", better: ""),
          Metric(label: "slow ones closed by the server", path: "slow_closed", better: ""),
          Metric(label: "hub: slowConsumerCloses (admin stats)", path: "hub_slow_consumer_closes", better: ""),
          Metric(label: "event payload (bytes)", path: "payload_bytes", better: ""),
          Metric(label: "server RSS before (MiB)", path: "server_rss_after_ramp_mb", better: ""),
          Metric(label: "server RSS max (MiB)", path: "server_rss_max_mb", better: "lower"),
          Metric(label: "server RSS at end (MiB)", path: "server_rss_end_mb", better: "lower"),
          Metric(label: "others' p99, first 3 s (ms)", path: "others_latency_first_3s.p99_ms", better: "lower"),
          Metric(label: "others' p99, last 5 s (ms)", path: "others_latency_last_5s.p99_ms", better: "lower"),
          Metric(label: "others' latency max (ms)", path: "latency.max_ms", better: "lower"),
          Metric(label: "events not sent in time", path: "publish_skipped", better: "lower"),
          Metric(label: "deliveries missing, reading subscribers (≤ 5 s after the last publish)", path: "lost", better: "lower"),
          Metric(label: "deliveries/s", path: "deliveries_per_second", better: "higher"),
          Metric(label: "server CPU per delivery (µs)", path: "server_cpu_us_per_delivery", better: "lower"),
          Metric(label: "generator CPU (% of a core)", path: "generator_cpu_percent", better: "")]),
        ("publish", "6. publish: the publish intake alone",
         "One publisher pipelines small account events as fast as the server replies (hub: one Unix-socket connection, up to 16 384 lines in flight; HTTP peers: 4 connections, NDJSON batches of up to 2 000 lines; nchan: one request per event, 64 pipelined per connection on 4 connections). Half the accounts have one subscriber, half none.",
         [Metric(label: "publishes/s (replied)", path: "publishes_per_second", better: "higher"),
          Metric(label: "server CPU per publish (µs)", path: "server_cpu_us_per_publish", better: "lower"),
          Metric(label: "server CPU (% of a core)", path: "server_cpu_percent", better: ""),
          Metric(label: "publish errors", path: "publish_errors", better: "lower"),
          Metric(label: "deliveries missing (not received within 5 s after the last publish)", path: "lost", better: "lower"),
          Metric(label: "generator CPU (% of a core)", path: "generator_cpu_percent", better: ""),
          Metric(label: "machine CPU busy (% of a core)", path: "machine_cpu_percent", better: "")]),
    ]

    static func value(_ run: Run, _ path: String) -> Double? {
        if path == "loadavg1" { return (run["loadavg"] as? String)?.split(separator: " ").first.flatMap { Double($0) } }
        var cur: Any? = run
        for key in path.split(separator: ".") { cur = (cur as? [String: Any])?[String(key)] }
        if let n = cur as? NSNumber { return n.doubleValue }
        return nil
    }

    static func median(_ xs: [Double]) -> Double? {
        guard !xs.isEmpty else { return nil }
        let s = xs.sorted()
        return s.count % 2 == 1 ? s[s.count / 2] : (s[s.count / 2 - 1] + s[s.count / 2]) / 2
    }

    static func fmt(_ v: Double?) -> String {
        guard let v else { return "–" }
        if v == v.rounded() && abs(v) < 1e12 { return Int(v).formatted() }
        if abs(v) >= 100 { return Int(v.rounded()).formatted() }
        if abs(v) >= 10 { return String(format: "%.1f", v) }
        return String(format: "%.2f", v)
    }

    static func ratio(_ hub: Double?, _ peer: Double?) -> String {
        guard let hub, let peer, peer != 0 else { return "–" }
        let r = hub / peer
        return r >= 10 ? String(format: "%.0f", r) : String(format: "%.2f", r)
    }

    static func run(_ options: Options) -> Never {
        let dir = options.string("results", "Benchmarks/results/raw")
        let chartsDir = options.string("charts", "Benchmarks/results")
        let out = options.string("out", "Benchmarks/RESULTS.md")
        let fm = FileManager.default
        let files = ((try? fm.contentsOfDirectory(atPath: dir)) ?? []).sorted()
        var runs: [String: [String: [Run]]] = [:]
        for f in files where f.hasSuffix(".json") {
            guard let data = fm.contents(atPath: "\(dir)/\(f)"),
                  let run = (try? JSONSerialization.jsonObject(with: data)) as? Run,
                  let scenario = run["scenario"] as? String, let server = run["server"] as? String else { continue }
            runs[scenario, default: [:]][server, default: []].append(run)
        }
        var machine: [String: String] = [:]
        if let text = try? String(contentsOfFile: "\(dir)/machine.env", encoding: .utf8) {
            for line in text.split(separator: "\n") {
                guard let eq = line.firstIndex(of: "=") else { continue }
                machine[String(line[..<eq])] = String(line[line.index(after: eq)...])
            }
        }
        let commands = (try? String(contentsOfFile: "\(dir)/commands.txt", encoding: .utf8)) ?? ""
        var skipped: [String] = []
        for f in files where f.hasPrefix("skipped-") {
            if let t = try? String(contentsOfFile: "\(dir)/\(f)", encoding: .utf8) { skipped.append(t.trimmingCharacters(in: .whitespacesAndNewlines)) }
        }
        let relCharts = relativePath(from: (out as NSString).deletingLastPathComponent, to: chartsDir)

        var md = "# Benchmark results\n\n"
        md += "Generated by `Benchmarks/run` (`hubbench report`); do not edit by hand. How the suite works: `Benchmarks/README.md`.\n\n"
        md += "## Machine and run\n\n| | |\n|---|---|\n"
        for key in ["date", "mode", "command", "nproc", "cpu", "memory", "kernel", "nofile", "loadavg_start", "loadavg_end", "suite_seconds", "git"] {
            if let v = machine[key] { md += "| \(key) | `\(v)` |\n" }
        }
        md += "\nThe machine is shared (2 cores, other engineers' builds and tests run beside the suite): read every number "
        md += "with the load average above and the per-run `loadavg` in the raw JSON. Each server runs alone, started fresh for "
        md += "each scenario, with the same load generator and the same parameters. CPU is in % of one core (200 % = both "
        md += "cores); \"generator CPU\" is hubbench's own (coordinator, publisher and workers): when it is near the server's "
        md += "the load generator, not the server, may be the limit. Below each table, **machine during the run** is every "
        md += "core's busy time over the whole run (server, generator and everyone else: the shared machine's other "
        md += "tenants), and **generator check** says whether the run could have been limited by the load generator: "
        md += "when the machine was not saturated (busy < 90 % of all cores) the generator had CPU to spare; when it was, "
        md += "a run where other processes took ≥ 25 % of a core, or the generator used more CPU than the server, is "
        md += "flagged ⚠.\n\n"
        let repeats = runs.values.flatMap { $0.values.map { $0.count } }.max() ?? 1
        if repeats > 1 {
            md += "Each cell is the **median of \(repeats) runs** (ratios are of the medians; failure and close reasons are the "
            md += "last run's; the per-account chart plots the median at each offered rate, the slow chart the first run's "
            md += "curves, the bar charts the medians).\n\n"
        }
        if !skipped.isEmpty {
            md += "**Skipped:**\n\n" + Set(skipped).sorted().map { "- \($0)" }.joined(separator: "\n") + "\n\n"
        }
        md += "Exact commands (one line per run; `$TMP` is the run's temp dir):\n\n```\n\(commands)```\n\n"

        for scenario in scenarios {
            guard let byServer = runs[scenario.name] else { continue }
            let servers = serverOrder.filter { byServer[$0] != nil } + byServer.keys.filter { !serverOrder.contains($0) }.sorted()
            let peers = servers.filter { $0 != "hub" }
            md += "## \(scenario.title)\n\n\(scenario.what)\n\n"
            if let params = byServer.values.first?.first?["command"] as? String {
                md += "Parameters: `\(parameters(params))`\n\n"
            }
            md += "| metric | " + servers.joined(separator: " | ")
            if servers.contains("hub") { md += peers.map { " | hub/\($0)" }.joined() }
            md += " |\n|---|" + String(repeating: "---:|", count: servers.count + (servers.contains("hub") ? peers.count : 0)) + "\n"
            for m in scenario.metrics {
                var values: [String: Double] = [:]
                for s in servers {
                    if let v = median(byServer[s]!.compactMap { value($0, m.path) }) { values[s] = v * m.scale }
                }
                if values.isEmpty { continue }
                md += "| \(m.label)\(m.better == "higher" ? " ↑" : m.better == "lower" ? " ↓" : "") | "
                md += servers.map { fmt(values[$0]) }.joined(separator: " | ")
                if servers.contains("hub") { md += peers.map { " | " + ratio(values["hub"], values[$0]) }.joined() }
                md += " |\n"
            }
            let blanks = servers.contains("hub") ? String(repeating: " | ", count: peers.count) : ""
            var loads: [String: Double] = [:]
            for srv in servers { if let v = median(byServer[srv]!.compactMap { value($0, "loadavg1") }) { loads[srv] = v } }
            if !loads.isEmpty {
                md += "| load average (1 min) when the run started | " + servers.map { fmt(loads[$0]) }.joined(separator: " | ")
                md += blanks + " |\n"
            }
            if servers.contains(where: { s in byServer[s]!.contains { $0["machine"] != nil } }) {
                md += "| machine during the run: busy / server / generator / others (% of a core) | "
                md += servers.map { s -> String in
                    let m = { (key: String) in machineMedian(byServer[s]!, key) }
                    guard let busy = m("busy_percent") else { return "–" }
                    return "\(fmt(busy)) / \(fmt(m("server_percent"))) / \(fmt(m("generator_percent"))) / \(fmt(m("others_percent")))"
                }.joined(separator: " | ") + blanks + " |\n"
                md += "| generator check | " + servers.map { generatorCheck(byServer[$0]!) }.joined(separator: " | ") + blanks + " |\n"
            }
            // Reasons, as text.
            for (key, label) in [("failed_by_reason", "failures by reason"), ("closed_by_reason", "established connections closed, by reason")] {
                let cells = servers.map { s -> String in
                    let d = (byServer[s]!.last?[key] as? [String: Any]) ?? [:]
                    return d.isEmpty ? "none" : d.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
                }
                if cells.contains(where: { $0 != "none" }) {
                    md += "| \(label) | " + cells.joined(separator: " | ") + (servers.contains("hub") ? String(repeating: " | ", count: peers.count) : "") + " |\n"
                }
            }
            md += "\n"
            if scenario.name == "per-account" { md += perAccountTable(byServer, servers) }
            if let chart = Charts.draw(scenario: scenario.name, byServer: byServer, servers: servers, dir: chartsDir) {
                md += "![\(scenario.name)](\(relCharts)/\(chart))\n\n"
            }
        }
        md += "## Raw data\n\nOne JSON file per run in `\(relativePath(from: (out as NSString).deletingLastPathComponent, to: dir))/`"
        md += " (every counter, histogram summaries, the server's and the generator's CPU, per-step and per-second series).\n"
        _ = fm.createFile(atPath: out, contents: Data(md.utf8))
        note("report: wrote \(out)")
        exit(0)
    }

    /// The median of `path` over the repeats at each offered rate of the per-account steps, by rate.
    static func stepMedians(_ runs: [Run], _ path: String) -> [(rate: Double, value: Double)] {
        var byRate: [Double: [Double]] = [:]
        for run in runs {
            for step in (run["steps"] as? [[String: Any]]) ?? [] {
                guard let rate = value(step, "rate_offered"), let v = value(step, path) else { continue }
                byRate[rate, default: []].append(v)
            }
        }
        return byRate.keys.sorted().compactMap { rate in median(byRate[rate]!).map { (rate, $0) } }
    }

    /// The median over the repeats of one of the `machine` numbers (`busy_percent`, `server_percent`, …).
    static func machineMedian(_ runs: [Run], _ key: String) -> Double? {
        median(runs.compactMap { value($0, "machine." + key) })
    }

    /// Whether the load generator could have been the limit of these runs (medians over the repeats).
    static func generatorCheck(_ runs: [Run]) -> String {
        let m = { (key: String) in machineMedian(runs, key) }
        guard let busy = m("busy_percent"), let generator = m("generator_percent"), let server = m("server_percent") else { return "–" }
        let capacity = (m("cores") ?? 1) * 100
        if busy < 0.9 * capacity { return "ok: machine not saturated (\(fmt(busy)) of \(fmt(capacity)) %)" }
        if let others = m("others_percent"), others >= 25 {
            return "⚠ machine saturated, \(fmt(others)) % taken by other processes: a contended run"
        }
        if generator >= server { return "⚠ machine saturated and generator ≥ server: may be generator-bound" }
        return "ok: machine saturated, server \(fmt(server)) % > generator \(fmt(generator)) %"
    }

    static func perAccountTable(_ byServer: [String: [Run]], _ servers: [String]) -> String {
        var rates: [Double] = []
        for s in servers {
            for run in byServer[s]! {
                for step in (run["steps"] as? [[String: Any]]) ?? [] {
                    if let r = (step["rate_offered"] as? NSNumber)?.doubleValue, !rates.contains(r) { rates.append(r) }
                }
            }
        }
        rates.sort()
        var md = "Latency curve (p50 / p99 ms; published/s; server CPU µs per delivery; generator CPU %):\n\n"
        md += "| offered events/s | " + servers.joined(separator: " | ") + " |\n|---:|" + String(repeating: "---|", count: servers.count) + "\n"
        for rate in rates {
            md += "| \(fmt(rate)) | "
            md += servers.map { s -> String in
                let steps = byServer[s]!.compactMap { run in
                    ((run["steps"] as? [[String: Any]]) ?? []).first { ($0["rate_offered"] as? NSNumber)?.doubleValue == rate }
                }
                if steps.isEmpty { return "(stopped)" }
                let p50 = median(steps.compactMap { value($0, "latency.p50_ms") })
                let p99 = median(steps.compactMap { value($0, "latency.p99_ms") })
                let ach = median(steps.compactMap { value($0, "publish_rate_achieved") })
                let cpu = median(steps.compactMap { value($0, "server_cpu_us_per_delivery") })
                let gen = median(steps.compactMap { value($0, "generator_cpu_percent") })
                return "\(fmt(p50)) / **\(fmt(p99))**; \(fmt(ach))/s; \(fmt(cpu)) µs; gen \(fmt(gen)) %"
            }.joined(separator: " | ")
            md += " |\n"
        }
        return md + "\n"
    }

    static func parameters(_ command: String) -> String {
        let parts = command.split(separator: " ").map(String.init)
        var keep: [String] = []
        var i = 0
        let drop: Set<String> = ["--server", "--kind", "--port", "--publish", "--server-pid", "--out", "--admin-socket", "--load-before"]
        while i < parts.count {
            if drop.contains(parts[i]) { i += 2; continue }
            if i > 0 { keep.append(parts[i]) }
            i += 1
        }
        return "hubbench " + keep.joined(separator: " ")
    }

    static func relativePath(from base: String, to path: String) -> String {
        let b = URL(fileURLWithPath: base).standardizedFileURL.pathComponents
        let p = URL(fileURLWithPath: path).standardizedFileURL.pathComponents
        var i = 0
        while i < b.count && i < p.count && b[i] == p[i] { i += 1 }
        let up = Array(repeating: "..", count: b.count - i)
        let rel = (up + p[i...]).joined(separator: "/")
        return rel.isEmpty ? "." : rel
    }
}
