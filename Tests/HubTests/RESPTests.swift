import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// What the engine does around `RESPDecoder`: bytes the decoder did not consume are kept and handed back in front of
/// the next chunk. Returns the values, and the bytes still held at the end.
private func decodeChunks(_ chunks: [[UInt8]], limits: RESPLimits = RESPLimits()) throws(RESPError) -> (values: [RESPValue], held: Int) {
    var decoder = RESPDecoder(limits: limits)
    var held: [UInt8] = []
    var values: [RESPValue] = []
    for chunk in chunks {
        held += chunk
        var start = 0
        scanning: while true {
            switch try feed(&decoder, held, from: start) {
            case .value(let value, let next):
                values.append(value)
                start = next
            case .incomplete(let keep):
                held.removeFirst(keep)
                break scanning
            }
        }
    }
    return (values, held.count)
}

/// One `next` call on `data` (`withUnsafeBytes` rethrows untyped errors; this keeps the decoder's own type).
private func feed(_ decoder: inout RESPDecoder, _ data: [UInt8], from start: Int = 0) throws(RESPError) -> RESPDecoder.Next {
    let result: Result<RESPDecoder.Next, RESPError> = data.withUnsafeBytes { buffer in
        do throws(RESPError) {
            return .success(try decoder.next(in: buffer, from: start))
        } catch {
            return .failure(error)
        }
    }
    return try result.get()
}

private func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

/// The same stream whole, one octet per read, and cut at pseudo-random places.
private func splits(_ stream: [UInt8], seed: UInt64) -> [[[UInt8]]] {
    var ways: [[[UInt8]]] = [[stream], stream.map { [$0] }]
    var state = seed | 1
    var cut: [[UInt8]] = []
    var i = 0
    while i < stream.count {
        state = state &* 6364136223846793005 &+ 1442695040888963407
        let n = Int(state >> 60) + 1
        cut.append(Array(stream[i..<min(stream.count, i + n)]))
        i += n
    }
    ways.append(cut)
    return ways
}

private let validCases: [(String, RESPValue)] = [
    ("+OK\r\n", .simple("OK")),
    ("+\r\n", .simple("")),
    ("-ERR unknown command 'FOO'\r\n", .error("ERR unknown command 'FOO'")),
    (":0\r\n", .integer(0)),
    (":-42\r\n", .integer(-42)),
    (":+7\r\n", .integer(7)),
    (":9223372036854775807\r\n", .integer(.max)),
    (":-9223372036854775808\r\n", .integer(.min)),
    ("$5\r\nhello\r\n", .bulk(bytes("hello"))),
    ("$0\r\n\r\n", .bulk([])),
    ("$4\r\na\r\nb\r\n", .bulk([0x61, 0x0D, 0x0A, 0x62])),
    ("$-1\r\n", .null),
    ("*-1\r\n", .null),
    ("_\r\n", .null),
    ("*0\r\n", .array([])),
    ("*2\r\n$3\r\nfoo\r\n:1\r\n", .array([.bulk(bytes("foo")), .integer(1)])),
    ("*2\r\n*1\r\n+a\r\n*0\r\n", .array([.array([.simple("a")]), .array([])])),
    ("*3\r\n$-1\r\n_\r\n*-1\r\n", .array([.null, .null, .null])),
    ("~2\r\n+a\r\n+b\r\n", .array([.simple("a"), .simple("b")])),
    ("%1\r\n+key\r\n:5\r\n", .map([.simple("key"), .integer(5)])),
    ("%0\r\n", .map([])),
    (">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nhey\r\n", .push([.bulk(bytes("message")), .bulk(bytes("ch")), .bulk(bytes("hey"))])),
    ("#t\r\n", .boolean(true)),
    ("#f\r\n", .boolean(false)),
    (",1.5\r\n", .double(1.5)),
    (",-2e3\r\n", .double(-2000)),
    (",inf\r\n", .double(.infinity)),
    (",-inf\r\n", .double(-.infinity)),
    ("(3492890328409238509324850943850943825024385\r\n", .bigNumber("3492890328409238509324850943850943825024385")),
    ("!21\r\nSYNTAX invalid syntax\r\n", .error("SYNTAX invalid syntax")),
    ("=15\r\ntxt:Some string\r\n", .bulk(bytes("Some string"))),
    // Attributes are dropped; the value they annotate stands in their place, at any depth.
    ("|1\r\n+ttl\r\n:3600\r\n:7\r\n", .integer(7)),
    ("*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n", .array([.integer(1), .integer(2)])),
    ("|0\r\n+x\r\n", .simple("x")),
]

@Suite("RESP decoder")
struct RESPDecoderTests {
    @Test("every RESP2 and RESP3 type decodes to its value, whole, one octet per read and cut anywhere")
    func validValues() throws {
        for (k, (text, expected)) in validCases.enumerated() {
            for chunks in splits(bytes(text), seed: UInt64(k)) {
                let result = try decodeChunks(chunks)
                #expect(result.values == [expected], "\(text.debugDescription) in \(chunks.count) reads")
                #expect(result.held == 0, "\(text.debugDescription): bytes left over")
            }
        }
    }

    @Test("a pipelined stream of every case decodes to every value, in order, however it is cut")
    func pipelined() throws {
        let stream = validCases.flatMap { bytes($0.0) }
        for (k, chunks) in splits(stream, seed: 99).enumerated() {
            let result = try decodeChunks(chunks)
            #expect(result.values == validCases.map(\.1), "split \(k)")
            #expect(result.held == 0)
        }
    }

    @Test("an incomplete value is absorbed except its unfinished header line, and finishes when the rest arrives")
    func incomplete() throws {
        var decoder = RESPDecoder()
        let part1 = bytes("*2\r\n$5\r\nhel")
        let r1 = try feed(&decoder, part1)
        #expect(r1 == .incomplete(keep: part1.count))  // the array header and the bulk's first bytes are absorbed
        #expect(!decoder.isIdle)
        let part2 = bytes("lo\r\n:12")
        let r2 = try feed(&decoder, part2)
        #expect(r2 == .incomplete(keep: 4))  // ":12" has no CRLF yet: kept by the caller
        let part3 = bytes(":12\r\n+next")
        let r3 = try feed(&decoder, part3)
        #expect(r3 == .value(.array([.bulk(bytes("hello")), .integer(12)]), next: 5))
        #expect(decoder.isIdle)
    }

    @Test("malformed input throws its specific error, whole and one octet per read")
    func errors() {
        let cases: [(String, RESPError.Kind)] = [
            ("?x\r\n", .unknownType),
            ("\r\n", .unknownType),
            ("*1\r\nhello\r\n", .unknownType),
            (":12a\r\n", .badInteger),
            (":\r\n", .badInteger),
            (":-\r\n", .badInteger),
            (":9223372036854775808\r\n", .badInteger),
            (":-9223372036854775809\r\n", .badInteger),
            (":\u{0663}\r\n", .badInteger),
            ("$-2\r\n", .badLength),
            ("$abc\r\n", .badLength),
            ("$99999999999999999999\r\n", .badLength),
            ("*-2\r\n", .badLength),
            ("%-1\r\n", .badLength),
            ("!-1\r\n", .badLength),
            ("$?\r\n", .unsupported),
            ("*?\r\n", .unsupported),
            ("$3\r\nabcd\r\n", .badTerminator),
            ("$3\r\nabc\n\r", .badTerminator),
            ("+OK\n", .badTerminator),
            ("+O\rK\r\n", .badTerminator),
            ("_x\r\n", .badNull),
            ("#x\r\n", .badBoolean),
            ("#tt\r\n", .badBoolean),
            (",\r\n", .badDouble),
            (",1.2.3\r\n", .badDouble),
            (",0x10\r\n", .badDouble),
            (",infinity\r\n", .badDouble),
            ("(\r\n", .badBigNumber),
            ("(12x\r\n", .badBigNumber),
            ("=3\r\ntxt\r\n", .badVerbatim),
            ("=5\r\ntxt;a\r\n", .badVerbatim),
        ]
        for (text, kind) in cases {
            for chunks in [[bytes(text)], bytes(text).map { [$0] }] {
                var thrown: RESPError? = nil
                do { _ = try decodeChunks(chunks) } catch { thrown = error }
                #expect(thrown?.kind == kind, "\(text.debugDescription) in \(chunks.count) reads: \(String(describing: thrown))")
            }
        }
    }

    @Test("a decoder that has thrown stays failed: valid bytes after the error are never parsed")
    func poisoned() throws {
        var decoder = RESPDecoder()
        let bad = bytes(":x\r\n")
        var first: RESPError? = nil
        do { _ = try feed(&decoder, bad) } catch { first = error }
        #expect(first?.kind == .badInteger)
        #expect(decoder.failure == first)
        let good = bytes("+OK\r\n")
        var second: RESPError? = nil
        do { _ = try feed(&decoder, good) } catch { second = error }
        #expect(second == first)
    }

    @Test("limits: bulk length, element count, nesting depth and line length are checked before anything is kept")
    func limits() {
        let limits = RESPLimits(maxLineBytes: 16, maxBulkBytes: 8, maxElements: 4, maxDepth: 3)
        let cases: [(String, RESPError.Kind)] = [
            ("$9\r\n", .bulkTooLong),
            ("!9\r\n", .bulkTooLong),
            ("$999999999999999\r\n", .bulkTooLong),
            ("*5\r\n", .tooManyElements),
            ("%3\r\n", .tooManyElements),  // 3 pairs are 6 values
            ("|3\r\n", .tooManyElements),
            ("*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", .tooDeep),
            ("+" + String(repeating: "a", count: 17), .lineTooLong),  // no CRLF needed to know
            ("+" + String(repeating: "a", count: 17) + "\r\n", .lineTooLong),
        ]
        for (text, kind) in cases {
            for chunks in [[bytes(text)], bytes(text).map { [$0] }] {
                var thrown: RESPError? = nil
                do { _ = try decodeChunks(chunks, limits: limits) } catch { thrown = error }
                #expect(thrown?.kind == kind, "\(text.debugDescription): \(String(describing: thrown))")
            }
        }
        // At the limits exactly, everything is accepted.
        let atLimits = "$8\r\n12345678\r\n*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n%2\r\n:1\r\n:2\r\n:3\r\n:4\r\n*1\r\n*1\r\n*1\r\n:1\r\n+" + String(repeating: "a", count: 16) + "\r\n"
        #expect(throws: Never.self) {
            let result = try decodeChunks([bytes(atLimits)], limits: limits)
            #expect(result.values.count == 5)
        }
    }

    @Test("a huge declared length or count allocates nothing up front: the value stays incomplete until bytes arrive")
    func declaredSizesAreNotTrusted() throws {
        var decoder = RESPDecoder()  // 64 MiB bulks, 1 Mi elements
        let header = bytes("*1000000\r\n$67108864\r\nab")
        let r = try feed(&decoder, header)
        #expect(r == .incomplete(keep: header.count))
        #expect(!decoder.isIdle)
    }

    @Test("decimal parsing: bounds, signs and non-digits")
    func integers() {
        func parse(_ s: String) -> Int64? { Array(s.utf8).withUnsafeBytes { RESPDecoder.parseInteger($0) } }
        #expect(parse("9223372036854775807") == .max)
        #expect(parse("-9223372036854775808") == .min)
        #expect(parse("9223372036854775808") == nil)
        #expect(parse("-9223372036854775809") == nil)
        #expect(parse("+0") == 0)
        #expect(parse("-0") == 0)
        #expect(parse("007") == 7)
        #expect(parse("") == nil)
        #expect(parse("+") == nil)
        #expect(parse("1 ") == nil)
        #expect(parse("--1") == nil)
    }
}

@Suite("RESP encoder")
struct RESPEncoderTests {
    @Test("a command is an array of bulk strings")
    func command() {
        #expect(RESPEncoder.command(["SET", "k", "v"]) == bytes("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"))
        #expect(RESPEncoder.command([]) == bytes("*0\r\n"))
        #expect(RESPEncoder.command(["ÅB"]) == bytes("*1\r\n$3\r\nÅB\r\n"))  // lengths in bytes
    }

    @Test("integers as bulk strings, at the bounds")
    func integers() {
        for n in [0, 7, -5, 1234567890, Int.max, Int.min] {
            var out: [UInt8] = []
            RESPEncoder.appendBulk(n, to: &out)
            let digits = String(n)
            #expect(out == bytes("$\(digits.utf8.count)\r\n\(digits)\r\n"))
        }
    }

    @Test("binary arguments round-trip through the decoder, CRLF and NUL included")
    func roundTrip() throws {
        let payloads: [[UInt8]] = [[], [0x0D, 0x0A], [0, 1, 2, 0xFF], Array(repeating: 0x2A, count: 70_000)]
        var out: [UInt8] = []
        RESPEncoder.appendArrayHeader(payloads.count, to: &out)
        for p in payloads { RESPEncoder.appendBulk(p, to: &out) }
        RESPEncoder.appendCommand(["PING"], to: &out)
        for chunks in splits(out, seed: 5) {
            let result = try decodeChunks(chunks)
            #expect(result.values == [.array(payloads.map { .bulk($0) }), .array([.bulk(bytes("PING"))])])
        }
    }
}

/// The RESP fuzzer's corpus (`Fuzz/RESPFuzz.swift`, `Tests/HubTests/Corpus/resp/`), replayed as the fuzzer runs each
/// input: byte 0 picks the limits, the rest is cut into reads by its own length bytes; the stream must decode to the
/// same values and the same error in one read, in those reads and one octet per read, within the limits.
@Suite("RESP fuzz corpus replay")
struct RESPCorpusReplayTests {
    static let limitSets: [RESPLimits] = [
        RESPLimits(),
        RESPLimits(maxLineBytes: 8, maxBulkBytes: 4, maxElements: 3, maxDepth: 2),
        RESPLimits(maxLineBytes: 32, maxBulkBytes: 64, maxElements: 16, maxDepth: 4),
        RESPLimits(maxLineBytes: 1, maxBulkBytes: 0, maxElements: 0, maxDepth: 1),
    ]

    private func outcome(_ chunks: [[UInt8]], _ limits: RESPLimits) -> (values: [RESPValue], error: RESPError.Kind?) {
        do { return (try decodeChunks(chunks, limits: limits).values, nil) } catch { return ([], error.kind) }
    }

    @Test func everyInputDecodesTheSameHoweverItIsCut() {
        let corpus = ConnectionFuzzReplayTests.corpus("resp")
        #expect(corpus.count >= 30)
        var seedsThatDecode = 0
        for (name, input) in corpus where !input.isEmpty {
            let limits = Self.limitSets[Int(input[0] & 3)]
            var chunks: [[UInt8]] = []
            var i = 1
            while i < input.count {
                var length = Int(input[i]); i += 1
                if length == 0 || length > input.count - i { length = input.count - i }
                chunks.append(Array(input[i..<(i + length)]))
                i += length
            }
            let stream = chunks.flatMap { $0 }
            let whole = outcome([stream], limits)
            for (how, cut) in [("its reads", chunks), ("one octet per read", stream.map { [$0] })] {
                let other = outcome(cut, limits)
                #expect(other.error == whole.error, "\(name), \(how)")
                #expect(other.values.count == whole.values.count, "\(name), \(how)")
            }
            if name.hasPrefix("seed_"), whole.error == nil, !whole.values.isEmpty { seedsThatDecode += 1 }
        }
        #expect(seedsThatDecode >= 15, "the seeds of valid streams decode")
    }
}
