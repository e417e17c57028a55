import Testing
@testable import WSProtocol

@Suite("FrameEncoder")
struct FrameEncoderTests {
    @Test(arguments: [
        (0, [UInt8]([0x82, 0x00])),
        (125, [0x82, 0x7D]),
        (126, [0x82, 0x7E, 0x00, 0x7E]),
        (65535, [0x82, 0x7E, 0xFF, 0xFF]),
        (65536, [0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0]),
    ])
    func exactServerHeaders(length: Int, header: [UInt8]) {
        let payload = [UInt8](repeating: 0x5A, count: length)
        let frame = FrameEncoder.frame(opcode: .binary, payload: payload)
        #expect(Array(frame.prefix(header.count)) == header)
        #expect(frame.count == header.count + length)
        #expect(Array(frame.dropFirst(header.count)) == payload)
        #expect(FrameEncoder.headerSize(payloadLength: length, masked: false) == header.count)
        #expect(FrameEncoder.headerSize(payloadLength: length, masked: true) == header.count + 4)
    }

    @Test func rfcExamples() {
        #expect(FrameEncoder.frame(opcode: .text, payload: Array("Hello".utf8)) == [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f])
        #expect(FrameEncoder.frame(opcode: .text, payload: Array("Hello".utf8), maskKey: 0x3d21_fa37)
                == [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58])
        #expect(FrameEncoder.frame(opcode: .text, payload: Array("Hel".utf8), fin: false) == [0x01, 0x03, 0x48, 0x65, 0x6c])
        #expect(FrameEncoder.frame(opcode: .continuation, payload: Array("lo".utf8)) == [0x80, 0x02, 0x6c, 0x6f])
        #expect(FrameEncoder.frame(opcode: .ping, payload: Array("Hello".utf8)) == [0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f])
        #expect(FrameEncoder.frame(opcode: .text, payload: [], rsv1: true) == [0xC1, 0x00])
        #expect(FrameEncoder.maxServerHeaderSize == 10 && FrameEncoder.maxClientHeaderSize == 14)
    }

    @Test(arguments: [0, 5, 125, 126, 300, 65535, 65536])
    func writeHeaderEndsAtPayloadOffset(length: Int) {
        let headroom = FrameEncoder.maxServerHeaderSize
        var buffer = [UInt8](repeating: 0xEE, count: headroom + length)
        for i in 0..<length { buffer[headroom + i] = UInt8(truncatingIfNeeded: i) }
        let start = buffer.withUnsafeMutableBytes {
            FrameEncoder.writeHeader(into: $0, endingAt: headroom, opcode: .text, payloadLength: length)
        }
        #expect(start == headroom - FrameEncoder.headerSize(payloadLength: length, masked: false))
        #expect(buffer[..<start].allSatisfy { $0 == 0xEE }, "bytes before the header untouched")
        let expected = FrameEncoder.frame(opcode: .text, payload: (0..<length).map { UInt8(truncatingIfNeeded: $0) })
        #expect(Array(buffer[start...]) == expected)
    }

    @Test func writeHeaderWithMaskKeyAndClientHeadroom() {
        var buffer = [UInt8](repeating: 0, count: 14 + 200)
        let start = buffer.withUnsafeMutableBytes {
            FrameEncoder.writeHeader(into: $0, endingAt: 14, opcode: .binary, fin: false, rsv1: true, payloadLength: 200, maskKey: 0x0403_0201)
        }
        #expect(start == 6)
        #expect(Array(buffer[6..<14]) == [0x42, 0xFE, 0x00, 0xC8, 1, 2, 3, 4])
    }

    @Test func clientFramesAreMaskedWithFreshKeysAndDecode() {
        let payload = Array("masked by the load generator".utf8)
        let a = FrameEncoder.clientFrame(opcode: .text, payload: payload)
        let b = FrameEncoder.clientFrame(opcode: .text, payload: payload)
        #expect(a[1] & 0x80 != 0)
        #expect(a[2..<6] != b[2..<6], "two random keys should differ (fails with probability 2^-32)")
        let out = readAll([a + b])
        #expect(out.error == nil)
        #expect(out.messages == [.text(payload), .text(payload)])
    }

    @Test func encodeClientAppendsMaskedFrames() {
        var out: [UInt8] = []
        let payload = Array("load generator".utf8)
        payload.withUnsafeBytes { p in
            FrameEncoder.encodeClient(opcode: .text, payload: p, fin: false, into: &out)
            FrameEncoder.encodeClient(opcode: .continuation, payload: p, into: &out)
        }
        #expect(out.count == 2 * (6 + payload.count))
        #expect(out[0] == 0x01 && out[1] == 0x80 | UInt8(payload.count))
        #expect(Array(out[6..<(6 + payload.count)]) != payload || out[2..<6] == [0, 0, 0, 0], "payload is masked")
        #expect(readAll([out]).messages == [.text(payload + payload)])
    }

    @Test func encodeAppendsAndLeavesCallerPayloadUnmasked() {
        var out: [UInt8] = [0xAA]
        let payload: [UInt8] = [1, 2, 3, 4, 5]
        FrameEncoder.encode(opcode: .binary, payload: payload, maskKey: 0xFFFF_FFFF, into: &out)
        #expect(out == [0xAA, 0x82, 0x85, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE, 0xFD, 0xFC, 0xFB, 0xFA])
        #expect(payload == [1, 2, 3, 4, 5])
    }
}
