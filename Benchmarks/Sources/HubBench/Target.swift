import Foundation
import HubAuth

/// The server under test, as the load generator sees it.
///  - `hub`: our hub; subscribe by message; publish on its Unix socket (NDJSON, pipelined).
///  - `jwt`: a peer with the hub's client protocol (Hummingbird, Python); publish by `POST /publish` with NDJSON batches.
///  - `nchan`: nginx + nchan; subscription by URL, no JWT; publish one `POST /pub/<channel>/<account>` per event.
struct TargetSpec: Codable {
    var name: String
    var kind: String
    var host: String
    var port: Int
    /// `unix:PATH`, `http://HOST:PORT/publish`, `nchan://HOST:PORT`.
    var publish: String
    var channel: String
    /// A cluster of hubs (`--port A,B,C`): connection i goes to `ports[i % count]`; nil for one server.
    var ports: [Int]? = nil
    /// wss:// (`--tls`): the connections speak TLS (no certificate check: the benchmark's throwaway CA).
    var tls: Bool? = nil

    var usesToken: Bool { kind != "nchan" }
    var subscribesByMessage: Bool { kind != "nchan" }

    func path(account: String, token: String?) -> String {
        if kind == "nchan" { return "/ws/\(channel)/\(account)" }
        return "/ws?access_token=\(token ?? "")"
    }
}

/// Mints HS256 tokens with the secret in `HUBBENCH_SECRET` (the same secret the hub and the peers were started with).
final class TokenMint {
    let signer: JWTSigner?
    let now = Int64(Date().timeIntervalSince1970)

    init(required: Bool) {
        guard let secret = ProcessInfo.processInfo.environment["HUBBENCH_SECRET"], !secret.isEmpty else {
            if required { fail("HUBBENCH_SECRET is not set (the servers' HS256 secret)") }
            signer = nil
            return
        }
        do {
            signer = try JWTSigner(key: .hmacSecret(Array(secret.utf8)))
        } catch {
            fail("HUBBENCH_SECRET: \(error)")
        }
    }

    func token(for account: String) -> String? {
        guard let signer else { return nil }
        return try? signer.sign(JWTClaims(subject: account, now: now, ttl: 3600))
    }
}

/// Small byte helpers for building NDJSON lines and HTTP requests without String interpolation on the hot path.
extension Array where Element == UInt8 {
    @inline(__always)
    mutating func appendDecimal(_ value: UInt64) {
        if value == 0 { append(0x30); return }
        var v = value
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var n = 0
        Swift.withUnsafeMutableBytes(of: &digits) { d in
            while v > 0 { d[n] = UInt8(truncatingIfNeeded: v % 10) &+ 0x30; v /= 10; n += 1 }
            var i = n - 1
            while i >= 0 { append(d[i]); i -= 1 }
        }
    }

    mutating func append(_ s: StaticString) {
        s.withUTF8Buffer { append(contentsOf: $0) }
    }

    mutating func append(_ s: String) { append(contentsOf: s.utf8) }
}

/// Finds `pattern` (e.g. `"delivered":`) in `bytes` from `start` and parses the decimal after it.
@inline(__always)
func scanValue(_ pattern: [UInt8], in bytes: UnsafeRawBufferPointer, from start: Int = 0, end: Int? = nil) -> (value: UInt64, next: Int)? {
    let n = end ?? bytes.count
    let m = pattern.count
    guard m > 0 else { return nil }
    let first = pattern[0]
    var i = start
    outer: while i + m <= n {
        if bytes[i] != first { i += 1; continue }
        for k in 1..<m where bytes[i + k] != pattern[k] { i += 1; continue outer }
        var j = i + m
        var v: UInt64 = 0
        var digits = 0
        while j < n, bytes[j] >= 0x30, bytes[j] <= 0x39 {
            v = v &* 10 &+ UInt64(bytes[j] &- 0x30)
            j += 1
            digits += 1
        }
        if digits > 0 { return (v, j) }
        i = j
    }
    return nil
}

/// Counts occurrences of `pattern` in `bytes[start..<end]`.
func countOccurrences(_ pattern: [UInt8], in bytes: UnsafeRawBufferPointer, from start: Int, to end: Int) -> Int {
    let m = pattern.count
    var i = start
    var found = 0
    let first = pattern[0]
    outer: while i + m <= end {
        if bytes[i] != first { i += 1; continue }
        for k in 1..<m where bytes[i + k] != pattern[k] { i += 1; continue outer }
        found += 1
        i += m
    }
    return found
}

let patT: [UInt8] = Array(#""t":"#.utf8)
let patI: [UInt8] = Array(#""i":"#.utf8)
let patDelivered: [UInt8] = Array(#""delivered":"#.utf8)
let patSubscribers: [UInt8] = Array(#""subscribers":"#.utf8)
let patOkFalse: [UInt8] = Array(#""ok":false"#.utf8)
let patSubscribed: [UInt8] = Array(#""type":"subscribed""#.utf8)
let patError: [UInt8] = Array(#""type":"error""#.utf8)
let patSeq: [UInt8] = Array(#""seq":"#.utf8)
let patBroadcastSeq: [UInt8] = Array(#""broadcastSeq":"#.utf8)
let patEpoch: [UInt8] = Array(#""epoch":""#.utf8)
let patReason: [UInt8] = Array(#""reason":""#.utf8)
let patRecoveredTrue: [UInt8] = Array(#""recovered":true"#.utf8)

/// The string after `pattern` (which ends with the opening quote), up to the next quote (no escapes expected).
func scanString(_ pattern: [UInt8], in bytes: UnsafeRawBufferPointer) -> String? {
    let m = pattern.count
    var i = 0
    outer: while i + m <= bytes.count {
        for k in 0..<m where bytes[i + k] != pattern[k] { i += 1; continue outer }
        var j = i + m
        while j < bytes.count, bytes[j] != 0x22 { j += 1 }
        return String(decoding: UnsafeRawBufferPointer(rebasing: bytes[(i + m)..<j]), as: UTF8.self)
    }
    return nil
}

func errnoName(_ code: Int32) -> String {
    switch code {
    case ECONNREFUSED: "ECONNREFUSED"
    case ECONNRESET: "ECONNRESET"
    case EADDRNOTAVAIL: "EADDRNOTAVAIL"
    case EADDRINUSE: "EADDRINUSE"
    case ETIMEDOUT: "ETIMEDOUT"
    case EMFILE: "EMFILE"
    case ENFILE: "ENFILE"
    case EPIPE: "EPIPE"
    case ENOBUFS: "ENOBUFS"
    default: "errno \(code)"
    }
}
