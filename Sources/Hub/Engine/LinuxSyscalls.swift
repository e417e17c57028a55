import CLinux
import Glibc

/// Constants of the Linux-only calls (epoll, eventfd, accept4) that `CLinux` wraps. The loop lays out
/// `struct epoll_event` by hand (it is packed on x86_64); `LinuxSyscallsTests` compares all of this with C's.
package enum LinuxSyscalls {
    static let EPOLLIN: UInt32 = 0x001
    static let EPOLLOUT: UInt32 = 0x004
    static let EPOLLERR: UInt32 = 0x008
    static let EPOLLHUP: UInt32 = 0x010
    static let EPOLLRDHUP: UInt32 = 0x2000
    static let EPOLLEXCLUSIVE: UInt32 = 1 << 28
    static let EPOLL_CTL_ADD: Int32 = 1
    static let EPOLL_CTL_DEL: Int32 = 2
    static let EPOLL_CTL_MOD: Int32 = 3
    package static let CLOEXEC: Int32 = 0o2000000  // EPOLL_CLOEXEC == EFD_CLOEXEC == O_CLOEXEC
    static let NONBLOCK: Int32 = 0o4000    // EFD_NONBLOCK == O_NONBLOCK

    /// `struct epoll_event` is packed (12 bytes) on x86_64 and naturally aligned (16) elsewhere.
    #if arch(x86_64)
    static let epollEventSize = 12
    #else
    static let epollEventSize = 16
    #endif
    static let epollDataOffset = epollEventSize - 8
}

func sys_epoll_create1(_ flags: Int32) -> Int32 { hub_epoll_create1(flags) }

func sys_epoll_ctl(_ epfd: Int32, _ op: Int32, _ fd: Int32, _ event: UnsafeMutableRawPointer?) -> Int32 {
    hub_epoll_ctl(epfd, op, fd, event)
}

func sys_epoll_wait(_ epfd: Int32, _ events: UnsafeMutableRawPointer?, _ maxEvents: Int32, _ timeout: Int32) -> Int32 {
    hub_epoll_wait(epfd, events, maxEvents, timeout)
}

func sys_eventfd(_ initval: UInt32, _ flags: Int32) -> Int32 { hub_eventfd(initval, flags) }

func sys_accept4(_ fd: Int32, _ addr: UnsafeMutableRawPointer?, _ len: UnsafeMutablePointer<socklen_t>?, _ flags: Int32) -> Int32 {
    hub_accept4(fd, addr, len, flags)
}
