import COpenSSL
import Glibc
import Testing
@testable import Hub
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// The hub's TLS 1.3 record layer alone, between two mirror-image layers (server and client keys swapped) over a
/// socketpair: the fuzzer's corpus replayed through its scenario, and properties the scenario does not spell out.
/// Against OpenSSL as the peer, see `TLSTests`.
@Suite struct TLSRecordLayerTests {
    /// The TLS record fuzzer's corpus (`Fuzz/TLSRecordsFuzz.swift`, `Tests/HubTests/Corpus/tlsrecords/`), replayed as
    /// the fuzzer runs each input (the invariants are in `TLSRecordScenario`).
    @Test func fuzzCorpusReplays() {
        let corpus = ConnectionFuzzReplayTests.corpus("tlsrecords")
        #expect(corpus.count >= 40)
        for (name, input) in corpus {
            let problem = TLSRecordScenario.run(input)
            #expect(problem == nil, "\(name): \(problem ?? "")")
        }
    }

    /// A layer pair over a socketpair.
    final class Pair {
        let server: TLSRecordLayer, client: TLSRecordLayer
        let crypto = TLSRecordCrypto()
        /// The client's scratch, with room for records over the limit (a misbehaving peer's).
        let clientCrypto = TLSRecordCrypto(recordCapacity: TLSRecordLayer.maxRecord + 512)
        var fds: [Int32] = [0, 0]
        init(_ suite: TLSRecordLayer.Suite) throws {
            let c = [UInt8](repeating: 0x31, count: 48), s = [UInt8](repeating: 0x42, count: 48)
            guard let server = TLSRecordLayer(suite: suite, readSecret: c, writeSecret: s, writeSeq: 0),
                  let client = TLSRecordLayer(suite: suite, readSecret: s, writeSecret: c, writeSeq: 0) else {
                throw HubTestError("the keys could not be derived")
            }
            (self.server, self.client) = (server, client)
            guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else { throw HubTestError("socketpair failed") }
            for fd in fds { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        }
        deinit { Glibc.close(fds[0]); Glibc.close(fds[1]) }

        /// One record the client seals (content, type, padding): its bytes.
        func clientRecord(_ content: [UInt8], type: UInt8 = 23, padding: Int = 0) -> [UInt8] {
            let inner = content + [type] + [UInt8](repeating: 0, count: padding)
            guard client.beginRecord(length: inner.count - 1, crypto: clientCrypto, maxLength: Int.max),
                  inner.withUnsafeBytes({ client.sealMore($0.baseAddress!, $0.count, crypto: clientCrypto) }),
                  let length = client.sealTag(crypto: clientCrypto) else { return [] }
            return Array(UnsafeRawBufferPointer(start: clientCrypto.record.baseAddress!, count: length))
        }

        /// A KeyUpdate record (not asking for one back), the client's write keys moved on.
        func clientKeyUpdate() -> [UInt8] {
            let record = clientRecord([24, 0, 0, 1, 0], type: 22)
            _ = client.keyUpdateSent()
            return record
        }

        /// The alert the server sent (the client opens what it wrote), or nil.
        func alertFromServer() -> UInt8? {
            let room = TLSRecordLayer.maxRecord * 2
            let out = UnsafeMutableRawPointer.allocate(byteCount: room, alignment: 16)
            defer { out.deallocate() }
            _ = try? client.read(fd: fds[1], into: out, room: room, crypto: clientCrypto)
            return client.alertReceived
        }

        /// Writes `bytes` to the server's socket and reads once: the plaintext, nil at EOF, or the error.
        func serverReads(_ bytes: [UInt8]) -> Result<[UInt8]?, SyscallError> {
            _ = bytes.withUnsafeBytes { send(fds[1], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            let room = TLSRecordLayer.maxRecord * 2
            let out = UnsafeMutableRawPointer.allocate(byteCount: room, alignment: 16)
            defer { out.deallocate() }
            do {
                switch try server.read(fd: fds[0], into: out, room: room, crypto: crypto) {
                case .processed(0): return .success(nil)
                case .processed(let n): return .success(Array(UnsafeRawBufferPointer(start: out, count: n)))
                case .wouldBlock: return .success([])
                }
            } catch {
                return .failure(error)
            }
        }
    }

    /// A peer that asks for KeyUpdates without reading our answers: the budget (32, then one per 64 KiB of data)
    /// ends it long before its unsent answers could pass `maxPendingOut`.
    @Test func aPeerThatAsksForKeyUpdatesWithoutReadingIsCutOff() throws {
        let pair = try Pair(.aes128GCM)
        var stream: [UInt8] = []
        for _ in 0..<1_300 {
            stream += pair.clientRecord([24, 0, 0, 1, 1], type: 22)
            #expect(pair.client.keyUpdateSent())
        }
        guard case .failure(let error) = pair.serverReads(stream) else {
            Issue.record("1 300 unanswered KeyUpdate requests were accepted")
            return
        }
        #expect(error.code == EPROTO)
        #expect(pair.server.keyUpdatesReceived == TLSRecordLayer.keyUpdateBurst)
        #expect(pair.server.pendingOutBytes == TLSRecordLayer.keyUpdateBurst * 27)
    }

    /// RFC 8446 §5.1: a KeyUpdate ends its record. One bundled with another (the red team's 29× CPU lever: 3 276 in
    /// one record), or followed by anything, fails with unexpected_message before the second is processed.
    @Test func aKeyUpdateMustEndItsRecord() throws {
        for tail: [UInt8] in [[24, 0, 0, 1, 0], [24, 0, 0, 1, 1], [20, 0, 0, 0]] {
            let pair = try Pair(.aes128GCM)
            guard case .failure = pair.serverReads(pair.clientRecord([24, 0, 0, 1, 0] + tail, type: 22)) else {
                Issue.record("a record with a KeyUpdate and \(tail) behind it was accepted")
                continue
            }
            #expect(pair.server.keyUpdatesReceived == 0)
            #expect(pair.alertFromServer() == 10, "unexpected_message")
        }
        // Alone in its record, it is fine, and the connection goes on under the new keys.
        let pair = try Pair(.aes128GCM)
        #expect(try pair.serverReads(pair.clientKeyUpdate() + pair.clientRecord(Array("on".utf8))).get() == Array("on".utf8))
    }

    /// The KeyUpdate budget: 32 at once; the 33rd without data between fails (unexpected_message, as BoringSSL);
    /// 64 KiB of application data earns one more, and credit never grows past the burst.
    @Test func keyUpdatesBeyondTheBudgetFail() throws {
        let burst = TLSRecordLayer.keyUpdateBurst
        let pair = try Pair(.chacha20Poly1305)
        for _ in 0..<burst { #expect(try pair.serverReads(pair.clientKeyUpdate()).get() == []) }
        let chunk = [UInt8](repeating: 0x61, count: TLSRecordLayer.maxPlaintext)
        for _ in 0..<(TLSRecordLayer.keyUpdateBytes / chunk.count) { #expect(try pair.serverReads(pair.clientRecord(chunk)).get() == chunk) }
        #expect(try pair.serverReads(pair.clientKeyUpdate()).get() == [], "64 KiB of data paid for one more")
        guard case .failure = pair.serverReads(pair.clientKeyUpdate()) else {
            Issue.record("a KeyUpdate beyond the budget was accepted")
            return
        }
        #expect(pair.server.keyUpdatesReceived == burst + 1)
        #expect(pair.alertFromServer() == 10)

        // Credit is capped at the burst: a gigabyte of data does not buy a burst of thousands.
        let rich = try Pair(.aes128GCM)
        for _ in 0..<(4 * burst) { _ = try rich.serverReads(rich.clientRecord(chunk)).get() }
        for _ in 0..<burst { #expect(try rich.serverReads(rich.clientKeyUpdate()).get() == []) }
        guard case .failure = rich.serverReads(rich.clientKeyUpdate()) else {
            Issue.record("credit grew past the burst")
            return
        }
    }

    /// RFC 8446 §5.4: the inner plaintext (content, type, padding) is at most 2^14 + 1 bytes. The limit itself opens,
    /// with content or with padding; one byte more is record_overflow (OpenSSL's answer too), though its ciphertext
    /// is under the 2^14 + 256 ciphertext cap that was checked alone before.
    @Test func innerPlaintextOverTheLimitIsRecordOverflow() throws {
        let limit = TLSRecordLayer.maxInnerPlaintext
        let full = [UInt8](repeating: 0x62, count: limit - 1)
        let pair = try Pair(.aes256GCM)
        #expect(try pair.serverReads(pair.clientRecord(full)).get() == full)
        #expect(try pair.serverReads(pair.clientRecord([0x63], padding: limit - 2)).get() == [0x63])
        for (content, padding) in [(full + [0x62], 0), ([0x63], limit - 1), (full, 200)] {
            let over = try Pair(.aes128GCM)
            let record = over.clientRecord(content, padding: padding)
            #expect(record.count - 5 <= TLSRecordLayer.maxCiphertext)
            guard case .failure = over.serverReads(record) else {
                Issue.record("an inner plaintext of \(content.count + 1 + padding) bytes was accepted")
                continue
            }
            #expect(over.alertFromServer() == 22, "record_overflow")
        }
    }

    @Test(arguments: [TLSRecordLayer.Suite.aes128GCM, .aes256GCM, .chacha20Poly1305])
    func paddedRecordsOpenToTheirContent(_ suite: TLSRecordLayer.Suite) throws {
        let pair = try Pair(suite)
        let records = pair.clientRecord(Array("hello".utf8), padding: 7) + pair.clientRecord([]) + pair.clientRecord(Array(" world".utf8), padding: 1)
        #expect(try pair.serverReads(records).get() == Array("hello world".utf8))
    }

    /// Every single bit flipped anywhere in a record (header included) fails the read: the tag covers the header as
    /// additional data, and the header's own checks catch the rest. Nothing of a forged record comes out.
    @Test func anyFlippedBitFailsTheRecord() throws {
        let record = try Pair(.aes128GCM).clientRecord(Array("tamper-evident".utf8))
        for index in 0..<record.count {
            for bit in [0, 3, 7] {
                let pair = try Pair(.aes128GCM)  // fresh sequence numbers for each try
                var forged = record
                forged[index] ^= UInt8(1 << bit)
                switch pair.serverReads(forged) {
                case .failure: break
                case .success(let plaintext):
                    // A flip in the length may only make the record look longer (still waiting for its rest).
                    #expect(index >= 3 && index <= 4 && plaintext == [], "byte \(index) bit \(bit): \(String(describing: plaintext))")
                }
            }
        }
    }

    /// A record replayed (the same bytes twice) fails the second time: its sequence number is spent.
    @Test func aReplayedRecordFails() throws {
        let pair = try Pair(.chacha20Poly1305)
        let record = pair.clientRecord(Array("once".utf8))
        #expect(try pair.serverReads(record).get() == Array("once".utf8))
        guard case .failure(let error) = pair.serverReads(record) else {
            Issue.record("the replayed record was accepted")
            return
        }
        #expect(error.code == EPROTO)
    }
}
