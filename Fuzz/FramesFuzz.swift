// libFuzzer target for the frame/message layer. Built by `Fuzz/run Frames SECONDS` together with the
// WSProtocol sources (so no `import`).
//
// Input format: byte 0 picks the configuration (bit 0: install a pass-through decompressor so RSV1 is
// accepted; bit 1: let the callback answer `.stop`; bits 2-3: limits). The rest is cut into reads the
// way uWebSockets' `makeChunked` does: a length byte L, then the next L bytes (L == 0: all the rest).

/// Stands in for permessage-deflate: "inflates" by copying, enforcing the limit like the real one must.
struct CopyDecompressor: MessageDecompressor {
    mutating func decompressMessage(_ compressed: UnsafeRawBufferPointer, into output: inout [UInt8], limit: Int) throws(ProtocolViolation) {
        if output.count + compressed.count > limit { throw ProtocolViolation(.decompressedTooLarge(output.count + compressed.count)) }
        output.append(contentsOf: compressed)
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let flags = data[0]
    let limits: [(Int, Int)] = [(125, 256), (1024, 4096), (4096, 1024), (1 << 16, 1 << 16)]
    let (maxFrame, maxMessage) = limits[Int(flags >> 2) & 3]
    let configuration = MessageReaderConfiguration(role: .server, maxFrameSize: maxFrame, maxMessageSize: maxMessage)
    var reader = MessageReader(configuration: configuration, decompressor: flags & 1 != 0 ? CopyDecompressor() : nil)
    let allowStop = flags & 2 != 0
    var deliveries = 0

    var i = 1
    while i < size {
        var length = Int(data[i]); i += 1
        if length == 0 || length > size - i { length = size - i }
        var chunk = Array(UnsafeBufferPointer(start: data + i, count: length))
        i += length
        var start = 0
        var rounds = 0
        do throws(ProtocolViolation) {
            while true {
                rounds += 1
                precondition(rounds <= 2 * length + 4, "reader makes no progress")
                let given = chunk.count - start
                let consumed = try chunk.withUnsafeMutableBytes { raw in
                    Result { () throws(ProtocolViolation) -> Int in
                    try reader.read(UnsafeMutableRawBufferPointer(rebasing: raw[start...])) { message in
                        deliveries += 1
                        switch message {
                        case .text(let p):
                            precondition(p.count <= maxMessage)
                            precondition(String(validating: p, as: UTF8.self) != nil, "invalid UTF-8 delivered as text")
                        case .binary(let p):
                            precondition(p.count <= maxMessage)
                        case .ping(let p), .pong(let p):
                            precondition(p.count <= 125)
                        case .close(let code, let reason):
                            precondition(reason.count <= 123)
                            if let code { precondition(CloseCode.isValidOnWire(code)) } else { precondition(reason.isEmpty) }
                            precondition(String(validating: reason, as: UTF8.self) != nil)
                        }
                        return allowStop && deliveries % 3 == 0 ? .stop : .continue
                    }
                    }
                }.get()
                precondition(consumed >= 0 && consumed <= given, "consumed more than given")
                start += consumed
                if start == chunk.count { break }
                precondition(allowStop, "stopped without being asked")
            }
        } catch {
            precondition(!error.description.isEmpty)
            return 0
        }
    }
    return 0
}
