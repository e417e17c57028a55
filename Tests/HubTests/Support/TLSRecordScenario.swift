// One input of the TLS record-layer fuzzer (`Fuzz/TLSRecordsFuzz.swift`), also replayed by `swift test`
// (`TLSRecordLayerTests`). The fuzz build compiles this file together with Sources/Hub/Engine/TLSRecords.swift, with
// no Hub module to import.
#if canImport(HubEngine)
@testable import HubEngine
#endif
import COpenSSL
import Glibc

/// A client's records, built from fuzz bytes and sealed by a mirror-image `TLSRecordLayer` (the client's keys), go
/// over a socketpair to the server's layer, cut into writes of one size; the server's layer reads them as the
/// connection would. The model says what must come out.
///
/// Input: byte 0 picks the suite (bits 0-1, mod 3) and the write size (bits 2-3: all at once, one octet for the
/// first `byteWiseBytes` and then 1000, 7, 1000).
/// Then operations, each an op byte `k` and its operands:
/// - `k % 8` 0-1: application data: a length byte L and L content bytes, then `(k >> 3) & 7` zeros of padding;
/// - 2: the first two times, a record near the size limit: a byte B, and an inner plaintext of 2^14 + 1 - 128 + B
///   bytes (content of the next byte repeated, or with bit 3 one content byte and zero padding); above 2^14 + 1 it
///   is record_overflow. After two, or when the write size is 1 or 7 (16 KiB a byte at a time is 30 ms an input),
///   as 0-1;
/// - 3: KeyUpdate, asking for one back if bit 3; bit 4 makes it malformed (request value 2: illegal_parameter); bit 5
///   puts a second KeyUpdate behind it in the same record (unexpected_message: a key change must end its record);
/// - 4: an alert with the next byte as its description (0 close_notify, 90 user_canceled, others fatal);
/// - 5: a record whose content type is not allowed (no type at all, change_cipher_spec, 24 or 99, by bits 3-4);
/// - 6: L raw bytes, not a record (what follows is unknowable: only the data before must hold);
/// - 7: an empty application data record.
///
/// A KeyUpdate beyond the budget (`keyUpdateBurst`, one more per `keyUpdateBytes` of data, capped) fails the read.
///
/// Invariants: no crash and no hang; the application bytes that come out are exactly those of the data records (a
/// prefix of them when a bad record ends the connection: bytes opened in the same read as the bad record are
/// dropped with the connection); a close_notify reads as EOF; a bad record fails the read; each KeyUpdate that
/// asks for one gets one, which the client opens (it reads them as they come, after each of the server's reads),
/// unless one read brought more requests than `maxPendingOut` holds answers (the layer then cuts the peer off, with
/// its output at the cap, and only the data before must hold); and a record the server seals at the end opens at the client,
/// so both sides' keys stayed in step through every update.
enum TLSRecordScenario {
    static let byteWiseBytes = 768
    private enum Ending { case open, closeNotify, invalid, garbage }

    /// nil when every invariant held, or what broke.
    static func run(_ input: [UInt8]) -> String? {
        guard input.count >= 1 else { return nil }
        let suite = TLSRecordLayer.Suite(rawValue: Int32(input[0] & 3) % 3) ?? .aes128GCM
        let writeSize = [Int.max, 1, 7, 1000][Int(input[0] >> 2) & 3]
        let clientSecret = [UInt8](repeating: 0x11, count: 48), serverSecret = [UInt8](repeating: 0x22, count: 48)
        guard let server = TLSRecordLayer(suite: suite, readSecret: clientSecret, writeSecret: serverSecret, writeSeq: 0),
              let client = TLSRecordLayer(suite: suite, readSecret: serverSecret, writeSecret: clientSecret, writeSeq: 0) else {
            return "the keys could not be derived"
        }
        let crypto = TLSRecordCrypto()
        // The client seals with room for oversized records, as a misbehaving peer would.
        let clientCrypto = TLSRecordCrypto(recordCapacity: TLSRecordLayer.maxPlaintext + TLSRecordLayer.overhead + 512)

        // The client's stream, and what the server must make of it.
        var stream: [UInt8] = []
        var expected: [UInt8] = []
        var answersOwed = 0
        var ending = Ending.open
        // The server's KeyUpdate budget, as the layer keeps it.
        var credit = TLSRecordLayer.maxKeyUpdateCredit
        var bigRecords = 0
        func seal(_ inner: [UInt8]) -> String? {
            guard client.beginRecord(length: inner.count - 1, crypto: clientCrypto, maxLength: Int.max),
                  inner.withUnsafeBytes({ client.sealMore($0.baseAddress!, $0.count, crypto: clientCrypto) }),
                  let length = client.sealTag(crypto: clientCrypto) else { return "the client could not seal a record" }
            stream += UnsafeRawBufferPointer(start: clientCrypto.record.baseAddress!, count: length)
            return nil
        }
        func data(_ content: [UInt8], padding: Int) -> String? {
            if let problem = seal(content + [23] + [UInt8](repeating: 0, count: padding)) { return problem }
            expected += content
            credit = min(TLSRecordLayer.maxKeyUpdateCredit, credit + content.count)
            return nil
        }
        var i = 1
        func byte() -> UInt8? {
            guard i < input.count else { return nil }
            defer { i += 1 }
            return input[i]
        }
        func bytes(_ n: Int) -> [UInt8] {
            let end = min(input.count, i + n)
            defer { i = end }
            return Array(input[i..<end])
        }
        while ending == .open, let k = byte() {
            switch k % 8 {
            case 2 where bigRecords < 2 && writeSize >= 1000:
                bigRecords += 1
                let inner = TLSRecordLayer.maxInnerPlaintext - 128 + Int(byte() ?? 0)
                let fill = byte() ?? 0x61
                let content = [UInt8](repeating: fill, count: k & 0x08 != 0 ? 1 : inner - 1)
                if inner > TLSRecordLayer.maxInnerPlaintext {
                    if let problem = seal(content + [23] + [UInt8](repeating: 0, count: inner - 1 - content.count)) { return problem }
                    ending = .invalid
                } else if let problem = data(content, padding: inner - 1 - content.count) {
                    return problem
                }
            case 0, 1, 2:
                if let problem = data(bytes(Int(byte() ?? 0)), padding: Int(k >> 3) & 7) { return problem }
            case 3:
                let malformed = k & 0x10 != 0
                let bundled = k & 0x20 != 0
                let request: UInt8 = malformed ? 2 : (k & 0x08 != 0 ? 1 : 0)
                let message: [UInt8] = [24, 0, 0, 1, request]
                if let problem = seal(message + (bundled ? [24, 0, 0, 1, 0] : []) + [22]) { return problem }
                if malformed || bundled || credit < TLSRecordLayer.keyUpdateBytes { ending = .invalid; break }
                credit -= TLSRecordLayer.keyUpdateBytes
                guard client.keyUpdateSent() else { return "the client's key update failed" }
                if request == 1 { answersOwed += 1 }
            case 4:
                let description = byte() ?? 0
                if let problem = seal([description == 0 ? 1 : 2, description, 21]) { return problem }
                if description == 0 { ending = .closeNotify } else if description != 90 { ending = .invalid }
            case 5:
                let inner: [[UInt8]] = [[0, 0, 0], [1, 20], [1, 24], [7, 99]]
                if let problem = seal(inner[Int(k >> 3) & 3]) { return problem }
                ending = .invalid
            case 6:
                stream += bytes(Int(byte() ?? 0))
                ending = .garbage
            default:
                if let problem = seal([23]) { return problem }
            }
        }

        // Over a socketpair, in writes of `writeSize`, read by the server after each.
        var fds: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else { return nil }  // out of descriptors: not the layer's fault
        defer { Glibc.close(fds[0]); Glibc.close(fds[1]) }
        for fd in fds { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        let room = TLSRecordLayer.maxRecord * 4
        let destination = UnsafeMutableRawPointer.allocate(byteCount: room, alignment: 16)
        defer { destination.deallocate() }
        var delivered: [UInt8] = []
        var eof = false
        var failed = false
        var cutOff = false
        var offset = 0
        var rounds = 0
        while offset < stream.count && !eof && !failed {
            rounds += 1
            if rounds > stream.count + 16 { return "no progress writing the stream" }
            // One octet at a time only for the stream's first `byteWiseBytes` (dozens of records, every kind of split
            // point); then 1000 at a time. Byte-wise writes of a whole stream were most of the target's time (a
            // send and two reads per octet).
            let size = writeSize == 1 && offset >= Self.byteWiseBytes ? 1000 : writeSize
            let n = min(size, stream.count - offset)
            let sent = stream[offset..<(offset + n)].withUnsafeBytes { send(fds[1], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent > 0 { offset += sent }
            // Read until the socket is drained, as the loop would.
            var reads = 0
            reading: while true {
                reads += 1
                if reads > stream.count + 16 { return "the server's read makes no progress" }
                do {
                    switch try server.read(fd: fds[0], into: destination, room: room, crypto: crypto) {
                    case .processed(0): eof = true; break reading
                    case .processed(let got): delivered += UnsafeRawBufferPointer(start: destination, count: got)
                    case .wouldBlock: break reading
                    }
                } catch {
                    failed = true
                    // The one failure a valid stream may meet: more KeyUpdate answers owed within one read than
                    // `maxPendingOut` holds (a burst of over 1 232 requests; BoringSSL allows 32). It is the layer's
                    // defence, and only that: the output must be at the cap.
                    cutOff = server.pendingOutBytes + 27 > TLSRecordLayer.maxPendingOut
                    break reading
                }
            }
            // As the connection does after a read, the server sends its KeyUpdate answers, and the client reads
            // them as a live peer would. (A peer that never reads is cut off once its unsent answers pass
            // `maxPendingOut`: `TLSRecordLayerTests.aPeerThatAsksForKeyUpdatesWithoutReadingIsCutOff`. Before this
            // drain the scenario modelled such a peer and the fuzzer found the cap, after 2 263 requests.)
            if failed || eof { break }
            guard server.hasPendingOut else { continue }
            do {
                _ = try server.sendPending(fd: fds[0])
                draining: while true {
                    switch try client.read(fd: fds[1], into: destination, room: room, crypto: clientCrypto) {
                    case .processed(0): return "the client read EOF while the stream was being written"
                    case .processed: return "the client got application data it was never sent"
                    case .wouldBlock: break draining
                    }
                }
            } catch {
                return "the server's KeyUpdate answers did not reach the client: \(error)"
            }
        }
        if cutOff {
            // Cut off for its burst of KeyUpdates: what came out before must still be what was sent.
            return expected.starts(with: delivered) ? nil : "delivered bytes that were not sent (before a KeyUpdate burst)"
        }
        switch ending {
        case .open:
            if failed || eof { return "a valid stream \(failed ? "failed" : "ended")" }
            if delivered != expected { return "delivered \(delivered.count) bytes, expected \(expected.count)" }
        case .closeNotify:
            if failed { return "a stream ending in close_notify failed" }
            if !eof { return "close_notify did not read as EOF" }
            if delivered != expected { return "delivered \(delivered.count) bytes before close_notify, expected \(expected.count)" }
        case .invalid:
            if !failed { return "a bad record did not fail the read (eof: \(eof))" }
            if !expected.starts(with: delivered) { return "delivered bytes that were not sent" }
        case .garbage:
            if !expected.starts(with: delivered) { return "delivered bytes that were not sent" }
        }
        guard ending == .open || ending == .closeNotify else { return nil }

        // The server's KeyUpdate answers reach the client, then a record of the server's: both open there.
        let tail = Array("tail".utf8)
        guard server.beginRecord(length: tail.count, crypto: crypto),
              tail.withUnsafeBytes({ server.sealMore($0.baseAddress!, $0.count, crypto: crypto) }),
              let length = server.finishRecord(type: 23, crypto: crypto) else { return "the server could not seal" }
        server.appendPending(crypto.record.baseAddress!, length)
        var got: [UInt8] = []
        var rounds2 = 0
        while got.count < tail.count {
            rounds2 += 1
            if rounds2 > 64 { return "the client never got the server's record" }
            do {
                _ = try server.sendPending(fd: fds[0])
                switch try client.read(fd: fds[1], into: destination, room: room, crypto: clientCrypto) {
                case .processed(0): return "the client read EOF"
                case .processed(let n): got += UnsafeRawBufferPointer(start: destination, count: n)
                case .wouldBlock: break
                }
            } catch {
                return "the client could not open the server's records: \(error)"
            }
        }
        if client.keyUpdatesReceived != answersOwed {
            return "the client got \(client.keyUpdatesReceived) KeyUpdates, asked for \(answersOwed)"
        }
        return got == tail ? nil : "the client opened other bytes than the server sealed"
    }
}
