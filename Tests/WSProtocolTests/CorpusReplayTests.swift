import Foundation
import Testing
@testable import WSProtocol

@Suite("Corpus replay")
struct CorpusReplayTests {
    static func corpusFiles() -> [URL] {
        guard let dir = Bundle.module.url(forResource: "Corpus", withExtension: nil)?.appendingPathComponent("frames"),
              let names = try? FileManager.default.contentsOfDirectory(atPath: dir.path) else { return [] }
        return names.sorted().map { dir.appendingPathComponent($0) }
    }

    @Test func corpusIsPresent() {
        #expect(Self.corpusFiles().count >= 10)
    }

    /// Every seed (and every fuzzer find committed later) is fed raw and without its 2-byte harness
    /// prefix, whole, byte by byte and in seeded random splits, to readers with small and default limits.
    /// It may succeed or throw, but the way the bytes arrive changes nothing: the same messages and the same
    /// violation, whole, byte by byte and in random pieces.
    @Test func everyCorpusFileReadsTheSameHoweverItIsSplit() throws {
        var rng = SplitMix64(seed: 0xC0)
        for url in Self.corpusFiles() {
            let data = [UInt8](try Data(contentsOf: url))
            for wire in [data, Array(data.dropFirst(2))] {
                let small = readAll([wire], maxFrameSize: 1024, maxMessageSize: 4096)
                let big = readAll([wire], decompressor: CopyDecompressor())
                for chunks in [wire.map { [$0] }, randomSplit(wire, maxChunk: 17, using: &rng)] {
                    #expect(readAll(chunks, maxFrameSize: 1024, maxMessageSize: 4096) == small, "\(url.lastPathComponent), small limits")
                    #expect(readAll(chunks, decompressor: CopyDecompressor()) == big, "\(url.lastPathComponent), default limits")
                }
            }
        }
    }

    @Test func knownSeedsBehaveAsDocumented() throws {
        func seed(_ name: String) throws -> [UInt8] {
            let url = try #require(Self.corpusFiles().first { $0.lastPathComponent == name })
            return Array([UInt8](try Data(contentsOf: url)).dropFirst(2))
        }
        #expect(readAll([try seed("hello_masked")]).messages == [.text("Hello")])
        #expect(readAll([try seed("invalid_utf8_midfragment")]).error?.kind == .invalidUTF8)
        #expect(readAll([try seed("highbit64")]).error?.kind == .lengthHighBitSet)
    }
}
