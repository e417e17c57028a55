import CLinux
import Testing
@testable import HubEngine

/// The epoll event layout and the flag values the loop writes by hand (`LinuxSyscalls`) are C's own, read from the
/// headers through `CLinux`.
@Suite struct EngineSyscallLayoutTests {
    @Test func epollEventLayoutIsCs() {
        #expect(LinuxSyscalls.epollEventSize == hub_epoll_event_size())
        #expect(LinuxSyscalls.epollDataOffset == hub_epoll_data_offset())
    }

    @Test func flagsAreCs() {
        #expect([LinuxSyscalls.EPOLLIN, LinuxSyscalls.EPOLLOUT, LinuxSyscalls.EPOLLERR, LinuxSyscalls.EPOLLHUP,
                 LinuxSyscalls.EPOLLRDHUP, LinuxSyscalls.EPOLLEXCLUSIVE] == (0..<6).map { hub_epoll_flags(Int32($0)) })
        #expect([LinuxSyscalls.EPOLL_CTL_ADD, LinuxSyscalls.EPOLL_CTL_DEL, LinuxSyscalls.EPOLL_CTL_MOD]
                == (0..<3).map { hub_epoll_ctl_op(Int32($0)) })
        #expect(LinuxSyscalls.CLOEXEC == hub_cloexec_flags())
        #expect(LinuxSyscalls.NONBLOCK == hub_nonblock_flags())
    }
}
