import Testing
@testable import WSProtocol

/// What a FrameDecoder produced: headers in order and the concatenated payload of each frame.
struct DecodedFrame: Equatable {
    var header: FrameHeader
    var payload: [UInt8]
}

func decodeFrames(_ chunks: [[UInt8]], role: Role, maxFrameSize: UInt64 = 1 << 20, allowRSV1: Bool = false)
    -> (frames: [DecodedFrame], error: ProtocolViolation?, pendingAtEnd: Bool) {
    var decoder = FrameDecoder(role: role, maxFrameSize: maxFrameSize, allowRSV1: allowRSV1)
    var frames: [DecodedFrame] = []
    for chunk in chunks {
        var copy = chunk
        let result = copy.withUnsafeMutableBytes { raw in
            Result { () throws(ProtocolViolation) in
                var offset = 0
                loop: while true {
                    switch try decoder.next(raw, at: &offset) {
                    case .needMoreData:
                        #expect(offset == raw.count)
                        break loop
                    case .header(let h):
                        frames.append(DecodedFrame(header: h, payload: []))
                    case .payload(let p, let complete):
                        frames[frames.count - 1].payload += Array(p)
                        if complete { #expect(UInt64(frames[frames.count - 1].payload.count) == frames[frames.count - 1].header.payloadLength) }
                    }
                }
            }
        }
        if case .failure(let error) = result { return (frames, error, true) }
    }
    return (frames, nil, !decoder.isAtFrameBoundary)
}

@Suite("FrameDecoder")
struct FrameDecoderTests {
    struct Vector: Sendable, CustomTestStringConvertible {
        let name: String, wire: [UInt8], role: Role, frames: [(FrameHeader, [UInt8])]
        var testDescription: String { name }
    }

    static let hello = Array("Hello".utf8)
    static let vectors: [Vector] = [
        Vector(name: "RFC 5.7 unmasked Hello", wire: [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f], role: .client,
               frames: [(FrameHeader(opcode: .text, payloadLength: 5), hello)]),
        Vector(name: "RFC 5.7 masked Hello", wire: [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58], role: .server,
               frames: [(FrameHeader(opcode: .text, masked: true, maskKey: 0x3d21_fa37, payloadLength: 5), hello)]),
        Vector(name: "RFC 5.7 fragmented Hel+lo", wire: [0x01, 0x03, 0x48, 0x65, 0x6c, 0x80, 0x02, 0x6c, 0x6f], role: .client,
               frames: [(FrameHeader(fin: false, opcode: .text, payloadLength: 3), Array("Hel".utf8)),
                        (FrameHeader(opcode: .continuation, payloadLength: 2), Array("lo".utf8))]),
        Vector(name: "RFC 5.7 unmasked ping Hello", wire: [0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f], role: .client,
               frames: [(FrameHeader(opcode: .ping, payloadLength: 5), hello)]),
        Vector(name: "RFC 5.7 masked pong Hello", wire: [0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58], role: .server,
               frames: [(FrameHeader(opcode: .pong, masked: true, maskKey: 0x3d21_fa37, payloadLength: 5), hello)]),
        Vector(name: "RFC 5.7 256-byte binary", wire: [0x82, 0x7E, 0x01, 0x00] + (0..<256).map { UInt8($0) }, role: .client,
               frames: [(FrameHeader(opcode: .binary, payloadLength: 256), (0..<256).map { UInt8($0) })]),
        Vector(name: "RFC 5.7 64 KiB binary", wire: [0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0] + [UInt8](repeating: 0xAB, count: 65536), role: .client,
               frames: [(FrameHeader(opcode: .binary, payloadLength: 65536), [UInt8](repeating: 0xAB, count: 65536))]),
        Vector(name: "empty masked close then empty text", wire: [0x88, 0x80, 1, 2, 3, 4, 0x81, 0x80, 5, 6, 7, 8], role: .server,
               frames: [(FrameHeader(opcode: .close, masked: true, maskKey: 0x0403_0201, payloadLength: 0), []),
                        (FrameHeader(opcode: .text, masked: true, maskKey: 0x0807_0605, payloadLength: 0), [])]),
    ]

    @Test(arguments: vectors)
    func rfcVectorsAtEverySplit(_ v: Vector) {
        let expected = v.frames.map { DecodedFrame(header: $0.0, payload: $0.1) }
        let splits = v.wire.count > 1000
            ? [("whole", [v.wire])] + [3, 4, 9, 10, 11, 300, 65545].map { ("cut \($0)", [Array(v.wire[..<$0]), Array(v.wire[$0...])]) }
            : everySplit(v.wire)
        for (label, chunks) in splits {
            let out = decodeFrames(chunks, role: v.role)
            #expect(out.error == nil, "\(label)")
            #expect(out.frames == expected, "\(label)")
            #expect(!out.pendingAtEnd, "\(label)")
        }
        // The 64 KiB vector one byte at a time through the header and then in one read.
        if v.wire.count > 1000 {
            let out = decodeFrames(v.wire[..<10].map { [$0] } + [Array(v.wire[10...])], role: v.role)
            #expect(out.frames == expected)
        }
    }

    struct Bad: Sendable, CustomTestStringConvertible {
        let name: String, wire: [UInt8], role: Role, kind: ProtocolViolation.Kind, code: UInt16
        var maxFrameSize: UInt64 = 1 << 20
        var allowRSV1 = false
        var testDescription: String { name }
    }

    static let bad: [Bad] = [
        Bad(name: "unmasked client frame", wire: [0x81, 0x05] + hello, role: .server, kind: .unmaskedClientFrame, code: 1002),
        Bad(name: "masked server frame", wire: [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58], role: .client, kind: .maskedServerFrame, code: 1002),
        Bad(name: "RSV1 without extension", wire: [0xC1, 0x80, 0, 0, 0, 0], role: .server, kind: .reservedBitsSet, code: 1002),
        Bad(name: "RSV2", wire: [0xA1, 0x80, 0, 0, 0, 0], role: .server, kind: .reservedBitsSet, code: 1002, allowRSV1: true),
        Bad(name: "RSV3", wire: [0x91, 0x80, 0, 0, 0, 0], role: .server, kind: .reservedBitsSet, code: 1002, allowRSV1: true),
        Bad(name: "opcode 3", wire: [0x83, 0x80, 0, 0, 0, 0], role: .server, kind: .reservedOpcode(3), code: 1002),
        Bad(name: "opcode 7", wire: [0x87, 0x80, 0, 0, 0, 0], role: .server, kind: .reservedOpcode(7), code: 1002),
        Bad(name: "opcode B", wire: [0x8B, 0x80, 0, 0, 0, 0], role: .server, kind: .reservedOpcode(0xB), code: 1002),
        Bad(name: "opcode F", wire: [0x8F, 0x80, 0, 0, 0, 0], role: .server, kind: .reservedOpcode(0xF), code: 1002),
        Bad(name: "fragmented ping", wire: [0x09, 0x80, 0, 0, 0, 0], role: .server, kind: .fragmentedControlFrame, code: 1002),
        Bad(name: "fragmented close", wire: [0x08, 0x80, 0, 0, 0, 0], role: .server, kind: .fragmentedControlFrame, code: 1002),
        Bad(name: "ping of 126 bytes", wire: [0x89, 0xFE, 0x00, 0x7E, 0, 0, 0, 0] + [UInt8](repeating: 0, count: 126), role: .server, kind: .controlFrameTooLong(126), code: 1002),
        Bad(name: "close with 64-bit length", wire: [0x88, 0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0], role: .server, kind: .controlFrameTooLong(127), code: 1002),
        Bad(name: "16-bit length < 126", wire: [0x82, 0xFE, 0x00, 0x7D, 0, 0, 0, 0], role: .server, kind: .nonMinimalLength, code: 1002),
        Bad(name: "64-bit length <= 65535", wire: [0x82, 0xFF, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0, 0, 0], role: .server, kind: .nonMinimalLength, code: 1002),
        Bad(name: "64-bit length high bit", wire: [0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], role: .server, kind: .lengthHighBitSet, code: 1002),
        Bad(name: "frame larger than limit", wire: [0x82, 0xFE, 0x04, 0x01, 0, 0, 0, 0], role: .server, kind: .frameTooLarge(1025), code: 1009, maxFrameSize: 1024),
        Bad(name: "64-bit frame larger than limit", wire: [0x82, 0xFF, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0], role: .server, kind: .frameTooLarge(1 << 32), code: 1009),
    ]

    @Test(arguments: bad)
    func violationsAtEverySplit(_ b: Bad) {
        for (label, chunks) in everySplit(b.wire) {
            let out = decodeFrames(chunks, role: b.role, maxFrameSize: b.maxFrameSize, allowRSV1: b.allowRSV1)
            #expect(out.error?.kind == b.kind, "\(label)")
            #expect(out.error?.closeCode.rawValue == b.code, "\(label)")
            #expect(out.frames.isEmpty, "\(label)")
        }
    }

    @Test func frameAtExactLimitIsAccepted() {
        let out = decodeFrames([[0x82, 0x7E, 0x04, 0x00] + [UInt8](repeating: 7, count: 1024)], role: .client, maxFrameSize: 1024)
        #expect(out.error == nil)
        #expect(out.frames.first?.payload.count == 1024)
    }

    @Test func rsv1AllowedWhenNegotiated() {
        let out = decodeFrames([[0xC1, 0x80, 0, 0, 0, 0]], role: .server, allowRSV1: true)
        #expect(out.error == nil)
        #expect(out.frames.first?.header.rsv1 == true)
    }

    @Test func violationIsReportedAsSoonAsTheBadByteArrives() {
        // Only the first byte of a reserved-opcode frame: the decoder must not wait for more.
        #expect(decodeFrames([[0x83]], role: .server).error?.kind == .reservedOpcode(3))
        // Two bytes of an unmasked frame that announces 126 bytes.
        #expect(decodeFrames([[0x81, 0x7E]], role: .server).error?.kind == .unmaskedClientFrame)
    }

    @Test func partialHeaderIsKeptByTheDecoder() {
        // 13 of the 14 header bytes, then the rest: the caller never re-presents bytes.
        let wire: [UInt8] = [0x82, 0xFF, 0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4] + [UInt8](repeating: 0, count: 65536)
        let out = decodeFrames([Array(wire[..<13]), Array(wire[13...])], role: .server)
        #expect(out.error == nil)
        #expect(out.frames.count == 1)
        #expect(out.frames.first?.header.maskKey == 0x0403_0201)
        #expect(out.frames.first?.payload == (0..<65536).map { [1, 2, 3, 4][$0 % 4] })
    }
}
