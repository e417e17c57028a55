import Testing
@testable import HubCluster
@testable import HubJSON
@testable import HubSupport

/// The specialised replacements for `Array(repeating:count:)` make the same arrays, and `appendZeros` appends exactly
/// `n` zeros after what is there, also past the 4 KiB zero page it copies from.
@Test(arguments: [0, 1, 7, 4095, 4096, 4097, 10_000])
func arraysMadeWithoutTheUnspecialisedPathAreTheSame(count: Int) {
    #expect([Int](filledWith: 7, count: count) == [Int](repeating: 7, count: count))
    #expect([String?](filledWith: "x", count: count) == [String?](repeating: "x", count: count))
    var bytes: [UInt8] = [1, 2, 3]
    bytes.appendZeros(count)
    #expect(bytes.count == 3 + count)
    #expect(bytes.prefix(3) == [1, 2, 3])
    #expect(bytes.dropFirst(3).allSatisfy { $0 == 0 })
    #expect(zeroPage.allSatisfy { $0 == 0 }, "the zero page was written to")
}
