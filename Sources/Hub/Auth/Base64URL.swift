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
    static func randomToken(bytes: Int) -> String {
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
    static func decode(buffer bytes: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        let count = bytes.count
        if count % 4 == 1 { return nil }
        var out = [UInt8]()
        out.reserveCapacity(count * 3 / 4)
        var accumulator: UInt32 = 0
        var pending = 0
        let table = reverse
        for char in bytes {
            let value = table[Int(char)]
            if value == 0xFF { return nil }
            accumulator = accumulator << 6 | UInt32(value)
            pending += 1
            if pending == 4 {
                out.append(UInt8(truncatingIfNeeded: accumulator >> 16))
                out.append(UInt8(truncatingIfNeeded: accumulator >> 8))
                out.append(UInt8(truncatingIfNeeded: accumulator))
                accumulator = 0
                pending = 0
            }
        }
        switch pending {
        case 0:
            break
        case 2:
            // 12 bits carry 8 bits of data: the low 4 must be zero.
            if accumulator & 0xF != 0 { return nil }
            out.append(UInt8(truncatingIfNeeded: accumulator >> 4))
        case 3:
            // 18 bits carry 16 bits of data: the low 2 must be zero.
            if accumulator & 0x3 != 0 { return nil }
            out.append(UInt8(truncatingIfNeeded: accumulator >> 10))
            out.append(UInt8(truncatingIfNeeded: accumulator >> 2))
        default:
            return nil
        }
        return out
    }
}
