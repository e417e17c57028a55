import Testing
@testable import WSProtocol

@Test(arguments: [
    (UInt16(0), false), (999, false), (1000, true), (1003, true), (1004, false), (1005, false), (1006, false),
    (1007, true), (1011, true), (1015, false), (1016, false), (2999, false), (3000, true), (4999, true), (5000, false), (65535, false),
])
func closeCodeValidity(code: UInt16, valid: Bool) {
    #expect(CloseCode.isValidOnWire(code) == valid)
}

@Test func violationsMapToCloseCodes() {
    #expect(ProtocolViolation(.invalidUTF8).closeCode == .invalidPayloadData)
    #expect(ProtocolViolation(.messageTooLarge(70_000)).closeCode == .messageTooBig)
    #expect(ProtocolViolation(.fragmentedControlFrame).closeCode == .protocolError)
    #expect(ProtocolViolation(.unsupportedData).closeCode == .unsupportedData)
}
