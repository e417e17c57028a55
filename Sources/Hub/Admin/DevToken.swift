import COpenSSL
import Foundation

/// Mints HS256 tokens for development and testing (`hubctl token`). Independent of the hub's verifier on
/// purpose: it is a second implementation of the same RFC 7519 shape, so the two check each other.
public enum DevToken {
    /// A compact JWS: header `{"alg":"HS256","typ":"JWT"}`, claims `{"sub","iat","exp"}` with
    /// `exp = now + ttl` (Unix seconds).
    public static func mint(account: String, ttl: Int, secret: [UInt8], now: Int) -> String {
        let header = #"{"alg":"HS256","typ":"JWT"}"#
        let claims = #"{"sub":"# + AdminClient.jsonString(account) + #","iat":\#(now),"exp":\#(now + ttl)}"#
        let signingInput = base64URL(Array(header.utf8)) + "." + base64URL(Array(claims.utf8))
        let signature = hmacSHA256(key: secret, message: Array(signingInput.utf8))
        return signingInput + "." + base64URL(signature)
    }

    /// The longest TTL `parseTTL` accepts: ten years.
    public static let maxTTL = 3650 * 86400

    /// Parses a TTL: `90s`, `15m`, `2h`, `1d`, or plain seconds (`900`). `nil` for anything else, zero,
    /// negative values, or more than `maxTTL`.
    public static func parseTTL(_ text: String) -> Int? {
        var digits = Substring(text)
        var unit = 1
        if let last = text.last, !last.isNumber {
            switch last {
            case "s": unit = 1
            case "m": unit = 60
            case "h": unit = 3600
            case "d": unit = 86400
            default: return nil
            }
            digits = digits.dropLast()
        }
        guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }),
              let value = Int(digits), value > 0 else { return nil }
        let (seconds, overflow) = value.multipliedReportingOverflow(by: unit)
        return overflow || seconds > maxTTL ? nil : seconds
    }

    /// The secret as stored in a secret file: the file's text with surrounding whitespace removed.
    public static func secret(fromFileContents bytes: [UInt8]) -> [UInt8] {
        let isSpace: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }
        guard let first = bytes.firstIndex(where: { !isSpace($0) }),
              let last = bytes.lastIndex(where: { !isSpace($0) }) else { return [] }
        return Array(bytes[first...last])
    }

    public static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        key.withUnsafeBufferPointer { k in
            message.withUnsafeBufferPointer { m in
                _ = HMAC(EVP_sha256(), k.baseAddress, Int32(k.count), m.baseAddress, m.count, &out, &length)
            }
        }
        return Array(out[0..<Int(length)])
    }

    public static func base64URL(_ bytes: [UInt8]) -> String {
        var text = Data(bytes).base64EncodedString()
        while text.hasSuffix("=") { text.removeLast() }
        return text.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
    }
}
