import Glibc

// Arrays made without the standard library's unspecialised allocation path.
//
// `Array(repeating:count:)` and `Array(unsafeUninitializedCapacity:initializingWith:)` allocate in the standard
// library's `_allocateBufferUninitialized(minimumCapacity:)`, which is never inlined: running unspecialised, it looks
// up `_ContiguousArrayStorage<Element>`'s metadata in the runtime's generic-metadata hash table on every call.
// `reserveCapacity` and `append` allocate in code specialised in the caller's module (these are `@inlinable`),
// where the metadata accessor caches the type.

extension Array {
    /// `count` copies of `value` (what `Array(repeating:count:)` makes), allocated once.
    @inlinable package init(filledWith value: Element, count: Int) {
        self.init()
        reserveCapacity(count)
        for _ in 0..<count { append(value) }
    }
}

/// 4 KiB of zero bytes, never written: the source `appendZeros` copies from.
@usableFromInline nonisolated(unsafe) let zeroPage: UnsafeRawBufferPointer = {
    let page = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 64)
    page.initializeMemory(as: UInt8.self, repeating: 0)
    return UnsafeRawBufferPointer(page)
}()

extension Array where Element == UInt8 {
    /// Appends `n` zero bytes: one growth to the final size, then copies from `zeroPage`.
    @inlinable package mutating func appendZeros(_ n: Int) {
        guard n > 0 else { return }
        reserveCapacity(count + n)
        var left = n
        while left > 0 {
            let chunk = Swift.min(left, zeroPage.count)
            append(contentsOf: UnsafeRawBufferPointer(rebasing: zeroPage[..<chunk]))
            left -= chunk
        }
    }
}
