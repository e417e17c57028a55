import Glibc

/// Small socket option helpers shared by listeners and connections.
enum Socket {
    static func setNonBlocking(_ fd: Int32) throws(SyscallError) {
        let flags = try syscallBlocking("fcntl(F_GETFL)") { fcntl(fd, F_GETFL) }
        _ = try syscallBlocking("fcntl(F_SETFL)") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
    }

    static func setNoDelay(_ fd: Int32) {
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    static func setFlag(_ fd: Int32, _ level: Int32, _ option: Int32) throws(SyscallError) {
        var one: Int32 = 1
        _ = try syscallBlocking("setsockopt") { setsockopt(fd, level, option, &one, socklen_t(MemoryLayout<Int32>.size)) }
    }
}
