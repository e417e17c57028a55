import Glibc

/// A failed system call: which call, and the `errno` it left.
///
/// Typed so callers can switch on `code` (EMFILE, ECONNREFUSED, …) without parsing strings.
public struct SyscallError: Error, CustomStringConvertible, Sendable, Equatable {
    public let call: String
    public let code: Int32

    public init(call: String, code: Int32) {
        self.call = call
        self.code = code
    }

    public var description: String {
        "\(call) failed: \(String(cString: strerror(code))) (errno \(code))"
    }
}

/// The outcome of a non-blocking system call: it ran, or the kernel said "try later".
///
/// `wouldBlock` is not an error on a non-blocking fd; it is the normal end of a read/write burst.
@usableFromInline
enum IOResult<T> {
    case processed(T)
    case wouldBlock
}

/// The one place in the engine that reads `errno`.
///
/// It reads errno straight after the call, before anything else can clobber it, retries EINTR,
/// maps EAGAIN to `.wouldBlock`, traps on EBADF/EFAULT (those mean our fd bookkeeping is wrong, not
/// that the peer did something) and throws a typed `SyscallError` for everything else.
@inline(__always)
@usableFromInline
func syscall<T: FixedWidthInteger>(_ call: StaticString, _ body: () -> T) throws(SyscallError) -> IOResult<T> {
    while true {
        let result = body()
        if result != -1 { return .processed(result) }
        let code = errno
        switch code {
        case EINTR: continue
        case EAGAIN: return .wouldBlock  // == EWOULDBLOCK on Linux
        case EBADF, EFAULT: preconditionFailure("\(call): errno \(code): fd bookkeeping bug")
        default: throw SyscallError(call: "\(call)", code: code)
        }
    }
}

/// `syscall` for calls that never legitimately return EAGAIN (setup calls on blocking paths).
@inline(__always)
@usableFromInline
func syscallBlocking<T: FixedWidthInteger>(_ call: StaticString, _ body: () -> T) throws(SyscallError) -> T {
    switch try syscall(call, body) {
    case .processed(let value): return value
    case .wouldBlock: throw SyscallError(call: "\(call)", code: EAGAIN)
    }
}

/// Closes an fd we own. EINTR on close must not be retried on Linux (the fd is already gone).
@inline(__always)
func closeFD(_ fd: Int32) {
    let rc = Glibc.close(fd)
    if rc == -1 && errno == EBADF { preconditionFailure("close(\(fd)): EBADF, double close") }
}
