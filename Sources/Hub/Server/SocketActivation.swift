import Glibc

/// Listening sockets handed over by the service manager (sd_listen_fds(3) semantics, without libsystemd):
/// `LISTEN_FDS` descriptors starting at 3, meant for this process when `LISTEN_PID` is its pid, named by
/// `LISTEN_FDNAMES` (colon-separated). The hub serves them instead of binding its own.
///
/// Names: `ws` (the client listener, `--listen`), `wss` (the TLS listener, `--tls-listen`), `publish` (the Unix
/// socket, `--socket`). A descriptor without one of these names is placed by its kind: a Unix socket is `publish`, and
/// one TCP socket is `ws`; two unnamed TCP sockets are refused (which would be the TLS one is not guessable).
public struct SocketActivation: Sendable, Equatable {
    public var ws: Int32? = nil
    public var wss: Int32? = nil
    public var publish: Int32? = nil

    public struct ActivationError: Error, CustomStringConvertible, Sendable, Equatable { public let description: String }

    /// The first descriptor passed (`SD_LISTEN_FDS_START`).
    static let firstDescriptor: Int32 = 3

    /// Reads and then unsets `LISTEN_FDS`, `LISTEN_PID` and `LISTEN_FDNAMES` (so nothing the hub starts inherits
    /// them). Nil when they are absent or meant for another process.
    public static func take(pid: pid_t = getpid()) throws(ActivationError) -> SocketActivation? {
        func variable(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }
        let fds = variable("LISTEN_FDS"), owner = variable("LISTEN_PID"), names = variable("LISTEN_FDNAMES")
        for name in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] { unsetenv(name) }
        return try parse(fds: fds, pid: owner, names: names, ownPID: pid, kind: describe)
    }

    /// What a descriptor is, as far as activation cares.
    enum Kind: Equatable { case tcp, unix, other(String) }

    /// The rules of `take`, on given values (`kind` inspects a descriptor).
    static func parse(fds: String?, pid: String?, names: String?, ownPID: pid_t,
                      kind: (Int32) -> Kind) throws(ActivationError) -> SocketActivation? {
        guard let fds, !fds.isEmpty else { return nil }
        guard let pid, let owner = pid_t(pid), owner == ownPID else { return nil }
        guard let count = Int32(fds), (1...16).contains(count) else {
            throw ActivationError(description: "LISTEN_FDS must be a count of 1 to 16 descriptors, got '\(fds)'")
        }
        let given = names.map { $0.split(separator: ":", omittingEmptySubsequences: false).map(String.init) } ?? []
        if names != nil && given.count != Int(count) {
            throw ActivationError(description: "LISTEN_FDNAMES names \(given.count) descriptors but LISTEN_FDS is \(count)")
        }
        var activation = SocketActivation()
        var unnamedTCP: [Int32] = []
        for i in 0..<count {
            let fd = firstDescriptor + i
            let name = given.indices.contains(Int(i)) ? given[Int(i)] : ""
            let what = kind(fd)
            func assign(_ slot: WritableKeyPath<SocketActivation, Int32?>, _ want: Kind) throws(ActivationError) {
                guard what == want else {
                    throw ActivationError(description: "descriptor \(fd) named '\(name)' must be a listening \(want == .tcp ? "TCP" : "Unix stream") socket (\(Self.text(what)))")
                }
                guard activation[keyPath: slot] == nil else {
                    throw ActivationError(description: "two descriptors are named '\(name)'")
                }
                activation[keyPath: slot] = fd
            }
            switch name {
            case "ws": try assign(\.ws, .tcp)
            case "wss": try assign(\.wss, .tcp)
            case "publish": try assign(\.publish, .unix)
            default:
                switch what {
                case .tcp: unnamedTCP.append(fd)
                case .unix:
                    guard activation.publish == nil else {
                        throw ActivationError(description: "descriptor \(fd) is a second Unix socket; name them (FileDescriptorName=publish)")
                    }
                    activation.publish = fd
                case .other:
                    throw ActivationError(description: "descriptor \(fd)\(name.isEmpty ? "" : " ('\(name)')") is not a listening TCP or Unix stream socket (\(Self.text(what)))")
                }
            }
        }
        if let fd = unnamedTCP.first {
            guard unnamedTCP.count == 1, activation.ws == nil else {
                throw ActivationError(description: "TCP descriptors \(unnamedTCP.map(String.init).joined(separator: ",")) have no name: name them ws and wss (FileDescriptorName=)")
            }
            activation.ws = fd
        }
        return activation
    }

    static func text(_ kind: Kind) -> String {
        switch kind {
        case .tcp: "a listening TCP socket"
        case .unix: "a listening Unix stream socket"
        case .other(let what): what
        }
    }

    /// Inspects a passed descriptor: a listening stream socket, TCP (IPv4/IPv6) or Unix. Marks it close-on-exec, as
    /// sd_listen_fds does.
    static func describe(_ fd: Int32) -> Kind {
        guard fcntl(fd, F_SETFD, FD_CLOEXEC) == 0 else { return .other("not an open descriptor") }
        func option(_ name: Int32) -> Int32? {
            var value: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            return getsockopt(fd, SOL_SOCKET, name, &value, &length) == 0 ? value : nil
        }
        guard let type = option(SO_TYPE) else { return .other("not a socket") }
        guard type == Int32(SOCK_STREAM.rawValue) else { return .other("not a stream socket") }
        guard option(SO_ACCEPTCONN) == 1 else { return .other("a socket that is not listening") }
        switch option(SO_DOMAIN) ?? -1 {
        case AF_INET, AF_INET6: return .tcp
        case AF_UNIX: return .unix
        default: return .other("a socket of another family")
        }
    }
}
