/// A setup error with a message meant for an operator's log (bad address, path in use, …).
public struct EngineError: Error, CustomStringConvertible, Sendable, Equatable {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
