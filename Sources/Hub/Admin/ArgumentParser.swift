/// hubctl's command-line parser, in the library so tests can drive it directly.
///
/// Grammar: `[global flags] COMMAND [flags and positionals in any order] [-- positionals...]`.
/// Value flags take `--name value` or `--name=value`; boolean flags take no value (`--name=x` is an error);
/// a lone `-` and negative numbers (`-1`, `-.5`) are positionals; everything after `--` is positional. Global flags may appear anywhere.
/// A repeated value flag keeps its last value. `-h` means `--help`.
public struct CommandSpec: Sendable {
    public var name: String
    public var valueFlags: Set<String>
    public var boolFlags: Set<String>
    public var minPositionals: Int
    public var maxPositionals: Int
    /// Names of the positionals, for "missing argument" messages.
    public var positionalNames: [String]

    public init(_ name: String, valueFlags: Set<String> = [], boolFlags: Set<String> = [],
                positionals: [String] = [], optionalPositionals: Int = 0) {
        self.name = name
        self.valueFlags = valueFlags
        self.boolFlags = boolFlags
        self.positionalNames = positionals
        self.minPositionals = positionals.count - optionalPositionals
        self.maxPositionals = positionals.count
    }
}

public struct ParsedArguments: Sendable, Equatable {
    public var command: String?
    public var values: [String: String] = [:]
    public var flags: Set<String> = []
    public var positionals: [String] = []

    public init(command: String? = nil, values: [String: String] = [:], flags: Set<String> = [],
                positionals: [String] = []) {
        self.command = command
        self.values = values
        self.flags = flags
        self.positionals = positionals
    }
}

public enum ArgumentError: Error, Equatable, CustomStringConvertible {
    case unknownCommand(String)
    case unknownFlag(String)
    case missingValue(String)
    case unexpectedValue(String)
    case missingArgument(String)
    case unexpectedArgument(String)

    public var description: String {
        switch self {
        case .unknownCommand(let name): return "unknown command \"\(name)\""
        case .unknownFlag(let flag): return "unknown flag \(flag)"
        case .missingValue(let flag): return "flag \(flag) needs a value"
        case .unexpectedValue(let flag): return "flag \(flag) takes no value"
        case .missingArgument(let name): return "missing argument \(name)"
        case .unexpectedArgument(let text): return "unexpected argument \"\(text)\""
        }
    }
}

public struct ArgumentParser: Sendable {
    public var globalValueFlags: Set<String>
    public var globalBoolFlags: Set<String>
    public var commands: [String: CommandSpec]

    public init(globalValueFlags: Set<String>, globalBoolFlags: Set<String>, commands: [CommandSpec]) {
        self.globalValueFlags = globalValueFlags
        self.globalBoolFlags = globalBoolFlags
        self.commands = Dictionary(commands.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
    }

    /// Parses `arguments` (without the program name). With `--help`, positional-count checks are skipped so
    /// `hubctl channel --help` works.
    public func parse(_ arguments: [String]) throws(ArgumentError) -> ParsedArguments {
        var result = ParsedArguments()
        var spec: CommandSpec?
        var index = 0
        var terminated = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            let negativeNumber = argument.count > 1 && argument.hasPrefix("-")
                && argument.dropFirst().first.map({ $0.isASCII && ($0.isNumber || $0 == ".") }) == true
            if terminated || argument == "-" || negativeNumber || !argument.hasPrefix("-") {
                if result.command == nil && !terminated {
                    guard let found = commands[argument] else { throw .unknownCommand(argument) }
                    result.command = argument
                    spec = found
                } else {
                    result.positionals.append(argument)
                }
                continue
            }
            if argument == "--" { terminated = true; continue }
            if argument == "-h" { result.flags.insert("help"); continue }
            guard argument.hasPrefix("--") else { throw .unknownFlag(argument) }
            var name = String(argument.dropFirst(2))
            var inlineValue: String?
            if let equals = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            let takesValue = globalValueFlags.contains(name) || spec?.valueFlags.contains(name) == true
            let isBool = globalBoolFlags.contains(name) || spec?.boolFlags.contains(name) == true
            if takesValue {
                if let inlineValue {
                    result.values[name] = inlineValue
                } else {
                    guard index < arguments.count else { throw .missingValue("--" + name) }
                    let next = arguments[index]
                    if next.hasPrefix("--") && next.count > 2 { throw .missingValue("--" + name) }
                    result.values[name] = next
                    index += 1
                }
            } else if isBool {
                if inlineValue != nil { throw .unexpectedValue("--" + name) }
                result.flags.insert(name)
            } else {
                throw .unknownFlag("--" + name)
            }
        }
        if let spec, !result.flags.contains("help") {
            if result.positionals.count < spec.minPositionals {
                throw .missingArgument(spec.positionalNames[result.positionals.count])
            }
            if result.positionals.count > spec.maxPositionals {
                throw .unexpectedArgument(result.positionals[spec.maxPositionals])
            }
        }
        return result
    }
}
