/// A value that belongs to one event loop, carried through a `@Sendable` job back to that loop
/// (`loop.execute { bound.value… }`): the only way the hub hands loop-confined state across threads. The loop is
/// stored with the value, and reading `value` anywhere but on that loop stops a debug build (`assertInLoop`;
/// nothing is checked in release builds). NIO's `NIOLoopBound` has the same shape. `@inlinable`: the modules above
/// read it per publish batch, and a generic getter called across a module is not specialised.
@usableFromInline package struct LoopBound<Value>: @unchecked Sendable {
    @usableFromInline package let loop: EventLoop
    @usableFromInline let stored: Value

    @inlinable package init(_ value: Value, loop: EventLoop) {
        self.loop = loop
        stored = value
    }

    @inlinable package var value: Value {
        loop.assertInLoop()
        return stored
    }
}

/// A weak reference, for a loop-bound job that must not keep its object alive (`LoopBound(Weak(self), loop:)`).
@usableFromInline package struct Weak<Object: AnyObject> {
    @usableFromInline package weak var object: Object?
    @inlinable package init(_ object: Object) { self.object = object }
}
