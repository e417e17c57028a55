import Glibc
import HubCluster
import HubEngine
import HubJSON

/// The configuration file (`--config FILE`, `HUB_CONFIG`): one JSON object, one key per option, named as the flag
/// without `--` (`"listen": "0.0.0.0:8080"`). Keys that start with `//` are comments and ignored. Read with the
/// hub's own JSON scanner. Precedence: flags > environment > file > defaults.
extension HubConfiguration {
    /// What a file may give for an option: flags take `true`/`false`; counts, sizes and durations a whole number
    /// (durations in seconds) or the flag's text (`"64m"`, `"30s"`); lists an array of strings or the flag's
    /// comma-separated text; everything else a string.
    enum FileType: Equatable { case string, number, bool, list }

    static func fileType(_ option: Option) -> FileType {
        switch option.kind {
        case .flag: return .bool
        case .value(let placeholder):
            switch placeholder {
            case "N", "BYTES", "DURATION": return .number
            case "LIST": return .list
            default: return .string
            }
        }
    }

    /// Reads `path` and applies its members to `config`. Every error names the file, the key and the reason.
    static func applyFile(at path: String, to config: inout HubConfiguration) throws(ConfigurationError) {
        let bytes: [UInt8]
        do {
            bytes = try readFile(path)
        } catch {
            throw ConfigurationError(message: "cannot read the config file \(path): \(error.message)")
        }
        try applyFile(bytes, path: path, to: &config)
        config.configFile = path
    }

    static func applyFile(_ bytes: [UInt8], path: String, to config: inout HubConfiguration) throws(ConfigurationError) {
        var members: [(key: String, value: JSONValue)] = []
        var failure: ConfigurationError? = nil
        bytes.withUnsafeBytes { raw in
            do throws(JSONError) {
                try JSONScanner.forEachMember(in: raw, maxDepth: 4) { key, value in
                    members.append((JSONScanner.decodeString(key, in: raw), value))
                }
            } catch {
                failure = ConfigurationError(message: "\(path): " + (error.isNotAnObject
                    ? "the file must hold one JSON object ({\"listen\": \"0.0.0.0:8080\", ...})" : error.description))
            }
        }
        if let failure { throw failure }
        var seen: Set<String> = []
        for (key, value) in members where !key.hasPrefix("//") {
            guard seen.insert(key).inserted else { throw ConfigurationError(message: "\(path): \"\(key)\" is given twice") }
            guard let option = options.first(where: { $0.name == key }) else {
                let hint = key.hasPrefix("--") ? " (write it without --)" : key == "config" ? " (a config file cannot name another)" : ""
                throw ConfigurationError(message: "\(path): unknown key \"\(key)\"\(hint); the keys are the options of hub --help without --")
            }
            let result = bytes.withUnsafeBytes { raw in fileText(value, in: raw, type: fileType(option)) }
            do {
                try option.apply(&config, try result.get())
            } catch {
                throw ConfigurationError(message: "\(path): \"\(key)\": \(error.message)")
            }
        }
    }

    /// A member's value as the flag's text, or why its JSON type does not fit.
    private static func fileText(_ value: JSONValue, in raw: UnsafeRawBufferPointer, type: FileType) -> Result<String, ConfigurationError> {
        do throws(ConfigurationError) {
            return .success(try fileTextOrThrow(value, in: raw, type: type))
        } catch {
            return .failure(error)
        }
    }

    private static func fileTextOrThrow(_ value: JSONValue, in raw: UnsafeRawBufferPointer, type: FileType) throws(ConfigurationError) -> String {
        func wrong(_ expected: String) -> ConfigurationError {
            let got: String
            switch value.kind {
            case .object: got = "an object"
            case .array: got = "an array"
            case .string: got = "a string"
            case .number: got = "a number"
            case .true, .false: got = "a boolean"
            case .null: got = "null"
            }
            return ConfigurationError(message: "expected \(expected), got \(got)")
        }
        switch (type, value.kind) {
        case (_, .string) where type != .bool:
            return JSONScanner.decodeString(value, in: raw)
        case (.number, .number):
            guard let n = JSONScanner.int64(value, in: raw) else { throw ConfigurationError(message: "expected a whole number") }
            return String(n)
        case (.bool, .true): return "true"
        case (.bool, .false): return "false"
        case (.list, .array):
            var items: [String] = []
            var bad = false
            try? JSONScanner.forEachElement(of: value, in: raw) { element in
                if element.kind == .string { items.append(JSONScanner.decodeString(element, in: raw)) } else { bad = true }
            }
            guard !bad else { throw ConfigurationError(message: "expected an array of strings") }
            return items.joined(separator: ",")
        case (.bool, _): throw wrong("true or false")
        case (.number, _): throw wrong("a whole number or a string")
        case (.list, _): throw wrong("an array of strings or a comma-separated string")
        case (.string, _): throw wrong("a string")
        }
    }

    /// The whole file; its errno's text on failure.
    static func readFile(_ path: String) throws(ConfigurationError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw ConfigurationError(message: String(cString: strerror(errno))) }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw ConfigurationError(message: String(cString: strerror(errno))) }
        guard st.st_mode & S_IFMT == S_IFREG else { throw ConfigurationError(message: "not a regular file") }
        guard st.st_size <= 1 << 20 else { throw ConfigurationError(message: "larger than 1 MiB") }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n > 0 { bytes += chunk[0..<n]; continue }
            if n == 0 { return bytes }
            if errno == EINTR { continue }
            throw ConfigurationError(message: String(cString: strerror(errno)))
        }
    }

    /// What SIGHUP calls: `parse` again with the start's arguments and environment (so the file is read anew and
    /// the flags and variables still win over it).
    public static func reloader(arguments: [String], environment: [String: String])
        -> @Sendable () throws(ConfigurationError) -> HubConfiguration {
        return { () throws(ConfigurationError) -> HubConfiguration in
            guard case .run(let c) = try parse(arguments: arguments, environment: environment) else {
                throw ConfigurationError(message: "the command line no longer describes a run")
            }
            return c
        }
    }

    // MARK: check-config and default-config

    /// One option's value as the file would give it; nil when unset (the default is derived or absent).
    enum FileValue: Equatable { case string(String), number(Int), bool(Bool), list([String]) }

    /// `name`'s effective value in `c`, secrets masked (a broker URL's password).
    static func fileValue(_ name: String, _ c: HubConfiguration) -> FileValue? {
        switch name {
        case "listen": .string(c.listen)
        case "tls-cert": c.tlsCertificateFile.map(FileValue.string)
        case "tls-key": c.tlsKeyFile.map(FileValue.string)
        case "tls-listen": c.tlsListen.map(FileValue.string)
        case "tls-records": .string(c.tlsRecords.rawValue)
        case "socket": .string(c.socketPath)
        case "state-dir": .string(c.stateDirectory)
        case "jwt-secret-file": c.jwtSecretFile.map(FileValue.string)
        case "jwt-public-key": c.jwtPublicKeyFile.map(FileValue.string)
        case "jwt-issuer": c.jwtIssuer.map(FileValue.string)
        case "jwt-audience": c.jwtAudience.map(FileValue.string)
        case "jwt-leeway": .number(c.jwtLeewaySeconds)
        case "channels": .list(c.channels)
        case "threads": c.threads > 0 ? .number(c.threads) : nil
        case "echo": .bool(c.echo)
        case "max-connections": c.maxConnections > 0 ? .number(c.maxConnections) : nil
        case "max-message-bytes": .number(c.maxMessageBytes)
        case "max-queued-bytes": .number(c.maxQueuedBytes)
        case "max-subscriptions": .number(c.maxSubscriptions)
        case "max-connections-per-account": .number(c.maxConnectionsPerAccount)
        case "allowed-origins": c.allowedOrigins.entries.isEmpty ? nil : .list(c.allowedOrigins.entries)
        case "handshake-timeout": .number(c.handshakeTimeoutSeconds)
        case "ping-interval": .number(c.pingIntervalSeconds)
        case "pong-timeout": .number(c.pongTimeoutSeconds)
        case "token-warning": .number(c.tokenWarningSeconds)
        case "rate-limit": .number(c.rateLimitPerMinute)
        case "max-line-bytes": .number(c.maxLineBytes)
        case "max-event-bytes": .number(c.maxEventBytes)
        case "shutdown-timeout": .number(c.shutdownTimeoutSeconds)
        case "drain-duration": c.drainDurationSeconds.map(FileValue.number) ?? .string("auto")
        case "history-size": .number(c.historySize)
        case "history-ttl": .number(c.historyTTLSeconds)
        case "history-memory": .number(c.historyMemoryBytes)
        case "recovery-max": .number(c.recoveryMax)
        case "idempotency-window": .number(c.idempotencyWindowSeconds)
        case "broker": .string(c.broker.map { $0.description } ?? "local")
        case "broker-fanout": .string(c.brokerFanout.rawValue)
        case "idempotency-max-keys": .number(c.idempotencyMaxKeys)
        case "log-format": c.logFormat.map { .string($0.rawValue) }
        case "log-level": .string(c.logLevel.name)
        case "log-accounts": .string(c.logAccounts.rawValue)
        default: nil
        }
    }

    private static func write(_ value: FileValue?, into w: inout JSONWriter) {
        switch value {
        case .none: w.null()
        case .string(let s): w.string(s)
        case .number(let n): w.int(n)
        case .bool(let b): w.bool(b)
        case .list(let items):
            w.beginArray()
            for item in items { w.string(item) }
            w.endArray()
        }
    }

    /// `hub check-config`: the effective configuration, one key per line; `null` where the hub derives the value
    /// (threads, max-connections) or the option is unset. Secrets are never printed.
    public static func effectiveText(_ c: HubConfiguration) -> String {
        var lines: [String] = []
        var w = JSONWriter()
        if let file = c.configFile {
            w.string(file)
            lines.append("  \"//config\": " + String(decoding: w.takeBytes(), as: UTF8.self))
        }
        if c.jwtSecret != nil { lines.append("  \"//jwt-secret\": \"set by HUB_JWT_SECRET (not shown)\"") }
        for option in options {
            w.reset()
            write(fileValue(option.name, c), into: &w)
            lines.append("  \"\(option.name)\": " + String(decoding: w.takeBytes(), as: UTF8.self))
        }
        return "{\n" + lines.joined(separator: ",\n") + "\n}"
    }

    /// `hub default-config`: every option at its default, each after a `//NAME` comment key saying what it does.
    /// Options without a fixed default (derived, or off) appear as their comment only. Valid JSON: use it as is.
    public static func defaultConfigText(socketPath: String? = nil, stateDirectory: String? = nil) -> String {
        var defaults = HubConfiguration()
        if let socketPath { defaults.socketPath = socketPath }
        if let stateDirectory { defaults.stateDirectory = stateDirectory }
        var lines = ["  \"//\": \"hub configuration. Keys are the options of hub --help without --; keys starting with // are comments. "
            + "Durations are seconds or text like 30s, 5m; sizes are bytes or text like 64m. Flags and HUB_... variables override this file. "
            + "Check it with: hub check-config FILE\""]
        var w = JSONWriter()
        for option in options {
            w.reset()
            w.string("\(option.help) (default: \(option.defaultText(defaults)))")
            lines.append("  \"//\(option.name)\": " + String(decoding: w.takeBytes(), as: UTF8.self))
            guard let value = fileValue(option.name, defaults), option.name != "log-format" else { continue }
            if case .list(let items) = value, items.isEmpty { continue }
            w.reset()
            write(value, into: &w)
            lines.append("  \"\(option.name)\": " + String(decoding: w.takeBytes(), as: UTF8.self))
        }
        return "{\n" + lines.joined(separator: ",\n") + "\n}"
    }
}
