import HubEngine
import HubRouting
import WSProtocol

/// `/echo` (with `--echo`): every message goes back as it came, compressed with permessage-deflate when the client
/// offered it. It exists for the conformance suites. The WebSocket session around it (frames, pings, the close
/// handshake) is `ClientConnection`'s, shared with `/ws`.
final class EchoSession {
    /// The `Sec-WebSocket-Extensions` answer, when permessage-deflate was negotiated.
    let extensionsHeader: String?
    /// Its deflate streams: classes, so each window lives in its object between messages.
    private let compressor: PerMessageDeflater?
    private let decompressor: PerMessageInflater?

    init(offers: [ExtensionOffer]) {
        if let (parameters, answer) = PerMessageDeflate.negotiate(offers: offers, configuration: PerMessageDeflateConfiguration()) {
            extensionsHeader = answer
            compressor = PerMessageDeflater(parameters: parameters, role: .server)
            decompressor = PerMessageInflater(parameters: parameters, role: .server)
        } else {
            (extensionsHeader, compressor, decompressor) = (nil, nil, nil)
        }
    }

    /// The reader for this session's frames, kept for the whole session (its inflater holds the client's window;
    /// `/ws` drops its reader between messages instead).
    func makeReader(maxMessageBytes: Int) -> MessageReader {
        MessageReader(configuration: MessageReaderConfiguration(role: .server, maxFrameSize: maxMessageBytes, maxMessageSize: maxMessageBytes),
                      decompressor: decompressor)
    }

    /// The frame that echoes one message (compressed from 64 bytes up, when negotiated).
    func frame(_ opcode: Opcode, _ payload: UnsafeRawBufferPointer) -> SharedBytes {
        if let compressor, payload.count >= 64 {
            let compressed = compressor.compressMessage(payload)
            return compressed.withUnsafeBytes { SharedBytes.frame(opcode: opcode, $0, rsv1: true) }
        }
        return SharedBytes.frame(opcode: opcode, payload)
    }
}
