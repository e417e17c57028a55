import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `URLSessionWebSocketTask` as a `HubTransport`: what an iOS or macOS app uses (it speaks `wss://` through the
/// system's TLS, proxies and network switching). It compiles on Linux too, where FoundationNetworking declares the
/// API, but this toolchain's libcurl cannot run a WebSocket: on Linux use `POSIXTransport`.
public final class URLSessionTransport: HubTransport {
    private let session: URLSession
    private let task = LockedTask()

    public init(session: URLSession = .shared) {
        self.session = session
    }

    public func connect(url: URL, protocols: [String]) async throws {
        let webSocket = session.webSocketTask(with: url, protocols: protocols)
        task.set(webSocket)
        webSocket.resume()
        // URLSession opens the socket lazily: the first receive or send reports a failed handshake. A ping makes
        // the failure surface here, in connect, as it does with POSIXTransport.
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            webSocket.sendPing { error in
                if let error { done.resume(throwing: HubTransportError("the WebSocket did not open: \(error)")) } else { done.resume() }
            }
        }
    }

    public func send(text: String) async throws {
        guard let webSocket = task.get() else { throw HubTransportError("not connected") }
        try await webSocket.send(.string(text))
    }

    public func receive() async -> HubTransportMessage {
        guard let webSocket = task.get() else { return .closed(code: 1006, reason: "") }
        do {
            switch try await webSocket.receive() {
            case .string(let text): return .text(text)
            case .data(let data): return .text(String(decoding: data, as: UTF8.self))
            @unknown default: return .text("")
            }
        } catch {
            let code = UInt16(clamping: webSocket.closeCode.rawValue)
            let reason = webSocket.closeReason.map { String(decoding: $0, as: UTF8.self) } ?? ""
            return .closed(code: code == 0 ? 1006 : code, reason: reason)
        }
    }

    public func close(code: UInt16, reason: String) async {
        let closeCode = URLSessionWebSocketTask.CloseCode(rawValue: Int(code)) ?? .normalClosure
        task.get()?.cancel(with: closeCode, reason: Data(reason.utf8))
    }
}

/// The task, set once per connect and read from any task.
private final class LockedTask: @unchecked Sendable {
    private let lock = NSLock()
    private var task: URLSessionWebSocketTask?
    func set(_ t: URLSessionWebSocketTask) { lock.lock(); task = t; lock.unlock() }
    func get() -> URLSessionWebSocketTask? { lock.lock(); defer { lock.unlock() }; return task }
}
