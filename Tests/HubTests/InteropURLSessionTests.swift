import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization
import Testing

/// What Foundation's URLSessionWebSocketTask (the iOS app's WebSocket client) can do on this toolchain, found by
/// a real attempt against a real hub: a task to /ws that sends the hub-protocol ping and waits for the pong.
enum URLSessionWebSocketProbe: Equatable, Sendable, CustomStringConvertible {
    /// It connected and exchanged a message with the hub.
    case supported
    /// swift-corelibs-foundation's FoundationNetworking was built against a libcurl without WebSocket support
    /// (`CFURLSessionWebSocketsSupported()` is false): every task fails with exactly this error.
    case unsupportedByLibcurl
    /// Something else happened (the probe could not tell): the detail says what.
    case inconclusive(String)

    static let libcurlMessage = "WebSockets not supported by libcurl"

    var description: String {
        switch self {
        case .supported: "supported"
        case .unsupportedByLibcurl: "unsupported: \(Self.libcurlMessage)"
        case .inconclusive(let detail): "inconclusive: \(detail)"
        }
    }

    static func run() -> URLSessionWebSocketProbe {
        let hub: HubProcess
        let token: String
        do {
            hub = try HubProcess()
            token = try hub.token("probe")
        } catch {
            return .inconclusive("could not start a hub for the probe: \(error)")
        }
        var request = URLRequest(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!)
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        request.timeoutInterval = 5
        let task = URLSession.shared.webSocketTask(with: request)
        let outcome = Mutex<URLSessionWebSocketProbe?>(nil)
        let done = DispatchSemaphore(value: 0)
        let finish: @Sendable (URLSessionWebSocketProbe) -> Void = { result in
            let first = outcome.withLock { current in
                defer { if current == nil { current = result } }
                return current == nil
            }
            if first { done.signal() }
        }
        // Exactly what FoundationNetworking reports then: NSURLErrorDomain -1002 (unsupportedURL) with this
        // localized description.
        let classify: @Sendable (any Error) -> URLSessionWebSocketProbe = { error in
            let unsupported = (error as? URLError)?.code == .unsupportedURL && error.localizedDescription == libcurlMessage
            return unsupported ? .unsupportedByLibcurl : .inconclusive("\(error)")
        }
        task.resume()
        task.send(.string(#"{"type":"ping","id":"probe"}"#)) { error in
            if let error { finish(classify(error)) }
        }
        task.receive { result in
            switch result {
            case .success(.string(let text)) where text == #"{"type":"pong","id":"probe"}"#: finish(.supported)
            case .success(let message): finish(.inconclusive("unexpected message \(message)"))
            case .failure(let error): finish(classify(error))
            }
        }
        if done.wait(timeout: .now() + 10) == .timedOut { finish(.inconclusive("no outcome within 10 s")) }
        task.cancel(with: .goingAway, reason: nil)
        return outcome.withLock { $0 } ?? .inconclusive("no outcome")
    }
}

/// Probed once per test run (lazily, so only when a test here runs).
let urlSessionWebSocketProbe = URLSessionWebSocketProbe.run()
let urlSessionWebSocketsSupported = urlSessionWebSocketProbe == .supported

@Suite struct InteropURLSessionTests {
    /// The app's client against the real hub: Authorization header at the handshake, subscribe, receive a
    /// published event byte for byte. Runs wherever FoundationNetworking has WebSockets (Darwin, or a Linux
    /// toolchain whose libcurl has them); reported as skipped, not passed, where it does not.
    @Test(.enabled(if: urlSessionWebSocketsSupported, "FoundationNetworking on this toolchain has no libcurl WebSocket support"))
    func urlSessionWebSocketTaskSubscribesAndReceivesAnEvent() async throws {
        let hub = try HubProcess()
        var request = URLRequest(url: URL(string: "ws://127.0.0.1:\(hub.port)/ws")!)
        request.setValue("Bearer \(try hub.token("acc_1"))", forHTTPHeaderField: "Authorization")
        request.setValue("iOS", forHTTPHeaderField: "X-Platform")
        request.setValue("1.0.0", forHTTPHeaderField: "X-App-Version")
        let task = URLSession.shared.webSocketTask(with: request)
        task.resume()
        defer { task.cancel(with: .normalClosure, reason: nil) }

        try await task.send(.string(#"{"type":"subscribe","channels":["wallet_updates"],"id":"s1"}"#))
        guard case .string(let subscribed) = try await task.receive() else { throw HubTestError("expected text") }
        #expect(withoutPositions(subscribed) == #"{"type":"subscribed","channels":["wallet_updates"],"id":"s1"}"#)

        let rows = try hub.request(#"{"op":"connections","account":"acc_1"}"#)["connections"] as? [[String: Any]] ?? []
        #expect(rows.first?["platform"] as? String == "iOS")
        #expect(rows.first?["appVersion"] as? String == "1.0.0")

        let data = #"{"balance":"1.50","history":[1e2, -0.0]}"#
        let reply = try hub.publish(channel: "wallet_updates", account: "acc_1", type: "wallet_balance_changed", data: data)
        #expect(reply["delivered"] as? Int == 1, "\(reply)")
        guard case .string(let event) = try await task.receive() else { throw HubTestError("expected text") }
        #expect(event == #"{"type":"wallet_balance_changed","channel":"wallet_updates","seq":1,"data":\#(data)}"#)
    }

    /// Runs always, so a toolchain change is noticed instead of silently flipping the test above between skipped
    /// and run: the probe must be conclusive (a real connection, or exactly the libcurl error, never some other
    /// failure that would skip the test for the wrong reason), and on Linux with this toolchain (Swift 6.3,
    /// FoundationNetworking built without libcurl WebSockets) it must find them unsupported. When this fails after
    /// a toolchain or libcurl upgrade because the probe now finds `supported`, the test above runs for real:
    /// update the expectation here.
    @Test func urlSessionProbeFindsWhatThisToolchainIsKnownToDo() {
        let probe = urlSessionWebSocketProbe
        if case .inconclusive = probe { Issue.record("the URLSession WebSocket probe was inconclusive: \(probe)") }
        #if os(Linux)
        #expect(probe == .unsupportedByLibcurl, "URLSessionWebSocketTask on this Linux toolchain: \(probe)")
        #else
        #expect(probe == .supported, "URLSessionWebSocketTask on Darwin: \(probe)")
        #endif
    }
}
