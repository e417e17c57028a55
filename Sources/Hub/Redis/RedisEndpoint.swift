import Glibc
import HubEngine
import HubJSON

/// Where Redis is, from the operator's URL:
/// - `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`: TCP; HOST is an IPv4 literal, `[IPv6]` or `localhost` (no DNS, as
///   everywhere in the hub); PORT defaults to 6379, DB to 0;
/// - `unix://[[USER]:PASSWORD@]/PATH[?db=DB]`: a Unix socket;
/// - `redis-cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]`: a Redis Cluster, found through any of these seed
///   nodes (the others are learnt from `CLUSTER SLOTS`); database 0 only, as Redis Cluster has no other.
/// USER and PASSWORD may be percent-encoded. With a password and no user, AUTH uses Redis's `default` user.
public struct RedisEndpoint: Sendable, Equatable, CustomStringConvertible {
    public enum Address: Sendable, Equatable {
        case tcp(host: String, port: UInt16)
        case unix(path: String)
    }

    public var address: Address
    public var username: String?
    public var password: String?
    public var database: Int
    /// A Redis Cluster (`redis-cluster://`): `address` and `moreSeeds` are seed nodes, commands are routed by slot.
    public var cluster = false
    /// Further seed nodes of a cluster, tried in turn after `address`.
    public var moreSeeds: [Address] = []

    public init(address: Address, username: String? = nil, password: String? = nil, database: Int = 0) {
        self.address = address
        self.username = username
        self.password = password
        self.database = database
    }

    /// Every seed node of a cluster (`address` first); for a single Redis, its address.
    public var seeds: [Address] { [address] + moreSeeds }

    /// The same credentials at another address (a cluster node), database 0, not itself a cluster endpoint.
    public func node(_ address: Address) -> RedisEndpoint {
        RedisEndpoint(address: address, username: username, password: password, database: 0)
    }

    /// Parses `url` in phases: the scheme, the credentials, then what the scheme puts after them (a socket path
    /// and `?db=`; a host, port and `/DB`; or a list of seed nodes).
    public init(parsing url: String) throws(RedisError) {
        let bad: Failure = { RedisError(.badURL, "\($0) in \"\(RedisEndpoint.redacted(url))\"") }
        let (scheme, afterScheme) = try Self.splitScheme(url, bad)
        let (username, password, rest) = try Self.splitCredentials(afterScheme, pathFollows: scheme == .unix, bad)
        switch scheme {
        case .unix:
            let (path, database) = try Self.parseUnixPath(rest, bad)
            self.init(address: .unix(path: path), username: username, password: password, database: database)
        case .redis:
            let (hostPort, database) = try Self.splitDatabase(rest, bad)
            self.init(address: try Self.parseHostPort(hostPort, bad), username: username, password: password,
                      database: database)
        case .cluster:
            let (hostPort, database) = try Self.splitDatabase(rest, bad)
            guard database == 0 else { throw bad("a Redis Cluster has database 0 only") }
            var addresses: [Address] = []
            for part in hostPort.split(separator: ",", omittingEmptySubsequences: false) {
                addresses.append(try Self.parseHostPort(part, bad))
            }
            guard let first = addresses.first, addresses.count <= 64 else { throw bad("expected 1 to 64 seed nodes") }
            self.init(address: first, username: username, password: password, database: 0)
            cluster = true
            moreSeeds = Array(addresses.dropFirst())
        }
    }

    /// Makes the error for a URL that does not parse, saying why.
    private typealias Failure = (String) -> RedisError
    private enum Scheme { case redis, cluster, unix }

    private static func splitScheme(_ url: String, _ bad: Failure) throws(RedisError) -> (Scheme, Substring) {
        for (prefix, scheme) in [("redis://", Scheme.redis), ("redis-cluster://", .cluster), ("unix://", .unix)]
        where url.hasPrefix(prefix) {
            return (scheme, url.dropFirst(prefix.count))
        }
        throw bad("expected redis://HOST:PORT[/DB], redis-cluster://HOST:PORT[,HOST:PORT...] or unix:///PATH")
    }

    /// `[[USER]:PASSWORD@]`, percent-decoded, and what follows it. Userinfo ends at the last "@" before the path (a
    /// password may hold "@" only percent-encoded, but be lenient).
    private static func splitCredentials(_ text: Substring, pathFollows: Bool, _ bad: Failure) throws(RedisError)
        -> (username: String?, password: String?, rest: Substring) {
        let pathStart = pathFollows ? text.firstIndex(of: "/") : nil
        guard let at = text[..<(pathStart ?? text.endIndex)].lastIndex(of: "@") else { return (nil, nil, text) }
        let info = text[..<at]
        let rest = text[text.index(after: at)...]
        guard let colon = info.firstIndex(of: ":") else {
            guard let p = percentDecoded(info) else { throw bad("bad percent-encoding in the credentials") }
            return (nil, p, rest)  // redis://secret@host, as redis-cli -u reads it
        }
        let user = info[..<colon]
        guard let u = percentDecoded(user), let p = percentDecoded(info[info.index(after: colon)...]) else {
            throw bad("bad percent-encoding in the credentials")
        }
        return (user.isEmpty ? nil : u, p, rest)
    }

    /// `/PATH[?db=DB]`.
    private static func parseUnixPath(_ text: Substring, _ bad: Failure) throws(RedisError) -> (String, Int) {
        var path = text
        var database = 0
        if let q = text.firstIndex(of: "?") {
            path = text[..<q]
            let query = text[text.index(after: q)...]
            guard query.hasPrefix("db="), let n = Int(query.dropFirst(3)), n >= 0 else { throw bad("expected ?db=N") }
            database = n
        }
        guard path.hasPrefix("/"), path.utf8.count < 108 else { throw bad("expected an absolute socket path under 108 bytes") }
        return (String(path), database)
    }

    /// `HOST[:PORT][,…]` and the database number after a `/` (0 when none).
    private static func splitDatabase(_ text: Substring, _ bad: Failure) throws(RedisError) -> (Substring, Int) {
        guard let slash = text.firstIndex(of: "/") else { return (text, 0) }
        let db = text[text.index(after: slash)...]
        guard !db.isEmpty else { return (text[..<slash], 0) }
        guard let n = Int(db), n >= 0 else { throw bad("expected a database number after /") }
        return (text[..<slash], n)
    }

    /// `HOST[:PORT]` or `[IPv6][:PORT]`; checked now, so a typo fails at startup rather than at every reconnect.
    private static func parseHostPort(_ hostPort: Substring, _ bad: Failure) throws(RedisError) -> Address {
        var host = hostPort
        var port: UInt16 = 6379
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else { throw bad("unclosed [") }
            host = hostPort[...close]
            let after = hostPort[hostPort.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":"), let p = UInt16(after.dropFirst()), p > 0 else { throw bad("bad port") }
                port = p
            }
        } else if let colon = hostPort.lastIndex(of: ":") {
            host = hostPort[..<colon]
            guard let p = UInt16(hostPort[hostPort.index(after: colon)...]), p > 0 else { throw bad("bad port") }
            port = p
        }
        guard !host.isEmpty else { throw bad("no host") }
        let address = Address.tcp(host: String(host), port: port)
        guard (try? RedisEndpoint(address: address).socketAddress()) != nil else {
            throw bad("expected an IPv4 or [IPv6] literal or localhost as the host")
        }
        return address
    }

    /// The address to connect to.
    public func socketAddress() throws(RedisError) -> SocketAddress {
        do {
            switch address {
            case .tcp(let host, let port): return try SocketAddress(parsing: "\(host):\(port)")
            case .unix(let path): return try SocketAddress(unixPath: path)
            }
        } catch {
            throw RedisError(.badURL, "bad Redis address in \(self): \(error)")
        }
    }

    /// The URL without its password, for logs.
    public var description: String {
        let auth = password == nil ? "" : "\(username ?? ""):***@"
        if cluster {
            let nodes = seeds.map { address -> String in
                switch address {
                case .tcp(let host, let port): return "\(host):\(port)"
                case .unix(let path): return path
                }
            }
            return "redis-cluster://\(auth)" + nodes.joined(separator: ",")
        }
        switch address {
        case .tcp(let host, let port): return "redis://\(auth)\(host):\(port)/\(database)"
        case .unix(let path): return "unix://\(auth)\(path)?db=\(database)"
        }
    }

    /// A URL with its credentials masked (for errors about a URL that did not parse).
    static func redacted(_ url: String) -> String {
        let scheme = ["redis://", "redis-cluster://", "unix://"].first { url.hasPrefix($0) } ?? ""
        let rest = url.dropFirst(scheme.count)
        guard let at = rest.lastIndex(of: "@") else { return url }
        return scheme + "***@" + String(rest[rest.index(after: at)...])
    }

    private static func percentDecoded(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var i = text.utf8.startIndex
        let utf8 = text.utf8
        while i != utf8.endIndex {
            let b = utf8[i]
            if b == UInt8(ascii: "%") {
                let h1 = utf8.index(after: i)
                guard h1 != utf8.endIndex else { return nil }
                let h2 = utf8.index(after: h1)
                guard h2 != utf8.endIndex else { return nil }
                let hi = JSONScanner.hexValue(utf8[h1]), lo = JSONScanner.hexValue(utf8[h2])
                guard hi < 16, lo < 16 else { return nil }
                bytes.append(hi << 4 | lo)
                i = utf8.index(after: h2)
            } else {
                bytes.append(b)
                i = utf8.index(after: i)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }
}
