import HubEngine
import WSProtocol

extension SharedBytes {
    /// One unmasked, final frame (a server's), header and payload in one buffer that every recipient shares.
    package static func frame(opcode: Opcode, _ payload: UnsafeRawBufferPointer, rsv1: Bool = false) -> SharedBytes {
        let header = FrameEncoder.headerSize(payloadLength: payload.count, masked: false)
        return SharedBytes(count: header + payload.count) { buffer in
            _ = FrameEncoder.writeHeader(into: buffer, endingAt: header, opcode: opcode, fin: true, rsv1: rsv1,
                                         payloadLength: payload.count, maskKey: nil)
            if payload.count > 0 { (buffer.baseAddress! + header).copyMemory(from: payload.baseAddress!, byteCount: payload.count) }
        }
    }
}
