import Foundation
import Synchronization
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport
#if canImport(Glibc)
import Glibc
#endif

@Suite("Redis endpoint and backoff")
struct RedisEndpointTests {
    @Test func validURLs() throws {
        let cases: [(String, RedisEndpoint)] = [
            ("redis://127.0.0.1:6380", RedisEndpoint(address: .tcp(host: "127.0.0.1", port: 6380))),
            ("redis://localhost", RedisEndpoint(address: .tcp(host: "localhost", port: 6379))),
            ("redis://127.0.0.1:6379/3", RedisEndpoint(address: .tcp(host: "127.0.0.1", port: 6379), database: 3)),
            ("redis://[::1]:7000/1", RedisEndpoint(address: .tcp(host: "[::1]", port: 7000), database: 1)),
            ("redis://:s3cret@127.0.0.1:6379", RedisEndpoint(address: .tcp(host: "127.0.0.1", port: 6379), password: "s3cret")),
            ("redis://s3cret@127.0.0.1", RedisEndpoint(address: .tcp(host: "127.0.0.1", port: 6379), password: "s3cret")),
            ("redis://hub:p%40ss%3Aw@127.0.0.1:6379/2",
             RedisEndpoint(address: .tcp(host: "127.0.0.1", port: 6379), username: "hub", password: "p@ss:w", database: 2)),
            ("unix:///run/redis/redis.sock", RedisEndpoint(address: .unix(path: "/run/redis/redis.sock"))),
            ("unix://:pw@/tmp/r.sock?db=5", RedisEndpoint(address: .unix(path: "/tmp/r.sock"), password: "pw", database: 5)),
        ]
        for (url, expected) in cases {
            #expect(try RedisEndpoint(parsing: url) == expected, "\(url)")
        }
    }

    @Test func invalidURLsFailWithoutShowingThePassword() {
        let cases = [
            "http://127.0.0.1:6379", "redis://", "redis://127.0.0.1:0", "redis://127.0.0.1:70000", "redis://127.0.0.1:x",
            "redis://redis.example.com:6379", "redis://127.0.0.1/-1", "redis://127.0.0.1/a", "redis://[::1",
            "unix://relative.sock", "unix:///tmp/r.sock?db=x", "redis://:p%zz@127.0.0.1",
            "redis://:topsecret@bad-host:6379",
        ]
        for url in cases {
            var thrown: RedisError? = nil
            do { _ = try RedisEndpoint(parsing: url) } catch { thrown = error }
            #expect(thrown?.kind == .badURL, "\(url)")
            #expect(thrown?.message.contains("topsecret") == false, "\(url): \(String(describing: thrown))")
        }
    }

    @Test func descriptionHidesThePassword() throws {
        let e = try RedisEndpoint(parsing: "redis://hub:topsecret@127.0.0.1:6379/2")
        #expect(e.description == "redis://hub:***@127.0.0.1:6379/2")
        #expect(!e.description.contains("topsecret"))
    }

    @Test func backoffDoublesToItsCapWithJitterInTheUpperHalf() {
        let b = RedisBackoff(initial: .milliseconds(100), maximum: .seconds(5))
        let ceilings = (1...10).map { b.ceiling(attempt: $0) }
        #expect(ceilings == [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000].map { Duration.milliseconds($0) })
        var rng = SystemRandomNumberGenerator()
        var distinct = Set<Duration>()
        for attempt in 1...10 {
            for _ in 0..<200 {
                let d = b.delay(attempt: attempt, using: &rng)
                #expect(d >= ceilings[attempt - 1] / 2 && d <= ceilings[attempt - 1])
                distinct.insert(d)
            }
        }
        #expect(distinct.count > 100, "jittered")
    }
}

/// A `RedisConnection` (or, with `cluster:`, a `RedisClusterClient`) on its own event loop (10 ms timer ticks), driven
/// from the test thread. The connection is
/// only touched on the loop thread; what it reports is collected under a lock. Closures that run on the loop hold
/// the connection's box and the collected reports, never this object, so its last release (which stops and joins
/// the loop) always happens on the test's thread. (They used to hold it weakly, but `self?.…` holds it strongly for
/// the call: when the test dropped it at that instant, deinit ran on the loop thread and its `submitAndWait` trapped,
/// seen once in scripts/test.)
final class RedisOnLoop: @unchecked Sendable {
    let loop: EventLoop
    private final class Box: @unchecked Sendable { var redis: (any RedisLink)? = nil }  // loop thread only
    private let box = Box()
    private final class Recorded: Sendable {
        let events = Mutex<[String]>([])
        let pushes = Mutex<[RESPValue]>([])
    }
    private let recorded = Recorded()

    /// `cluster`: a `RedisClusterClient` (a subscriber link if `subscriber`) on `endpoint`'s seeds.
    init(_ endpoint: RedisEndpoint, backoff: RedisBackoff = RedisBackoff(initial: .milliseconds(20), maximum: .milliseconds(200)),
         onReady: [String]? = nil, cluster: Bool = false, subscriber: Bool = false) throws {
        let loop = try EventLoop(configuration: testLoopConfiguration(tickMillis: 10))
        self.loop = loop
        let box = box
        let recorded = recorded
        try loop.submitAndWait {
            let r: any RedisLink = cluster
                ? RedisClusterClient(endpoint: endpoint, loop: loop, subscriber: subscriber, backoff: backoff)
                : RedisConnection(endpoint: endpoint, loop: loop, backoff: backoff)
            // The connection's callbacks hold only what they record into, never this object (see the type's comment).
            r.onReady = { [weak r] in
                recorded.events.withLock { $0.append("ready") }
                if let onReady, let r {
                    r.subscribe(onReady) { error in recorded.events.withLock { $0.append("subscribed: \(error.map { "\($0)" } ?? "ok")") } }
                }
            }
            r.onDown = { error in recorded.events.withLock { $0.append("down \(error.kind.rawValue): \(error.message)") } }
            r.onPush = { value in recorded.pushes.withLock { $0.append(value) } }
            box.redis = r
            r.start()
        }
    }

    deinit {
        let box = box
        _ = try? loop.submitAndWait { box.redis?.close(); box.redis = nil }
        loop.stop()
        loop.join()
    }

    /// Connected to `server` over its Unix socket and ready (HELLO done), or a thrown error saying what happened.
    static func ready(_ server: RedisServer, timeout: Double = 10) throws -> RedisOnLoop {
        let r = try RedisOnLoop(RedisEndpoint(address: .unix(path: server.socketPath)))
        guard r.waitFor(timeout, { r.readyCount == 1 }) else { throw HubTestError("not ready after \(timeout) s: \(r.log)") }
        return r
    }

    var log: [String] { recorded.events.withLock { $0 } }
    var readyCount: Int { log.filter { $0 == "ready" }.count }
    var pushed: [RESPValue] { recorded.pushes.withLock { $0 } }

    func state() throws -> RedisConnection.State {
        let box = box
        return try loop.submitAndWait { box.redis?.state ?? .closed }
    }

    func inFlight() throws -> Int {
        let box = box
        return try loop.submitAndWait { (box.redis as? RedisConnection)?.inFlight ?? -1 }
    }

    /// Sends the commands back to back (pipelined, in one loop turn) and waits up to `timeout` for every reply.
    func call(_ commands: [[String]], timeout: Double = 10) throws -> [Result<RESPValue, RedisError>] {
        let replies = Mutex<[Int: Result<RESPValue, RedisError>]>([:])
        let done = DispatchSemaphore(value: 0)
        let count = commands.count
        let box = box
        loop.execute {
            for (i, command) in commands.enumerated() {
                box.redis?.send(command) { result in
                    let finished = replies.withLock { r -> Bool in
                        r[i] = result
                        return r.count == count
                    }
                    if finished { done.signal() }
                }
            }
        }
        guard done.wait(timeout: .now() + timeout) == .success else {
            throw HubTestError("\(replies.withLock { $0.count }) of \(count) replies after \(timeout) s; log: \(log)")
        }
        return replies.withLock { r in (0..<count).map { r[$0]! } }
    }

    func call(_ command: [String], timeout: Double = 10) throws -> Result<RESPValue, RedisError> {
        try call([command], timeout: timeout)[0]
    }

    /// Sends `command` and returns without waiting; its reply is recorded in `log` as "reply: …".
    func sendAndRecord(_ command: [String]) {
        let box = box
        let recorded = recorded
        loop.execute {
            box.redis?.send(command) { result in
                recorded.events.withLock { $0.append("reply: \(result)") }
            }
        }
    }

    /// Runs `body` on the loop with the connection; it calls its second argument once with a result, which this
    /// returns (after at most `timeout` seconds).
    func onLoop<T: Sendable>(timeout: Double = 10, _ body: @escaping @Sendable (any RedisLink, @escaping (T) -> Void) -> Void) throws -> T {
        let result = Mutex<T?>(nil)
        let done = DispatchSemaphore(value: 0)
        let box = box
        loop.execute {
            guard let redis = box.redis else { return }
            body(redis) { value in
                result.withLock { $0 = value }
                done.signal()
            }
        }
        guard done.wait(timeout: .now() + timeout) == .success, let value = result.withLock({ $0 }) else {
            throw HubTestError("no result after \(timeout) s; log: \(log)")
        }
        return value
    }

    func waitFor(_ timeout: Double = 10, _ condition: () throws -> Bool) rethrows -> Bool {
        try eventually(timeout: timeout, condition)
    }
}

@Suite("Redis connection against a real redis-server", .serialized)
struct RedisConnectionTests {
    private func unix(_ server: RedisServer, password: String? = nil, database: Int = 0) -> RedisEndpoint {
        RedisEndpoint(address: .unix(path: server.socketPath), password: password, database: database)
    }

    @Test("connects with HELLO 3, pipelines 10 000 commands with replies in order, reports error replies",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func pipelining() throws {
        let server = try RedisServer()
        let r = try RedisOnLoop(unix(server))
        #expect(r.waitFor { r.readyCount == 1 }, "\(r.log)")
        #expect(try r.state() == .ready)
        let replies = try r.call((0..<10_000).map { _ in ["INCR", "n"] })
        #expect(replies.map { try? $0.get() } == (1...10_000).map { RESPValue.integer(Int64($0)) })
        let error = try r.call(["NO-SUCH-COMMAND"])
        guard case .failure(let e) = error else { Issue.record("expected an error, got \(error)"); return }
        #expect(e.kind == .server)
        #expect(e.message.hasPrefix("ERR unknown command"), "\(e)")
        // RESP3 after HELLO 3: a hash is a map.
        _ = try r.call(["HSET", "h", "f", "v"])
        #expect(try r.call(["HGETALL", "h"]).get() == .map([.bulk(Array("f".utf8)), .bulk(Array("v".utf8))]))
    }

    @Test("a connection owing replies that hears nothing is closed by closeIfStalled, fails what it owed, and reconnects",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func stall() throws {
        let server = try RedisServer()
        let r = try RedisOnLoop(unix(server))
        #expect(r.waitFor { r.readyCount == 1 }, "\(r.log)")
        let pid = server.process.process.processIdentifier
        // Nothing owed: never stalled, however quiet.
        #expect(try r.onLoop { redis, done in done(redis.closeIfStalled(after: .milliseconds(1))) } == false)
        kill(pid, SIGSTOP)  // Redis hangs: no error on the socket, just silence
        defer { kill(pid, SIGCONT) }
        r.sendAndRecord(["PING"])
        usleep(100_000)
        #expect(try r.onLoop { redis, done in done(redis.closeIfStalled(after: .seconds(5))) } == false, "closed before its time")
        #expect(eventually(timeout: 5) { (try? r.onLoop { redis, done in done(redis.closeIfStalled(after: .milliseconds(200))) }) == true })
        #expect(r.waitFor { r.log.contains { $0.hasPrefix("reply: failure") && $0.contains("connectionLost") } }, "\(r.log)")
        #expect(r.log.contains { $0.contains("no reply from") }, "\(r.log)")
        kill(pid, SIGCONT)
        #expect(r.waitFor { r.readyCount == 2 }, "did not reconnect: \(r.log)")
        #expect(try r.call(["PING"]).get() == .simple("PONG"))
    }

    @Test("over TCP: a refused connect is retried, and once Redis listens the connection is ready",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func tcp() throws {
        let port = try freeLoopbackPort()
        let r = try RedisOnLoop(try RedisEndpoint(parsing: "redis://127.0.0.1:\(port)"))
        #expect(r.waitFor { r.log.filter { $0.hasPrefix("down unavailable") && $0.contains("refused") }.count >= 2 }, "\(r.log)")
        let server = try RedisServer(arguments: ["--port", String(port), "--bind", "127.0.0.1"])
        #expect(r.waitFor(5) { r.readyCount == 1 }, "\(r.log)")
        #expect(try r.call(["PING"]).get() == .simple("PONG"))
        _ = server
    }

    @Test("a refused SUBSCRIBE is an error reply for that subscribe alone: replies after it stay matched",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func refusedSubscription() throws {
        let server = try RedisServer()
        let admin = try RedisOnLoop(unix(server))
        #expect(admin.waitFor { admin.readyCount == 1 })
        _ = try admin.call(["ACL", "SETUSER", "limited", "on", ">pw", "~*", "resetchannels", "&allowed", "+@all"]).get()
        let r = try RedisOnLoop(RedisEndpoint(address: .unix(path: server.socketPath), username: "limited", password: "pw"))
        #expect(r.waitFor { r.readyCount == 1 }, "\(r.log)")
        let outcome: [String] = try r.onLoop { redis, done in
            var seen: [String] = []
            func note(_ s: String) {
                seen.append(s)
                if seen.count == 4 { done(seen) }
            }
            redis.subscribe(["SUBSCRIBE", "forbidden"]) { note("forbidden: \($0.map { "\($0.kind.rawValue) \($0.message)" } ?? "ok")") }
            redis.send(["PING"]) { note("ping: \((try? $0.get().string) ?? "failed")") }
            redis.subscribe(["SUBSCRIBE", "allowed"]) { note("allowed: \($0.map { "\($0)" } ?? "ok")") }
            redis.send(["ECHO", "after"]) { note("echo: \((try? $0.get().string) ?? "failed")") }
        }
        #expect(outcome.count == 4)
        #expect(outcome[0].hasPrefix("forbidden: server NOPERM"), "\(outcome)")
        #expect(outcome[1] == "ping: PONG", "\(outcome)")
        #expect(outcome[2] == "allowed: ok")
        #expect(outcome[3] == "echo: after", "\(outcome)")
        #expect(try r.state() == .ready, "a refusal does not drop the connection")
    }

    @Test("SELECT puts the connection in its database", .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func database() throws {
        let server = try RedisServer()
        let db3 = try RedisOnLoop(unix(server, database: 3))
        let db0 = try RedisOnLoop(unix(server))
        #expect(db3.waitFor { db3.readyCount == 1 && db0.readyCount == 1 })
        _ = try db3.call(["SET", "k", "in-3"])
        #expect(try db3.call(["GET", "k"]).get() == .bulk(Array("in-3".utf8)))
        #expect(try db0.call(["GET", "k"]).get() == .null)
        #expect(try db3.call(["CLIENT", "INFO"]).get().string?.contains("db=3") == true)
    }

    @Test("a password: refused without it or with a wrong one (retried with backoff), accepted when right",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func authentication() throws {
        let server = try RedisServer(arguments: ["--requirepass", "s3cret"])
        let none = try RedisOnLoop(unix(server))
        let wrong = try RedisOnLoop(unix(server, password: "nope"))
        let right = try RedisOnLoop(unix(server, password: "s3cret"))
        #expect(right.waitFor { right.readyCount == 1 }, "\(right.log)")
        #expect(try right.call(["PING"]).get() == .simple("PONG"))
        #expect(none.waitFor { none.log.filter { $0.hasPrefix("down handshake") }.count >= 2 }, "retried: \(none.log)")
        #expect(none.log.contains { $0.contains("NOAUTH") || $0.contains("HELLO 3 refused") }, "\(none.log)")
        #expect(wrong.waitFor { wrong.log.contains { $0.contains("WRONGPASS") } }, "\(wrong.log)")
        #expect(none.readyCount == 0 && wrong.readyCount == 0)
        #expect(!wrong.log.joined().contains("nope"), "the password is never in a message")
        guard case .failure(let e) = try wrong.call(["PING"]) else { Issue.record("PING went through without auth"); return }
        #expect(e.kind == .unavailable)
    }

    @Test("Redis down: commands fail at once with unavailable; it connects as soon as Redis is there",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func unavailableThenUp() throws {
        let directory = try makeRedisDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let r = try RedisOnLoop(RedisEndpoint(address: .unix(path: directory + "/redis.sock")))
        #expect(r.waitFor { r.log.filter { $0.hasPrefix("down unavailable") }.count >= 3 }, "retrying: \(r.log)")
        let started = Date()
        guard case .failure(let e) = try r.call(["PING"]) else { Issue.record("PING without Redis"); return }
        #expect(e.kind == .unavailable)
        #expect(Date().timeIntervalSince(started) < 1, "fails fast")
        let server = try RedisServer(directory: directory)
        #expect(r.waitFor(5) { r.readyCount == 1 }, "up within the backoff cap: \(r.log)")
        #expect(try r.call(["PING"]).get() == .simple("PONG"))
        _ = server
    }

    @Test("Redis killed mid-command: the command gets connectionLost, the connection comes back and resubscribes",
          .enabled(if: RedisPeer.enabled, RedisPeer.skipReason))
    func lostAndBack() throws {
        let directory = try makeRedisDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var server: RedisServer? = try RedisServer(directory: directory)
        let endpoint = RedisEndpoint(address: .unix(path: directory + "/redis.sock"))
        let subscriber = try RedisOnLoop(endpoint, onReady: ["SUBSCRIBE", "events"])
        let r = try RedisOnLoop(endpoint)
        #expect(r.waitFor { r.readyCount == 1 && subscriber.readyCount == 1 })
        #expect(subscriber.waitFor { subscriber.pushed.count == 1 })
        #expect(try r.call(["PUBLISH", "events", "one"]).get() == .integer(1))
        #expect(subscriber.waitFor { subscriber.pushed.count == 2 })

        r.sendAndRecord(["BLPOP", "never", "30"])  // blocks in Redis
        #expect(r.waitFor { (try? r.inFlight()) == 1 })
        usleep(100_000)  // Redis reads it and blocks
        server?.crash()
        server = nil
        #expect(r.waitFor { r.log.contains { $0.hasPrefix("reply: failure") && $0.contains("connectionLost") } }, "\(r.log)")
        #expect(r.waitFor { r.log.contains { $0.hasPrefix("down connectionLost") } }, "\(r.log)")

        server = try RedisServer(directory: directory)
        #expect(r.waitFor(5) { r.readyCount == 2 && subscriber.readyCount == 2 }, "\(r.log) \(subscriber.log)")
        #expect(subscriber.waitFor { subscriber.pushed.count == 3 }, "subscribed again: \(subscriber.pushed)")
        #expect(try r.call(["PUBLISH", "events", "two"]).get() == .integer(1))
        #expect(subscriber.waitFor { subscriber.pushed.count == 4 })
        #expect(subscriber.pushed.compactMap { $0.elements?.first?.string } == ["subscribe", "message", "subscribe", "message"])
        #expect(subscriber.pushed.last == .push([.bulk(Array("message".utf8)), .bulk(Array("events".utf8)), .bulk(Array("two".utf8))]))
    }
}

/// A TCP port on 127.0.0.1 that nothing listened on a moment ago (bound to port 0, then closed).
func freeLoopbackPort() throws -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else { throw HubTestError("cannot bind 127.0.0.1:0: errno \(errno)") }
    return UInt16(bigEndian: address.sin_port)
}
