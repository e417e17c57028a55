import Foundation
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

/// Pairs of account ids that Swift's `String ==` treats as equal (canonical equivalence) but whose bytes differ.
/// They are different accounts: RFC 7519 §7.3 compares claim values with no normalisation (issue 14, break 1).
let canonicallyEquivalentPairs: [(String, String)] = [
    ("caf\u{E9}", "cafe\u{301}"),                   // NFC vs NFD
    ("\u{C5}ngstr\u{F6}m", "\u{212B}ngstr\u{F6}m"),   // U+00C5 vs U+212B ANGSTROM SIGN
    ("a\u{301}\u{323}", "a\u{323}\u{301}"),           // combining marks in another order
    ("\u{AC00}", "\u{1100}\u{1161}"),                 // Hangul syllable vs its jamo
]

@Suite struct AccountIDTests {
    @Test func swiftStringsWouldConflateThePairs() {
        // The premise: if this ever stops holding, the type below is still right, but the test explains why it exists.
        for (a, b) in canonicallyEquivalentPairs { #expect(a == b && Array(a.utf8) != Array(b.utf8)) }
    }

    @Test func accountIDsCompareAndHashByBytes() {
        for (a, b) in canonicallyEquivalentPairs {
            #expect(AccountID(a) != AccountID(b))
            #expect(AccountID(a) == AccountID(String(decoding: Array(a.utf8), as: UTF8.self)))
            let set: Set<AccountID> = [AccountID(a), AccountID(b)]
            #expect(set.count == 2)
            #expect(StreamKey(channel: 0, account: AccountID(a)) != StreamKey(channel: 0, account: AccountID(b)))
        }
    }

    @Test func equalityIsByteEqualityForEveryLength() {
        // `==` compares contiguous bytes with memcmp: check it against the byte arrays, for empty, small (inline)
        // and heap strings, ASCII and not, equal, same length but different, and different lengths.
        var rng = SystemRandomNumberGenerator()
        let alphabet: [String] = ["a", "b", "\u{E9}", "e\u{301}", "\u{212B}", "\u{C5}", "\u{1F600}", "\u{0}"]
        for _ in 0..<3_000 {
            let a = (0..<Int.random(in: 0...24, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
            var b = a
            switch Int.random(in: 0..<3, using: &rng) {
            case 0: break
            case 1: b = (0..<Int.random(in: 0...24, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
            default:
                if !b.isEmpty { b.removeLast(); b.append(alphabet.randomElement(using: &rng)!) }
            }
            #expect((ExactString(a) == ExactString(b)) == (Array(a.utf8) == Array(b.utf8)), "\(Array(a.utf8)) vs \(Array(b.utf8))")
            if ExactString(a) == ExactString(b) { #expect(ExactString(a).hashValue == ExactString(b).hashValue) }
        }
        // A substring's copy and a string built byte by byte compare equal to the original.
        let long = "acc_\u{E9}_" + String(repeating: "x", count: 40)
        #expect(ExactString(long) == ExactString(String(long.dropFirst(0))))
        #expect(ExactString(long) == ExactString(String(decoding: Array(long.utf8), as: UTF8.self)))
        #expect(ExactString(long) != ExactString(String(long.dropLast()) + "y"))
        // A short id inline and the same bytes in a heap buffer (a string that reserved capacity keeps its buffer):
        // different words, equal bytes, so equal, with one hash.
        for id in ["", "u", "acct_42", "caf\u{E9}", "exactly15bytes!"] {
            var heap = ""
            heap.reserveCapacity(64)
            heap.append(id)
            #expect(unsafeBitCast(heap, to: (UInt64, UInt64).self) != unsafeBitCast(id, to: (UInt64, UInt64).self))
            #expect(ExactString(heap) == ExactString(id) && ExactString(id) == ExactString(heap))
            #expect(ExactString(heap).hashValue == ExactString(id).hashValue)
            #expect(ExactString(heap + "x") != ExactString(id) && ExactString(id + "x") != ExactString(heap))
        }
        // The hash depends on every byte and on the length: distinct ids, including ones that differ only by
        // trailing NULs or in their last byte, hash apart (64-bit hashes: a collision among these would be a
        // broken hash, not bad luck).
        var ids: Set<[UInt8]> = [[], [0], [0, 0], Array("a".utf8), Array("a\u{0}".utf8), Array("a\u{0}\u{0}".utf8)]
        for n in 1...17 {
            ids.insert([UInt8](repeating: 0x61, count: n))
            ids.insert([UInt8](repeating: 0x61, count: n - 1) + [0x62])
            ids.insert([UInt8](repeating: 0x61, count: n - 1) + [UInt8(n)])
        }
        while ids.count < 2_000 { ids.insert((0..<Int.random(in: 0...20, using: &rng)).map { _ in UInt8.random(in: 0...127, using: &rng) }) }
        let hashes = Set(ids.map { ExactString(String(decoding: $0, as: UTF8.self)).hashValue })
        #expect(hashes.count == ids.count)
    }

    @Test func registryKeepsEquivalentAccountsApart() {
        for (a, b) in canonicallyEquivalentPairs {
            var registry = LocalRegistry<FakeSubscriber>(channelCount: 1)
            let s = FakeSubscriber("s")
            registry.subscribe(s, account: AccountID(a), channel: 0)
            #expect(registry.subscribers(channel: 0, account: AccountID(a)).count == 1)
            #expect(registry.subscribers(channel: 0, account: AccountID(b)).isEmpty)
        }
    }

    @Test func channelNamesAreExactToo() {
        let index = ChannelIndex(["Kelvin", "wallet_updates"])
        #expect(index["Kelvin"] == 0)
        #expect(index["\u{212A}elvin"] == nil)  // KELVIN SIGN, canonically equivalent to "K"
        #expect(index["wallet_updates"] == 1)
        // Both ways of looking up (a scan for up to 8 names, a dictionary beyond) answer alike: exact bytes, the
        // first of a name configured twice, nil for an unknown one.
        for count in [1, 3, 8, 9, 20] {
            let names = (0..<count).map { "ch\u{E9}_\($0)" } + ["ch\u{E9}_0"]
            let index = ChannelIndex(names)
            for i in 0..<count { #expect(index["ch\u{E9}_\(i)"] == i) }
            #expect(index["che\u{301}_0"] == nil)
            #expect(index["ch\u{E9}_\(count)"] == nil)
            #expect(index[""] == nil)
        }
    }
}

/// The same, against the real hub: delivery, in-band auth, sequence streams and the admin filters.
@Suite struct IntegrationAccountIsolationTests {
    static func publishLine(_ account: String) -> String {
        #"{"op":"publish","channel":"wallet_updates","account":""# + account + #"","type":"t","data":{}}"#
    }

    @Test(arguments: 0..<canonicallyEquivalentPairs.count)
    func equivalentButDifferentIdsAreDifferentAccounts(_ pair: Int) throws {
        let (nfc, other) = canonicallyEquivalentPairs[pair]
        let hub = try HubProcess()
        let ws = try hub.client(nfc, channels: ["wallet_updates"])
        let admin = try hub.admin()

        // An event for the other spelling reaches no one, and numbers its own stream.
        let toOther = try parseObject(try admin.request(Self.publishLine(other)))
        #expect(toOther["delivered"] as? Int == 0)
        #expect(toOther["seq"] as? Int == 1)
        let toSelf = try parseObject(try admin.request(Self.publishLine(nfc)))
        #expect(toSelf["delivered"] as? Int == 1)
        #expect(toSelf["seq"] as? Int == 1, "a stream of its own")
        let event = try ws.nextJSON()
        #expect(event["seq"] as? Int == 1)
        #expect(try ws.isQuiet(for: 0.2))

        // In-band auth with the other spelling's token is another account.
        try ws.send(json: ["type": "auth", "token": try hub.token(other), "id": "a1"])
        let reply = try ws.nextJSON()
        #expect((reply["error"] as? [String: Any])?["code"] as? String == "FORBIDDEN", "\(reply)")

        // Admin filters: the other spelling lists and disconnects nobody.
        let listed = try parseObject(try admin.request(#"{"op":"connections","account":""# + other + #""}"#))
        #expect(listed["total"] as? Int == 0)
        let listedSelf = try parseObject(try admin.request(#"{"op":"connections","account":""# + nfc + #""}"#))
        #expect(listedSelf["total"] as? Int == 1)
        let disconnected = try parseObject(try admin.request(#"{"op":"disconnect","account":""# + other + #""}"#))
        #expect(disconnected["disconnected"] as? Int == 0, "\(disconnected)")
        #expect(try ws.isQuiet(for: 0.2), "the connection was not closed")
    }
}

/// Names and other ids on every input path compare by bytes too (the second red team found `since` keys matched
/// with `String` ==): a subscribe's channel list and its `since` keys, the allowed origins, and the token's
/// `iss` and `aud` against the configured ones. Each pair below is canonically equivalent and byte-distinct.
@Suite struct IntegrationExactNamesTests {
    /// `"since":{"\u212Ax":…}` with `"channels":["Kx"]` was accepted as Kx's position. It names a channel the
    /// subscribe does not list: VALIDATION_ERROR. Listing both spellings is not one channel either: the one not
    /// configured is unknown, and nothing is subscribed.
    @Test func sinceKeysAndChannelListsMatchByBytes() throws {
        let hub = try HubProcess(["--channels", "Kx,wallet_updates"])
        let ws = try hub.client("acc_1")
        let position = #"{"epoch":"e","seq":0,"broadcastSeq":0}"#
        try ws.send(text: #"{"type":"subscribe","channels":["Kx"],"since":{"\u212Ax":\#(position)},"id":"a"}"#)
        let refused = try ws.nextJSON()
        let error = refused["error"] as? [String: Any]
        #expect(error?["code"] as? String == "VALIDATION_ERROR" && (error?["message"] as? String)?.contains("not in \"channels\"") == true,
                "\(refused)")
        try ws.send(text: #"{"type":"subscribe","channels":["Kx","\u212Ax"],"id":"b"}"#)
        let unknown = try ws.nextJSON()
        #expect(unknown["id"] as? String == "b" && ((unknown["error"] as? [String: Any])?["details"] as? [String: Any])?["unknownChannels"] as? [String] == ["\u{212A}x"],
                "\(unknown)")
        // The exact spelling works, with its since.
        try ws.send(text: #"{"type":"subscribe","channels":["Kx"],"since":{"Kx":\#(position)},"id":"c"}"#)
        let subscribed = try ws.nextJSON()
        #expect(subscribed["type"] as? String == "subscribed" && subscribed["channels"] as? [String] == ["Kx"], "\(subscribed)")
    }

    /// An allowed origin is matched by bytes with ASCII case folded: KELVIN SIGN lowercases to "k" under Unicode
    /// rules, and a decomposed "é" is canonically "é"; neither is the allowed origin.
    @Test func allowedOriginsMatchByBytes() throws {
        let hub = try HubProcess(["--allowed-origins", "https://kiosk.example.com,https://caf\u{E9}.example"])
        func status(_ origin: String) throws -> Int? {
            do {
                _ = try hub.client("acc_1", headers: [("Origin", origin)])
                return 101
            } catch {
                return "\(error)".contains("403") ? 403 : nil
            }
        }
        #expect(try status("https://kiosk.example.com") == 101)
        #expect(try status("HTTPS://KIOSK.EXAMPLE.COM") == 101)
        #expect(try status("https://\u{212A}iosk.example.com") == 403)
        #expect(try status("https://caf\u{E9}.example") == 101)
        #expect(try status("https://cafe\u{301}.example") == 403)
    }

    /// RFC 7519 §7.3: `iss` and `aud` compare without normalisation.
    @Test func issuerAndAudienceMatchByBytes() throws {
        let hub = try HubProcess(["--jwt-issuer", "caf\u{E9}", "--jwt-audience", "\u{C5}pp"])
        let signer = try JWTSigner(key: .hmacSecret(try hub.secret()))
        func token(iss: String, aud: String) throws -> String {
            try signer.sign(JWTClaims(sub: "acc_1", exp: Int64(time(nil)) + 600, iat: Int64(time(nil)), iss: iss, aud: [aud]))
        }
        #expect(throws: Never.self) { try hub.client("acc_1", token: try token(iss: "caf\u{E9}", aud: "\u{C5}pp")) }
        for (iss, aud, reason) in [("cafe\u{301}", "\u{C5}pp", "issuer"), ("caf\u{E9}", "\u{212B}pp", "aud")] {
            do {
                _ = try hub.client("acc_1", token: try token(iss: iss, aud: aud))
                Issue.record("a token with iss \(iss) and aud \(aud) was accepted")
            } catch {
                #expect("\(error)".contains("401") && "\(error)".contains(reason), "\(error)")
            }
        }
    }
}
