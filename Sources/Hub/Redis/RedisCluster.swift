import HubEngine

/// Redis Cluster's key slots: CRC16 (XMODEM: polynomial 0x1021, initial 0) of the key, or of its hash tag (the
/// bytes between the first `{` and the first `}` after it, when not empty), modulo 16384.
public enum RedisSlot {
    public static let count = 16_384

    public static func of(_ key: String) -> Int {
        var key = key
        return key.withUTF8 { bytes in
            var tagged = bytes[...]
            if let open = bytes.firstIndex(of: UInt8(ascii: "{")),
               let close = bytes[(open + 1)...].firstIndex(of: UInt8(ascii: "}")), close > open + 1 {
                tagged = bytes[(open + 1)..<close]
            }
            return Int(crc16(tagged) & 0x3FFF)
        }
    }

    static func crc16<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> UInt16 {
        var crc: UInt16 = 0
        for b in bytes {
            crc = (crc << 8) ^ table[Int(UInt8(truncatingIfNeeded: crc >> 8) ^ b)]
        }
        return crc
    }

    /// CRC16/XMODEM of each byte value (polynomial 0x1021), for a table-driven CRC.
    private static let table: [UInt16] = (0..<256).map { (n: Int) -> UInt16 in
        var crc = UInt16(n) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        return crc
    }

    /// The slot a command's routing key falls in, for the commands the hub sends; nil for a command with no key
    /// (PING, PUBLISH: any node serves it).
    static func of(command arguments: [String]) -> Int? {
        guard let name = arguments.first else { return nil }
        switch name {  // the hub's own commands, always spelled in capitals
        case "EVAL", "EVALSHA":
            // EVALSHA sha numkeys key...: the first key decides (the hub's scripts keep all keys in one slot).
            guard arguments.count > 3, let n = Int(arguments[2]), n > 0 else { return nil }
            return of(arguments[3])
        case "PING", "PUBLISH", "CLUSTER", "HELLO", "ASKING", "INFO", "TIME":
            return nil
        default:
            return arguments.count > 1 ? of(arguments[1]) : nil
        }
    }
}

/// A Redis Cluster behind the `RedisLink` calls: one `RedisConnection` per master, commands routed by their key's
/// slot, the slot map read with `CLUSTER SLOTS` from a seed node and read again when Redis redirects (`MOVED`), when
/// a master's connection goes down (a failover may have promoted a replica) and when a shard channel is taken from
/// a subscriber (a slot moved). `ASK` (a slot being migrated) is followed for the one command, and `TRYAGAIN` (its
/// keys split between the two masters) is waited out.
///
/// SUBSCRIBE-family commands are split by slot and sent to each channel's master: the hub uses sharded pub/sub
/// (`SSUBSCRIBE`, `SPUBLISH` inside its scripts) in a cluster, so an event travels only to the master of its stream's
/// slot and the nodes subscribed there, never over the cluster bus to every node.
///
/// The link is ready while the slot map is known and every master's connection is up (the hub reports itself
/// degraded otherwise). Commands are routed per slot: those of a slot whose master is not connected fail at once
/// with `unavailable` (the hub answers `BROKER_UNAVAILABLE`), the others go on. A subscriber link that lost a master, or whose masters changed, goes down and comes back up
/// (`onDown`, then `onReady`), so the broker subscribes again and fills what it missed from the stream history.
public final class RedisClusterClient: RedisLink {
    public private(set) var state: RedisConnection.State = .waiting
    public private(set) var lastError: RedisError? = nil
    public var onReady: () -> Void = {}
    public var onPush: (RESPValue) -> Void = { _ in }
    public var onDown: (RedisError) -> Void = { _ in }

    public let endpoint: RedisEndpoint
    /// The slot map is known and some master is connected: commands are routed, each failing or not by its slot.
    public var canSend: Bool { mapped && state != .closed && masters.values.contains { $0.state == .ready } }
    private let loop: EventLoop
    private let backoff: RedisBackoff
    /// A subscriber link: keyless commands (the stall check's PING) go to every master, and a topology change or a
    /// lost master takes the whole link down and up again.
    private let subscriberRole: Bool
    private let maxRedirects = 5
    /// `TRYAGAIN` answers waited out per command (20 ms apart, at the loop's timer precision): a migration moves a
    /// slot's keys in batches of a few hundred, so this covers seconds.
    private let maxTryAgain = 50

    /// Connections to the masters, by "host:port".
    private var masters: [String: RedisConnection] = [:]
    /// The master of each slot ("host:port"; nil while the map is unknown or the slot is not served).
    private var slotOwner: [String?] = Array(repeating: nil, count: RedisSlot.count)
    private var mapped = false
    /// A connection to a seed node, only to read the slot map while no master connection is up.
    private var probe: RedisConnection? = nil
    private var nextSeed = 0
    private var refreshing = false
    private var refreshAgain = false
    private var refreshTimer = TimerHandle.none
    private var refreshAttempt = 0
    private var random = SystemRandomNumberGenerator()
    /// Shard channels subscribed (subscriber role): a `sunsubscribe` push for one of them that the hub did not ask
    /// for means its slot moved.
    private var wanted: Set<String> = []

    public init(endpoint: RedisEndpoint, loop: EventLoop, subscriber: Bool, backoff: RedisBackoff = RedisBackoff()) {
        self.endpoint = endpoint
        self.loop = loop
        self.backoff = backoff
        subscriberRole = subscriber
    }

    /// The masters known, as "host:port" (for tests and logs).
    public var masterAddresses: [String] { masters.keys.sorted() }

    public func start() {
        loop.assertInLoop()
        guard state == .waiting, !mapped, probe == nil else { return }
        state = .connecting
        refresh()
    }

    public func close() {
        loop.assertInLoop()
        guard state != .closed else { return }
        state = .closed
        _ = loop.cancel(refreshTimer)
        probe?.close()
        probe = nil
        for c in masters.values { c.close() }
        masters = [:]
    }

    // MARK: Commands

    public func send(_ arguments: [String], reply: @escaping RedisConnection.Reply) {
        loop.assertInLoop()
        guard let slot = RedisSlot.of(command: arguments) else {
            if subscriberRole, arguments.first?.uppercased() == "PING" { return pingAll(reply) }
            guard mapped, state != .closed, let c = masters.values.first(where: { $0.state == .ready }) else {
                return reply(.failure(unavailable()))
            }
            return c.send(arguments, reply: reply)
        }
        route(arguments, slot: slot, redirects: 0, reply: reply)
    }

    private func route(_ arguments: [String], slot: Int, redirects: Int, tries: Int = 0, reply: @escaping RedisConnection.Reply) {
        // Per slot: with one master down, the slots of the others are still served.
        guard mapped, state != .closed, let owner = slotOwner[slot], let c = masters[owner], c.state == .ready else {
            return reply(.failure(unavailable(slot: slot)))
        }
        c.send(arguments) { [weak self] result in
            guard let self, case .failure(let error) = result, error.kind == .server else { return reply(result) }
            if self.tryAgainLater(error, arguments, slot: slot, tries: tries, reply: reply) { return }
            guard let redirect = Redirect(error.message), redirects < self.maxRedirects else { return reply(result) }
            self.follow(redirect, arguments, redirects: redirects + 1, tries: tries, reply: reply)
        }
    }

    /// `TRYAGAIN`: a command on several keys of a slot being migrated, some moved and some not. Redis ran nothing;
    /// the command is sent again shortly (from the start: the slot may have moved meanwhile), a bounded number of
    /// times, and only then answered with the error.
    private func tryAgainLater(_ error: RedisError, _ arguments: [String], slot: Int, tries: Int,
                               reply: @escaping RedisConnection.Reply) -> Bool {
        guard error.message.hasPrefix("TRYAGAIN"), tries < maxTryAgain else { return false }
        _ = loop.schedule(after: .milliseconds(20)) { [weak self] in
            guard let self else { return reply(.failure(error)) }
            self.route(arguments, slot: slot, redirects: 0, tries: tries + 1, reply: reply)
        }
        return true
    }

    /// `MOVED SLOT HOST:PORT` (the slot lives there now: remember it, read the whole map again, resend) or
    /// `ASK SLOT HOST:PORT` (the slot is being migrated and this key already moved: `ASKING`, then the command, there).
    private func follow(_ redirect: Redirect, _ arguments: [String], redirects: Int, tries: Int,
                        reply: @escaping RedisConnection.Reply) {
        guard redirect.slot >= 0, redirect.slot < RedisSlot.count else {
            return reply(.failure(RedisError(.protocolError, "redirect to slot \(redirect.slot)")))
        }
        let target = connection(to: redirect.address)
        if redirect.moved {
            slotOwner[redirect.slot] = redirect.address
            scheduleRefresh(after: .zero)
            if target.state == .ready { return route(arguments, slot: redirect.slot, redirects: redirects, tries: tries, reply: reply) }
            // A master not seen before: the refresh connects it; until then this command cannot be sent.
            return reply(.failure(unavailable()))
        }
        guard target.state == .ready else { return reply(.failure(unavailable())) }
        target.send(["ASKING"]) { _ in }
        target.send(arguments) { [weak self] result in
            guard let self, case .failure(let error) = result, error.kind == .server else { return reply(result) }
            if self.tryAgainLater(error, arguments, slot: redirect.slot, tries: tries, reply: reply) { return }
            guard let again = Redirect(error.message), redirects < self.maxRedirects else { return reply(result) }
            self.follow(again, arguments, redirects: redirects + 1, tries: tries, reply: reply)
        }
    }

    struct Redirect: Equatable {
        let moved: Bool
        let slot: Int
        let address: String

        /// Parses `MOVED 3999 127.0.0.1:6381` or `ASK 3999 127.0.0.1:6381` (Redis's error text, prefix included).
        init?(_ message: String) {
            let parts = message.split(separator: " ")
            guard parts.count == 3, parts[0] == "MOVED" || parts[0] == "ASK", let slot = Int(parts[1]),
                  let colon = parts[2].lastIndex(of: ":"), UInt16(parts[2][parts[2].index(after: colon)...]) != nil else { return nil }
            moved = parts[0] == "MOVED"
            self.slot = slot
            var host = String(parts[2][..<colon])
            if host.contains(":"), !host.hasPrefix("[") { host = "[\(host)]" }
            address = host + parts[2][colon...]
        }
    }

    /// The stall check's PING on a subscriber link: to every master (each connection must show it is alive).
    private func pingAll(_ reply: @escaping RedisConnection.Reply) {
        let ready = masters.values.filter { $0.state == .ready }
        guard mapped, state != .closed, !ready.isEmpty else { return reply(.failure(unavailable())) }
        var remaining = ready.count
        var first: RedisError? = nil
        for c in ready {
            c.send(["PING"]) { result in
                if case .failure(let error) = result, first == nil { first = error }
                remaining -= 1
                if remaining == 0 { reply(first.map { .failure($0) } ?? .success(.simple("PONG"))) }
            }
        }
    }

    public func subscribe(_ arguments: [String], done: @escaping (RedisError?) -> Void) {
        loop.assertInLoop()
        guard let command = arguments.first, arguments.count > 1 else {
            return done(RedisError(.protocolError, "\(arguments.first ?? "SUBSCRIBE") needs explicit channels here"))
        }
        guard mapped, state != .closed else { return done(unavailable()) }
        let upper = command.uppercased()
        let subscribing = !upper.contains("UNSUBSCRIBE")
        // SSUBSCRIBE takes channels of one slot per command: one command per slot, on the slot's master.
        var bySlot: [Int: [String]] = [:]
        for channel in arguments.dropFirst() {
            bySlot[RedisSlot.of(channel), default: []].append(channel)
            if subscribing { wanted.insert(channel) } else { wanted.remove(channel) }
        }
        var plan: [(RedisConnection, [String])] = []
        for (slot, channels) in bySlot {
            guard let owner = slotOwner[slot], let c = masters[owner], c.state == .ready else {
                if subscribing { return done(unavailable(slot: slot)) }
                continue  // nothing to leave on a master that is gone
            }
            plan.append((c, channels))
        }
        guard !plan.isEmpty else { return done(nil) }
        var remaining = plan.count
        var failed = false
        for (c, channels) in plan {
            c.subscribe([command] + channels) { [weak self] error in
                guard !failed else { return }
                if let error {
                    // MOVED: the slot is elsewhere now; the new map takes a subscriber link down and up.
                    if error.kind == .server, Redirect(error.message) != nil { self?.scheduleRefresh(after: .zero) }
                    failed = true
                    return done(error)
                }
                remaining -= 1
                if remaining == 0 { done(nil) }
            }
        }
    }

    @discardableResult
    public func closeIfStalled(after timeout: Duration) -> Bool {
        var closed = false
        for c in masters.values where c.closeIfStalled(after: timeout) { closed = true }
        return closed
    }

    private func unavailable(slot: Int? = nil) -> RedisError {
        guard mapped else {
            return RedisError(.unavailable, "the Redis Cluster's slot map is not known yet" + (lastError.map { " (\($0.message))" } ?? ""))
        }
        if let slot {
            guard let owner = slotOwner[slot] else { return RedisError(.unavailable, "no master of the Redis Cluster serves slot \(slot)") }
            let why = masters[owner]?.lastError.map { " (\($0.message))" } ?? ""
            return RedisError(.unavailable, "the master of slot \(slot), \(owner), is not connected" + why)
        }
        return RedisError(.unavailable, "no master of the Redis Cluster is connected" + (lastError.map { " (\($0.message))" } ?? ""))
    }

    // MARK: The slot map

    private func scheduleRefresh(after delay: Duration) {
        guard state != .closed else { return }
        if refreshing { refreshAgain = true; return }
        guard refreshTimer == .none else { return }
        refreshTimer = loop.schedule(after: delay) { [weak self] in
            guard let self else { return }
            self.refreshTimer = .none
            self.refresh()
        }
    }

    /// Reads `CLUSTER SLOTS` from a master that is up, or else from a seed node (in turn, with backoff).
    private func refresh() {
        guard state != .closed, !refreshing else { return }
        refreshing = true
        if let c = masters.values.first(where: { $0.state == .ready }) {
            c.send(["CLUSTER", "SLOTS"]) { [weak self] result in self?.refreshed(result) }
            return
        }
        let seeds = endpoint.seeds
        let seed = endpoint.node(seeds[nextSeed % seeds.count])
        nextSeed += 1
        // One attempt: its own reconnects are not wanted (the next refresh tries the next seed).
        let probe = RedisConnection(endpoint: seed, loop: loop, backoff: RedisBackoff(initial: .seconds(3600)))
        self.probe = probe
        probe.onReady = { [weak self, unowned probe] in
            probe.send(["CLUSTER", "SLOTS"]) { result in
                guard let self, self.probe === probe else { return }
                if case .failure = result {} else if probe.serverMode != nil, probe.serverMode != "cluster" {
                    return self.refreshed(.failure(RedisError(.handshake, "\(seed) is not a cluster node (mode \(probe.serverMode ?? "?")): use redis:// for a single Redis")))
                }
                self.refreshed(result)
            }
        }
        probe.onDown = { [weak self, unowned probe] error in
            guard let self, self.probe === probe else { return }
            self.refreshed(.failure(error))
        }
        probe.start()
    }

    private func refreshed(_ result: Result<RESPValue, RedisError>) {
        refreshing = false
        if let probe {
            self.probe = nil
            probe.close()
        }
        guard state != .closed else { return }
        switch result.flatMap(Self.parseSlots) {
        case .failure(let error):
            lastError = error
            if state == .connecting { onDown(error) }
            refreshAttempt += 1
            let delay = backoff.delay(attempt: refreshAttempt, using: &random)
            refreshAgain = false
            scheduleRefresh(after: delay)
        case .success(let ranges):
            refreshAttempt = 0
            apply(ranges)
            if refreshAgain {
                refreshAgain = false
                scheduleRefresh(after: .milliseconds(100))
            }
        }
    }

    struct SlotRange: Equatable {
        let first: Int
        let last: Int
        let master: String
    }

    /// `CLUSTER SLOTS`: `[[first, last, [host, port, id, …], replicas…], …]`. An empty host means "the node you asked".
    static func parseSlots(_ value: RESPValue) -> Result<[SlotRange], RedisError> {
        guard let rows = value.elements else { return .failure(RedisError(.protocolError, "unexpected CLUSTER SLOTS reply")) }
        var ranges: [SlotRange] = []
        for row in rows {
            guard let fields = row.elements, fields.count >= 3, let first = fields[0].int, let last = fields[1].int,
                  first >= 0, first <= last, last < Int64(RedisSlot.count), let node = fields[2].elements, node.count >= 2,
                  let host = node[0].string, let port = node[1].int, port > 0, port <= 65_535 else {
                return .failure(RedisError(.protocolError, "unexpected CLUSTER SLOTS row \(row)"))
            }
            guard !host.isEmpty, host != "?" else { continue }  // a master whose address is not known
            let literal = host.contains(":") ? "[\(host)]" : host
            ranges.append(SlotRange(first: Int(first), last: Int(last), master: "\(literal):\(port)"))
        }
        guard !ranges.isEmpty else { return .failure(RedisError(.unavailable, "the Redis Cluster serves no slot yet")) }
        return .success(ranges)
    }

    private func apply(_ ranges: [SlotRange]) {
        var owner = [String?](repeating: nil, count: RedisSlot.count)
        for r in ranges {
            for slot in r.first...r.last { owner[slot] = r.master }
        }
        let wantedMasters = Set(ranges.map(\.master))
        let changed = mapped && (owner != slotOwner || Set(masters.keys) != wantedMasters)
        slotOwner = owner
        mapped = true
        for (address, c) in masters where !wantedMasters.contains(address) {
            masters[address] = nil
            c.close()
        }
        for address in wantedMasters { _ = connection(to: address) }
        if changed, subscriberRole, state == .ready {
            // Its subscriptions are on the old masters: down and up again, so the broker subscribes anew and fills.
            goDown(RedisError(.connectionLost, "the Redis Cluster's slot map changed"))
        }
        updateState()
    }

    /// The connection to a master, made and started if new.
    private func connection(to address: String) -> RedisConnection {
        if let c = masters[address] { return c }
        let node = endpoint.node(Self.address(address))
        let c = RedisConnection(endpoint: node, loop: loop, backoff: backoff)
        c.bindsNumberingToProcess = false
        masters[address] = c
        c.onReady = { [weak self] in self?.updateState() }
        c.onDown = { [weak self, unowned c] error in
            guard let self, self.masters[address] === c else { return }
            self.lastError = error
            if self.state == .ready { self.goDown(error) }
            // A failover may have given this master's slots to a replica.
            self.scheduleRefresh(after: self.backoff.initial)
        }
        c.onPush = { [weak self] push in self?.pushed(push) }
        c.start()
        return c
    }

    static func address(_ text: String) -> RedisEndpoint.Address {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]) else {
            return .tcp(host: text, port: 6379)
        }
        return .tcp(host: String(text[..<colon]), port: port)
    }

    private func pushed(_ push: RESPValue) {
        if subscriberRole, case .push(let items) = push, items.count >= 2, items[0].string == "sunsubscribe",
           let channel = items[1].string, wanted.contains(channel) {
            // Redis took a channel it was not asked to leave: its slot moved to another master.
            scheduleRefresh(after: .zero)
            if state == .ready { goDown(RedisError(.connectionLost, "the Redis Cluster moved the slot of \(channel)")) }
            return
        }
        onPush(push)
    }

    private func goDown(_ error: RedisError) {
        state = .waiting
        lastError = error
        onDown(error)
    }

    /// Ready when the map is known and every master's connection is up; says so once per change.
    private func updateState() {
        guard state != .closed else { return }
        let up = mapped && !masters.isEmpty && masters.values.allSatisfy { $0.state == .ready }
        if up, state != .ready {
            state = .ready
            lastError = nil
            onReady()
        } else if !up, state == .ready {
            goDown(lastError ?? RedisError(.connectionLost, "a master of the Redis Cluster is not connected"))
        } else if !up, state == .connecting, mapped {
            state = .waiting
        }
    }
}
