import Glibc

/// A thin owner of one epoll set and its preallocated event array.
///
/// User data is `key | generation << 32`, where the key is the registrant's slot in its loop's table (not the fd
/// number: a loop's table then spans only its own registrations). When a registration ends and its slot or fd is
/// reused within one `epoll_wait` batch, the loop compares the generation and drops the stale event instead of
/// delivering it to the new owner.
final class Epoll {
    /// Interest bits, spelled once so callers don't repeat the `rawValue` dance.
    static let readable = LinuxSyscalls.EPOLLIN | LinuxSyscalls.EPOLLRDHUP
    static let writable = LinuxSyscalls.EPOLLOUT
    static let hangup = LinuxSyscalls.EPOLLHUP | LinuxSyscalls.EPOLLRDHUP
    static let error = LinuxSyscalls.EPOLLERR
    static let input = LinuxSyscalls.EPOLLIN

    let fd: Int32
    let capacity: Int
    /// `capacity` raw `struct epoll_event`s (layout per `LinuxSyscalls.epollEventSize`).
    private let events: UnsafeMutableRawPointer

    init(capacity: Int = 1024) throws(SyscallError) {
        fd = try syscallBlocking("epoll_create1") { sys_epoll_create1(LinuxSyscalls.CLOEXEC) }
        self.capacity = capacity
        events = .allocate(byteCount: capacity * LinuxSyscalls.epollEventSize, alignment: 16)
        events.initializeMemory(as: UInt8.self, repeating: 0, count: capacity * LinuxSyscalls.epollEventSize)
    }

    deinit {
        events.deallocate()
        closeFD(fd)
    }

    /// The key of the loop's own wake-up eventfd.
    static let wakeKey = UInt32.max

    @inline(__always)
    static func pack(key: UInt32, generation: UInt32) -> UInt64 {
        UInt64(key) | UInt64(generation) << 32
    }

    private func control(_ op: Int32, _ name: StaticString, fd target: Int32, key: UInt32, generation: UInt32, events mask: UInt32) throws(SyscallError) {
        var event: (UInt64, UInt64) = (0, 0)  // 16 bytes, enough for either layout
        withUnsafeMutableBytes(of: &event) { raw in
            raw.storeBytes(of: mask, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: Epoll.pack(key: key, generation: generation), toByteOffset: LinuxSyscalls.epollDataOffset, as: UInt64.self)
        }
        _ = try syscallBlocking(name) { withUnsafeMutableBytes(of: &event) { sys_epoll_ctl(fd, op, target, $0.baseAddress) } }
    }

    func add(fd target: Int32, key: UInt32, generation: UInt32, events mask: UInt32) throws(SyscallError) {
        try control(LinuxSyscalls.EPOLL_CTL_ADD, "epoll_ctl(ADD)", fd: target, key: key, generation: generation, events: mask)
    }

    func modify(fd target: Int32, key: UInt32, generation: UInt32, events mask: UInt32) throws(SyscallError) {
        try control(LinuxSyscalls.EPOLL_CTL_MOD, "epoll_ctl(MOD)", fd: target, key: key, generation: generation, events: mask)
    }

    func remove(fd target: Int32) {
        // ENOENT can only mean it was never added; ignore rather than crash on teardown paths.
        _ = try? syscallBlocking("epoll_ctl(DEL)") { sys_epoll_ctl(fd, LinuxSyscalls.EPOLL_CTL_DEL, target, nil) }
    }

    /// Waits up to `timeoutMs` (-1 = forever) and returns how many events are ready.
    func wait(timeoutMs: Int32) throws(SyscallError) -> Int {
        switch try syscall("epoll_wait", { sys_epoll_wait(fd, events, Int32(capacity), timeoutMs) }) {
        case .processed(let n): return Int(n)
        case .wouldBlock: return 0
        }
    }

    /// The i-th ready event as (key, generation, event bits).
    @inline(__always)
    func event(at index: Int) -> (key: UInt32, generation: UInt32, events: UInt32) {
        let base = events + index * LinuxSyscalls.epollEventSize
        let mask = base.loadUnaligned(as: UInt32.self)
        let data = base.loadUnaligned(fromByteOffset: LinuxSyscalls.epollDataOffset, as: UInt64.self)
        return (UInt32(truncatingIfNeeded: data), UInt32(truncatingIfNeeded: data >> 32), mask)
    }
}

@available(*, unavailable)
extension Epoll: Sendable {}
