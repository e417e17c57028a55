import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubJSON
@testable import HubRouting
@testable import HubSupport

@Test(arguments: [
    ("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy"),
])
func base64URLRFC4648Vectors(plain: String, encoded: String) {
    #expect(Base64URL.encode(Array(plain.utf8)) == encoded)
    #expect(Base64URL.decode(encoded) == Array(plain.utf8))
}

@Test func base64URLUsesURLAlphabet() {
    #expect(Base64URL.encode([0xFB, 0xFF, 0xBF]) == "-_-_")
    #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
    #expect(Base64URL.decode("-_8") == [0xFB, 0xFF])
}

@Test(arguments: ["Zg==", "Zg=", "Zm8=", "Z", "Zm9vY", "+w", "/w", "Zm 9v", "Zm9v\n", "Zh", "Zm9", "Zg.", "é", "Zm9vYm*y", "Zm9v\u{7F}mFy", "Zm9vYmF\u{FF}"])
func base64URLRejects(text: String) {
    #expect(Base64URL.decode(text) == nil)
}

@Test func base64URLRoundTripsAllLengths() {
    var generator = SystemRandomNumberGenerator()
    for length in 0..<200 {
        let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let encoded = Base64URL.encode(bytes)
        #expect(!encoded.contains("="))
        #expect(Base64URL.decode(encoded) == bytes)
    }
}
