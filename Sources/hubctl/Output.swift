import Foundation
import Hub
#if canImport(Glibc)
import Glibc
#endif

/// ANSI styling, a no-op unless colour is enabled (stdout is a TTY, `NO_COLOR` unset, no `--no-color`).
struct Style {
    let color: Bool

    static func detect(noColorFlag: Bool) -> Style {
        let noColorEnv = ProcessInfo.processInfo.environment["NO_COLOR"].map { !$0.isEmpty } ?? false
        return Style(color: !noColorFlag && !noColorEnv && isatty(STDOUT_FILENO) == 1)
    }

    private func wrap(_ code: String, _ text: String) -> String {
        color ? "\u{1B}[\(code)m\(text)\u{1B}[0m" : text
    }
    func bold(_ text: String) -> String { wrap("1", text) }
    func dim(_ text: String) -> String { wrap("2", text) }
    func red(_ text: String) -> String { wrap("31", text) }
    func green(_ text: String) -> String { wrap("32", text) }
    func yellow(_ text: String) -> String { wrap("33", text) }
}

enum Align { case left, right }

/// An aligned text table: columns padded to their widest cell, numbers right-aligned, two spaces between
/// columns, no trailing spaces.
struct Table {
    var headers: [String]
    var align: [Align]
    var rows: [[String]] = []

    init(_ columns: [(String, Align)]) {
        headers = columns.map(\.0)
        align = columns.map(\.1)
    }

    mutating func add(_ row: [String]) { rows.append(row) }

    func render(_ style: Style, indent: String = "") -> [String] {
        var widths = headers.map(\.count)
        for row in rows {
            for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], cell.count) }
        }
        func line(_ cells: [String], header: Bool) -> String {
            var parts: [String] = []
            for (i, cell) in cells.enumerated() where i < widths.count {
                let pad = String(repeating: " ", count: widths[i] - cell.count)
                let isLast = i == widths.count - 1
                let text = header ? style.bold(cell) : cell
                parts.append(align[i] == .right ? pad + text : (isLast ? text : text + pad))
            }
            return indent + parts.joined(separator: "  ")
        }
        return [line(headers, header: true)] + rows.map { line($0, header: false) }
    }
}

/// Key/value lines with the keys padded to one width.
func keyValueLines(_ pairs: [(String, String)], style: Style) -> [String] {
    let width = pairs.map(\.0.count).max() ?? 0
    return pairs.map { key, value in
        style.bold(key) + String(repeating: " ", count: width - key.count) + "  " + value
    }
}

enum Units {
    /// 999, 1.2k, 34k, 1.2M, 3.4G.
    static func count(_ value: Int?) -> String {
        guard let value else { return "-" }
        let magnitude = Double(abs(value))
        let sign = value < 0 ? "-" : ""
        if magnitude < 1000 { return String(value) }
        for (limit, suffix) in [(1e6, "k"), (1e9, "M"), (1e12, "G"), (Double.infinity, "T")] {
            let scaled = magnitude / (limit / 1000)
            if scaled < 999.95 || limit == .infinity {
                return sign + String(format: scaled < 99.95 ? "%.1f" : "%.0f", scaled) + suffix
            }
        }
        return String(value)
    }

    /// A rate: 0, 0.5, 12, 1.2k (per second, without the unit).
    static func rate(_ value: Double?) -> String {
        guard let value, value.isFinite, abs(value) < 9e18 else { return "-" }
        if value == 0 { return "0" }
        if value < 10 { return String(format: "%.1f", value) }
        if value < 1000 { return String(format: "%.0f", value) }
        return count(Int(value.rounded()))
    }

    /// 512 B, 3.4 KiB, 12 MiB, 1.2 GiB.
    static func bytes(_ value: Int?) -> String {
        guard let value else { return "-" }
        if value < 1024 { return "\(value) B" }
        var scaled = Double(value)
        for unit in ["KiB", "MiB", "GiB", "TiB"] {
            scaled /= 1024
            if scaled < 1023.95 || unit == "TiB" {
                return (scaled < 99.95 ? String(format: "%.1f", scaled) : String(format: "%.0f", scaled)) + " " + unit
            }
        }
        return "\(value) B"
    }

    static func byteRate(_ value: Double?) -> String {
        guard let value, value.isFinite, abs(value) < 9e18 else { return "-" }
        return bytes(Int(value.rounded())) + "/s"
    }

    /// 45s, 5m, 2h13m, 3d4h.
    static func duration(_ seconds: Double?) -> String {
        guard let seconds, seconds.isFinite, abs(seconds) < 1e15 else { return "-" }
        let s = max(0, Int(seconds))
        if s < 60 { return "\(s)s" }
        if s < 3600 { return "\(s / 60)m" }
        if s < 86400 { return "\(s / 3600)h\(s % 3600 / 60)m" }
        return "\(s / 86400)d\(s % 86400 / 3600)h"
    }

    /// "5m ago", "now", or "never" for a missing time.
    static func ago(_ time: Double?, now: Double) -> String {
        guard let time else { return "never" }
        let elapsed = now - time
        if elapsed < 1 { return "now" }
        return duration(elapsed) + " ago"
    }

    static func percent(_ fraction: Double?) -> String {
        guard let fraction, fraction.isFinite else { return "-" }
        return String(format: "%.0f%%", fraction * 100)
    }

    /// Local wall-clock time with milliseconds: 22:13:05.123.
    static func clock(_ time: Double?) -> String {
        guard let time, time.isFinite, abs(time) < 1e12 else { return "-" }
        var seconds = time_t(time)
        var parts = tm()
        localtime_r(&seconds, &parts)
        let millis = Int((time - Double(seconds)) * 1000)
        return String(format: "%02d:%02d:%02d.%03d", parts.tm_hour, parts.tm_min, parts.tm_sec, max(0, millis))
    }
}

/// One message (possibly several lines) to stderr, control characters other than the line breaks made visible.
/// Through the shared `StandardStream` writer: a closed or reader-less stderr loses the message, never the exit code.
func writeStderr(_ text: String) {
    let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map { TerminalText.escape(String($0)) }
    StandardStream.error.writeLine(lines.joined(separator: "\n"))
}

/// Prints a reply line as received (JSON is UTF-8) followed by a newline.
func writeStdout(bytes: [UInt8]) {
    print(String(decoding: bytes, as: UTF8.self))
}

/// Flushes stdout (all C streams: the C globals are not reachable from strict-concurrency Swift).
func flushOutput() {
    fflush(nil)
}

func now() -> Double { Date().timeIntervalSince1970 }

/// Cluster mode: the other nodes' replies a hub appended to its own (`"cluster":{"nodes":[…],"missing":[…]}`), each
/// rendered by `render` under a heading; nothing for a single hub.
func otherNodesLines(_ reply: JSON, style: Style, render: (JSON) -> [String]) -> [String] {
    let cluster = reply["cluster"]
    guard cluster.object != nil else { return [] }
    var lines: [String] = []
    for node in cluster["nodes"].array ?? [] {
        lines.append("")
        lines.append(style.bold("node \(node["node"].text ?? "?")"))
        let answer = node["reply"]
        if answer["ok"].bool == true {
            lines += render(answer)
        } else {
            lines.append("(no answer: \(answer["error"]["message"].text ?? "not valid JSON"))")
        }
    }
    let missing = (cluster["missing"].array ?? []).compactMap(\.text)
    if !missing.isEmpty { lines += ["", style.yellow("no answer within 2 s from: \(missing.joined(separator: ", "))")] }
    return lines
}
