import Testing
@testable import WSProtocol

// Shared helpers for the frame/message tests (no tests in this file).

/// A delivered message, copied out of the callback.
enum Msg: Equatable, Sendable, CustomStringConvertible {
    case text([UInt8]), binary([UInt8]), ping([UInt8]), pong([UInt8]), close(UInt16?, [UInt8])

    static func text(_ s: String) -> Msg { .text(Array(s.utf8)) }

    init(_ m: InboundMessage) {
        switch m {
        case .text(let p): self = .text(Array(p))
        case .binary(let p): self = .binary(Array(p))
        case .ping(let p): self = .ping(Array(p))
        case .pong(let p): self = .pong(Array(p))
        case .close(let code, let reason): self = .close(code, Array(reason))
        }
    }

    var description: String {
        switch self {
        case .text(let b): return "text(\(b.count): \(String(decoding: b.prefix(40), as: UTF8.self)))"
        case .binary(let b): return "binary(\(b.count))"
        case .ping(let b): return "ping(\(b.count))"
        case .pong(let b): return "pong(\(b.count))"
        case .close(let c, let r): return "close(\(c.map(String.init) ?? "nil"), \(r.count))"
        }
    }
}

struct ReadOutcome: Equatable {
    var messages: [Msg] = []
    var error: ProtocolViolation? = nil
}

/// Feeds `chunks` to a fresh reader, one `read` per chunk; stops at the first violation.
func readAll(_ chunks: [[UInt8]], role: Role = .server, maxFrameSize: Int = 1 << 20, maxMessageSize: Int = 1 << 20,
             decompressor: (any MessageDecompressor)? = nil) -> ReadOutcome {
    var reader = MessageReader(configuration: .init(role: role, maxFrameSize: maxFrameSize, maxMessageSize: maxMessageSize),
                               decompressor: decompressor)
    var outcome = ReadOutcome()
    for chunk in chunks {
        var copy = chunk
        do {
            let consumed = try copy.withUnsafeMutableBytes { raw in
                try reader.read(raw) { outcome.messages.append(Msg($0)); return .continue }
            }
            if consumed != chunk.count { Issue.record("consumed \(consumed) of \(chunk.count)") }
        } catch let error as ProtocolViolation {
            outcome.error = error
            return outcome
        } catch {
            Issue.record("unexpected error \(error)")
        }
    }
    return outcome
}

/// The stream whole, split in two at every cut, and one byte at a time.
func everySplit(_ wire: [UInt8]) -> [(String, [[UInt8]])] {
    var out: [(String, [[UInt8]])] = [("whole", [wire])]
    for cut in 0...wire.count { out.append(("cut \(cut)", [Array(wire[..<cut]), Array(wire[cut...])])) }
    out.append(("bytewise", wire.map { [$0] }))
    return out
}

/// Random splits of the stream into 1...maxChunk byte reads.
func randomSplit(_ wire: [UInt8], maxChunk: Int, using rng: inout SplitMix64) -> [[UInt8]] {
    var out: [[UInt8]] = []
    var i = 0
    while i < wire.count {
        let n = min(wire.count - i, Int.random(in: 1...maxChunk, using: &rng))
        out.append(Array(wire[i..<(i + n)]))
        i += n
    }
    return out
}

/// Deterministic, seedable generator so failures reproduce.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

let rfcKey: [UInt8] = [0x37, 0xfa, 0x21, 0x3d]

/// A hand-built frame, independent of FrameEncoder. `op` is raw so reserved opcodes can be built;
/// `key == nil` builds an unmasked frame. `lengthForm` forces a 16- or 64-bit length encoding.
func wsFrame(_ op: UInt8, _ payload: [UInt8], fin: Bool = true, rsv: UInt8 = 0, key: [UInt8]? = rfcKey,
             lengthForm: Int? = nil) -> [UInt8] {
    var out: [UInt8] = [(fin ? 0x80 : 0) | rsv | op]
    let mask: UInt8 = key == nil ? 0 : 0x80
    let n = payload.count
    let form = lengthForm ?? (n <= 125 ? 7 : n <= 0xFFFF ? 16 : 64)
    switch form {
    case 7: out.append(mask | UInt8(n))
    case 16: out.append(mask | 126); out += [UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)]
    default: out.append(mask | 127); out += (0..<8).reversed().map { UInt8(truncatingIfNeeded: UInt64(n) >> (8 * UInt64($0))) }
    }
    if let key {
        out += key
        out += payload.enumerated().map { $0.element ^ key[$0.offset % 4] }
    } else {
        out += payload
    }
    return out
}

/// Client (masked) frame shorthands.
func text(_ s: String, fin: Bool = true) -> [UInt8] { wsFrame(0x1, Array(s.utf8), fin: fin) }
func cont(_ s: String, fin: Bool = true) -> [UInt8] { wsFrame(0x0, Array(s.utf8), fin: fin) }
func textBytes(_ b: [UInt8], fin: Bool = true) -> [UInt8] { wsFrame(0x1, b, fin: fin) }
func contBytes(_ b: [UInt8], fin: Bool = true) -> [UInt8] { wsFrame(0x0, b, fin: fin) }

/// Stands in for permessage-deflate in tests: "inflates" by copying, honouring the limit.
struct CopyDecompressor: MessageDecompressor {
    mutating func decompressMessage(_ compressed: UnsafeRawBufferPointer, into output: inout [UInt8], limit: Int) throws(ProtocolViolation) {
        if output.count + compressed.count > limit { throw ProtocolViolation(.decompressedTooLarge(output.count + compressed.count)) }
        output.append(contentsOf: compressed)
    }
}

/// One row of a wire table: the stream, the messages delivered, and the violation (if any) with its close code.
struct WireCase: Sendable, CustomTestStringConvertible {
    let name: String
    let wire: [UInt8]
    let messages: [Msg]
    let error: ProtocolViolation.Kind?
    let closeCode: UInt16?
    var testDescription: String { name }

    init(_ name: String, _ wire: [UInt8], _ messages: [Msg] = [], error: ProtocolViolation.Kind? = nil, code: UInt16? = nil) {
        self.name = name; self.wire = wire; self.messages = messages; self.error = error; self.closeCode = code
    }
}

/// Runs a wire case at every split point and checks messages, violation kind and close code.
func checkEverySplit(_ c: WireCase, role: Role = .server, maxFrameSize: Int = 1 << 20, maxMessageSize: Int = 1 << 20,
                     decompressor: (any MessageDecompressor)? = nil, sourceLocation: SourceLocation = #_sourceLocation) {
    let expectedMessages = c.messages
    for (label, chunks) in everySplit(c.wire) {
        let out = readAll(chunks, role: role, maxFrameSize: maxFrameSize, maxMessageSize: maxMessageSize, decompressor: decompressor)
        #expect(out.messages == expectedMessages, "\(c.name) [\(label)]", sourceLocation: sourceLocation)
        #expect(out.error?.kind == c.error, "\(c.name) [\(label)]", sourceLocation: sourceLocation)
        if let code = c.closeCode {
            #expect(out.error?.closeCode.rawValue == code, "\(c.name) [\(label)]", sourceLocation: sourceLocation)
        }
        if out.messages != expectedMessages || out.error?.kind != c.error { return }  // one report per case is enough
    }
}
