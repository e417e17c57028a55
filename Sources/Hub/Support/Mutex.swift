import Glibc

/// The hub's lock: a value guarded by a `pthread_mutex_t`, with the `withLock` shape of `Synchronization.Mutex`, which
/// it shadows inside this module.
///
/// Why not `Synchronization.Mutex`: its contended path waits on a futex inside the uninstrumented standard library,
/// so ThreadSanitizer never sees the lock being taken and reports a race on every value it guards (a 10-line program,
/// eight threads appending under one `Mutex`, is reported at -O and -Onone alike). `pthread_mutex_lock` is intercepted
/// by the sanitizers, so `scripts/sanitize thread` can prove the hub's real synchronization instead of drowning in
/// false reports. glibc's mutex is futex-based too: an uncontended lock is one atomic exchange either way.
final class Mutex<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    init(_ initialValue: Value) {
        value = initialValue
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with exclusive access to the value. Never call it again from inside `body` (not recursive).
    @inline(__always)
    func withLock<Result, E: Error>(_ body: (inout Value) throws(E) -> Result) throws(E) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
