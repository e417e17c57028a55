import Foundation
import Glibc
import Testing
import WSProtocol
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// Frames that must fail the connection, sent the way an attacker found crashed the hub (issue 8): one octet per
/// TCP segment. The hub used to answer 1002, keep feeding the failed reader, parse the next octet without the
/// first-byte checks and trap on a force-unwrap, taking every connection of the process down.
@Suite(.serialized) struct IntegrationHardeningTests {
    struct BadFrame: Sendable, CustomTestStringConvertible {
        let name: String
        let bytes: [UInt8]
        var testDescription: String { name }
    }

    static let badFrames: [BadFrame] = [
        BadFrame(name: "RSV1 without an extension", bytes: masked(0xC1, "hello")),
        BadFrame(name: "reserved opcode 0x7", bytes: masked(0x87, "hello")),
        BadFrame(name: "reserved opcode 0xF", bytes: masked(0x8F, "hello")),
        BadFrame(name: "RSV2 on a text frame", bytes: masked(0xA1, "hello")),
        BadFrame(name: "reserved control opcode 0xB", bytes: masked(0x8B, "hello")),
    ]

    /// A masked frame with first byte `b0` and `text` as payload (FrameEncoder refuses to build bad frames).
    static func masked(_ b0: UInt8, _ text: String) -> [UInt8] {
        let key: [UInt8] = [0x37, 0xFA, 0x21, 0x3D]
        let payload = Array(text.utf8)
        return [b0, 0x80 | UInt8(payload.count)] + key + payload.enumerated().map { $0.element ^ key[$0.offset % 4] }
    }

    /// Sends `bytes` one per TCP segment (Nagle off, a pause between writes). Writes after the hub closed fail;
    /// that is expected and ignored.
    static func sendByteByByte(_ fd: Int32, _ bytes: [UInt8]) {
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        for byte in bytes {
            var b = byte
            guard send(fd, &b, 1, Int32(MSG_NOSIGNAL)) == 1 else { return }
            usleep(3_000)
        }
    }

    /// The hub still serves: a new client subscribes and gets an event published for it.
    static func expectServing(_ hub: HubProcess) throws {
        #expect(hub.process.isRunning, "the hub exited: \(hub.log)")
        let witness = try hub.client("witness", channels: ["wallet_updates"])
        let reply = try hub.publish(channel: "wallet_updates", account: "witness")
        #expect(reply["delivered"] as? Int == 1)
        #expect(try witness.nextJSON()["channel"] as? String == "wallet_updates")
    }

    @Test(arguments: badFrames)
    func violationSentOneOctetPerSegmentOnWS(_ frame: BadFrame) throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        Self.sendByteByByte(ws.fd, frame.bytes)
        #expect(try ws.expectClose().code == 1002)
        #expect(try ws.waitForEOF(timeout: 1), "the hub closes TCP at once after failing the connection")
        try Self.expectServing(hub)
    }

    @Test(arguments: badFrames)
    func violationSentOneOctetPerSegmentOnEcho(_ frame: BadFrame) throws {
        let hub = try HubProcess(["--echo"])
        let ws = try TestWebSocket.connect(port: hub.port, path: "/echo")
        Self.sendByteByByte(ws.fd, frame.bytes)
        #expect(try ws.expectClose().code == 1002)
        #expect(try ws.waitForEOF(timeout: 1))
        try Self.expectServing(hub)
    }

    /// Autobahn 7.3.2 / 7.9.x / 7.13.x: the peer's close frame is itself bad. The hub answers 1002 and closes TCP
    /// at once: the peer's close was already received, so no other close will come (it used to wait 2 s for one).
    @Test(arguments: [
        [0x88, 0x81, 0, 0, 0, 0, 0x03] as [UInt8],                    // 1-byte close body
        FrameEncoder.clientFrame(opcode: .close, payload: [0x03, 0xEC]),  // code 1004 (reserved)
        FrameEncoder.clientFrame(opcode: .close, payload: [0x13, 0x88]),  // code 5000
        FrameEncoder.clientFrame(opcode: .close, payload: [0x03, 0xE8, 0xFF]),  // reason not UTF-8
    ])
    func badCloseFrameIsAnsweredAndTCPClosedAtOnce(_ bytes: [UInt8]) throws {
        let hub = try HubProcess(["--echo"])
        let ws = try TestWebSocket.connect(port: hub.port, path: "/echo")
        try ws.sendRaw(bytes)
        let started = Date()
        let code = try ws.expectClose().code
        #expect(code == 1002 || code == 1007)
        #expect(try ws.waitForEOF(timeout: 1))
        #expect(Date().timeIntervalSince(started) < 1)
    }

    /// Autobahn 5.9-5.18: a bad continuation fails the connection; the hub closes TCP without waiting for the
    /// peer's close reply, and whatever the peer sends after the bad frame is never parsed.
    @Test func failedConnectionClosesTCPWithoutWaitingForTheReply() throws {
        let hub = try HubProcess(["--echo"])
        let ws = try TestWebSocket.connect(port: hub.port, path: "/echo")
        let continuation = FrameEncoder.clientFrame(opcode: .continuation, payload: Array("fragment".utf8))
        let text = FrameEncoder.clientFrame(opcode: .text, payload: Array("after".utf8))
        try ws.sendRaw(continuation + text)
        let started = Date()
        var texts: [String] = []
        var code: UInt16?
        while code == nil, let m = try ws.receive(timeout: 2) {
            if case .text(let t) = m { texts.append(t) }
            if case .close(let c, _) = m { code = c }
        }
        #expect(code == 1002)
        #expect(texts.isEmpty, "nothing after the bad frame is processed: \(texts)")
        #expect(try ws.waitForEOF(timeout: 1))
        #expect(Date().timeIntervalSince(started) < 1)
    }
}
