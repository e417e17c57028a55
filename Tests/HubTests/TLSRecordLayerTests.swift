import COpenSSL
import Glibc
import Testing
@testable import Hub

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
        var fds: [Int32] = [0, 0]
        init(_ suite: TLSRecordLayer.Suite) throws {
            let c = [UInt8](repeating: 0x31, count: 48), s = [UInt8](repeating: 0x42, count: 48)
            server = TLSRecordLayer(suite: suite, clientSecret: c, serverSecret: s, writeSeq: 0)
            client = TLSRecordLayer(suite: suite, clientSecret: s, serverSecret: c, writeSeq: 0)
            guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else { throw HubTestError("socketpair failed") }
            for fd in fds { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        }
        deinit { Glibc.close(fds[0]); Glibc.close(fds[1]) }

        /// One record the client seals (content, type, padding): its bytes.
        func clientRecord(_ content: [UInt8], type: UInt8 = 23, padding: Int = 0) -> [UInt8] {
            let inner = content + [type] + [UInt8](repeating: 0, count: padding)
            guard client.beginRecord(length: inner.count - 1, crypto: crypto),
                  inner.withUnsafeBytes({ client.sealMore($0.baseAddress!, $0.count, crypto: crypto) }),
                  let length = client.sealTag(crypto: crypto) else { return [] }
            return Array(UnsafeRawBufferPointer(start: crypto.record.baseAddress!, count: length))
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

    /// A peer that keeps asking for KeyUpdates and never reads our answers is cut off when they would pass
    /// `maxPendingOut` unsent (found by the TLSRecords fuzzer, whose scenario then modelled such a peer): each answer
    /// record is 27 bytes and the cap 2 × 16 645, so 1 232 fit and the 1 233rd request fails the read.
    @Test func aPeerThatAsksForKeyUpdatesWithoutReadingIsCutOff() throws {
        let pair = try Pair(.aes128GCM)
        var stream: [UInt8] = []
        for _ in 0..<1_300 {
            stream += pair.clientRecord([24, 0, 0, 1, 1], type: 22)
            #expect(pair.client.keyUpdateSent())
        }
        var outcome: Result<[UInt8]?, SyscallError> = .success([])
        var offset = 0
        while offset < stream.count, case .success = outcome {
            let piece = Array(stream[offset..<min(stream.count, offset + 4096)])
            offset += piece.count
            outcome = pair.serverReads(piece)  // the server reads and never sends: its answers pile up
        }
        guard case .failure(let error) = outcome else {
            Issue.record("1 300 unanswered KeyUpdate requests were accepted: \(outcome)")
            return
        }
        #expect(error.code == EPROTO)
        #expect(pair.server.keyUpdatesReceived == 1_233)
        #expect(pair.server.pendingOutBytes == 1_232 * 27)
        #expect(pair.server.pendingOutBytes <= TLSRecordLayer.maxPendingOut)
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
