import Foundation
import Glibc
import HubEngine

/// Publish counters (loop-owned; copied out with `snapshot`).
struct PublishStats {
    var sent: UInt64 = 0
    var acked: UInt64 = 0
    var errors: UInt64 = 0
    var delivered: UInt64 = 0
    var requests: UInt64 = 0
    var skipped: UInt64 = 0
}

/// Publishes stamped events to the server under test from its own event loop:
///  - hub: NDJSON lines on the Unix socket, pipelined (up to `window` lines without a reply);
///  - jwt peers: `POST /publish` with an NDJSON batch per request, one request in flight per connection;
///  - nchan: one `POST /pub/<channel>/<account>` per event, pipelined on keep-alive connections.
/// Each event's `data` is `{"t":<CLOCK_MONOTONIC ns at send>,"i":<event id>}` (plus padding when asked).
final class PublishDriver: @unchecked Sendable {
    let loop: EventLoop
    let target: TargetSpec
    var channels: [PublishChannel] = []
    var stats = PublishStats()
    // Pacing (loop thread).
    var rate = 0.0            // events/s; 0 = stopped
    var unlimited = false     // as fast as the windows allow
    var accountSpan = 0       // 0: broadcast; else a random account in [0, span)
    var accountPrefix = "acc_"
    var padding: [UInt8] = []
    var phaseStart: UInt64 = 0
    var phaseSent: UInt64 = 0
    var nextId: UInt64 = 1
    var rng = SystemRandomNumberGenerator()
    let window: Int
    let channelBytes: [UInt8]

    init(loop: EventLoop, target: TargetSpec, connections: Int, window: Int) throws {
        self.loop = loop
        self.target = target
        self.window = window
        channelBytes = Array(target.channel.utf8)
        try loop.submitAndWait { [self] in
            // One connection per hub socket (`unix:A,unix:B`: a cluster's nodes, used in turn), or `connections`.
            let addresses = target.publish.split(separator: ",").map(String.init)
            if target.kind == "hub" {
                for address in addresses { channels.append(try makeChannel(address)) }
            } else {
                for _ in 0..<connections { channels.append(try makeChannel(target.publish)) }
            }
            _ = loop.scheduleRepeating(every: .milliseconds(1)) { [self] in tick() }
        }
    }

    private func makeChannel(_ address: String) throws -> PublishChannel {
        let fd: Int32
        if address.hasPrefix("unix:") {
            fd = try unixConnect(String(address.dropFirst(5)))
        } else {
            guard let url = URLComponents(string: address), let host = url.host, let port = url.port else {
                throw EngineError("bad publish URL \(address)")
            }
            fd = try SocketAddress(parsing: "\(host):\(port)").connect()
        }
        let channel = PublishChannel(driver: self, http: !address.hasPrefix("unix:"))
        let c = try Connection(adopting: fd, on: loop, peer: address, handler: channel, maxQueuedBytes: 256 << 20)
        channel.connection = c
        return channel
    }

    private func unixConnect(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SyscallError(call: "socket", code: errno) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { Glibc.close(fd); throw EngineError("socket path too long") }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i] = b }
            raw[bytes.count] = 0
        }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if rc != 0 { let e = errno; Glibc.close(fd); throw SyscallError(call: "connect \(path)", code: e) }
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        return fd
    }

    private var firstChannel = 0

    /// Sets the pace (any thread).
    func setRate(_ eventsPerSecond: Double, unlimited: Bool = false) {
        loop.execute { [self] in
            rate = eventsPerSecond
            self.unlimited = unlimited
            phaseStart = monotonicNanos()
            phaseSent = 0
        }
    }

    func configure(accountSpan: Int, accountPrefix: String, paddingBytes: Int) {
        _ = try? loop.submitAndWait { [self] in
            self.accountSpan = accountSpan
            self.accountPrefix = accountPrefix
            padding = Array(repeating: UInt8(ascii: "x"), count: paddingBytes)
        }
    }

    func snapshot() -> PublishStats {
        (try? loop.submitAndWait { [self] in stats }) ?? PublishStats()
    }

    private func tick() {
        guard rate > 0 || unlimited else { return }
        var due: Int
        if unlimited {
            due = Int.max
        } else {
            let elapsed = Double(monotonicNanos() - phaseStart) / 1e9
            let target = UInt64(elapsed * rate)
            if target <= phaseSent { return }
            // Never build a backlog of more than 50 ms: what could not be sent in time is skipped and counted.
            let maxLag = UInt64(max(rate * 0.05, 1))
            if target - phaseSent > maxLag {
                stats.skipped += target - phaseSent - maxLag
                phaseSent = target - maxLag
            }
            due = Int(target - phaseSent)
        }
        // Each tick starts at the next connection, so several hub sockets (a cluster) share the load evenly.
        let count = channels.count
        guard count > 0 else { return }
        firstChannel = (firstChannel + 1) % count
        for k in 0..<count {
            guard due > 0 else { break }
            let n = channels[(firstChannel + k) % count].send(upTo: due)
            due -= n
            phaseSent += UInt64(n)
        }
    }

    /// Event `data` JSON: {"t":NOW,"i":ID[,"p":"xxx"]}.
    @inline(__always)
    func appendData(_ out: inout [UInt8]) {
        out.append(#"{"t":"#)
        out.appendDecimal(monotonicNanos())
        out.append(#","i":"#)
        out.appendDecimal(nextId)
        nextId += 1
        if !padding.isEmpty {
            out.append(#","p":""#)
            out.append(contentsOf: padding)
            out.append(UInt8(ascii: "\""))
        }
        out.append(UInt8(ascii: "}"))
    }

    /// The account of the next event, or nil for a broadcast.
    @inline(__always)
    func nextAccount() -> UInt64? {
        accountSpan > 0 ? UInt64.random(in: 0..<UInt64(accountSpan), using: &rng) : nil
    }
}

/// One publish connection and its reply parser.
final class PublishChannel: ConnectionHandler {
    unowned let driver: PublishDriver
    let http: Bool
    var connection: Connection?
    /// Lines (hub) or requests (HTTP) awaiting a reply; for HTTP, the lines in each request, in order.
    var outstanding = 0
    var requestLines: [Int] = []
    var requestHead = 0
    var buffer: [UInt8] = []

    init(driver: PublishDriver, http: Bool) {
        self.driver = driver
        self.http = http
        buffer.reserveCapacity(1 << 20)
    }

    /// Sends up to `limit` events; returns how many.
    func send(upTo limit: Int) -> Int {
        guard let connection, connection.isOpen else { return 0 }
        let d = driver
        buffer.removeAll(keepingCapacity: true)
        var sent = 0
        switch d.target.kind {
        case "hub":
            let n = min(limit, d.window - outstanding)
            guard n > 0 else { return 0 }
            for _ in 0..<n {
                buffer.append(#"{"op":"publish","channel":""#)
                buffer.append(contentsOf: d.channelBytes)
                if let a = d.nextAccount() {
                    buffer.append(#"","account":""#)
                    buffer.append(d.accountPrefix)
                    buffer.appendDecimal(a)
                    buffer.append(#"","type":"bench","data":"#)
                } else {
                    buffer.append(#"","broadcast":true,"type":"bench","data":"#)
                }
                d.appendData(&buffer)
                buffer.append(#"}"# + "\n")
            }
            outstanding += n
            sent = n
        case "nchan":
            // Pipelined single-event requests; at most `window` per connection in flight.
            let n = min(limit, max(0, min(d.window, 64) - outstanding))
            guard n > 0 else { return 0 }
            var body: [UInt8] = []
            for _ in 0..<n {
                body.removeAll(keepingCapacity: true)
                let account = d.nextAccount()
                body.append(#"{"type":"bench","channel":""#)
                body.append(contentsOf: d.channelBytes)
                body.append(#"","seq":"#)
                body.appendDecimal(d.nextId)
                if account == nil { body.append(#","broadcast":true"#) }
                body.append(#","data":"#)
                d.appendData(&body)
                body.append(UInt8(ascii: "}"))
                buffer.append("POST /pub/")
                buffer.append(contentsOf: d.channelBytes)
                buffer.append(UInt8(ascii: "/"))
                if let account { buffer.append(d.accountPrefix); buffer.appendDecimal(account) } else { buffer.append("broadcast") }
                buffer.append(" HTTP/1.1\r\nHost: \(d.target.host)\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: ")
                buffer.appendDecimal(UInt64(body.count))
                buffer.append("\r\n\r\n")
                buffer.append(contentsOf: body)
                requestLines.append(1)
            }
            outstanding += n
            sent = n
            d.stats.requests += UInt64(n)
        default:
            // NDJSON batch, one request in flight per connection.
            guard outstanding == 0 else { return 0 }
            let n = min(limit, 2000)
            var body: [UInt8] = []
            body.reserveCapacity(n * 110)
            for _ in 0..<n {
                body.append(#"{"channel":""#)
                body.append(contentsOf: d.channelBytes)
                if let a = d.nextAccount() {
                    body.append(#"","account":""#)
                    body.append(d.accountPrefix)
                    body.appendDecimal(a)
                    body.append(#"","type":"bench","data":"#)
                } else {
                    body.append(#"","broadcast":true,"type":"bench","data":"#)
                }
                d.appendData(&body)
                body.append(#"}"# + "\n")
            }
            let url = URLComponents(string: d.target.publish)
            buffer.append("POST \(url?.path ?? "/publish") HTTP/1.1\r\nHost: \(d.target.host)\r\nContent-Type: application/x-ndjson\r\nContent-Length: ")
            buffer.appendDecimal(UInt64(body.count))
            buffer.append("\r\n\r\n")
            buffer.append(contentsOf: body)
            requestLines.append(n)
            outstanding = 1
            sent = n
            d.stats.requests += 1
        }
        d.stats.sent += UInt64(sent)
        buffer.withUnsafeBytes { _ = connection.write(copying: $0) }
        return sent
    }

    func connectionReadable(_ connection: Connection, _ bytes: UnsafeMutableRawBufferPointer) -> Int {
        let b = UnsafeRawBufferPointer(bytes)
        let d = driver
        if !http {
            // One reply line per request line.
            var start = 0
            var i = 0
            while i < b.count {
                if b[i] == 0x0A {
                    d.stats.acked += 1
                    outstanding -= 1
                    if b[start + 2] == UInt8(ascii: "o") && b[start + 6] == UInt8(ascii: "f") {
                        d.stats.errors += 1
                    } else if let v = scanValue(patDelivered, in: b, from: start, end: i) {
                        d.stats.delivered += v.value
                    }
                    start = i + 1
                }
                i += 1
            }
            refill()
            return start
        }
        var offset = 0
        while let r = parseHTTPResponse(b, from: offset) {
            let lines = requestLines[requestHead]
            requestHead += 1
            if requestHead > 4096 { requestLines.removeFirst(requestHead); requestHead = 0 }
            outstanding -= d.target.kind == "nchan" ? 1 : 1
            if r.status >= 200 && r.status < 300 {
                d.stats.acked += UInt64(lines)
                let errs = countOccurrences(patOkFalse, in: b, from: r.bodyStart, to: r.end)
                d.stats.errors += UInt64(errs)
                var pos = r.bodyStart
                let pattern = d.target.kind == "nchan" ? patSubscribers : patDelivered
                while let v = scanValue(pattern, in: b, from: pos, end: r.end) {
                    d.stats.delivered += v.value
                    pos = v.next
                }
            } else {
                d.stats.errors += UInt64(lines)
            }
            offset = r.end
        }
        refill()
        return offset
    }

    private func refill() {
        if driver.unlimited { _ = send(upTo: Int.max) }
    }

    func connectionClosed(_ connection: Connection, reason: CloseReason) {
        note("publisher: connection to \(driver.target.publish) closed: \(reason)")
        self.connection = nil
    }
}

/// One complete HTTP/1.1 response at `b[from...]`: its end, status and where its body starts; nil if incomplete.
func parseHTTPResponse(_ b: UnsafeRawBufferPointer, from: Int) -> (end: Int, status: Int, bodyStart: Int)? {
    let n = b.count
    var i = from
    var headEnd = -1
    while i + 3 < n {
        if b[i] == 0x0D && b[i + 1] == 0x0A && b[i + 2] == 0x0D && b[i + 3] == 0x0A { headEnd = i + 4; break }
        i += 1
    }
    guard headEnd > 0, headEnd - from >= 12 else { return nil }
    var status = 0
    for k in 9..<12 { status = status * 10 + Int(b[from + k] &- 0x30) }
    // Headers.
    var contentLength = -1
    var chunked = false
    var lineStart = from
    var j = from
    while j < headEnd - 2 {
        if b[j] == 0x0D {
            let len = j - lineStart
            if len > 15 && lower(b[lineStart]) == UInt8(ascii: "c") {
                let name = String(decoding: UnsafeRawBufferPointer(rebasing: b[lineStart..<min(j, lineStart + 15)]), as: UTF8.self).lowercased()
                if name == "content-length:" {
                    var v = 0
                    for k in (lineStart + 15)..<j where b[k] >= 0x30 && b[k] <= 0x39 { v = v * 10 + Int(b[k] - 0x30) }
                    contentLength = v
                }
            } else if len > 18 && lower(b[lineStart]) == UInt8(ascii: "t") {
                let line = String(decoding: UnsafeRawBufferPointer(rebasing: b[lineStart..<j]), as: UTF8.self).lowercased()
                if line.hasPrefix("transfer-encoding:") && line.contains("chunked") { chunked = true }
            }
            lineStart = j + 2
        }
        j += 1
    }
    if chunked {
        var p = headEnd
        while true {
            var size = 0
            var q = p
            while q < n && b[q] != 0x0D {
                let c = lower(b[q])
                if c >= 0x30 && c <= 0x39 { size = size * 16 + Int(c - 0x30) }
                else if c >= UInt8(ascii: "a") && c <= UInt8(ascii: "f") { size = size * 16 + Int(c - UInt8(ascii: "a") + 10) }
                else if c == UInt8(ascii: ";") { while q < n && b[q] != 0x0D { q += 1 }; break }
                q += 1
            }
            guard q + 1 < n else { return nil }
            p = q + 2
            if size == 0 {
                guard p + 1 < n else { return nil }
                return (p + 2, status, headEnd)
            }
            p += size + 2
            guard p <= n else { return nil }
        }
    }
    let end = headEnd + max(contentLength, 0)
    guard end <= n else { return nil }
    return (end, status, headEnd)
}

@inline(__always) private func lower(_ c: UInt8) -> UInt8 { c >= 0x41 && c <= 0x5A ? c + 0x20 : c }
