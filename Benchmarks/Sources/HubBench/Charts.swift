import Foundation

/// One gnuplot chart (PNG) per scenario. The script, with its data inline, is kept next to the image
/// (`results/plot/NAME.gp`) so a chart can be redrawn or restyled by hand.
enum Charts {
    typealias Run = [String: Any]

    static func draw(scenario: String, byServer: [String: [Run]], servers: [String], dir: String) -> String? {
        let med = { (s: String, path: String) -> Double in Report.median(byServer[s]!.compactMap { Report.value($0, path) }) ?? 0 }
        var gp = "set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'\nset output '\(scenario).png'\n"
        gp += "set grid ytics\nset key below\nset style fill solid 0.8 border -1\nset format y '%g'\n"
        func bars(_ title: String, _ ylabel: String, _ rows: [(String, Double)], log: Bool = false) -> String {
            var s = "$d\(abs(title.hashValue) % 100000) << EOD\n"
            for (name, v) in rows { s += "\"\(name)\" \(v)\n" }
            s += "EOD\nset title \"\(title)\"\nset ylabel '\(ylabel)'\nset style data histograms\nset style histogram clustered\n"
            s += "set boxwidth 0.7\nset xtics nomirror rotate by -25\nset format y '%g'\n" + (log ? "set logscale y\n" : "unset logscale y\n")
            s += "set yrange [0:*]\n".replacingOccurrences(of: "0:", with: log ? "*:" : "0:")
            s += "plot $d\(abs(title.hashValue) % 100000) using 2:xtic(1) notitle lc rgb '#4477aa'\n"
            return s
        }
        func percentiles(_ title: String, _ prefix: String) -> String {
            let keys = [("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms"), ("max", "max_ms")]
            var s = "$lat << EOD\nserver " + keys.map { $0.0 }.joined(separator: " ") + "\n"
            for srv in servers { s += "\(srv) " + keys.map { String(max(med(srv, "\(prefix).\($0.1)"), 0.001)) }.joined(separator: " ") + "\n" }
            s += "EOD\nset title \"\(title)\"\nset ylabel 'ms (log scale)'\nset logscale y\nset yrange [*:*]\nset format y '%g'\n"
            s += "set style data histograms\nset style histogram clustered gap 1\nset boxwidth 0.9\nset xtics rotate by -25\n"
            s += "plot for [i=2:\(keys.count + 1)] $lat using i:xtic(1) title columnheader(i)\n"
            return s
        }
        switch scenario {
        case "connections":
            gp += "set multiplot layout 1,3\n"
            gp += bars("handshakes/s during the ramp", "per second", servers.map { ($0, med($0, "handshakes_per_second")) })
            gp += bars("RSS per connection", "KiB", servers.map { ($0, med($0, "rss_per_connection_bytes") / 1024) })
            gp += bars("server CPU per handshake", "µs", servers.map { ($0, med($0, "server_cpu_us_per_handshake")) })
            gp += "unset multiplot\n"
        case "broadcast":
            gp += "set multiplot layout 1,2\n"
            gp += percentiles("publish-to-receive latency, all deliveries", "latency")
            gp += "unset logscale y\n" + bars("server CPU per delivery", "µs", servers.map { ($0, med($0, "server_cpu_us_per_delivery")) })
            gp += "unset multiplot\n"
        case "churn":
            gp += "set multiplot layout 1,2\n"
            gp += percentiles("stable clients' latency under churn", "latency")
            gp += "unset logscale y\n" + bars("churn handshakes completed/s", "per second", servers.map { ($0, med($0, "churn_handshakes_per_second")) })
            gp += "unset multiplot\n"
        case "publish":
            gp += "set multiplot layout 1,2\n"
            gp += bars("publishes/s accepted and replied", "per second", servers.map { ($0, med($0, "publishes_per_second")) })
            gp += bars("server CPU per publish", "µs", servers.map { ($0, med($0, "server_cpu_us_per_publish")) })
            gp += "unset multiplot\n"
        case "per-account":
            gp += "set multiplot layout 1,2\n"
            for (title, path, ylabel, log) in [("p99 latency vs offered rate", "latency.p99_ms", "p99 ms (log scale)", true),
                                              ("events published/s vs offered", "publish_rate_achieved", "events/s", false)] {
                var plots: [String] = []
                for (i, s) in servers.enumerated() {
                    // The median over the repeats at each offered rate (a rate some repeat stopped before counts
                    // the repeats that reached it).
                    let points = Report.stepMedians(byServer[s] ?? [], path)
                    if points.isEmpty { continue }
                    gp += "$s\(i)\(log ? "l" : "r") << EOD\n"
                    for (rate, v) in points { gp += "\(rate) \(max(v, 0.001))\n" }
                    gp += "EOD\n"
                    plots.append("$s\(i)\(log ? "l" : "r") using 1:2 with linespoints lw 2 title '\(s)'")
                }
                gp += "set title \"\(title)\"\nset xlabel 'offered events/s'\nset ylabel '\(ylabel)'\nset style data linespoints\n"
                gp += "set logscale x\nset format x '%.0s%c'\nset format y '\(log ? "%g" : "%.0s%c")'\n"
                gp += (log ? "set logscale y\nset yrange [*:*]\n" : "unset logscale y\nset yrange [0:*]\n")
                if log { plots.append("10 with lines dt 2 lc rgb 'gray' title '10 ms'") }
                gp += "plot " + plots.joined(separator: ", ") + "\n"
            }
            gp += "unset multiplot\n"
        case "slow":
            gp += "set multiplot layout 1,2\n"
            for (title, key, ylabel, log) in [("server RSS while 10 % of subscribers do not read", "server_rss_mb", "MiB", false),
                                              ("reading subscribers' p99 per second", "p99_ms", "ms (log scale)", true)] {
                var plots: [String] = []
                for (i, s) in servers.enumerated() {
                    guard let run = byServer[s]?.first, let series = run["series"] as? [[String: Any]] else { continue }
                    gp += "$w\(i)\(key.count) << EOD\n"
                    for point in series { gp += "\(Report.value(point, "t") ?? 0) \(max(Report.value(point, key) ?? 0, 0.001))\n" }
                    gp += "EOD\n"
                    plots.append("$w\(i)\(key.count) using 1:2 with linespoints lw 2 title '\(s)'")
                }
                gp += "set title \"\(title)\"\nset xlabel 'seconds'\nset ylabel '\(ylabel)'\nset format y '%g'\n"
                gp += (log ? "set logscale y\nset yrange [*:*]\n" : "unset logscale y\nset yrange [0:*]\n")
                gp += "plot " + plots.joined(separator: ", ") + "\n"
            }
            gp += "unset multiplot\n"
        default:
            return nil
        }
        let plotDir = "\(dir)/plot"
        try? FileManager.default.createDirectory(atPath: plotDir, withIntermediateDirectories: true)
        let script = "\(plotDir)/\(scenario).gp"
        _ = FileManager.default.createFile(atPath: script, contents: Data(gp.utf8))
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["gnuplot", "plot/\(scenario).gp"]
        p.currentDirectoryURL = URL(fileURLWithPath: dir)  // the scripts name their output relative to it
        do {
            try p.run()
            p.waitUntilExit()
        } catch {
            note("report: gnuplot not available: \(error)")
            return nil
        }
        guard p.terminationStatus == 0 else { note("report: gnuplot failed on \(script)"); return nil }
        return "\(scenario).png"
    }
}
