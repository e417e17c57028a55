import Glibc

/// The hub's lock: a value guarded by a `pthread_mutex_t`, with the `withLock` shape of `Synchronization.Mutex`.
///
/// Why not `Synchronization.Mutex`: its contended path waits on a futex inside the uninstrumented standard library,
/// so ThreadSanitizer never sees the lock being taken and reports a race on every value it guards (a 10-line program,
/// eight threads appending under one `Mutex`, is reported at -O and -Onone alike). `pthread_mutex_lock` is intercepted
/// by the sanitizers, so `scripts/sanitize thread` can prove the hub's real synchronization instead of drowning in
/// false reports. glibc's mutex is futex-based too: an uncontended lock is one atomic exchange either way.
@usableFromInline package final class LockedValue<Value>: @unchecked Sendable {
    /// One allocation: the `pthread_mutex_t`, then the value. The value is reached through a pointer, not a stored
    /// `var`, because Swift would check every `inout` access to a stored property at run time (exclusivity
    /// enforcement): here the lock itself is what makes the access exclusive.
    @usableFromInline let base: UnsafeMutableRawPointer
    @inlinable static var valueOffset: Int {
        let align = MemoryLayout<Value>.alignment
        return (MemoryLayout<pthread_mutex_t>.stride + align - 1) / align * align
    }
    @inlinable var mutex: UnsafeMutablePointer<pthread_mutex_t> { base.assumingMemoryBound(to: pthread_mutex_t.self) }
    @inlinable var value: UnsafeMutablePointer<Value> { (base + Self.valueOffset).assumingMemoryBound(to: Value.self) }

    @inlinable package init(_ initialValue: Value) {
        base = .allocate(byteCount: Self.valueOffset + MemoryLayout<Value>.size,
                         alignment: max(MemoryLayout<pthread_mutex_t>.alignment, MemoryLayout<Value>.alignment))
        base.initializeMemory(as: pthread_mutex_t.self, repeating: pthread_mutex_t(), count: 1)
        (base + Self.valueOffset).initializeMemory(as: Value.self, repeating: initialValue, count: 1)
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        value.deinitialize(count: 1)
        mutex.deinitialize(count: 1)
        base.deallocate()
    }

    /// Runs `body` with exclusive access to the value. Never call it again from inside `body` (not recursive).
    @inlinable
    package func withLock<Result, E: Error>(_ body: (inout Value) throws(E) -> Result) throws(E) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value.pointee)
    }
}
