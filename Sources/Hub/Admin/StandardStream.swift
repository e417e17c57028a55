import Glibc
import HubSupport
import Synchronization

/// The one way `hub` and `hubctl` write their log and error lines (and read stdin in full): plain `write(2)` and
/// `read(2)` loops that never trap.
///
/// Why not `FileHandle`: in swift-corelibs-foundation `FileHandle.write(_: Data)` and `readDataToEndOfFile()` are
/// `try!`, so a log line written after stderr's reader went away (EPIPE), or with stderr closed (EBADF), killed the
/// process with SIGILL (exit 132): no close frames, the socket file left behind. Here a failed write drops the
/// rest of that line and the caller carries on; logging is best effort, serving is not.
///
/// Callers must ignore SIGPIPE (both programs do, first thing), or a write to a pipe without a reader raises it.
public enum StandardStream: Sendable {
    case output
    case error

    public var descriptor: Int32 {
        switch self {
        case .output: STDOUT_FILENO
        case .error: STDERR_FILENO
        }
    }

    /// Whole lines from different threads must not interleave: writes of one process are serialized here
    /// (the kernel only keeps writes of up to PIPE_BUF bytes whole on a pipe).
    private static let lock = LockedValue(())

    /// Writes `text` and a newline unless it already ends with one. False when not every byte was written
    /// (the reader is gone, the descriptor is closed, the disk is full); never traps.
    @discardableResult
    public func writeLine(_ text: String) -> Bool {
        var bytes = Array(text.utf8)
        if bytes.last != 0x0A { bytes.append(0x0A) }
        return write(bytes: bytes)
    }

    /// Writes `bytes` as they are. False when not every byte was written; never traps.
    @discardableResult
    public func write(bytes: [UInt8]) -> Bool {
        let fd = descriptor
        return Self.lock.withLock { _ in
            bytes.withUnsafeBytes { Self.writeAll(fd, $0) }
        }
    }

    /// The `write(2)` loop: resumes after short writes and EINTR, waits for a non-blocking descriptor to drain,
    /// and gives up (false) on any other error, EPIPE and EBADF included.
    static func writeAll(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) -> Bool {
        guard var next = buffer.baseAddress else { return true }
        var remaining = buffer.count
        while remaining > 0 {
            let n = Glibc.write(fd, next, remaining)
            if n > 0 {
                next += n
                remaining -= n
                continue
            }
            if n == 0 { return false }
            switch errno {
            case EINTR:
                continue
            case EAGAIN:
                // Someone made the descriptor non-blocking: wait as a blocking write would.
                var pfd = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                if poll(&pfd, 1, -1) < 0 && errno != EINTR { return false }
            default:
                return false
            }
        }
        return true
    }

    /// Reads standard input to its end with `read(2)`. A closed stdin reads as empty; any other read error
    /// (stdin is a directory, EIO) is thrown as its errno, for the caller to report.
    public static func readInput() throws(ReadError) -> [UInt8] {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(STDIN_FILENO, $0.baseAddress, $0.count) }
            if n > 0 {
                bytes += chunk[0..<n]
                continue
            }
            if n == 0 { return bytes }
            let code = errno
            if code == EINTR { continue }
            if code == EBADF { return bytes }
            throw ReadError(code: code)
        }
    }

    public struct ReadError: Error, CustomStringConvertible, Sendable {
        public let code: Int32
        public var description: String { String(cString: strerror(code)) }
    }

    /// Call first thing in `main`, before anything opens a descriptor: a standard descriptor the parent left
    /// closed (`2>&-`) is opened on /dev/null. Otherwise the first socket or file the program opens would get
    /// number 0, 1 or 2, and log lines would be written into it (a client's connection, the secret file).
    public static func reserveStandardDescriptors() {
        for fd in [STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO] where fcntl(fd, F_GETFD) == -1 && errno == EBADF {
            let null = open("/dev/null", O_RDWR)
            if null >= 0 && null != fd {
                dup2(null, fd)
                Glibc.close(null)
            }
        }
    }
}
