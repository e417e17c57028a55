/// Standard Base64 (RFC 4648 section 4, with padding), as the WebSocket handshake uses it.
enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode<C: Collection<UInt8>>(_ bytes: C) -> String {
        var out: [UInt8] = []
        encode(bytes, into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends the encoding of `bytes` to `out`.
    static func encode<C: Collection<UInt8>>(_ bytes: C, into out: inout [UInt8]) {
        let input = Array(bytes)
        let start = out.count, count = (input.count + 2) / 3 * 4
        guard count > 0 else { return }
        out.append(contentsOf: repeatElement(0, count: count))
        out.withUnsafeMutableBufferPointer { dst in
            input.withUnsafeBufferPointer { src in
                if let base = dst.baseAddress { _ = encode(src, to: base + start) }  // not empty: `count` > 0
            }
        }
    }

    /// Writes the encoding of `bytes` to `dst` (room for `(bytes.count + 2) / 3 * 4` bytes); returns its length.
    static func encode(_ bytes: UnsafeBufferPointer<UInt8>, to dst: UnsafeMutablePointer<UInt8>) -> Int {
        var o = 0, i = 0
        let n = bytes.count
        while i < n {
            let b0 = bytes[i], b1: UInt8? = i + 1 < n ? bytes[i + 1] : nil, b2: UInt8? = i + 2 < n ? bytes[i + 2] : nil
            let v = UInt32(b0) << 16 | UInt32(b1 ?? 0) << 8 | UInt32(b2 ?? 0)
            dst[o] = alphabet[Int(v >> 18 & 63)]
            dst[o + 1] = alphabet[Int(v >> 12 & 63)]
            dst[o + 2] = b1 == nil ? UInt8(ascii: "=") : alphabet[Int(v >> 6 & 63)]
            dst[o + 3] = b2 == nil ? UInt8(ascii: "=") : alphabet[Int(v & 63)]
            i += 3
            o += 4
        }
        return o
    }

    /// Strict decoding: length a multiple of 4, padding only at the end, unused bits zero. Nil otherwise.
    static func decode(_ string: String) -> [UInt8]? {
        var out: [UInt8] = []
        let s = Array(string.utf8)
        out.reserveCapacity(s.count / 4 * 3)
        return decode(s[...], { out.append($0) }) ? out : nil
    }

    /// How many bytes `bytes` decodes to under the rules of ``decode(_:)``, without keeping them; nil when it is not
    /// valid Base64. (The handshake only checks that its key is 16 bytes.)
    static func decodedCount(_ bytes: ArraySlice<UInt8>) -> Int? {
        var n = 0
        return decode(bytes, { _ in n += 1 }) ? n : nil
    }

    /// Decodes `s`, handing each byte to `emit`; false (after some bytes, maybe) if `s` is not valid Base64.
    private static func decode(_ s: ArraySlice<UInt8>, _ emit: (UInt8) -> Void) -> Bool {
        guard s.count % 4 == 0 else { return false }
        var i = s.startIndex
        while i < s.endIndex {
            let last = i + 4 == s.endIndex
            var n: UInt32 = 0
            var pad = 0
            for j in 0..<4 {
                let c = s[i + j]
                if c == UInt8(ascii: "=") {
                    guard last, j >= 2 else { return false }
                    pad += 1
                    n <<= 6
                } else {
                    guard pad == 0, let v = value(c) else { return false }
                    n = n << 6 | UInt32(v)
                }
            }
            emit(UInt8(n >> 16 & 0xFF))
            if pad < 2 { emit(UInt8(n >> 8 & 0xFF)) } else if n & 0xFFFF != 0 { return false }
            if pad < 1 { emit(UInt8(n & 0xFF)) } else if n & 0xFF != 0 { return false }
            i += 4
        }
        return true
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
