import Foundation
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubRouting
#if canImport(Glibc)
import Glibc
#endif

@Suite struct AdminClientTests {
    @Test func requestGetsOneReplyLine() throws {
        let hub = FakeHub { line in .lines([#"{"ok":true,"echo":\#(line)}"#]) }
        defer { hub.stop() }
        let client = try AdminClient(socketPath: hub.path)
        let reply = try client.request(#"{"op":"stats"}"#)
        #expect(String(decoding: reply, as: UTF8.self) == #"{"ok":true,"echo":{"op":"stats"}}"#)
        #expect(hub.received == [#"{"op":"stats"}"#])
        // A line that already ends in \n is not doubled.
        _ = try client.request(Array("{\"op\":\"channels\"}\n".utf8))
        #expect(hub.received == [#"{"op":"stats"}"#, #"{"op":"channels"}"#])
    }

    @Test func pipelinedRequestsKeepOrder() throws {
        let hub = FakeHub { line in .lines([#"{"n":\#(FakeHub.field("n", in: line) as? Int ?? -1)}"#]) }
        defer { hub.stop() }
        let client = try AdminClient(socketPath: hub.path)
        let lines = (0..<50).map { #"{"op":"x","n":\#($0)}"# }
        let replies = try client.requests(lines)
        #expect(replies.map { String(decoding: $0, as: UTF8.self) } == (0..<50).map { #"{"n":\#($0)}"# })
    }

    @Test func readLineStreamsThenReturnsNilAtClose() throws {
        let hub = FakeHub { _ in .linesThenClose(["a", "b\r", "", "c"]) }
        defer { hub.stop() }
        let client = try AdminClient(socketPath: hub.path)
        #expect(try client.request("tail") == Array("a".utf8))
        #expect(try client.readLine() == Array("b".utf8), "CRLF is stripped")
        #expect(try client.readLine() == [])
        #expect(try client.readLine() == Array("c".utf8))
        #expect(try client.readLine() == nil)
        #expect(try client.readLine() == nil)
    }

    @Test func closedBeforeReplyIsConnectionClosed() throws {
        let hub = FakeHub { _ in .linesThenClose([]) }
        defer { hub.stop() }
        let client = try AdminClient(socketPath: hub.path)
        #expect(throws: AdminClientError.connectionClosed) { try client.request("x") }
    }

    @Test func silentHubTimesOut() throws {
        let hub = FakeHub { _ in .silence }
        defer { hub.stop() }
        let client = try AdminClient(socketPath: hub.path, readTimeout: 0.2)
        let start = Date()
        #expect(throws: AdminClientError.timedOut(seconds: 0.2)) { try client.request("x") }
        #expect(Date().timeIntervalSince(start) < 5)
    }

    @Test func noSocketIsHubNotRunning() {
        let path = "/tmp/admin-client-missing-\(getpid()).sock"
        #expect(throws: AdminClientError.hubNotRunning(path: path)) { try AdminClient(socketPath: path) }
        let error = AdminClientError.hubNotRunning(path: "./hub.sock")
        #expect(error.description == "no hub is listening on ./hub.sock (start one with: swift run -c release hub)")
    }

    @Test func tooLongPathIsReported() {
        let path = "/tmp/" + String(repeating: "x", count: 200)
        #expect(throws: AdminClientError.pathTooLong(path: path)) { try AdminClient(socketPath: path) }
    }

    @Test func permissionDetailNamesModeOwnerAndGroup() throws {
        let hub = FakeHub { _ in .silence }
        defer { hub.stop() }
        chmod(hub.path, 0)
        let detail = AdminClient.permissionDetail(hub.path)
        #expect(detail.contains("mode 00 (owner \(AdminClient.userName(getuid())), group"))
        #expect(detail.contains("0660"))
        #expect(AdminClient.permissionDetail("/nonexistent/dir/hub.sock").contains("not accessible"))
    }

    @Test func jsonStringEscapes() {
        #expect(AdminClient.jsonString("a\"b\\c\n\u{01}é") == #""a\"b\\c\n\u0001é""#)
    }
}
