import Foundation
import Testing
import WSProtocol
@testable import Hub
@testable import HubEngine

@Suite struct IntegrationCloseTests {
    /// Bytes behind a client's close frame in the same read are not read (RFC 6455 5.5.1): the close is echoed
    /// and nothing is counted as a protocol error.
    @Test func framesBehindACloseAreIgnored() throws {
        let hub = try HubProcess()
        let ws = try hub.client("acc_1", channels: ["wallet_updates"])
        let close = FrameEncoder.clientFrame(opcode: .close, payload: closePayload(code: CloseCode(1000), reason: "bye"))
        let text = FrameEncoder.clientFrame(opcode: .text, payload: Array(#"{"type":"ping"}"#.utf8))
        try ws.sendRaw(close + text)
        let echoed = try ws.expectClose()
        #expect(echoed.code == 1000)
        #expect(try ws.waitForEOF())
        let stats = try hub.request(#"{"op":"stats"}"#)["stats"] as? [String: Any]
        let drops = try #require(stats?["drops"] as? [String: Any])
        #expect(drops["protocolErrors"] as? Int == 0)
    }
}
