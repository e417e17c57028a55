import Glibc
import Synchronization
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// Blocking loopback client helpers for engine tests. Every socket gets 10 s send/receive timeouts
/// so a broken engine fails a test instead of hanging it.
enum TestClient {
    static func connect(port: Int, host: String = "127.0.0.1") -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        precondition(fd >= 0)
        var tv = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_port = UInt16(port).bigEndian
        inet_pton(AF_INET, host, &sin.sin_addr)
        let rc = withUnsafePointer(to: &sin) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        precondition(rc == 0, "connect failed: errno \(errno)")
        return fd
    }

    static func connectUnix(path: String) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var tv = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: Array(path.utf8))
            raw[path.utf8.count] = 0
        }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        precondition(rc == 0, "unix connect failed: errno \(errno)")
        return fd
    }

    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + off, bytes.count - off) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            off += n
        }
        return true
    }

    /// Reads exactly `count` bytes, or returns what it got before EOF/timeout.
    static func read(_ fd: Int32, count: Int) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: count)
        var off = 0
        while off < count {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + off, count - off) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            off += n
        }
        return Array(buffer[..<off])
    }

    /// Reads until EOF (or timeout / `limit`).
    static func readToEnd(_ fd: Int32, limit: Int = 64 << 20) -> [UInt8] {
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while result.count < limit {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress!, 65536) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            result.append(contentsOf: chunk[..<n])
        }
        return result
    }

    static func pattern(_ count: Int, seed: UInt8) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            for i in 0..<count { buffer[i] = UInt8(truncatingIfNeeded: i &* 31 &+ Int(seed) &+ (i >> 11)) }
            initialized = count
        }
    }
}

/// A mutable box the tests hand to loop jobs; only touched on the loop thread (or after a
/// `submitAndWait` hand-off), which is why `@unchecked` is sound here.
final class LoopBox<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

/// Echoes length-prefixed frames (4-byte big-endian length + payload) but only whole frames, so
/// partial frames stay unconsumed and exercise the engine's spill path.
final class FramedEchoHandler: ConnectionHandler {
    func connectionReadable(_ c: Connection, _ b: UnsafeMutableRawBufferPointer) -> Int {
        var off = 0
        while b.count - off >= 4 {
            let len = Int(UInt32(bigEndian: b.loadUnaligned(fromByteOffset: off, as: UInt32.self)))
            guard b.count - off - 4 >= len else { break }
            if c.write(copying: UnsafeRawBufferPointer(rebasing: b[off..<(off + 4 + len)])) == .overCap { c.close(.abort) }
            off += 4 + len
        }
        return off
    }

    func connectionClosed(_ c: Connection, reason: CloseReason) {}
}

/// Accepts every connection with a handler made by `make`; records peers and connections.
final class TestDelegate: ListenerDelegate {
    let make: () -> any ConnectionHandler
    let maxQueued: Int
    var connections: [Connection] = []
    var exhaustedCount = 0
    var shedCount = 0
    var onAccept: ((Connection) -> Void)?

    init(maxQueued: Int = 64 << 20, make: @escaping () -> any ConnectionHandler) {
        self.make = make
        self.maxQueued = maxQueued
    }

    func accepted(fd: Int32, peer: String, on loop: EventLoop) {
        guard let c = try? Connection(adopting: fd, on: loop, peer: peer, handler: make(), maxQueuedBytes: maxQueued) else { return }
        connections.append(c)
        onAccept?(c)
    }

    func shedding(fd: Int32, on loop: EventLoop) {
        shedCount += 1
        let body = Array("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n".utf8)
        _ = body.withUnsafeBytes { Glibc.write(fd, $0.baseAddress!, $0.count) }
    }

    func descriptorsExhausted(errno: Int32, on loop: EventLoop) { exhaustedCount += 1 }
}

/// Polls `condition` on the loop every 5 ms until it holds or `seconds` pass; returns whether it held.
@discardableResult
func waitUntil(_ loop: EventLoop, seconds: Double = 5, _ condition: @escaping @Sendable () -> Bool) -> Bool {
    let deadline = monotonicNanos() + UInt64(seconds * 1e9)
    while monotonicNanos() < deadline {
        if (try? loop.submitAndWait(condition)) == true { return true }
        usleep(5000)
    }
    return false
}

func testLoopConfiguration(tickMillis: UInt64 = 50) -> EventLoop.Configuration {
    var c = EventLoop.Configuration()
    c.timerTickNanos = tickMillis * 1_000_000
    return c
}

@Suite("Engine support")
struct EngineSupportTests {
    @Test func addressParsing() throws {
        #expect(try SocketAddress(parsing: "127.0.0.1:8080").description == "127.0.0.1:8080")
        #expect(try SocketAddress(parsing: "localhost:80").description == "127.0.0.1:80")
        #expect(try SocketAddress(parsing: "[::1]:9000").description == "[::1]:9000")
        #expect(try SocketAddress(parsing: ":7000").description == "0.0.0.0:7000")
        #expect(throws: EngineError.self) { try SocketAddress(parsing: "nohost") }
        #expect(throws: EngineError.self) { try SocketAddress(parsing: "1.2.3.4:99999") }
        #expect(throws: EngineError.self) { try SocketAddress(parsing: "example.com:80") }
    }

    /// The IPv4 text is written digit by digit: it must equal `inet_ntop` and the port for every octet width.
    @Test func ipv4DescriptionMatchesInetNtop() throws {
        var rng = SystemRandomNumberGenerator()
        let edges: [UInt8] = [0, 1, 9, 10, 99, 100, 199, 255]
        let ports = [0, 1, 9, 10, 99, 100, 999, 1_000, 9_999, 10_000, 65_535]
        for round in 0..<3_000 {
            let octets: [UInt8] = (0..<4).map { _ in
                round % 2 == 0 ? edges[Int.random(in: 0..<edges.count, using: &rng)] : UInt8.random(in: 0...255, using: &rng)
            }
            let port = round < ports.count ? ports[round] : Int.random(in: 0...65_535, using: &rng)
            var sin = sockaddr_in()
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = UInt16(port).bigEndian
            withUnsafeMutableBytes(of: &sin.sin_addr) { $0.copyBytes(from: octets) }
            var storage = sockaddr_storage()
            withUnsafeMutableBytes(of: &storage) { dst in withUnsafeBytes(of: sin) { dst.copyMemory(from: $0) } }
            let address = SocketAddress(storage: storage, length: socklen_t(MemoryLayout<sockaddr_in>.size))
            var text = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN) + 1)
            var a = sin.sin_addr
            #expect(inet_ntop(AF_INET, &a, &text, socklen_t(text.count)) != nil)
            let expected = text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) } + ":\(port)"
            #expect(address.description == expected)
        }
    }

    @Test func descriptorLimitIsRaised() {
        let (soft, hard) = TCPListener.raiseDescriptorLimit()
        #expect(soft > 0 && soft <= hard)
        #expect(TCPListener.descriptorLimit().soft == soft)
    }
}

/// A connection's channel list (channel and registry position per entry) against a dictionary: 5 000 random sets,
/// updates and removals over 6 channels, in order of first subscription, through every inline/array transition; and
/// it stays 16 bytes (the connection object's malloc block, `connectionObjectsFitTheirMallocBlocks`).
@Test func channelListMatchesAModel() {
    #expect(MemoryLayout<ChannelList>.size == 16)
    var list = ChannelList()
    var model: [(channel: Int, position: Int)] = []
    var rng = SystemRandomNumberGenerator()
    for _ in 0..<5_000 {
        let channel = Int.random(in: 0..<6, using: &rng)
        if Int.random(in: 0..<3, using: &rng) == 0 {
            list.setPosition(nil, of: channel)
            model.removeAll { $0.channel == channel }
        } else {
            let position = Int.random(in: 0..<100_000, using: &rng)
            list.setPosition(position, of: channel)
            if let i = model.firstIndex(where: { $0.channel == channel }) { model[i].position = position } else { model.append((channel, position)) }
        }
        #expect(Array(list) == model.map(\.channel))
        for c in 0..<6 { #expect(list.position(of: c) == model.first { $0.channel == c }?.position) }
    }
}

/// InlineList (the outbound queue's chunks): one element inline, an array from the second
/// on; the same order and contents through every transition (append, drop the first ones, remove one, remove by a
/// rule, empty with and without keeping the array).
@Test func inlineListKeepsOrderThroughItsTransitions() {
    func chunk(_ v: UInt8) -> SharedBytes { SharedBytes([v]) }
    func contents(_ list: InlineList<SharedBytes>) -> [UInt8] { list.map { $0.bytes[0] } }
    var list = InlineList<SharedBytes>()
    #expect(list.count == 0)
    list.append(chunk(1))
    #expect(contents(list) == [1] && list.spillCapacity == 0)  // inline: no array
    list.append(chunk(2)); list.append(chunk(3))
    #expect(contents(list) == [1, 2, 3] && list.spillCapacity >= 3)
    list.removeFirst(2)
    #expect(contents(list) == [3])
    list.append(chunk(4))
    #expect(contents(list) == [3, 4])
    list.removeAll(keepingCapacity: true)
    // The array made for [3, 4] is kept: room for 2 at least (more only if malloc rounded the block up, which
    // glibc does and AddressSanitizer's allocator does not).
    #expect(list.count == 0 && list.spillCapacity >= 2)
    list.append(chunk(5))
    #expect(contents(list) == [5])
    list.append(chunk(6))
    #expect(contents(list) == [5, 6])
    list.removeAll()
    #expect(list.count == 0 && list.spillCapacity == 0)
    list.append(chunk(7))
    list.removeFirst(1)
    #expect(list.count == 0)
    list.append(chunk(8))
    #expect(contents(list) == [8])

    var ints = InlineList<Int>()
    ints.append(1); ints.append(2); ints.append(3)
    ints.remove(at: 1)
    #expect(Array(ints) == [1, 3] && ints.firstIndex(of: 3) == 1)
    ints.removeAll { $0 == 1 }
    #expect(Array(ints) == [3] && ints.spillCapacity == 0)  // back inline, the array freed
    ints.remove(at: 0)
    #expect(ints.isEmpty)
    ints.append(4); ints.append(5)
    ints.removeAll { $0 > 3 }
    #expect(ints.isEmpty && ints.spillCapacity == 0)
    ints.append(6)
    ints.removeAll { $0 == 7 }
    #expect(Array(ints) == [6] && ints.contains(6))
}
