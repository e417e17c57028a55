import Foundation
import HubCluster
import HubEngine
import HubSupport

/// Everything `hub` can be told, from flags or `HUB_…` environment variables (a flag wins over its variable).
/// Every field has a default that works on a fresh machine with no configuration at all.
public struct HubConfiguration: Sendable, Equatable {
    public var listen = "127.0.0.1:8080"
    /// TLS: the certificate chain (PEM, leaf first) and its key. With both and no `tlsListen`, `listen` speaks TLS.
    public var tlsCertificateFile: String? = nil
    public var tlsKeyFile: String? = nil
    /// A second listener that speaks TLS, next to the plain one on `listen`.
    public var tlsListen: String? = nil
    /// Who runs a TLS 1.3 connection's records after its handshake: the hub's layer, or OpenSSL's.
    public var tlsRecords = TLSContext.Records.hub
    public var socketPath = "./hub.sock"
    public var stateDirectory = "./.hub-state"
    public var jwtSecretFile: String? = nil
    /// The secret itself, only from `HUB_JWT_SECRET` (never a flag: flags show up in `ps`).
    public var jwtSecret: String? = nil
    public var jwtPublicKeyFile: String? = nil
    public var jwtIssuer: String? = nil
    public var jwtAudience: String? = nil
    public var jwtLeewaySeconds = 30
    public var channels = ["profile_updates", "wallet_updates"]
    public var threads = 0  // 0: one per core
    public var echo = false
    public var maxConnections = 0  // 0: derived from RLIMIT_NOFILE
    public var maxMessageBytes = 64 * 1024
    public var maxEchoMessageBytes = 16 * 1024 * 1024
    public var maxQueuedBytes = 1024 * 1024
    public var maxSubscriptions = 64
    public var maxConnectionsPerAccount = 64
    public var allowedOrigins = OriginPolicy()
    public var handshakeTimeoutSeconds = 10
    public var pingIntervalSeconds = 25
    public var pongTimeoutSeconds = 10
    public var tokenWarningSeconds = 60
    public var rateLimitPerMinute = 100
    public var maxLineBytes = 1024 * 1024
    public var maxEventBytes = 256 * 1024
    public var shutdownTimeoutSeconds = 5
    /// How long SIGTERM spreads the clients' 1001 closes over; nil: at `HubServer.drainConnectionsPerSecond`.
    public var drainDurationSeconds: Int? = nil
    public var historySize = 100
    public var historyTTLSeconds = 600
    public var historyMemoryBytes = 64 << 20
    public var recoveryMax = 100
    public var idempotencyWindowSeconds = 300
    public var idempotencyMaxKeys = 100_000
    /// Cluster mode: the Redis every node shares (`redis://[user:password@]host:port[/db]` or `unix:///path`).
    /// nil: the embedded single-process broker.
    public var broker: RedisEndpoint? = nil
    /// Cluster mode: how events travel through Redis pub/sub (docs/OPERATIONS.md, "Cluster").
    public var brokerFanout = RedisStreams.FanoutLayout.streams
    /// nil: `LogFormat.automatic()` (JSON unless stderr is a terminal).
    public var logFormat: LogFormat? = nil
    public var logLevel = LogLevel.info
    public var logAccounts = AccountLogging.omit
    /// The configuration file the values came from (`--config`, `HUB_CONFIG`), re-read on SIGHUP.
    public var configFile: String? = nil

    public init() {}

    /// One option: its flag, environment variable, help text and how it sets the configuration.
    struct Option: Sendable {
        enum Kind: Sendable { case value(placeholder: String), flag }
        let name: String
        let kind: Kind
        let help: String
        let defaultText: @Sendable (HubConfiguration) -> String
        let apply: @Sendable (inout HubConfiguration, String) throws(ConfigurationError) -> Void
        var environmentName: String { "HUB_" + name.uppercased().replacingOccurrences(of: "-", with: "_") }
    }

    public struct ConfigurationError: Error, Equatable, CustomStringConvertible {
        public let message: String
        public var description: String { message }
    }

    static let options: [Option] = [
        .init(name: "listen", kind: .value(placeholder: "HOST:PORT"), help: "where clients connect (port 0 picks a free port)",
              defaultText: { $0.listen }, apply: { c, v throws(ConfigurationError) in c.listen = try parseListen(v) }),
        .init(name: "tls-cert", kind: .value(placeholder: "FILE"), help: "serve wss:// with this PEM certificate chain (leaf first); SIGHUP reloads it",
              defaultText: { _ in "none (plain ws://)" }, apply: { c, v throws(ConfigurationError) in c.tlsCertificateFile = try nonEmpty(v, "tls-cert") }),
        .init(name: "tls-key", kind: .value(placeholder: "FILE"), help: "the PEM private key of --tls-cert",
              defaultText: { _ in "none" }, apply: { c, v throws(ConfigurationError) in c.tlsKeyFile = try nonEmpty(v, "tls-key") }),
        .init(name: "tls-listen", kind: .value(placeholder: "HOST:PORT"), help: "a TLS listener next to the plain --listen (without it, --tls-cert makes --listen itself speak TLS)",
              defaultText: { _ in "none" }, apply: { c, v throws(ConfigurationError) in c.tlsListen = try parseListen(v) }),
        .init(name: "tls-records", kind: .value(placeholder: "LAYER"), help: "after a TLS 1.3 handshake: \"hub\" (the hub's own record layer, ~0.3 KiB per idle connection) or \"openssl\" (OpenSSL's throughout: ~15 KiB more per connection, nothing of ours on the wire)",
              defaultText: { $0.tlsRecords.rawValue }, apply: { c, v throws(ConfigurationError) in
                  guard let records = TLSContext.Records(rawValue: v) else {
                      throw ConfigurationError(message: "tls-records must be hub or openssl, got \"\(v)\"")
                  }
                  c.tlsRecords = records
              }),
        .init(name: "socket", kind: .value(placeholder: "PATH"), help: "Unix socket for publishing and hubctl (mode 0660)",
              defaultText: { $0.socketPath }, apply: { c, v throws(ConfigurationError) in c.socketPath = try nonEmpty(v, "socket") }),
        .init(name: "state-dir", kind: .value(placeholder: "DIR"), help: "where the hub keeps its generated JWT secret, and its recovery state across a graceful restart",
              defaultText: { $0.stateDirectory }, apply: { c, v throws(ConfigurationError) in c.stateDirectory = try nonEmpty(v, "state-dir") }),
        .init(name: "jwt-secret-file", kind: .value(placeholder: "FILE"), help: "HS256 secret (file text, surrounding whitespace ignored); HUB_JWT_SECRET gives the secret itself",
              defaultText: { _ in "generated in the state dir" }, apply: { c, v throws(ConfigurationError) in c.jwtSecretFile = try nonEmpty(v, "jwt-secret-file") }),
        .init(name: "jwt-public-key", kind: .value(placeholder: "PEM"), help: "verify RS256/ES256 tokens with this public key file instead of a secret",
              defaultText: { _ in "none" }, apply: { c, v throws(ConfigurationError) in c.jwtPublicKeyFile = try nonEmpty(v, "jwt-public-key") }),
        .init(name: "jwt-issuer", kind: .value(placeholder: "ISS"), help: "require this iss claim",
              defaultText: { _ in "not checked" }, apply: { c, v throws(ConfigurationError) in c.jwtIssuer = try nonEmpty(v, "jwt-issuer") }),
        .init(name: "jwt-audience", kind: .value(placeholder: "AUD"), help: "require this aud claim",
              defaultText: { _ in "not checked" }, apply: { c, v throws(ConfigurationError) in c.jwtAudience = try nonEmpty(v, "jwt-audience") }),
        .init(name: "jwt-leeway", kind: .value(placeholder: "DURATION"), help: "clock skew allowed on exp and nbf",
              defaultText: { "\($0.jwtLeewaySeconds)s" }, apply: { c, v throws(ConfigurationError) in c.jwtLeewaySeconds = try parseDuration(v, "jwt-leeway", allowZero: true) }),
        .init(name: "channels", kind: .value(placeholder: "LIST"), help: "comma-separated channel names clients may subscribe to",
              defaultText: { $0.channels.joined(separator: ",") }, apply: { c, v throws(ConfigurationError) in c.channels = try parseChannels(v) }),
        .init(name: "threads", kind: .value(placeholder: "N"), help: "event-loop threads",
              defaultText: { _ in "one per core" }, apply: { c, v throws(ConfigurationError) in c.threads = try parseInt(v, "threads", 1...1024) }),
        .init(name: "echo", kind: .flag, help: "also serve /echo without auth (diagnostics, conformance suites)",
              defaultText: { _ in "off" }, apply: { c, v throws(ConfigurationError) in c.echo = try parseBool(v, "echo") }),
        .init(name: "max-connections", kind: .value(placeholder: "N"), help: "client connections beyond this get HTTP 503",
              defaultText: { _ in "open-file limit minus a reserve" }, apply: { c, v throws(ConfigurationError) in c.maxConnections = try parseInt(v, "max-connections", 1...10_000_000) }),
        .init(name: "max-message-bytes", kind: .value(placeholder: "BYTES"), help: "largest client message on /ws (larger: close 1009)",
              defaultText: { "\($0.maxMessageBytes)" }, apply: { c, v throws(ConfigurationError) in c.maxMessageBytes = try parseInt(v, "max-message-bytes", 125...(64 << 20)) }),
        .init(name: "max-queued-bytes", kind: .value(placeholder: "BYTES"), help: "outbound bytes a connection may have queued (more: close 4008)",
              defaultText: { "\($0.maxQueuedBytes)" }, apply: { c, v throws(ConfigurationError) in c.maxQueuedBytes = try parseInt(v, "max-queued-bytes", 4096...(1 << 30)) }),
        .init(name: "max-subscriptions", kind: .value(placeholder: "N"), help: "channels one connection may subscribe to",
              defaultText: { "\($0.maxSubscriptions)" }, apply: { c, v throws(ConfigurationError) in c.maxSubscriptions = try parseInt(v, "max-subscriptions", 1...100_000) }),
        .init(name: "max-connections-per-account", kind: .value(placeholder: "N"), help: "open connections one account may hold (more: HTTP 429)",
              defaultText: { "\($0.maxConnectionsPerAccount)" }, apply: { c, v throws(ConfigurationError) in c.maxConnectionsPerAccount = try parseInt(v, "max-connections-per-account", 1...10_000_000) }),
        .init(name: "allowed-origins", kind: .value(placeholder: "LIST"), help: "browser origins allowed to connect, e.g. https://app.example.com,https://*.example.com (others: HTTP 403)",
              defaultText: { _ in "any (no Origin check)" }, apply: { c, v throws(ConfigurationError) in c.allowedOrigins = try OriginPolicy(list: v) }),
        .init(name: "handshake-timeout", kind: .value(placeholder: "DURATION"), help: "time to send the request head (slowloris guard: HTTP 408)",
              defaultText: { "\($0.handshakeTimeoutSeconds)s" }, apply: { c, v throws(ConfigurationError) in c.handshakeTimeoutSeconds = try parseDuration(v, "handshake-timeout") }),
        .init(name: "ping-interval", kind: .value(placeholder: "DURATION"), help: "WebSocket ping interval",
              defaultText: { "\($0.pingIntervalSeconds)s" }, apply: { c, v throws(ConfigurationError) in c.pingIntervalSeconds = try parseDuration(v, "ping-interval") }),
        .init(name: "pong-timeout", kind: .value(placeholder: "DURATION"), help: "close (4002) when no pong arrives within this",
              defaultText: { "\($0.pongTimeoutSeconds)s" }, apply: { c, v throws(ConfigurationError) in c.pongTimeoutSeconds = try parseDuration(v, "pong-timeout") }),
        .init(name: "token-warning", kind: .value(placeholder: "DURATION"), help: "send token_expiring this long before the token expires",
              defaultText: { "\($0.tokenWarningSeconds)s" }, apply: { c, v throws(ConfigurationError) in c.tokenWarningSeconds = try parseDuration(v, "token-warning", allowZero: true) }),
        .init(name: "rate-limit", kind: .value(placeholder: "N"), help: "client messages per minute per connection",
              defaultText: { "\($0.rateLimitPerMinute)" }, apply: { c, v throws(ConfigurationError) in c.rateLimitPerMinute = try parseInt(v, "rate-limit", 1...1_000_000) }),
        .init(name: "max-line-bytes", kind: .value(placeholder: "BYTES"), help: "longest request line on the Unix socket",
              defaultText: { "\($0.maxLineBytes)" }, apply: { c, v throws(ConfigurationError) in c.maxLineBytes = try parseInt(v, "max-line-bytes", 1024...(64 << 20)) }),
        .init(name: "max-event-bytes", kind: .value(placeholder: "BYTES"), help: "largest event frame a publish may produce",
              defaultText: { "\($0.maxEventBytes)" }, apply: { c, v throws(ConfigurationError) in c.maxEventBytes = try parseInt(v, "max-event-bytes", 256...(16 << 20)) }),
        .init(name: "shutdown-timeout", kind: .value(placeholder: "DURATION"), help: "how long SIGTERM waits for close handshakes after the drain",
              defaultText: { "\($0.shutdownTimeoutSeconds)s" }, apply: { c, v throws(ConfigurationError) in c.shutdownTimeoutSeconds = try parseDuration(v, "shutdown-timeout", allowZero: true) }),
        .init(name: "drain-duration", kind: .value(placeholder: "DURATION"), help: "SIGTERM closes clients with 1001 spread over this (0: all at once; auto: 10000 per 2 s), then waits --shutdown-timeout",
              defaultText: { _ in "auto" }, apply: { c, v throws(ConfigurationError) in
                  c.drainDurationSeconds = v == "auto" ? nil : try parseDuration(v, "drain-duration", allowZero: true)
              }),
        .init(name: "history-size", kind: .value(placeholder: "N"), help: "events kept per stream for clients that resume (0: none)",
              defaultText: { "\($0.historySize)" }, apply: { c, v throws(ConfigurationError) in c.historySize = try parseInt(v, "history-size", 0...1_000_000) }),
        .init(name: "history-ttl", kind: .value(placeholder: "DURATION"), help: "how long events are kept; a stream silent this long is forgotten",
              defaultText: { "\($0.historyTTLSeconds / 60)m" }, apply: { c, v throws(ConfigurationError) in c.historyTTLSeconds = try parseDuration(v, "history-ttl") }),
        .init(name: "history-memory", kind: .value(placeholder: "BYTES"), help: "size of the history ring shared by all streams (each event: its frame + 32 bytes), oldest overwritten first; accepts 512k, 64m, 1g",
              defaultText: { "\($0.historyMemoryBytes >> 20)m" }, apply: { c, v throws(ConfigurationError) in c.historyMemoryBytes = try parseByteSize(v, "history-memory", 0...(1 << 40)) }),
        .init(name: "recovery-max", kind: .value(placeholder: "N"), help: "most events replayed per stream when a client resumes (more: recovered false, too_many)",
              defaultText: { "\($0.recoveryMax)" }, apply: { c, v throws(ConfigurationError) in c.recoveryMax = try parseInt(v, "recovery-max", 0...1_000_000) }),
        .init(name: "idempotency-window", kind: .value(placeholder: "DURATION"), help: "how long a publish's idempotencyKey is remembered (0: off)",
              defaultText: { "\($0.idempotencyWindowSeconds / 60)m" }, apply: { c, v throws(ConfigurationError) in c.idempotencyWindowSeconds = try parseDuration(v, "idempotency-window", allowZero: true) }),
        .init(name: "broker", kind: .value(placeholder: "URL"), help: "cluster mode: share numbering, history and fan-out with other hubs through Redis (redis://[:PASSWORD@]HOST:PORT[/DB], unix:///PATH, or a Redis Cluster: redis-cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT...]; \"local\": the embedded broker)",
              defaultText: { _ in "local (one process, no Redis)" }, apply: { c, v throws(ConfigurationError) in c.broker = try parseBroker(v) }),
        .init(name: "broker-fanout", kind: .value(placeholder: "LAYOUT"), help: "cluster mode: \"streams\" (a Redis channel per stream: a node receives only the streams it serves) or \"shards\" (16 channels: every node receives every event)",
              defaultText: { $0.brokerFanout.rawValue }, apply: { c, v throws(ConfigurationError) in
                  guard let layout = RedisStreams.FanoutLayout(rawValue: v) else {
                      throw ConfigurationError(message: "broker-fanout must be streams or shards, got \"\(v)\"")
                  }
                  c.brokerFanout = layout
              }),
        .init(name: "idempotency-max-keys", kind: .value(placeholder: "N"), help: "idempotency keys remembered at most (oldest forgotten first)",
              defaultText: { "\($0.idempotencyMaxKeys)" }, apply: { c, v throws(ConfigurationError) in c.idempotencyMaxKeys = try parseInt(v, "idempotency-max-keys", 0...10_000_000) }),
        .init(name: "log-format", kind: .value(placeholder: "FORMAT"), help: "text (a line for a person) or json (one object per line: ts, level, msg and fields)",
              defaultText: { _ in "json when stderr is not a terminal, else text" }, apply: { c, v throws(ConfigurationError) in
                  guard let format = LogFormat(rawValue: v) else { throw ConfigurationError(message: "expected text or json, got '\(v)'") }
                  c.logFormat = format
              }),
        .init(name: "log-level", kind: .value(placeholder: "LEVEL"), help: "debug, info, warn or error: lines below it are not written (debug adds a line per refused token and closed connection)",
              defaultText: { $0.logLevel.name }, apply: { c, v throws(ConfigurationError) in
                  guard let level = LogLevel(name: v) else { throw ConfigurationError(message: "expected debug, info, warn or error, got '\(v)'") }
                  c.logLevel = level
              }),
        .init(name: "log-accounts", kind: .value(placeholder: "MODE"), help: "account ids in log lines: omit, hash (first 16 hex digits of their SHA-256) or plain",
              defaultText: { $0.logAccounts.rawValue }, apply: { c, v throws(ConfigurationError) in
                  guard let mode = AccountLogging(rawValue: v) else { throw ConfigurationError(message: "expected omit, hash or plain, got '\(v)'") }
                  c.logAccounts = mode
              }),
    ]

    public enum ParseOutcome: Equatable, Sendable {
        case run(HubConfiguration)
        case help(String)
        case version
        /// `hub check-config [FILE] [options]`: the configuration is valid; print it.
        case checkConfig(HubConfiguration)
        /// `hub default-config`: print this.
        case defaultConfig(String)
    }

    /// Reads the config file (`--config`, else `HUB_CONFIG`), then `HUB_…` variables, then the flags (`--name value`,
    /// `--name=value`, and `--echo` style booleans): a flag wins over its variable, a variable over the file.
    /// `check-config [FILE]` and `default-config` as the first argument are the subcommands.
    public static func parse(arguments: [String], environment: [String: String]) throws(ConfigurationError) -> ParseOutcome {
        var arguments = arguments
        var checking = false
        var file: String? = nil
        switch arguments.first {
        case "default-config":
            guard arguments.count == 1 else { throw ConfigurationError(message: "default-config takes no arguments") }
            return .defaultConfig(defaultConfigText())
        case "check-config":
            checking = true
            arguments.removeFirst()
            if let first = arguments.first, !first.hasPrefix("-") {
                file = first
                arguments.removeFirst()
            }
        default:
            break
        }
        var config = HubConfiguration()
        if !arguments.contains(where: { ["--help", "-h", "--version"].contains($0) }) {
            if file == nil { file = try configFlag(in: arguments) }
            if file == nil, let variable = environment["HUB_CONFIG"] {
                guard !variable.isEmpty else { throw ConfigurationError(message: "HUB_CONFIG is set but empty") }
                file = variable
            }
            if let file { try applyFile(at: file, to: &config) }
        }
        let outcome = try parse(arguments: arguments, environment: environment, over: config)
        if checking, case .run(let checked) = outcome { return .checkConfig(checked) }
        return outcome
    }

    /// The value of `--config FILE` / `--config=FILE`, if given.
    static func configFlag(in arguments: [String]) throws(ConfigurationError) -> String? {
        var found: String? = nil
        for (i, argument) in arguments.enumerated() {
            if argument == "--config" {
                guard i + 1 < arguments.count else { throw ConfigurationError(message: "--config needs a value") }
                found = arguments[i + 1]
            } else if argument.hasPrefix("--config=") {
                found = String(argument.dropFirst("--config=".count))
            }
        }
        if found == "" { throw ConfigurationError(message: "--config: config must not be empty") }
        return found
    }

    static func parse(arguments: [String], environment: [String: String], over file: HubConfiguration) throws(ConfigurationError) -> ParseOutcome {
        var config = file
        if let secret = environment["HUB_JWT_SECRET"] {
            let trimmed = secret.trimmingCharacters(in: .whitespacesAndNewlines)
            guard !trimmed.isEmpty else { throw ConfigurationError(message: "HUB_JWT_SECRET is set but empty") }
            config.jwtSecret = trimmed
        }
        for option in options {
            if let value = environment[option.environmentName] {
                do { try option.apply(&config, value) } catch {
                    throw ConfigurationError(message: "\(option.environmentName): \(error.message)")
                }
            }
        }
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if argument == "--help" || argument == "-h" { return .help(helpText()) }
            if argument == "--version" { return .version }
            guard argument.hasPrefix("--") else {
                throw ConfigurationError(message: "unexpected argument '\(argument)' (see hub --help)")
            }
            var name = String(argument.dropFirst(2))
            var inlineValue: String? = nil
            if let eq = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: eq)...])
                name = String(name[..<eq])
            }
            if name == "config" {
                if inlineValue == nil { index += 1 }  // read before everything else (configFlag)
                continue
            }
            guard let option = options.first(where: { $0.name == name }) else {
                throw ConfigurationError(message: "unknown option --\(name) (see hub --help)")
            }
            let value: String
            switch option.kind {
            case .flag:
                value = inlineValue ?? "true"
            case .value:
                if let inlineValue {
                    value = inlineValue
                } else {
                    guard index < arguments.count else { throw ConfigurationError(message: "--\(name) needs a value") }
                    value = arguments[index]
                    index += 1
                }
            }
            do { try option.apply(&config, value) } catch {
                throw ConfigurationError(message: "--\(name): \(error.message)")
            }
        }
        if (config.tlsCertificateFile == nil) != (config.tlsKeyFile == nil) {
            throw ConfigurationError(message: "--tls-cert and --tls-key go together: give both, or neither")
        }
        if config.tlsListen != nil && config.tlsCertificateFile == nil {
            throw ConfigurationError(message: "--tls-listen needs --tls-cert and --tls-key")
        }
        if config.jwtPublicKeyFile != nil && (config.jwtSecretFile != nil || config.jwtSecret != nil) {
            throw ConfigurationError(message: "--jwt-public-key and a JWT secret are mutually exclusive: the key decides the algorithm")
        }
        return .run(config)
    }

    public static func helpText() -> String {
        let defaults = HubConfiguration()
        var lines = [
            "hub \(HubVersion.string): realtime WebSocket event hub",
            "",
            "Usage: hub [options]",
            "       hub check-config [FILE] [options]   validate, print the effective configuration (secrets masked)",
            "       hub default-config                  print a commented configuration file to start from",
            "",
            "Clients connect to ws://HOST:PORT/ws with a bearer JWT; the backend publishes on the Unix socket.",
            "Every option can also be set with the environment variable shown, or in the config file under its name",
            "(a flag wins over its variable, a variable over the file).",
            "",
            "Options:",
            "  --config FILE                 a JSON configuration file, one key per option (docs/OPERATIONS.md)",
            "                                [HUB_CONFIG; default: none]",
        ]
        for option in options {
            let left: String
            switch option.kind {
            case .value(let placeholder): left = "--\(option.name) \(placeholder)"
            case .flag: left = "--\(option.name)"
            }
            let padded = left.padding(toLength: max(30, left.count + 1), withPad: " ", startingAt: 0)
            lines.append("  \(padded)\(option.help)")
            lines.append("  \(String(repeating: " ", count: max(30, left.count + 1)))[\(option.environmentName); default: \(option.defaultText(defaults))]")
        }
        lines.append("  --help                        show this help")
        lines.append("  --version                     print the version")
        lines.append("")
        lines.append("HUB_JWT_SECRET sets the HS256 secret itself. With no secret and no public key the hub creates")
        lines.append("a random secret in the state dir; `hubctl token ACCOUNT` mints tokens with it.")
        return lines.joined(separator: "\n")
    }

    // MARK: value parsers

    static func parseBroker(_ value: String) throws(ConfigurationError) -> RedisEndpoint? {
        if value == "local" { return nil }
        do {
            return try RedisEndpoint(parsing: value)
        } catch {
            throw ConfigurationError(message: "broker: \(error.message) (expected redis://HOST:PORT[/DB], redis-cluster://HOST:PORT[,HOST:PORT...], unix:///PATH or local)")
        }
    }

    static func nonEmpty(_ value: String, _ what: String) throws(ConfigurationError) -> String {
        guard !value.isEmpty else { throw ConfigurationError(message: "\(what) must not be empty") }
        return value
    }

    static func parseInt(_ value: String, _ what: String, _ range: ClosedRange<Int>) throws(ConfigurationError) -> Int {
        guard let n = Int(value), range.contains(n) else {
            throw ConfigurationError(message: "expected a whole number in \(range.lowerBound)...\(range.upperBound), got '\(value)'")
        }
        return n
    }

    /// "65536", "512k", "64m", "1g" (powers of 1024; also "64MiB", "64MB") → bytes.
    static func parseByteSize(_ value: String, _ what: String, _ range: ClosedRange<Int>) throws(ConfigurationError) -> Int {
        let lower = value.lowercased()
        let digits = lower.prefix { $0.isASCII && $0.isNumber }
        let unit: Int
        switch lower.dropFirst(digits.count) {
        case "", "b": unit = 1
        case "k", "kb", "kib": unit = 1 << 10
        case "m", "mb", "mib": unit = 1 << 20
        case "g", "gb", "gib": unit = 1 << 30
        default: throw ConfigurationError(message: "expected a size like 65536, 512k, 64m or 1g, got '\(value)'")
        }
        guard let n = Int(digits), n <= range.upperBound / unit, range.contains(n * unit) else {
            throw ConfigurationError(message: "expected a size in \(range.lowerBound)...\(range.upperBound) bytes, got '\(value)'")
        }
        return n * unit
    }

    static func parseBool(_ value: String, _ what: String) throws(ConfigurationError) -> Bool {
        switch value.lowercased() {
        case "1", "true", "yes", "on": return true
        case "0", "false", "no", "off", "": return false
        default: throw ConfigurationError(message: "expected true or false, got '\(value)'")
        }
    }

    /// "25", "25s", "2m", "1h" → seconds.
    static func parseDuration(_ value: String, _ what: String, allowZero: Bool = false) throws(ConfigurationError) -> Int {
        var digits = value
        var unit = 1
        if let last = value.last, !last.isNumber {
            digits = String(value.dropLast())
            switch last {
            case "s": unit = 1
            case "m": unit = 60
            case "h": unit = 3600
            default: throw ConfigurationError(message: "expected a duration like 30s, 5m or 1h, got '\(value)'")
            }
        }
        guard let n = Int(digits), n >= (allowZero ? 0 : 1), n <= 7 * 24 * 3600 / unit else {
            throw ConfigurationError(message: "expected a duration like 30s, 5m or 1h, got '\(value)'")
        }
        return n * unit
    }

    static func parseChannels(_ value: String) throws(ConfigurationError) -> [String] {
        var names: [String] = []
        for part in value.split(separator: ",", omittingEmptySubsequences: false) {
            let name = part.trimmingCharacters(in: .whitespaces)
            guard isValidChannelName(name) else {
                throw ConfigurationError(message: "invalid channel name '\(name)': use 1-128 characters from A-Z a-z 0-9 _ - . :")
            }
            guard !names.contains(name) else {
                throw ConfigurationError(message: "channel '\(name)' is listed twice: each name once")
            }
            names.append(name)
        }
        guard !names.isEmpty else { throw ConfigurationError(message: "at least one channel is needed") }
        return names
    }

    static func isValidChannelName(_ name: String) -> Bool {
        guard (1...128).contains(name.utf8.count) else { return false }
        return name.utf8.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x5F || b == 0x2D || b == 0x2E || b == 0x3A
        }
    }

    static func parseListen(_ value: String) throws(ConfigurationError) -> String {
        guard let colon = value.lastIndex(of: ":"), let port = Int(value[value.index(after: colon)...]), (0...65535).contains(port),
              colon != value.startIndex else {
            throw ConfigurationError(message: "expected HOST:PORT (e.g. 127.0.0.1:8080, [::1]:8080, 0.0.0.0:8080), got '\(value)'")
        }
        return value
    }
}
