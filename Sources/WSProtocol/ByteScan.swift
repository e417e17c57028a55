import Glibc

/// Whole-buffer byte checks for the handshake's long values (a request target or an `Authorization` header carrying
/// a ~200-byte token): 8 bytes per step, or glibc's vectorised `memchr`, instead of a closure call per byte (which
/// cost 3-4 instructions a byte, several hundred per check and handshake under callgrind: set-up cost).
public enum ByteScan {
    /// Whether every byte of `bytes` is in `range`. The bounds must be ASCII (`upperBound` at most 0x7F); any byte
    /// from 0x80 up is outside.
    public static func all(_ bytes: UnsafeRawBufferPointer, in range: ClosedRange<UInt8>) -> Bool {
        precondition(range.upperBound < 0x80, "ByteScan.all takes an ASCII range")
        let lo = UInt64(range.lowerBound), hi = UInt64(range.upperBound)
        let ones: UInt64 = 0x0101_0101_0101_0101, highs: UInt64 = 0x8080_8080_8080_8080
        let n = bytes.count
        var i = 0
        while i &+ 8 <= n {
            let x = bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self)
            // A byte below `lo` (it borrows: x - lo), above `hi` (it carries into its high bit: x + 127 - hi), or
            // with its high bit set. Borrows and carries crossing into the next byte only happen from a byte that is
            // itself out of range, so "some byte is out" is exact.
            let below = lo == 0 ? 0 : (x &- ones &* lo) & ~x & highs
            let above = ((x &+ ones &* (127 &- hi)) | x) & highs
            if below | above != 0 { return false }
            i &+= 8
        }
        while i < n {
            if !range.contains(bytes[i]) { return false }
            i &+= 1
        }
        return true
    }

    /// The offset of the first `byte` in `bytes` at or after `start`, or nil (`memchr`).
    public static func firstIndex(of byte: UInt8, in bytes: UnsafeRawBufferPointer, from start: Int = 0) -> Int? {
        guard let base = bytes.baseAddress, start < bytes.count else { return nil }
        guard let found = memchr(base + start, Int32(byte), bytes.count - start) else { return nil }
        return UnsafeRawPointer(found) - base
    }

    /// Whether `byte` occurs in `bytes`.
    public static func contains(_ byte: UInt8, in bytes: UnsafeRawBufferPointer) -> Bool {
        firstIndex(of: byte, in: bytes) != nil
    }
}
