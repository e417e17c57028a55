/// An immutable byte buffer that many connections can queue at once without copying.
///
/// Why: a pub/sub event for 10 000 subscribers is framed once; the same `SharedBytes` object is
/// enqueued on every subscriber's outbound queue (one retain each), and `writev` points straight
/// into it. The bytes are written once at initialisation and never again, which is what makes the
/// `@unchecked Sendable` sound: after `init` returns, every access is a read.
public final class SharedBytes: @unchecked Sendable {
    /// The immutable contents.
    public let bytes: UnsafeRawBufferPointer
    private let storage: UnsafeMutableRawPointer?

    /// Allocates `count` bytes and lets `initialize` fill them (e.g. frame header + payload in one go).
    public init(count: Int, initializingWith initialize: (UnsafeMutableRawBufferPointer) throws -> Void) rethrows {
        let p = count > 0 ? UnsafeMutableRawPointer.allocate(byteCount: count, alignment: 16) : nil
        storage = p
        let mutable = UnsafeMutableRawBufferPointer(start: p, count: count)
        do { try initialize(mutable) } catch { p?.deallocate(); throw error }
        bytes = UnsafeRawBufferPointer(mutable)
    }

    /// Copies `source` into a new shared buffer.
    public convenience init(copying source: UnsafeRawBufferPointer) {
        self.init(count: source.count) { dst in
            if let base = source.baseAddress, source.count > 0 { dst.baseAddress!.copyMemory(from: base, byteCount: source.count) }
        }
    }

    /// Copies a byte sequence (array, string's utf8 view, …).
    public convenience init<S: Collection>(_ source: S) where S.Element == UInt8 {
        self.init(count: source.count) { dst in _ = dst.initializeMemory(as: UInt8.self, from: source) }
    }

    public var count: Int { bytes.count }

    deinit { storage?.deallocate() }
}
