import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

@Suite("Unix listener", .serialized)
struct EngineUnixTests {
    private func tempPath(_ name: String) -> String {
        "/tmp/hub-engine-\(getpid())-\(UInt32.random(in: 0...UInt32.max))-\(name).sock"
    }

    private func mode(_ path: String) -> (mode: mode_t, isSocket: Bool)? {
        var st = stat()
        guard lstat(path, &st) == 0 else { return nil }
        return (st.st_mode & 0o777, st.st_mode & S_IFMT == S_IFSOCK)
    }

    @Test func modeServeLiveAndUnlink() throws {
        let loop = try EventLoop()
        defer { loop.stop(); loop.join() }
        let path = tempPath("live")
        let listener = try UnixListener.bind(path: path, on: loop) { _ in TestDelegate { FramedEchoHandler() } }
        #expect(mode(path)?.mode == 0o660)
        #expect(mode(path)?.isSocket == true)

        let fd = TestClient.connectUnix(path: path)
        let frame: [UInt8] = [0, 0, 0, 2, 7, 8]
        #expect(TestClient.writeAll(fd, frame))
        #expect(TestClient.read(fd, count: frame.count) == frame)
        _ = close(fd)

        #expect {
            _ = try UnixListener.bind(path: path, on: loop) { _ in TestDelegate { FramedEchoHandler() } }
        } throws: { ($0 as? EngineError)?.message == "another hub is listening on \(path)" }
        #expect(mode(path)?.isSocket == true, "the live socket is left alone")

        listener.close()
        #expect(mode(path) == nil, "unlinked on close")
    }

    @Test func staleSocketIsReplaced() throws {
        let loop = try EventLoop()
        defer { loop.stop(); loop.join() }
        let path = tempPath("stale")
        // A socket file nobody listens on: what a crashed hub leaves behind.
        let s = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: Array(path.utf8))
            raw[path.utf8.count] = 0
        }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(s, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        #expect(rc == 0)
        _ = close(s)
        #expect(mode(path)?.isSocket == true)

        let listener = try UnixListener.bind(path: path, on: loop) { _ in TestDelegate { FramedEchoHandler() } }
        let fd = TestClient.connectUnix(path: path)
        let frame: [UInt8] = [0, 0, 0, 1, 5]
        #expect(TestClient.writeAll(fd, frame))
        #expect(TestClient.read(fd, count: frame.count) == frame)
        _ = close(fd)
        listener.close()
        #expect(mode(path) == nil)
    }

    @Test func regularFileIsRefusedAndKept() throws {
        let loop = try EventLoop()
        defer { loop.stop(); loop.join() }
        let path = tempPath("file")
        let f = open(path, O_CREAT | O_WRONLY, 0o600)
        _ = write(f, "keep me", 7)
        _ = close(f)
        defer { unlink(path) }
        #expect {
            _ = try UnixListener.bind(path: path, on: loop) { _ in TestDelegate { FramedEchoHandler() } }
        } throws: { ($0 as? EngineError)?.message.contains("is not a socket") == true }
        #expect(mode(path)?.isSocket == false, "still the regular file")
        var st = stat()
        #expect(lstat(path, &st) == 0 && st.st_size == 7)
    }
}
