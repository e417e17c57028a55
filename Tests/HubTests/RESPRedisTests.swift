import Foundation
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
#if canImport(Glibc)
import Glibc
#endif

/// The outside peer `redis-server` (Debian's, 7.x). `scripts/test` installs it with apt when it is missing and sets
/// `HUB_TEST_REQUIRE_PEERS=1`, which makes its absence a failure; a plain `swift test` on a machine without it
/// disables these tests (reported as skipped). Each test starts its own server on a Unix socket in a fresh
/// temporary directory (no TCP port, no persistence) and kills it by its pid.
enum RedisPeer {
    static let required = ProcessInfo.processInfo.environment["HUB_TEST_REQUIRE_PEERS"] == "1"

    /// `redis-server` on PATH (or `HUB_REDIS_SERVER`), if executable.
    static let executable: String? = {
        if let explicit = ProcessInfo.processInfo.environment["HUB_REDIS_SERVER"] {
            return access(explicit, X_OK) == 0 ? explicit : nil
        }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for dir in path.split(separator: ":") {
            let candidate = "\(dir)/redis-server"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return access("/usr/bin/redis-server", X_OK) == 0 ? "/usr/bin/redis-server" : nil
    }()

    static let enabled = required || executable != nil
    static let skipReason: Comment = "redis-server is not installed (scripts/test installs Debian's redis-server and sets HUB_TEST_REQUIRE_PEERS=1, which makes its absence a failure)"
}

/// One `redis-server` of a test: Unix socket only, no RDB/AOF, in its own temporary directory (or in `directory`,
/// which a test passes to start a server again at the same socket path; that directory is the test's to remove).
final class RedisServer {
    let directory: String
    let socketPath: String
    let process: InteropProcess
    private let ownsDirectory: Bool

    init(directory: String? = nil, arguments: [String] = []) throws {
        guard let executable = RedisPeer.executable else {
            throw HubTestError("HUB_TEST_REQUIRE_PEERS=1 but there is no redis-server (Debian: apt-get install redis-server; scripts/test does)")
        }
        if let directory {
            self.directory = directory
            ownsDirectory = false
        } else {
            self.directory = try makeRedisDirectory()
            ownsDirectory = true
        }
        socketPath = self.directory + "/redis.sock"
        process = try InteropProcess(executable, [
            "--port", "0", "--unixsocket", socketPath, "--unixsocketperm", "700",
            "--save", "", "--appendonly", "no", "--dir", self.directory, "--daemonize", "no",
        ] + arguments)
        let up = eventually(timeout: 10) { [socketPath, process] in
            guard process.process.isRunning, let fd = try? unixConnect(socketPath) else { return false }
            close(fd)
            return true
        }
        guard up else {
            process.kill()
            throw HubTestError("redis-server did not come up on \(socketPath)\n\(process.summary)")
        }
    }

    deinit {
        process.kill()
        if ownsDirectory { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// SIGKILL (as a crash), then the socket file is gone so nothing can connect until a new server binds.
    func crash() {
        process.kill()
        unlink(socketPath)
    }

    func connect() throws -> RESPTestConnection { try RESPTestConnection(socketPath) }
}

/// A fresh temporary directory for a Redis server's socket.
func makeRedisDirectory() throws -> String {
    var template = Array("/tmp/hub-redis-XXXXXX".utf8CString)
    guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
        throw HubTestError("mkdtemp failed: errno \(errno)")
    }
    return String(cString: made)
}

/// A blocking connection to Redis that decodes with the hub's `RESPDecoder`, reading in whatever pieces the kernel
/// hands out. Every read is bounded (5 s receive timeout).
final class RESPTestConnection {
    let fd: Int32
    private var decoder = RESPDecoder()
    private var held: [UInt8] = []
    private(set) var reads = 0

    init(_ path: String) throws {
        fd = try unixConnect(path)
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(fd) }

    func send(_ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw HubTestError("send to redis failed: errno \(errno)") }
            sent += n
        }
    }

    func send(_ arguments: [String]) throws { try send(RESPEncoder.command(arguments)) }

    /// The next value; reads until one is complete.
    func read() throws -> RESPValue {
        while true {
            if !held.isEmpty {
                let next = try held.withUnsafeBytes { try decoder.next(in: $0, from: 0) }
                switch next {
                case .value(let value, let after):
                    held.removeFirst(after)
                    return value
                case .incomplete(let keep):
                    held.removeFirst(keep)
                }
            }
            var chunk = [UInt8](repeating: 0, count: 65_536)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw HubTestError("redis closed or timed out (recv \(n), errno \(errno))") }
            reads += 1
            held += chunk[0..<n]
        }
    }

    func call(_ arguments: [String]) throws -> RESPValue {
        try send(arguments)
        return try read()
    }
}

/// A map's value for a string key.
private func lookup(_ map: RESPValue, _ key: String) -> RESPValue? {
    guard case .map(let items) = map else { return nil }
    var i = 0
    while i + 1 < items.count {
        if items[i].string == key { return items[i + 1] }
        i += 2
    }
    return nil
}

@Suite("RESP against a real redis-server", .serialized)
struct RESPRedisTests {
    @Test(.enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func resp2RepliesOfEveryShape() throws {
        let redis = try RedisServer()
        let c = try redis.connect()
        #expect(try c.call(["PING"]) == .simple("PONG"))
        #expect(try c.call(["SET", "k", "v"]) == .simple("OK"))
        #expect(try c.call(["GET", "k"]) == .bulk(Array("v".utf8)))
        #expect(try c.call(["GET", "missing"]) == .null)  // RESP2 null bulk, $-1
        #expect(try c.call(["INCRBY", "n", "-9223372036854775807"]) == .integer(-9_223_372_036_854_775_807))
        let error = try c.call(["NO-SUCH-COMMAND"])
        #expect(error.isError)
        #expect(error.string == nil)
        #expect(try c.call(["RPUSH", "list", "a", "", "c"]) == .integer(3))
        #expect(try c.call(["LRANGE", "list", "0", "-1"]) == .array([.bulk(Array("a".utf8)), .bulk([]), .bulk(Array("c".utf8))]))
        // A nested reply from a Lua script (a table of mixed types), and a script error.
        #expect(try c.call(["EVAL", "return {1, 'two', {3, 'four'}, redis.status_reply('ok')}", "0"])
            == .array([.integer(1), .bulk(Array("two".utf8)), .array([.integer(3), .bulk(Array("four".utf8))]), .simple("ok")]))
        #expect(try c.call(["EVAL", "return redis.error_reply('MYERR boom')", "0"]) == .error("MYERR boom"))
    }

    @Test(.enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func resp3HelloMapsAndDoubles() throws {
        let redis = try RedisServer()
        let c = try redis.connect()
        let hello = try c.call(["HELLO", "3"])
        #expect(lookup(hello, "server")?.string == "redis")
        #expect(lookup(hello, "proto") == .integer(3))
        #expect(lookup(hello, "version")?.string?.hasPrefix("7.") == true, "\(hello)")
        #expect(try c.call(["GET", "missing"]) == .null)  // RESP3 null, _
        #expect(try c.call(["HSET", "h", "f", "1"]) == .integer(1))
        #expect(try c.call(["HGETALL", "h"]) == .map([.bulk(Array("f".utf8)), .bulk(Array("1".utf8))]))
        #expect(try c.call(["ZADD", "z", "1.5", "m"]) == .integer(1))
        #expect(try c.call(["ZSCORE", "z", "m"]) == .double(1.5))
        #expect(try c.call(["SISMEMBER", "nope", "x"]) == .integer(0))
        // RESP3 types a Lua script can return: double, big number, map.
        #expect(try c.call(["EVAL", "redis.setresp(3); return {double=3.5}", "0"]) == .double(3.5))
        #expect(try c.call(["EVAL", "redis.setresp(3); return {big_number='123456789012345678901234567890'}", "0"])
            == .bigNumber("123456789012345678901234567890"))
        #expect(try c.call(["EVAL", "redis.setresp(3); return {map={a=1}}", "0"]) == .map([.bulk(Array("a".utf8)), .integer(1)]))
    }

    /// What the cluster broker will use: a stream as history and pub/sub for fan-out, with binary payloads.
    @Test(.enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func streamsAndPushMessages() throws {
        let redis = try RedisServer()
        let publisher = try redis.connect()
        let subscriber = try redis.connect()
        _ = try subscriber.call(["HELLO", "3"])
        let confirmation = try subscriber.call(["SUBSCRIBE", "events"])
        #expect(confirmation == .push([.bulk(Array("subscribe".utf8)), .bulk(Array("events".utf8)), .integer(1)]))

        // Payloads with CRLF, NUL and bytes that are not UTF-8, one of 1 MiB: pipelined, then read back in order.
        let payloads: [[UInt8]] = [Array("{\"seq\":1}".utf8), [0x0D, 0x0A, 0x00, 0xFF, 0x2A], Array(repeating: 0x41, count: 1 << 20)]
        var pipeline: [UInt8] = []
        for p in payloads {
            RESPEncoder.appendArrayHeader(3, to: &pipeline)
            RESPEncoder.appendBulk("PUBLISH", to: &pipeline)
            RESPEncoder.appendBulk("events", to: &pipeline)
            RESPEncoder.appendBulk(p, to: &pipeline)
        }
        for p in payloads {
            RESPEncoder.appendArrayHeader(5, to: &pipeline)
            for part in ["XADD", "history", "*", "frame"] { RESPEncoder.appendBulk(part, to: &pipeline) }
            RESPEncoder.appendBulk(p, to: &pipeline)
        }
        try publisher.send(pipeline)
        for _ in payloads { #expect(try publisher.read() == .integer(1)) }  // one subscriber each
        var ids: [String] = []
        for _ in payloads {
            let id = try publisher.read()
            #expect(id.string?.contains("-") == true, "\(id)")
            ids.append(id.string ?? "")
        }
        for p in payloads {
            #expect(try subscriber.read() == .push([.bulk(Array("message".utf8)), .bulk(Array("events".utf8)), .bulk(p)]))
        }
        #expect(subscriber.reads > 1, "the 1 MiB message arrives in several reads")

        let range = try publisher.call(["XRANGE", "history", "-", "+"])
        let expected: [RESPValue] = zip(ids, payloads).map { id, p in
            .array([.bulk(Array(id.utf8)), .array([.bulk(Array("frame".utf8)), .bulk(p)])])
        }
        #expect(range == .array(expected))
    }
}
