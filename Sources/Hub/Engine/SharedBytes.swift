/// An immutable byte buffer that many connections can queue at once without copying.
///
/// Why: a pub/sub event for 10 000 subscribers is framed once; the same buffer is enqueued on every subscriber's
/// outbound queue (one retain each), and `writev` points straight into it. The bytes are written once at
/// initialisation and never again, which is what makes the `@unchecked Sendable` sound: after `init` returns,
/// every access is a read.
///
/// One allocation per buffer: the bytes live in the tail of their reference-counted object (`ManagedBuffer`), not
/// in a second block the object points to. A frame costs one malloc and one free instead of two, which matters most
/// for the history's retained events, freed long after they were made, when both blocks had left the cache
/// (Benchmarks/README.md, "Recovery"). The value is one reference (8 bytes), as the class it replaced.
public struct SharedBytes: @unchecked Sendable {
    /// The count in the header, the bytes after it.
    final class Storage: ManagedBuffer<Int, UInt8> {}

    /// nil for an empty buffer.
    private let storage: Storage?

    /// Allocates `count` bytes and lets `initialize` fill them (e.g. frame header + payload in one go).
    public init(count: Int, initializingWith initialize: (UnsafeMutableRawBufferPointer) throws -> Void) rethrows {
        guard count > 0 else {
            storage = nil
            try initialize(UnsafeMutableRawBufferPointer(start: nil, count: 0))
            return
        }
        // `create` may round the capacity up: the header holds the exact count.
        let made = unsafeDowncast(Storage.create(minimumCapacity: count) { _ in count }, to: Storage.self)
        try made.withUnsafeMutablePointerToElements { elements in
            try initialize(UnsafeMutableRawBufferPointer(start: elements, count: count))
        }
        storage = made
    }

    /// Copies `source` into a new shared buffer.
    public init(copying source: UnsafeRawBufferPointer) {
        self.init(count: source.count) { dst in
            if let base = source.baseAddress, source.count > 0 { dst.baseAddress!.copyMemory(from: base, byteCount: source.count) }
        }
    }

    /// Copies a byte sequence (array, string's utf8 view, …).
    public init<S: Collection>(_ source: S) where S.Element == UInt8 {
        self.init(count: source.count) { dst in _ = dst.initializeMemory(as: UInt8.self, from: source) }
    }

    /// The immutable contents. Valid as long as this value (or a copy of it) is alive: the bytes are the tail of the
    /// storage object, which never moves.
    @inline(__always)
    public var bytes: UnsafeRawBufferPointer {
        guard let storage else { return UnsafeRawBufferPointer(start: nil, count: 0) }
        return storage.withUnsafeMutablePointers { count, elements in UnsafeRawBufferPointer(start: elements, count: count.pointee) }
    }

    /// Read through the header's pointer: `ManagedBuffer.header` is a stored `var` of a class, and every access to
    /// it would cost a run-time exclusivity check (a delivered event reads the count several times).
    /// The header is written once, by `create`.
    @inline(__always)
    public var count: Int {
        guard let storage else { return 0 }
        return storage.withUnsafeMutablePointerToHeader { $0.pointee }
    }
}
