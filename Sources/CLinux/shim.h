// Linux calls Swift's Glibc module does not import: <sys/epoll.h>, <sys/eventfd.h>, and accept4. The wrappers take
// `void *` for the event and address buffers: `struct epoll_event` is packed on x86_64, which Swift does not import
// faithfully, so the loop lays events out itself (LinuxSyscalls).
//
// No _GNU_SOURCE here: headers compiled with other macros than SwiftGlibc's clash with it (fd_set defined twice), so
// accept4, which glibc declares only under _GNU_SOURCE, is declared below as glibc defines it.
#ifndef HUB_CLINUX_SHIM_H
#define HUB_CLINUX_SHIM_H
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

extern int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);

static inline int hub_epoll_create1(int flags) { return epoll_create1(flags); }
static inline int hub_epoll_ctl(int epfd, int op, int fd, void *event) {
    return epoll_ctl(epfd, op, fd, (struct epoll_event *)event);
}
static inline int hub_epoll_wait(int epfd, void *events, int max_events, int timeout) {
    return epoll_wait(epfd, (struct epoll_event *)events, max_events, timeout);
}
static inline int hub_eventfd(unsigned int initval, int flags) { return eventfd(initval, flags); }
static inline int hub_accept4(int fd, void *addr, socklen_t *len, int flags) {
    return accept4(fd, (struct sockaddr *)addr, len, flags);
}
/// The layout the loop writes and reads by hand, for a test to compare.
static inline size_t hub_epoll_event_size(void) { return sizeof(struct epoll_event); }
static inline size_t hub_epoll_data_offset(void) { return offsetof(struct epoll_event, data); }
static inline unsigned int hub_epoll_flags(int which) {
    switch (which) {
    case 0: return EPOLLIN;
    case 1: return EPOLLOUT;
    case 2: return EPOLLERR;
    case 3: return EPOLLHUP;
    case 4: return EPOLLRDHUP;
    case 5: return EPOLLEXCLUSIVE;
    default: return 0;
    }
}
static inline int hub_epoll_ctl_op(int which) {
    return which == 0 ? EPOLL_CTL_ADD : which == 1 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
}
static inline int hub_cloexec_flags(void) { return EPOLL_CLOEXEC == EFD_CLOEXEC && EFD_CLOEXEC == SOCK_CLOEXEC ? EPOLL_CLOEXEC : -1; }
static inline int hub_nonblock_flags(void) { return EFD_NONBLOCK == SOCK_NONBLOCK ? EFD_NONBLOCK : -1; }
#endif
