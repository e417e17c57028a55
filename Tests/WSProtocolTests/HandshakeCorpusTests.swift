import Foundation
import Testing
@testable import WSProtocol

/// Replays every seed and past crasher of the handshake fuzz target through the request parser,
/// `validateUpgrade` and negotiation, at several split points. Nothing may crash, `consumed` must be exact,
/// and every split must give the same outcome as feeding the file whole.
@Suite struct HandshakeCorpusTests {
    static func corpusFiles() throws -> [URL] {
        let dir = try #require(Bundle.module.resourceURL).appendingPathComponent("Corpus/handshake")
        return try FileManager.default.contentsOfDirectory(at: dir, includingPropertiesForKeys: nil)
            .filter { !$0.lastPathComponent.hasPrefix(".") }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    enum Outcome: Equatable {
        case needMore
        case parsed(consumed: Int, upgrade: String)
        case rejected(Int, String)
    }

    static func run(_ data: [UInt8], splits: [Int]) -> Outcome {
        var parser = HTTPRequestParser()
        var start = 0
        for end in splits.filter({ $0 > 0 && $0 < data.count }) + [data.count] where end > start {
            do {
                switch try parser.parse(Array(data[start..<end])) {
                case .needMoreData:
                    start = end
                case .complete(let head, let consumed):
                    #expect(consumed <= end - start)
                    do {
                        let request = try WebSocketHandshake.validateUpgrade(head)
                        let negotiated = PerMessageDeflate.negotiate(offers: request.extensions, configuration: .init())
                        return .parsed(consumed: start + consumed, upgrade: negotiated?.responseHeaderValue ?? "-")
                    } catch {
                        return .parsed(consumed: start + consumed, upgrade: "\(error.status) \(error.code)")
                    }
                }
            } catch {
                return .rejected(error.status, error.code)
            }
        }
        return .needMore
    }

    @Test func corpusIsPresent() throws {
        #expect(try Self.corpusFiles().count >= 10)
    }

    @Test func replayAtSeveralSplits() throws {
        for url in try Self.corpusFiles() {
            let data = try [UInt8](Data(contentsOf: url))
            let whole = Self.run(data, splits: [])
            for splits in [[1], [7], [data.count / 2], [1, 2, 3, 50, 51, 200], Array(stride(from: 13, to: data.count, by: 13))] {
                #expect(Self.run(data, splits: splits) == whole, "\(url.lastPathComponent) split \(splits.prefix(6))")
            }
        }
    }

    @Test func knownSeedsHaveTheExpectedOutcome() throws {
        let files = Dictionary(uniqueKeysWithValues: try Self.corpusFiles().map { ($0.lastPathComponent, $0) })
        func outcome(_ name: String) throws -> Outcome { Self.run(try [UInt8](Data(contentsOf: try #require(files[name]))), splits: [5]) }
        guard case .parsed(_, "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10")
            = try outcome("deflate-all-params") else { Issue.record("deflate-all-params"); return }
        #expect(try outcome("bare-lf") == .rejected(400, "BAD_REQUEST"))
        #expect(try outcome("long-target") == .rejected(414, "URI_TOO_LONG"))
        #expect(try outcome("many-headers") == .rejected(431, "HEADER_TOO_LARGE"))
        guard case .parsed(_, "426 UPGRADE_REQUIRED") = try outcome("no-upgrade") else { Issue.record("no-upgrade"); return }
        let pipelined = try [UInt8](Data(contentsOf: try #require(files["pipelined-frame"])))
        #expect(Self.run(pipelined, splits: [3]) == .parsed(consumed: pipelined.count - 7, upgrade: "permessage-deflate"))
    }
}
