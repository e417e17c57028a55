#if canImport(Glibc)
import Glibc
import HubAuth
#endif

/// What went wrong talking to the hub's Unix socket. `description` is a sentence an operator can act on.
public enum AdminClientError: Error, Equatable, CustomStringConvertible {
    /// Nothing listens at the path (ENOENT or ECONNREFUSED).
    case hubNotRunning(path: String)
    /// The socket exists but this user may not connect (EACCES/EPERM). `detail` names who may.
    case permissionDenied(path: String, detail: String)
    /// The path does not fit in `sockaddr_un.sun_path` (107 bytes).
    case pathTooLong(path: String)
    /// A system call failed with this errno.
    case io(errno: Int32, operation: String)
    /// No complete reply line within the read timeout.
    case timedOut(seconds: Double)
    /// The hub closed the connection before a reply line arrived.
    case connectionClosed
    /// A reply line exceeded `maxLineBytes`.
    case lineTooLong(limit: Int)

    public var description: String {
        switch self {
        case .hubNotRunning(let path):
            return "no hub is listening on \(path) (start one with: swift run -c release hub)"
        case .permissionDenied(let path, let detail):
            return "permission denied connecting to \(path): \(detail)"
        case .pathTooLong(let path):
            return "socket path is too long for a Unix socket (at most 107 bytes): \(path)"
        case .io(let code, let operation):
            return "\(operation) failed: \(String(cString: strerror(code))) (errno \(code))"
        case .timedOut(let seconds):
            return "the hub did not answer within \(AdminClient.formatSeconds(seconds))"
        case .connectionClosed:
            return "the hub closed the connection before replying"
        case .lineTooLong(let limit):
            return "a reply line from the hub exceeded \(limit) bytes"
        }
    }
}

/// A small blocking client for the hub's Unix socket (docs/PROTOCOL.md section 2): one request line out, one
/// reply line back, pipelining, and line streaming for `tail`. Not thread-safe: use one client per thread.
public final class AdminClient {
    public let socketPath: String
    /// Seconds to wait for a reply line; `nil` waits forever (streaming).
    public var readTimeout: Double?
    /// Longest reply line accepted.
    public var maxLineBytes: Int = 64 << 20

    private var fd: Int32
    private var buffer: [UInt8] = []
    private var start = 0  // consumed prefix of `buffer`
    private var eof = false
    private var chunk = [UInt8](repeating: 0, count: 65536)

    public init(socketPath: String, readTimeout: Double? = 10) throws(AdminClientError) {
        self.socketPath = socketPath
        self.readTimeout = readTimeout
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let pathBytes = Array(socketPath.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard !pathBytes.isEmpty, pathBytes.count < capacity else { throw .pathTooLong(path: socketPath) }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in pathBytes.enumerated() { raw[i] = byte }
            raw[pathBytes.count] = 0
        }
        let socketFD = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard socketFD >= 0 else { throw .io(errno: errno, operation: "socket") }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + pathBytes.count + 1)
        var result: Int32
        repeat {
            result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socketFD, $0, length) }
            }
        } while result != 0 && errno == EINTR
        if result != 0 {
            let code = errno
            _ = Glibc.close(socketFD)
            switch code {
            case ENOENT, ECONNREFUSED, ENOTDIR:
                throw .hubNotRunning(path: socketPath)
            case EACCES, EPERM:
                throw .permissionDenied(path: socketPath, detail: AdminClient.permissionDetail(socketPath))
            default:
                throw .io(errno: code, operation: "connect to \(socketPath)")
            }
        }
        fd = socketFD
    }

    deinit { close() }

    /// Closes the socket; later calls fail with `.connectionClosed`.
    public func close() {
        if fd >= 0 { _ = Glibc.close(fd); fd = -1 }
    }

    /// Sends one request line (a newline is appended when missing) and returns the reply line without its newline.
    public func request(_ line: [UInt8]) throws(AdminClientError) -> [UInt8] {
        try send(line)
        guard let reply = try readLine() else { throw .connectionClosed }
        return reply
    }

    public func request(_ line: String) throws(AdminClientError) -> [UInt8] {
        try request(Array(line.utf8))
    }

    /// Pipelines the lines in one write and reads one reply per line, in order.
    public func requests(_ lines: [[UInt8]]) throws(AdminClientError) -> [[UInt8]] {
        var out: [UInt8] = []
        for line in lines {
            out += line
            if line.last != 0x0A { out.append(0x0A) }
        }
        try writeAll(out)
        var replies: [[UInt8]] = []
        replies.reserveCapacity(lines.count)
        for _ in lines {
            guard let reply = try readLine() else { throw .connectionClosed }
            replies.append(reply)
        }
        return replies
    }

    public func requests(_ lines: [String]) throws(AdminClientError) -> [[UInt8]] {
        try requests(lines.map { Array($0.utf8) })
    }

    /// Writes one line (appending the newline when missing) without waiting for a reply.
    public func send(_ line: [UInt8]) throws(AdminClientError) {
        var out = line
        if out.last != 0x0A { out.append(0x0A) }
        try writeAll(out)
    }

    /// The next line (without `\n` or `\r\n`), or `nil` when the hub closed the connection cleanly.
    /// A final line without a newline before the close is returned as a line.
    public func readLine() throws(AdminClientError) -> [UInt8]? {
        var scanFrom = start
        while true {
            if let newline = buffer[scanFrom...].firstIndex(of: 0x0A) {
                var end = newline
                if end > start && buffer[end - 1] == 0x0D { end -= 1 }
                let line = Array(buffer[start..<end])
                start = newline + 1
                if start > 65536 && start * 2 > buffer.count {
                    buffer.removeFirst(start)
                    start = 0
                }
                return line
            }
            scanFrom = buffer.count
            if buffer.count - start > maxLineBytes { throw .lineTooLong(limit: maxLineBytes) }
            if eof {
                if start == buffer.count { return nil }
                let line = Array(buffer[start...])
                start = buffer.count
                return line
            }
            try fill()
        }
    }

    // MARK: - Internals

    private func fill() throws(AdminClientError) {
        guard fd >= 0 else { throw .connectionClosed }
        if let timeout = readTimeout {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let deadline = AdminClient.monotonicSeconds() + timeout
            while true {
                let remaining = deadline - AdminClient.monotonicSeconds()
                if remaining <= 0 { throw .timedOut(seconds: timeout) }
                let ready = poll(&pfd, 1, Int32(min(remaining * 1000, 2_000_000_000).rounded(.up)))
                if ready > 0 { break }
                if ready < 0 && errno != EINTR { throw .io(errno: errno, operation: "poll") }
            }
        }
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                buffer.append(contentsOf: chunk[0..<n])
                return
            }
            if n == 0 { eof = true; return }
            let code = errno
            if code == EINTR { continue }
            if code == ECONNRESET { eof = true; return }
            throw .io(errno: code, operation: "read")
        }
    }

    private func writeAll(_ bytes: [UInt8]) throws(AdminClientError) {
        guard fd >= 0 else { throw .connectionClosed }
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw in
                Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n >= 0 { offset += n; continue }
            let code = errno
            if code == EINTR { continue }
            if code == EPIPE || code == ECONNRESET { throw .connectionClosed }
            throw .io(errno: code, operation: "write")
        }
    }

    static func monotonicSeconds() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    static func formatSeconds(_ seconds: Double) -> String {
        seconds == seconds.rounded() ? "\(Int(seconds)) s" : "\(seconds) s"
    }

    /// "the socket is mode 0660 (owner root, group hub): only user root and members of group hub may connect;
    /// you are alice (groups alice, dev)".
    static func permissionDetail(_ path: String) -> String {
        var info = stat()
        guard stat(path, &info) == 0 else {
            return "a directory on the path is not accessible to you (\(userName(getuid())))"
        }
        let mode = String(info.st_mode & 0o777, radix: 8)
        let owner = userName(info.st_uid)
        let group = groupName(info.st_gid)
        return "the socket is mode 0\(mode) (owner \(owner), group \(group)): the hub's socket is 0660, so only user "
            + "\(owner) and members of group \(group) may connect; you are \(userName(getuid())). "
            + "Run hubctl as \(owner) or add yourself to group \(group)"
    }

    static func userName(_ uid: uid_t) -> String {
        if let entry = getpwuid(uid), let name = entry.pointee.pw_name { return String(cString: name) }
        return "uid \(uid)"
    }

    static func groupName(_ gid: gid_t) -> String {
        if let entry = getgrgid(gid), let name = entry.pointee.gr_name { return String(cString: name) }
        return "gid \(gid)"
    }

    /// `text` as a JSON string literal, quotes included (for building request lines by hand).
    public static func jsonString(_ text: String) -> String { JSONText.quote(text) }
}
