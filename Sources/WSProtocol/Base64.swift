/// Standard Base64 (RFC 4648 section 4, with padding), as the WebSocket handshake uses it.
enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode<C: Collection<UInt8>>(_ bytes: C) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var it = bytes.makeIterator()
        while let b0 = it.next() {
            let b1 = it.next(), b2 = it.next()
            let n = UInt32(b0) << 16 | UInt32(b1 ?? 0) << 8 | UInt32(b2 ?? 0)
            out.append(alphabet[Int(n >> 18 & 63)])
            out.append(alphabet[Int(n >> 12 & 63)])
            out.append(b1 == nil ? UInt8(ascii: "=") : alphabet[Int(n >> 6 & 63)])
            out.append(b2 == nil ? UInt8(ascii: "=") : alphabet[Int(n & 63)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Strict decoding: length a multiple of 4, padding only at the end, unused bits zero. Nil otherwise.
    static func decode(_ string: String) -> [UInt8]? {
        let s = Array(string.utf8)
        guard s.count % 4 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(s.count / 4 * 3)
        var i = 0
        while i < s.count {
            let last = i + 4 == s.count
            var n: UInt32 = 0
            var pad = 0
            for j in 0..<4 {
                let c = s[i + j]
                if c == UInt8(ascii: "=") {
                    guard last, j >= 2 else { return nil }
                    pad += 1
                    n <<= 6
                } else {
                    guard pad == 0, let v = value(c) else { return nil }
                    n = n << 6 | UInt32(v)
                }
            }
            out.append(UInt8(n >> 16 & 0xFF))
            if pad < 2 { out.append(UInt8(n >> 8 & 0xFF)) } else if n & 0xFFFF != 0 { return nil }
            if pad < 1 { out.append(UInt8(n & 0xFF)) } else if n & 0xFF != 0 { return nil }
            i += 4
        }
        return out
    }

    @inline(__always) private static func value(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): return c - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): return c - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0") + 52
        case UInt8(ascii: "+"): return 62
        case UInt8(ascii: "/"): return 63
        default: return nil
        }
    }
}
