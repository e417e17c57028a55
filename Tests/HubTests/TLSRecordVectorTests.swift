import COpenSSL
import Glibc
import Testing
@testable import HubEngine

/// The hub's TLS 1.3 record layer against RFC 8448 §3 ("Simple 1-RTT Handshake", TLS_AES_128_GCM_SHA256): from the
/// trace's application traffic secrets, it must seal the trace's records byte for byte and open the client's.
@Suite struct TLSRecordVectorTests {
    /// client_application_traffic_secret_0 and server_application_traffic_secret_0 of the trace.
    static let clientSecret = bytes("""
        9e 40 64 6c e7 9a 7f 9d c0 5a f8 88 9b ce 65 52 87 5a fa 0b 06 df 00 87 f7 92 eb b7 c1 75 04 a5
        """)
    static let serverSecret = bytes("""
        a1 1a f9 f0 55 31 f8 56 ad 47 11 6b 45 a9 50 32 82 04 b4 f4 4b fb 6b 3a 4b 4f 1f 3f cb 63 16 43
        """)
    /// Both application_data records carry the 50 octets 00 01 … 31.
    static let payload = (0..<50).map { UInt8($0) }
    /// "{client} send application_data record": the client's first record under its application keys (seq 0).
    static let clientData = bytes("""
        17 03 03 00 43 a2 3f 70 54 b6 2c 94 d0 af fa fe 82 28 ba 55 cb ef ac ea 42 f9 14 aa 66 bc ab 3f 2b 98 19
        a8 a5 b4 6b 39 5b d5 4a 9a 20 44 1e 2b 62 97 4e 1f 5a 62 92 a2 97 70 14 bd 1e 3d ea e6 3a ee bb 21 69 49
        15 e4
        """)
    /// "{server} send application_data record": seq 1, after the NewSessionTicket.
    static let serverData = bytes("""
        17 03 03 00 43 2e 93 7e 11 ef 4a c7 40 e5 38 ad 36 00 5f c4 a4 69 32 fc 32 25 d0 5f 82 aa 1b 36 e3 0e fa
        f9 7d 90 e6 df fc 60 2d cb 50 1a 59 a8 fc c4 9c 4b f2 e5 f0 a2 1c 00 47 c2 ab f3 32 54 0d d0 32 e1 67 c2
        95 5d
        """)
    /// "{client} send alert record" (close_notify, seq 1) and "{server} send alert record" (close_notify, seq 2).
    static let clientCloseNotify = bytes("17 03 03 00 13 c9 87 27 60 65 56 66 b7 4d 7f f1 15 3e fd 6d b6 d0 b0 e3")
    static let serverCloseNotify = bytes("17 03 03 00 13 b5 8f d6 71 66 eb f5 99 d2 47 20 cf be 7e fa 7a 88 64 a9")

    static func bytes(_ hex: String) -> [UInt8] {
        hex.split(whereSeparator: { $0 == " " || $0 == "\n" }).compactMap { UInt8($0, radix: 16) }
    }

    /// One record sealed the way the hub seals its own (content, then the type byte, then the tag).
    static func seal(_ layer: TLSRecordLayer, _ content: [UInt8], type: UInt8, crypto: TLSRecordCrypto) -> [UInt8]? {
        guard layer.beginRecord(length: content.count, crypto: crypto),
              content.withUnsafeBytes({ layer.sealMore($0.baseAddress!, $0.count, crypto: crypto) }),
              let length = layer.finishRecord(type: type, crypto: crypto) else { return nil }
        return Array(UnsafeRawBufferPointer(start: crypto.record.baseAddress!, count: length))
    }

    /// The server's layer after the trace's handshake: it has sent one record (the ticket) under its application keys.
    static func server() throws -> TLSRecordLayer {
        try #require(TLSRecordLayer(suite: .aes128GCM, readSecret: clientSecret, writeSecret: serverSecret, writeSeq: 1))
    }

    @Test func theServerSealsTheTracesRecord() throws {
        let record = Self.seal(try Self.server(), Self.payload, type: 23, crypto: TLSRecordCrypto())
        #expect(record == Self.serverData)
    }

    @Test func theServersCloseNotifyIsTheTraces() throws {
        let server = try Self.server()
        let crypto = TLSRecordCrypto()
        _ = Self.seal(server, Self.payload, type: 23, crypto: crypto)
        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        defer { Glibc.close(fds[0]); Glibc.close(fds[1]) }
        server.sendCloseNotify(fd: fds[0], crypto: crypto)
        var out = [UInt8](repeating: 0, count: 64)
        let n = recv(fds[1], &out, out.count, Int32(MSG_DONTWAIT))
        #expect(n > 0 && Array(out.prefix(max(0, n))) == Self.serverCloseNotify)
    }

    /// The client's side, by the mirror-image layer the tests and the fuzzer use as a peer.
    @Test func theClientMirrorSealsTheTracesRecords() throws {
        let client = try #require(TLSRecordLayer(suite: .aes128GCM, readSecret: Self.serverSecret, writeSecret: Self.clientSecret,
                                                 writeSeq: 0))
        let crypto = TLSRecordCrypto()
        #expect(Self.seal(client, Self.payload, type: 23, crypto: crypto) == Self.clientData)
        #expect(Self.seal(client, [1, 0], type: 21, crypto: crypto) == Self.clientCloseNotify)
    }

    /// The trace's client records, read from a socket as a connection reads them: the payload, then EOF at the
    /// close_notify. One flipped bit in the tag fails the record instead.
    @Test(arguments: [false, true])
    func theServerOpensTheClientsRecords(flipped: Bool) throws {
        let server = try Self.server()
        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        defer { Glibc.close(fds[0]); Glibc.close(fds[1]) }
        var stream = Self.clientData + Self.clientCloseNotify
        if flipped { stream[Self.clientData.count - 1] ^= 0x01 }
        #expect(stream.withUnsafeBytes { send(fds[1], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == stream.count)
        let room = TLSRecordLayer.maxRecord
        let out = UnsafeMutableRawPointer.allocate(byteCount: room, alignment: 16)
        defer { out.deallocate() }
        let crypto = TLSRecordCrypto()
        if flipped {
            #expect(throws: SyscallError.self) { _ = try server.read(fd: fds[0], into: out, room: room, crypto: crypto) }
            return
        }
        guard case .processed(let n) = try server.read(fd: fds[0], into: out, room: room, crypto: crypto) else {
            Issue.record("nothing read")
            return
        }
        #expect(Array(UnsafeRawBufferPointer(start: out, count: n)) == Self.payload)
        #expect(server.peerClosed)
        guard case .processed(0) = try server.read(fd: fds[0], into: out, room: room, crypto: crypto) else {
            Issue.record("no EOF after the close_notify")
            return
        }
    }
}
