
/// Base64url (RFC 4648 §5) without padding, as used by JWS compact serialization (RFC 7515 §2).
///
/// Decoding is strict: `=` padding, characters outside `A-Z a-z 0-9 - _`, whitespace, impossible
/// lengths (`count % 4 == 1`) and non-canonical encodings (non-zero unused trailing bits) are all
/// rejected, so every byte string has exactly one accepted encoding.
public enum Base64URL {
    private static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// 0...63 for alphabet characters, 0xFF otherwise.
    private static let reverse: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, char) in alphabet.enumerated() { table[Int(char)] = UInt8(index) }
        return table
    }()

    /// `bytes` random bytes from the system generator, encoded (epochs, node ids).
    package static func randomToken(bytes: Int) -> String {
        var rng = SystemRandomNumberGenerator()
        return encode((0..<bytes).map { _ in UInt8.random(in: 0...255, using: &rng) })
    }

    public static func encode<Bytes: Collection>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        let input = Array(bytes)
        var out = [UInt8]()
        out.reserveCapacity((input.count * 4 + 2) / 3)
        var i = 0
        while i + 3 <= input.count {
            let n = UInt32(input[i]) << 16 | UInt32(input[i + 1]) << 8 | UInt32(input[i + 2])
            out.append(alphabet[Int(n >> 18 & 63)])
            out.append(alphabet[Int(n >> 12 & 63)])
            out.append(alphabet[Int(n >> 6 & 63)])
            out.append(alphabet[Int(n & 63)])
            i += 3
        }
        switch input.count - i {
        case 1:
            let n = UInt32(input[i]) << 16
            out.append(alphabet[Int(n >> 18 & 63)])
            out.append(alphabet[Int(n >> 12 & 63)])
        case 2:
            let n = UInt32(input[i]) << 16 | UInt32(input[i + 1]) << 8
            out.append(alphabet[Int(n >> 18 & 63)])
            out.append(alphabet[Int(n >> 12 & 63)])
            out.append(alphabet[Int(n >> 6 & 63)])
        default:
            break
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func decode(_ text: String) -> [UInt8]? {
        decode(bytes: Array(text.utf8))
    }

    /// Decodes ASCII bytes; `nil` for anything that is not canonical unpadded base64url.
    public static func decode<Bytes: Collection>(bytes: Bytes) -> [UInt8]? where Bytes.Element == UInt8 {
        if let result = bytes.withContiguousStorageIfAvailable({ decode(buffer: $0) }) { return result }
        return Array(bytes).withUnsafeBufferPointer { decode(buffer: $0) }
    }

    /// Non-generic core, so the hot path never goes through unspecialised generic iteration.
    package static func decode(buffer bytes: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        guard let outCount = decodedCount(bytes.count) else { return nil }
        guard outCount > 0 else { return [] }
        var out: [UInt8] = []
        out.appendZeros(outCount)  // not `init(unsafeUninitializedCapacity:)`: see ArrayAllocation.swift
        let written = out.withUnsafeMutableBufferPointer { decode(bytes, into: $0) }
        return written == nil ? nil : out
    }

    /// How many bytes `count` characters decode to; nil for an impossible length (`count % 4 == 1`).
    package static func decodedCount(_ count: Int) -> Int? {
        let rest = count % 4
        if rest == 1 { return nil }
        return count / 4 * 3 + (rest == 0 ? 0 : rest - 1)
    }

    /// Decodes into `out`'s first `decodedCount(bytes.count)` bytes (`out` must hold them) and returns that count;
    /// nil for anything that is not canonical unpadded base64url (`out`'s bytes are then unspecified). Allocates
    /// nothing: the verifier decodes a token's three parts into one scratch buffer on the stack (an array
    /// each before). Four characters at a time, not a byte at a time through `append`; an invalid character is
    /// noticed once, after the loop (the 0xFF of the reverse table sets bits no alphabet value has).
    package static func decode(_ bytes: UnsafeBufferPointer<UInt8>, into out: UnsafeMutableBufferPointer<UInt8>) -> Int? {
        guard let outCount = decodedCount(bytes.count), outCount <= out.count else { return nil }
        guard outCount > 0, let src = bytes.baseAddress, let dst = out.baseAddress else { return 0 }
        let full = bytes.count / 4, rest = bytes.count % 4
        let valid = reverse.withUnsafeBufferPointer { table -> Bool in
            var seen: UInt32 = 0
            var i = 0, o = 0
            for _ in 0..<full {
                let a = UInt32(table[Int(src[i])]), b = UInt32(table[Int(src[i &+ 1])])
                let c = UInt32(table[Int(src[i &+ 2])]), d = UInt32(table[Int(src[i &+ 3])])
                seen |= a | b | c | d
                let n = a << 18 | b << 12 | c << 6 | d
                dst[o] = UInt8(truncatingIfNeeded: n >> 16)
                dst[o &+ 1] = UInt8(truncatingIfNeeded: n >> 8)
                dst[o &+ 2] = UInt8(truncatingIfNeeded: n)
                i &+= 4
                o &+= 3
            }
            var unusedBits: UInt32 = 0
            switch rest {
            case 2:
                // 12 bits carry 8 bits of data: the low 4 must be zero.
                let a = UInt32(table[Int(src[i])]), b = UInt32(table[Int(src[i &+ 1])])
                seen |= a | b
                dst[o] = UInt8(truncatingIfNeeded: a << 2 | b >> 4)
                unusedBits = b & 0xF
            case 3:
                // 18 bits carry 16 bits of data: the low 2 must be zero.
                let a = UInt32(table[Int(src[i])]), b = UInt32(table[Int(src[i &+ 1])])
                let c = UInt32(table[Int(src[i &+ 2])])
                seen |= a | b | c
                let n = a << 12 | b << 6 | c
                dst[o] = UInt8(truncatingIfNeeded: n >> 10)
                dst[o &+ 1] = UInt8(truncatingIfNeeded: n >> 2)
                unusedBits = c & 0x3
            default:
                break
            }
            return seen & 0xC0 == 0 && unusedBits == 0
        }
        return valid ? outCount : nil
    }
}
