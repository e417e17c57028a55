#if canImport(Glibc)
import Glibc
#endif
import Hub

/// The terminal state `top` restores on every way out, including from signal handlers.
nonisolated(unsafe) private var savedTermios = termios()
nonisolated(unsafe) private var termiosSaved = false

enum TopCommand {
    static let spec = CommandSpec("top", boolFlags: ["once"])
    static let help = """
        usage: hubctl top [--once] [--json]

        A live view refreshed every second: status summary, the busiest channels (by publishes per second)
        and the busiest connections (by queued bytes, then messages out). Uses the terminal's alternate screen
        and restores it on exit: q, Ctrl-C, SIGTERM, or the hub going away (exit 3).
        --once renders one frame without terminal control (also what happens when stdout is not a terminal).
        --json prints one frame as {"stats":<stats reply>,"channels":<channels reply>,"connections":<reply>}.

        examples:
          hubctl top
          hubctl top --once
        """

    static func run(_ context: Context) throws(CLIError) {
        let session = try context.connect()
        let live = !context.flag("once") && !context.json && isatty(STDOUT_FILENO) == 1
        if !live {
            let replies = try fetch(session, context: context)
            if context.json {
                var out = Array(#"{"stats":"#.utf8) + replies[0].raw
                out += Array(#","channels":"#.utf8) + replies[1].raw
                out += Array(#","connections":"#.utf8) + replies[2].raw + [UInt8(ascii: "}")]
                writeStdout(bytes: out)
            } else {
                print(try render(replies, style: context.style, now: now(), rows: nil).joined(separator: "\n"))
            }
            return
        }
        enterTerminal()
        while true {
            let frame: [String]
            do {
                frame = try render(try fetch(session, context: context), style: context.style, now: now(),
                                   rows: terminalRows())
            } catch {
                restoreTerminal()
                if error.exitCode == ExitCode.unreachable {
                    throw CLIError(exitCode: ExitCode.unreachable, message: "the hub went away: \(error.message)")
                }
                throw error
            }
            var screen = "\u{1B}[H\u{1B}[2J" + frame.joined(separator: "\n")
            screen += "\n" + context.style.dim("q or Ctrl-C to quit")
            print(screen, terminator: "")
            flushOutput()
            if waitForQuit(milliseconds: 1000) {
                restoreTerminal()
                return
            }
        }
    }

    static func fetch(_ session: HubSession, context: Context) throws(CLIError) -> [HubSession.Reply] {
        let lines = [RequestLine(op: "stats").text, RequestLine(op: "channels").text,
                     #"{"op":"connections","limit":1000}"#]
        let raws: [[UInt8]]
        do { raws = try session.client.requests(lines) } catch {
            throw HubSession.map(error, socketPath: context.socketPath)
        }
        var replies: [HubSession.Reply] = []
        for raw in raws { replies.append(try HubSession.check(raw, context: context)) }
        return replies
    }

    static func render(_ replies: [HubSession.Reply], style: Style, now: Double, rows: Int?) throws(CLIError) -> [String] {
        let stats = replies[0].json["stats"]
        guard stats.object != nil else { throw .unexpected("\"stats\" is missing or not an object") }
        guard let channels = replies[1].json["channels"].array else {
            throw .unexpected("\"channels\" is missing or not an array")
        }
        guard let connections = replies[2].json["connections"].array else {
            throw .unexpected("\"connections\" is missing or not an array")
        }
        let c = stats["connections"], m = stats["messages"], b = stats["bytes"], d = stats["drops"]
        var lines = [
            style.bold("hub \(stats["version"].text ?? "?")") + "  up \(Units.duration(stats["uptimeSeconds"].double))"
                + "  connections \(Units.count(c["open"].int)) open, \(Units.count(c["handshaking"].int)) handshaking"
                + ", limit \(Units.count(c["limit"].int))  subscriptions \(Units.count(stats["subscriptions"].int))",
            "msgs in \(Units.rate(m["inPerSecond"].double))/s out \(Units.rate(m["outPerSecond"].double))/s"
                + "  bytes in \(Units.byteRate(b["inPerSecond"].double)) out \(Units.byteRate(b["outPerSecond"].double))"
                + "  publishes \(Units.rate(stats["publishes"]["perSecond"].double))/s"
                + "  slow-consumer closes \(Units.count(d["slowConsumerCloses"].int))"
                + "  fds \(Units.count(stats["descriptors"]["open"].int))/\(Units.count(stats["descriptors"]["limit"].int))",
            "",
            style.bold("busiest channels"),
        ]
        let busyChannels = channels.sorted {
            ($0["publishedPerSecond"].double ?? 0, $0["published"].int ?? 0)
                > ($1["publishedPerSecond"].double ?? 0, $1["published"].int ?? 0)
        }.prefix(10)
        if busyChannels.isEmpty {
            lines.append("  (no channels)")
        } else {
            var table = Table([("CHANNEL", .left), ("SUBSCRIBERS", .right), ("PUBLISHED/S", .right),
                               ("PUBLISHED", .right), ("DELIVERED", .right), ("LAST EVENT", .left)])
            for ch in busyChannels {
                table.add([ch["name"].text ?? "?", Units.count(ch["subscribers"].int),
                           Units.rate(ch["publishedPerSecond"].double), Units.count(ch["published"].int),
                           Units.count(ch["delivered"].int), Units.ago(ch["lastEventAt"].double, now: now)])
            }
            lines += table.render(style, indent: "  ")
        }
        lines += ["", style.bold("busiest connections")]
        let busyConnections = connections.sorted {
            ($0["queuedBytes"].int ?? 0, $0["messagesOut"].int ?? 0) > ($1["queuedBytes"].int ?? 0, $1["messagesOut"].int ?? 0)
        }.prefix(10)
        if busyConnections.isEmpty {
            lines.append("  (no connections)")
        } else {
            var table = Table([("ID", .left), ("ACCOUNT", .left), ("QUEUED", .right), ("OUT", .right),
                               ("IN", .right), ("SINCE", .right), ("PLATFORM", .left)])
            for conn in busyConnections {
                table.add([conn["id"].text ?? "?", conn["account"].text ?? "?", Units.bytes(conn["queuedBytes"].int),
                           Units.count(conn["messagesOut"].int), Units.count(conn["messagesIn"].int),
                           conn["connectedAt"].double.map { Units.duration(now - $0) } ?? "-",
                           conn["platform"].text ?? "-"])
            }
            lines += table.render(style, indent: "  ")
        }
        if let rows, lines.count > rows - 1 { lines = Array(lines.prefix(max(1, rows - 1))) }
        return lines
    }

    // MARK: - Terminal

    static func enterTerminal() {
        if tcgetattr(STDIN_FILENO, &savedTermios) == 0 {
            termiosSaved = true
            var raw = savedTermios
            raw.c_lflag &= ~tcflag_t(ICANON | ECHO)
            raw.c_cc.6 = 0  // VMIN
            raw.c_cc.5 = 0  // VTIME
            tcsetattr(STDIN_FILENO, TCSANOW, &raw)
        }
        print("\u{1B}[?1049h\u{1B}[?25l", terminator: "")
        flushOutput()
        let handler: @convention(c) (Int32) -> Void = { _ in
            TopCommand.restoreTerminal()
            _exit(0)
        }
        signal(SIGINT, handler)
        signal(SIGTERM, handler)
    }

    /// Shows the cursor, leaves the alternate screen, restores the terminal mode. Async-signal-safe.
    static func restoreTerminal() {
        let sequence: StaticString = "\u{1B}[?25h\u{1B}[?1049l"
        _ = write(STDOUT_FILENO, sequence.utf8Start, sequence.utf8CodeUnitCount)
        if termiosSaved { tcsetattr(STDIN_FILENO, TCSANOW, &savedTermios) }
    }

    /// Waits up to `milliseconds` for a key; true when it was q or Q.
    static func waitForQuit(milliseconds: Int32) -> Bool {
        let deadline = MonotonicClock.now() + Double(milliseconds) / 1000
        while true {
            let remaining = Int32(max(0, (deadline - MonotonicClock.now()) * 1000))
            if remaining == 0 { return false }
            var pfd = pollfd(fd: STDIN_FILENO, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, remaining)
            if ready <= 0 { if ready < 0 && errno != EINTR { return false }; continue }
            var byte: UInt8 = 0
            let n = read(STDIN_FILENO, &byte, 1)
            if n == 0 { _ = poll(nil, 0, remaining); return false }  // stdin closed: just wait
            if n == 1 && (byte == UInt8(ascii: "q") || byte == UInt8(ascii: "Q")) { return true }
        }
    }

    static func terminalRows() -> Int? {
        var size = winsize()
        guard ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0, size.ws_row > 0 else { return nil }
        return Int(size.ws_row)
    }
}

enum MonotonicClock {
    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}
