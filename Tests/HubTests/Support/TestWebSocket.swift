import Foundation
import Glibc
import WSProtocol

/// A blocking WebSocket client for tests, on real TCP and our codec's client side.
final class TestWebSocket {
    enum Received: Equatable {
        case text(String)
        case binary([UInt8])
        case ping([UInt8])
        case pong([UInt8])
        case close(code: UInt16?, reason: String)
    }

    /// The hub refused the upgrade with an HTTP response.
    struct Refused: Error, CustomStringConvertible {
        let status: Int
        let headers: HTTPHeaders
        let body: String
        var description: String { "HTTP \(status): \(body)" }
        var json: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] ?? [:] }
        var errorCode: String? { (json["error"] as? [String: Any])?["code"] as? String }
    }

    let fd: Int32
    private var reader = MessageReader(configuration: MessageReaderConfiguration(role: .client, maxFrameSize: 64 << 20, maxMessageSize: 64 << 20))
    private var pending: [Received] = []
    /// Answer pings automatically (a well-behaved client); set false to test pong timeouts.
    var autoPong = true
    private(set) var closedByPeer = false
    let response: HTTPResponseHead

    private init(fd: Int32, response: HTTPResponseHead, leftover: [UInt8], deflate: PerMessageDeflateParameters? = nil) {
        self.fd = fd
        self.response = response
        if let deflate {
            // The server may compress what it sends: inflate it (we send uncompressed, which is always allowed).
            reader = MessageReader(configuration: MessageReaderConfiguration(role: .client, maxFrameSize: 64 << 20, maxMessageSize: 64 << 20),
                                   decompressor: PerMessageInflater(parameters: deflate, role: .client))
        }
        if !leftover.isEmpty { feed(leftover) }
    }

    deinit { Glibc.close(fd) }

    static func tcpConnect(port: Int, host: String = "127.0.0.1", receiveBuffer: Int32? = nil) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        if var size = receiveBuffer {
            // Before connect, so the advertised window stays small (a slow consumer).
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, host, &address.sin_addr)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { let e = errno; Glibc.close(fd); throw HubTestError("connect failed: errno \(e)") }
        return fd
    }

    /// Performs the opening handshake; throws `Refused` when the server answers with anything but 101.
    static func connect(port: Int, host: String = "127.0.0.1", path: String = "/ws", headers: [(String, String)] = [],
                        deflate: PerMessageDeflateConfiguration? = nil, receiveBuffer: Int32? = nil,
                        behindRequest: [UInt8] = [], subprotocols: [String] = []) throws -> TestWebSocket {
        let fd = try tcpConnect(port: port, host: host, receiveBuffer: receiveBuffer)
        let key = ClientHandshake.makeKey()
        let request = ClientHandshake.request(host: "\(host):\(port)", path: path, key: key, subprotocols: subprotocols,
                                              extraHeaders: headers, deflate: deflate)
        try writeAll(fd, request + behindRequest)  // frames may ride in the same write as the request
        var parser = HTTPResponseParser()
        var buffer = [UInt8](repeating: 0, count: 65536)
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline {
            guard try waitReadable(fd, timeout: deadline.timeIntervalSinceNow) else { break }
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { break }
            let chunk = Array(buffer[0..<n])
            let result = try chunk.withUnsafeBytes { try parser.parse($0) }
            switch result {
            case .needMoreData:
                continue
            case .complete(let head, let consumed):
                if head.status != 101 {
                    var body = Array(chunk[consumed...])
                    let length = Int(head.headers[first: "Content-Length"] ?? "") ?? 0
                    while body.count < length, try waitReadable(fd, timeout: 2) {
                        let m = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
                        if m <= 0 { break }
                        body += buffer[0..<m]
                    }
                    Glibc.close(fd)
                    throw Refused(status: head.status, headers: head.headers, body: String(decoding: body, as: UTF8.self))
                }
                let result = try ClientHandshake.verify(head, key: key, offeredSubprotocols: subprotocols, deflate: deflate)
                return TestWebSocket(fd: fd, response: head, leftover: Array(chunk[consumed...]), deflate: result.deflate)
            }
        }
        Glibc.close(fd)
        throw HubTestError("no handshake response")
    }

    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            // MSG_NOSIGNAL: a peer that already closed is an error here, never a SIGPIPE that kills the test run.
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw HubTestError("write failed: errno \(errno)") }
            offset += n
        }
    }

    static func waitReadable(_ fd: Int32, timeout: Double) throws -> Bool {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let rc = poll(&p, 1, Int32(max(0, timeout) * 1000))
        return rc > 0
    }

    // MARK: Sending

    func send(text: String) throws { try sendFrame(.text, Array(text.utf8)) }

    func send(json: [String: Any]) throws {
        try send(text: String(decoding: try JSONSerialization.data(withJSONObject: json), as: UTF8.self))
    }

    func sendFrame(_ opcode: Opcode, _ payload: [UInt8], fin: Bool = true) throws {
        try Self.writeAll(fd, FrameEncoder.clientFrame(opcode: opcode, payload: payload, fin: fin))
    }

    func sendRaw(_ bytes: [UInt8]) throws { try Self.writeAll(fd, bytes) }

    func sendClose(code: UInt16 = 1000, reason: String = "") throws {
        try sendFrame(.close, closePayload(code: CloseCode(code), reason: reason))
    }

    // MARK: Receiving

    private func feed(_ bytes: [UInt8]) {
        var copy = bytes
        do {
            _ = try copy.withUnsafeMutableBytes { raw in
                try reader.read(raw) { message in
                    switch message {
                    case .text(let p): pending.append(.text(String(decoding: p, as: UTF8.self)))
                    case .binary(let p): pending.append(.binary(Array(p)))
                    case .ping(let p):
                        pending.append(.ping(Array(p)))
                        if autoPong { try? sendFrame(.pong, Array(p)) }
                    case .pong(let p): pending.append(.pong(Array(p)))
                    case .close(let code, let reason):
                        pending.append(.close(code: code, reason: String(decoding: reason, as: UTF8.self)))
                    }
                    return .continue
                }
            }
        } catch {
            pending.append(.close(code: nil, reason: "client-side protocol violation: \(error)"))
        }
    }

    /// The next message or control frame, or nil on timeout / EOF.
    func receive(timeout: Double = 5) throws -> Received? {
        let deadline = Date().addingTimeInterval(timeout)
        var buffer = [UInt8](repeating: 0, count: 65536)
        while pending.isEmpty {
            let left = deadline.timeIntervalSinceNow
            guard left > 0, try Self.waitReadable(fd, timeout: left) else { return nil }
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { closedByPeer = true; return nil }
            feed(Array(buffer[0..<n]))
        }
        return pending.removeFirst()
    }

    /// The next text message, skipping pings and pongs.
    func nextText(timeout: Double = 5) throws -> String {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            guard let m = try receive(timeout: deadline.timeIntervalSinceNow) else { throw HubTestError("no text message within \(timeout)s") }
            switch m {
            case .text(let s): return s
            case .ping, .pong: continue
            default: throw HubTestError("expected text, got \(m)")
            }
        }
    }

    func nextJSON(timeout: Double = 5) throws -> [String: Any] {
        let text = try nextText(timeout: timeout)
        guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            throw HubTestError("not a JSON object: \(text)")
        }
        return object
    }

    /// Waits for the server's close frame (skipping other messages) and returns its code.
    func expectClose(timeout: Double = 5) throws -> (code: UInt16?, reason: String) {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            guard let m = try receive(timeout: deadline.timeIntervalSinceNow) else { throw HubTestError("no close frame within \(timeout)s") }
            if case .close(let code, let reason) = m { return (code, reason) }
        }
    }

    /// True when nothing but pings arrives within `timeout`.
    func isQuiet(for timeout: Double) throws -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while deadline.timeIntervalSinceNow > 0 {
            guard let m = try receive(timeout: deadline.timeIntervalSinceNow) else { return true }
            if case .ping = m { continue }
            return false
        }
        return true
    }

    /// Every text message until `timeout` passes with nothing new (pings answered and skipped).
    func drainTexts(quiet timeout: Double = 0.3) throws -> [String] {
        var texts: [String] = []
        while let m = try receive(timeout: timeout) {
            if case .text(let s) = m { texts.append(s) }
            if case .close = m { break }
        }
        return texts
    }

    /// Answers the server's close frame like a well-behaved client: echo the code, wait for the server to close
    /// TCP, then close ours. Returns whether the server closed TCP within `timeout`.
    @discardableResult
    func completeClose(code: UInt16 = 1000, timeout: Double = 2) throws -> Bool {
        try sendClose(code: code)
        let closed = try waitForEOF(timeout: timeout)
        shutdownTCP()
        return closed
    }

    /// Closes our side of TCP (what a client does once the server closed after the close handshake).
    func shutdownTCP() { shutdown(fd, Int32(SHUT_RDWR)) }

    /// Waits for the server to close the TCP connection.
    func waitForEOF(timeout: Double = 5) throws -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while deadline.timeIntervalSinceNow > 0 {
            guard try Self.waitReadable(fd, timeout: deadline.timeIntervalSinceNow) else { return false }
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { return true }
        }
        return false
    }
}

/// A plain HTTP exchange on a fresh TCP connection: writes `request` as is, reads until the server closes.
struct RawHTTPResponse {
    let status: Int
    /// Header names lowercased.
    let headers: [String: String]
    let body: String
    /// The server closed the TCP connection after the response (within the read timeout).
    let closed: Bool
    var json: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] ?? [:] }
    var errorCode: String? { (json["error"] as? [String: Any])?["code"] as? String }
}

func rawHTTP(port: Int, host: String = "127.0.0.1", _ request: [UInt8], timeout: Double = 5) throws -> RawHTTPResponse {
    let fd = try TestWebSocket.tcpConnect(port: port, host: host)
    defer { Glibc.close(fd) }
    try? TestWebSocket.writeAll(fd, request)  // the server may answer (and stop reading) before the whole request is in
    return try readHTTPResponse(fd, timeout: timeout)
}

func rawHTTP(port: Int, host: String = "127.0.0.1", _ request: String, timeout: Double = 5) throws -> RawHTTPResponse {
    try rawHTTP(port: port, host: host, Array(request.utf8), timeout: timeout)
}

/// Reads one HTTP response (head and Content-Length body) and waits for the server to close.
func readHTTPResponse(_ fd: Int32, timeout: Double = 5) throws -> RawHTTPResponse {
    var data: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    let deadline = Date().addingTimeInterval(timeout)
    var closed = false
    while deadline.timeIntervalSinceNow > 0 {
        guard try TestWebSocket.waitReadable(fd, timeout: deadline.timeIntervalSinceNow) else { break }
        let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        if n <= 0 { closed = true; break }
        data += buffer[0..<n]
    }
    let text = String(decoding: data, as: UTF8.self)
    guard let headEnd = text.range(of: "\r\n\r\n") else { throw HubTestError("no HTTP response head: \(text.debugDescription)") }
    let lines = text[..<headEnd.lowerBound].components(separatedBy: "\r\n")
    let statusParts = lines[0].split(separator: " ")
    guard statusParts.count >= 2, let status = Int(statusParts[1]) else { throw HubTestError("bad status line: \(lines[0])") }
    var headers: [String: String] = [:]
    for line in lines.dropFirst() {
        guard let colon = line.firstIndex(of: ":") else { continue }
        headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
    }
    return RawHTTPResponse(status: status, headers: headers, body: String(text[headEnd.upperBound...]), closed: closed)
}

/// A `subscribed` reply without its `positions` member (epochs are random per hub start), for exact comparisons of
/// everything else.
func withoutPositions(_ text: String) -> String {
    text.replacing(/,"positions":\{("(?:[^"\\]|\\.)*":\{[^{}]*\},?)*\}/, with: "")
}
