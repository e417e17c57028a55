import Testing
@testable import WSProtocol

/// After a violation the decoder and the reader are poisoned (RFC 6455 section 7.1.7: no further data is processed).
/// Regression for issue 8: a frame that must fail, fed one octet per call, used to advance the partial header past
/// the failed first-byte check; the next octet was then parsed unchecked and a later force-unwrap trapped.
@Suite("Poisoned after a violation")
struct PoisonedDecoderTests {
    static let badFirstBytes: [UInt8] = [0xC1, 0xA1, 0x91, 0x87, 0x8F, 0x83, 0x8B, 0x09]

    static func frame(_ b0: UInt8) -> [UInt8] { [b0, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58] }

    @Test(arguments: badFirstBytes)
    func decoderFedOneOctetAtATimeRethrowsAndConsumesNothing(_ b0: UInt8) {
        var decoder = FrameDecoder(role: .server)
        var first: ProtocolViolation?
        for (i, byte) in Self.frame(b0).enumerated() {
            var one = [byte]
            var offset = 0
            let thrown = one.withUnsafeMutableBytes { raw -> ProtocolViolation? in
                do throws(ProtocolViolation) { _ = try decoder.next(raw, at: &offset); return nil } catch { return error }
            }
            if i == 0 {
                first = thrown
                #expect(thrown != nil, "the first octet 0x\(String(b0, radix: 16)) is refused at once")
            } else {
                #expect(thrown == first, "octet \(i) after the violation is not parsed")
                #expect(offset == 0)
            }
        }
        #expect(decoder.violation == first)
    }

    @Test(arguments: badFirstBytes)
    func readerFedOneOctetAtATimeDeliversNothingMore(_ b0: UInt8) {
        var reader = MessageReader(configuration: MessageReaderConfiguration(role: .server))
        var errors: [ProtocolViolation] = []
        var messages = 0
        // The bad frame, then a valid masked text frame that must never be delivered.
        let valid: [UInt8] = [0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58]
        for byte in Self.frame(b0) + valid {
            var one = [byte]
            one.withUnsafeMutableBytes { raw in
                do throws(ProtocolViolation) {
                    _ = try reader.read(raw) { _ in messages += 1; return .continue }
                } catch {
                    errors.append(error)
                }
            }
        }
        #expect(messages == 0)
        #expect(errors.count == Self.frame(b0).count + valid.count)
        #expect(Set(errors).count == 1)
    }

    /// A message-level violation (a continuation with no message) poisons the reader too: the valid frame behind it
    /// in the same buffer and in later buffers is never delivered.
    @Test func messageViolationPoisonsTheReader() {
        var reader = MessageReader(configuration: MessageReaderConfiguration(role: .server))
        var wire: [UInt8] = [0x80, 0x80, 0, 0, 0, 0]  // continuation, empty, no message in progress
        wire += [0x81, 0x80, 0, 0, 0, 0]              // empty text
        var delivered = 0
        var thrown = 0
        for _ in 0..<2 {
            var copy = wire
            copy.withUnsafeMutableBytes { raw in
                do { _ = try reader.read(raw) { _ in delivered += 1; return .continue } } catch { thrown += 1 }
            }
        }
        #expect(delivered == 0)
        #expect(thrown == 2)
        #expect(reader.violation == ProtocolViolation(.unexpectedContinuation))
    }
}
