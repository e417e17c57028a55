// Whole-connection harness: the real `ClientConnection` (/ws, /echo, HTTP) and `SocketConnection` (Unix-socket
// protocol) behind a socketpair, on a caller-driven `EventLoop` run on the calling thread one iteration at a time.
//
// One file, compiled into two places: the libFuzzer targets (`Fuzz/ClientFuzz.swift`, `Fuzz/SocketFuzz.swift`,
// built by `Fuzz/run`) and the normal test run (`ConnectionFuzzReplayTests` replays the corpora in
// Tests/HubTests/Corpus/). It uses only Glibc, WSProtocol and Hub (no Foundation, no Testing).
//
// Input format (docs/TESTING.md, "Fuzzing"): byte 0 chooses the scenario, the rest is cut into reads by its own
// bytes as `Fuzz/FramesFuzz.swift` does: a length byte L, then the next L bytes (L == 0, or more than is left: all
// the rest). Each piece is written to the hub's socket and the loop runs until it is idle before the next one.
//
// Every run checks invariants, not just "no crash" (see `runClient` and `runSocket`), and throws `HarnessFailure`
// when one breaks; the fuzz targets trap on it, the replay test records it.

import Glibc
import WSProtocol
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubEngine
@testable import HubJSON
@testable import HubRouting

/// An invariant the hub broke, with what was seen.
struct HarnessFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// What a client run saw (replay tests assert on it).
struct ClientRunResult {
    /// The HTTP status of the hub's response, nil when it sent none.
    var status: Int?
    /// Text and binary messages the hub sent after a 101 (inflated), in order.
    var messages: [[UInt8]] = []
    /// The code of the hub's close frame (1005 for an empty body), nil when it sent none.
    var closeCode: UInt16?
    /// The hub closed TCP (EOF) before the harness closed its side.
    var hubClosedTCP = false
}

/// What a Unix-socket run saw.
struct SocketRunResult {
    /// Complete reply lines (without the newline), in order, tail event lines included.
    var lines: [[UInt8]] = []
    /// The hub closed the socket before the harness did.
    var hubClosed = false
}

/// Our end of a socketpair: what the hub wrote to it, whether the hub closed it.
final class FakePeer {
    let fd: Int32
    /// The hub's end of the socketpair (-1: not known).
    let hubFD: Int32
    private(set) var received: [UInt8] = []
    private(set) var sent: [UInt8] = []
    private(set) var eof = false
    /// The hub's end is gone: writes fail.
    private(set) var gone = false
    private var open = true
    /// False once the harness closed its end.
    var isOpen: Bool { open }
    /// Where `drain` reads into: the harness's buffer, shared by its peers (a fresh 64 KiB per run cost the fuzzer
    /// ~10 % in ASan's allocator alone).
    private let scratch: UnsafeMutableRawBufferPointer

    init(fd: Int32, hubFD: Int32, scratch: UnsafeMutableRawBufferPointer) {
        self.fd = fd
        self.hubFD = hubFD
        self.scratch = scratch
    }

    /// Waits (without running the loop) up to `timeoutMs` for the EOF of an end the hub has already closed, reading
    /// what comes before it. In the parallel test run another thread may be starting a process: between its clone
    /// and its exec the child holds a copy of every descriptor (close-on-exec ones too), so the hub's close reaches
    /// this end only once that child has exec'd. The fuzzer runs no other threads and never waits here.
    func awaitEOF(timeoutMs: Int32) {
        var waited: Int32 = 0
        while open && !eof && waited < timeoutMs {
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&p, 1, 10)
            waited += 10
            _ = drain()
        }
    }

    deinit {
        close()
    }

    /// Reads everything the hub has written; returns how much happened (bytes, plus 1 for a new EOF).
    func drain() -> Int {
        guard open, !eof else { return 0 }
        var total = 0
        while true {
            let n = recv(fd, scratch.baseAddress, scratch.count, Int32(MSG_DONTWAIT))
            if n > 0 {
                received.append(contentsOf: UnsafeRawBufferPointer(rebasing: scratch[0..<n]))
                total += n
            } else if n == 0 {
                eof = true
                return total + 1
            } else if errno == EINTR {
                continue
            } else if errno == EAGAIN || errno == EWOULDBLOCK {
                return total
            } else {
                eof = true  // ECONNRESET: the hub aborted
                return total + 1
            }
        }
    }

    /// Writes all of `bytes`, running `pump` while the socket is full. Stops early (and sets `gone`) if the hub's
    /// end is closed.
    func write(_ bytes: UnsafeRawBufferPointer, pump: () throws(HarnessFailure) -> Void) throws(HarnessFailure) {
        var offset = 0
        var stalls = 0
        while offset < bytes.count && !gone {
            let n = send(fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            if n > 0 {
                sent.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + n)]))
                offset += n
                stalls = 0
            } else if n < 0 && errno == EINTR {
                continue
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                stalls += 1
                if stalls > 1000 { throw HarnessFailure("the hub stopped reading: \(bytes.count - offset) bytes could not be sent") }
                try pump()
            } else {
                gone = true  // EPIPE / ECONNRESET: the hub closed its end
            }
        }
    }

    /// `write` for an array.
    func write(_ bytes: [UInt8], pump: () throws(HarnessFailure) -> Void) throws(HarnessFailure) {
        try bytes.withUnsafeBytes { raw in Result { () throws(HarnessFailure) in try write(raw, pump: pump) } }.get()
    }

    func shutdownWrite() {
        if open { _ = shutdown(fd, Int32(SHUT_WR)) }
    }

    func close() {
        if open {
            open = false
            _ = Glibc.close(fd)
        }
    }
}

/// Collects broker completions (they run on the same loop, later in the same pump).
final class DeliveryRecord: @unchecked Sendable {
    var delivered: [Int]?
}

/// One hub (configuration, core, the loop's context) on the harness's loop.
struct HarnessHub {
    let configuration: HubConfiguration
    let core: HubCore
    let context: LoopContext
}

/// The client-side scenarios: byte 0 of a client input, bits 0-2.
enum ClientScenario: UInt8, CaseIterable {
    /// No prefix: the input is the whole byte stream, request head included.
    case raw = 0
    case wsHeaderToken, wsQueryToken, wsBadToken, wsNoToken
    case echo, echoDeflate, echoDeflateNoContext
}

final class ConnectionHarness {
    // MARK: Fixed identities (so corpus files can carry a valid token literally)

    static let secret: [UInt8] = Array("hub-fuzz-harness-secret-0123456789abcdef".utf8)
    static let account = "acc_fuzz"
    static let otherAccount = "acc_other"
    /// 2100-01-01: far enough that the token never expires during a run, fixed so the token is always the same.
    static let expiry: Int64 = 4_102_444_800
    static let key = "dGhlIHNhbXBsZSBub25jZQ=="
    static let eventType = "fuzz_event"

    /// The token every scenario authenticates with (HS256 over `secret`, sub `acc_fuzz`).
    let token: String
    /// A valid token of another account (for `auth` seeds).
    let otherToken: String
    let loop: EventLoop
    /// [default limits, small limits] (byte 0 chooses).
    let hubs: [HarnessHub]
    /// Check that the hub's descriptors are closed after a run. Only for a process that opens no descriptors on other
    /// threads meanwhile (the fuzzer, not the parallel test run).
    var checkDescriptors = false
    /// Weak references to the long-lived contexts. The hub takes weak references to a `LoopContext` (`LoopBound`),
    /// which gives it a side table that only its object header points to, in an encoded form LeakSanitizer does not
    /// read as a pointer: a false leak report at exit. One weak reference kept here keeps the table visibly reachable.
    private let contextAnchors: [WeakContext]
    /// What the peers read into.
    private let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
    /// Each scenario's prefix, parsed once (index: `ClientScenario.rawValue`).
    private var prefixHeads: [(HTTPRequestHead, Int)?] = []

    private struct WeakContext {
        weak var context: LoopContext?
    }

    init() throws {
        let signer = try JWTSigner(key: .hmacSecret(Self.secret))
        token = try signer.sign(JWTClaims(sub: Self.account, exp: Self.expiry))
        otherToken = try signer.sign(JWTClaims(sub: Self.otherAccount, exp: Self.expiry))
        var engine = EventLoop.Configuration()
        // A small shared read buffer, so the engine's spill paths (a partial message bigger than half the buffer
        // is read straight into the connection's own buffer) are reached by inputs of a few KiB.
        engine.readBufferSize = 4096
        let loop = try EventLoop(drivenByCallerWith: engine)
        self.loop = loop

        var normal = HubConfiguration()
        normal.echo = true
        var small = normal
        small.maxMessageBytes = 125
        small.maxEchoMessageBytes = 300
        small.maxQueuedBytes = 4096
        small.maxSubscriptions = 1
        small.maxConnectionsPerAccount = 1
        small.rateLimitPerMinute = 4
        small.maxLineBytes = 1024
        small.maxEventBytes = 256
        hubs = try [normal, small].map { configuration in
            let context = LoopContext(loop: loop, channelCount: configuration.channels.count)
            context.ledger = PublishLedger(channelNames: configuration.channels)
            let verifier = try JWTVerifier(key: .hmacSecret(Self.secret))
            let core = HubCore(configuration: configuration, verifier: verifier, authDescription: "HS256 (harness)",
                               contexts: [context], maxConnections: 1000, descriptorLimit: 1024,
                               listenAddress: "harness", log: { _ in })
            context.hub = core
            return HarnessHub(configuration: configuration, core: core, context: context)
        }
        contextAnchors = hubs.map { WeakContext(context: $0.context) }
        prefixHeads = []
        for scenario in ClientScenario.allCases {
            var parser = HTTPRequestParser()
            let bytes = prefix(scenario)
            if case .complete(let head, let consumed)? = try? parser.parse(bytes), consumed == bytes.count {
                prefixHeads.append((head, consumed))
            } else {
                prefixHeads.append(nil)
            }
        }
    }

    deinit {
        loop.finishDriven()
        scratch.deallocate()
    }

    // MARK: Input helpers

    /// The pieces of `bytes` (after byte 0), cut by their own length bytes.
    static func reads(_ input: UnsafeRawBufferPointer) -> [Range<Int>] {
        var pieces: [Range<Int>] = []
        var i = 1
        while i < input.count {
            var length = Int(input[i])
            i += 1
            if length == 0 || length > input.count - i { length = input.count - i }
            if length > 0 { pieces.append(i..<(i + length)) }
            i += length
        }
        return pieces
    }

    /// An input with the same byte 0 and the same stream, delivered `size` octets per read.
    static func rechunk(_ input: [UInt8], size: Int) -> [UInt8] {
        guard let flags = input.first else { return [] }
        var stream: [UInt8] = []
        input.withUnsafeBytes { raw in
            for piece in reads(raw) { stream.append(contentsOf: raw[piece]) }
        }
        return encode(flags: flags, stream: stream, readSize: size)
    }

    /// Builds an input: `flags`, then `stream` in reads of `readSize` octets (0: one read).
    static func encode(flags: UInt8, stream: [UInt8], readSize: Int = 0) -> [UInt8] {
        var out = [flags]
        guard readSize > 0 && readSize < 256 else {
            if !stream.isEmpty { out.append(0); out.append(contentsOf: stream) }
            return out
        }
        var i = 0
        while i < stream.count {
            let n = min(readSize, stream.count - i)
            out.append(UInt8(n))
            out.append(contentsOf: stream[i..<(i + n)])
            i += n
        }
        return out
    }

    /// The request head a scenario puts in front of the input (`open`: without the blank line that ends it, so the
    /// input continues the header section).
    func prefix(_ scenario: ClientScenario, open: Bool = false) -> [UInt8] {
        var path = "/ws"
        var headers: [String] = []
        switch scenario {
        case .raw: return []
        case .wsHeaderToken: headers.append("Authorization: Bearer \(token)")
        case .wsQueryToken: path = "/ws?access_token=\(token)"
        case .wsBadToken:
            var bad = Array(token.utf8)
            let i = bad.count - 10  // inside the signature: a different MAC, not just different padding bits
            bad[i] = bad[i] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            headers.append("Authorization: Bearer \(String(decoding: bad, as: UTF8.self))")
        case .wsNoToken: break
        case .echo: path = "/echo"
        case .echoDeflate:
            path = "/echo"
            headers.append("Sec-WebSocket-Extensions: \(PerMessageDeflate.clientOffer(Self.offer(for: scenario) ?? .init()))")
        case .echoDeflateNoContext:
            path = "/echo"
            headers.append("Sec-WebSocket-Extensions: \(PerMessageDeflate.clientOffer(Self.offer(for: scenario) ?? .init()))")
        }
        var head = "GET \(path) HTTP/1.1\r\nHost: hub.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        head += "Sec-WebSocket-Key: \(Self.key)\r\nSec-WebSocket-Version: 13\r\n"
        for h in headers { head += h + "\r\n" }
        if !open { head += "\r\n" }
        return Array(head.utf8)
    }

    static func offer(for scenario: ClientScenario) -> PerMessageDeflateConfiguration? {
        switch scenario {
        case .echoDeflate: return PerMessageDeflateConfiguration()
        case .echoDeflateNoContext:
            return PerMessageDeflateConfiguration(serverNoContextTakeover: true, clientNoContextTakeover: true,
                                                  serverMaxWindowBits: 9, clientMaxWindowBits: 10)
        default: return nil
        }
    }

    /// A masked client frame (mask key 0, so the payload reads as plain text in a corpus file).
    static func clientFrame(_ opcode: Opcode, _ payload: [UInt8], fin: Bool = true) -> [UInt8] {
        var frame: [UInt8] = [(fin ? 0x80 : 0) | opcode.rawValue]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else {
            frame.append(0x80 | 126)
            frame.append(UInt8(payload.count >> 8))
            frame.append(UInt8(payload.count & 0xFF))
        }
        frame.append(contentsOf: [0, 0, 0, 0])
        frame.append(contentsOf: payload)
        return frame
    }

    // MARK: Driving the loop

    /// Runs the loop and drains the peers until nothing happens any more.
    func pump(_ peers: [FakePeer]) throws(HarnessFailure) {
        var waitedForHub: [Int32] = []
        for _ in 0..<100_000 {
            var work = loop.runOnce()
            for peer in peers { work += peer.drain() }
            if work == 0 {
                // A close on either side reaches the other end only when every copy of the descriptor is closed, and
                // a process being spawned by another thread holds copies until its exec (see `FakePeer.awaitEOF`).
                // An end the hub has closed (no longer registered on the loop) shows its EOF to the peer after that;
                // if the hub deregistered an end without closing it, the EOF never comes and the checks fail.
                for peer in peers where !peer.eof && peer.hubFD >= 0 && loop.registered(fd: peer.hubFD) == nil {
                    peer.awaitEOF(timeoutMs: 5_000)
                }
                // An end we closed shows the hub its EOF after that: wait for it to be pending, then let the loop
                // see it. One wait per end and pump; a hub that ignores a pending EOF still fails the checks.
                var waited = false
                for peer in peers where !peer.isOpen && peer.hubFD >= 0 && !waitedForHub.contains(peer.hubFD)
                    && loop.registered(fd: peer.hubFD) != nil {
                    waitedForHub.append(peer.hubFD)
                    var p = pollfd(fd: peer.hubFD, events: Int16(POLLIN) | 0x2000 /* POLLRDHUP */, revents: 0)
                    if poll(&p, 1, 0) == 0 {
                        _ = poll(&p, 1, 5_000)
                        waited = true
                    }
                }
                if waited { continue }
                return
            }
        }
        throw HarnessFailure("the loop never went idle")
    }

    private func socketPair() throws(HarnessFailure) -> (hub: Int32, peer: Int32) {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            throw HarnessFailure("socketpair failed: errno \(errno)")
        }
        return (fds[0], fds[1])
    }

    /// After a run: the hub's end of the socketpair must be closed (EBADF; nothing else opens descriptors meanwhile
    /// in a single-threaded fuzzer).
    private func checkClosed(_ fd: Int32) throws(HarnessFailure) {
        guard checkDescriptors else { return }
        if fcntl(fd, F_GETFD) != -1 || errno != EBADF { throw HarnessFailure("descriptor leak: the hub's end (fd \(fd)) is still open") }
    }

    /// Accepts a client exactly as the TCP listener does (`ClientAcceptor`); returns our end and the hub's object.
    private func connectClient(_ hub: HarnessHub) throws(HarnessFailure) -> (peer: FakePeer, client: ClientConnection, fds: (Int32, Int32)) {
        let pair = try socketPair()
        let serial = hub.context.nextSerial
        ClientAcceptor(context: hub.context, tls: nil).accepted(fd: pair.hub, peer: "harness", on: loop)
        guard let client = hub.context.clients[serial] else {
            Glibc.close(pair.peer)
            throw HarnessFailure("the acceptor did not register the client")
        }
        return (FakePeer(fd: pair.peer, hubFD: pair.hub, scratch: scratch), client, pair)
    }

    /// State every run starts from and must leave behind: nothing open, nothing subscribed, no timers.
    private func checkIdle(_ hub: HarnessHub, _ when: String) throws(HarnessFailure) {
        let context = hub.context
        var problems: [String] = []
        if !context.clients.isEmpty { problems.append("\(context.clients.count) clients still registered") }
        if context.registry.totalSubscriptions != 0 { problems.append("\(context.registry.totalSubscriptions) subscriptions left in the registry") }
        if context.counters.handshaking != 0 || context.counters.upgraded != 0 {
            problems.append("gauges handshaking \(context.counters.handshaking) upgraded \(context.counters.upgraded)")
        }
        if hub.core.clientCount != 0 { problems.append("client count \(hub.core.clientCount)") }
        let metrics = loop.metrics
        if metrics.connectionsOpened != metrics.connectionsClosed {
            problems.append("connections opened \(metrics.connectionsOpened), closed \(metrics.connectionsClosed)")
        }
        if loop.timers.count != 0 { problems.append("\(loop.timers.count) timers pending") }
        // Per-account admission: with nothing open, one more connection of the account must be admitted.
        if hub.core.admitAccount(AccountID(Self.account)) {
            hub.core.releaseAccount(AccountID(Self.account))
        } else {
            problems.append("account slots not released (admitAccount refused with nothing open)")
        }
        if !problems.isEmpty { throw HarnessFailure("\(when): " + problems.joined(separator: "; ")) }
    }

    /// Publishes one event (a broadcast on channel 0, or one to `acc_fuzz` on channel 1) through the real broker.
    private func publish(_ hub: HarnessHub, broadcast: Bool, n: Int) -> DeliveryRecord {
        let record = DeliveryRecord()
        let data = Array("{\"n\":\(n)}".utf8)
        data.withUnsafeBytes { raw in
            let draft = EventDraft(channel: broadcast ? 0 : 1, account: broadcast ? nil : AccountID(Self.account),
                                   type: Self.eventType, data: raw)
            hub.core.broker.publish([draft]) { outcome in record.delivered = outcome.delivered }
        }
        return record
    }

    // MARK: Client target

    /// One client connection: byte 0 = scenario (bits 0-2, `ClientScenario`), small limits (bit 3), publish a
    /// broadcast and an account event after every read (bit 4), leave the prefixed head open so the input adds
    /// headers (bit 5). The rest is the byte stream the client sends after connecting, cut into reads.
    ///
    /// Invariants: the hub answers a complete request head (an HTTP response, or a 101 then frames) and closes TCP
    /// after any other response; a prefixed valid request gets its expected status; everything after a 101 is valid
    /// server frames (unmasked, valid UTF-8, nothing after the close frame); /ws replies are JSON, one per text
    /// message; /echo echoes exactly the messages sent, pings get their pongs; a protocol violation is answered
    /// with its close code and TCP closed at once (RFC 6455 7.1.7), a client close with a close and TCP closed;
    /// the hub closes on its own only as a slow consumer (4008) or for abuse (1008); events reach the client
    /// exactly when the broker counted them, in seq order; the registry matches the connection's channels; and once
    /// the client sends EOF the hub closes and nothing is left: no client, subscription, gauge, account slot, timer,
    /// descriptor, and the `ClientConnection` object itself is freed.
    @discardableResult
    func runClient(_ input: UnsafeRawBufferPointer) throws(HarnessFailure) -> ClientRunResult {
        guard let flags = input.first else { return ClientRunResult() }
        let scenario = ClientScenario(rawValue: flags & 7) ?? .raw
        let hub = hubs[Int(flags >> 3) & 1]
        let publishing = flags & 0x10 != 0
        let openHead = flags & 0x20 != 0 && scenario != .raw
        try checkIdle(hub, "before the run")
        hub.context.nextSerial = 1  // ids are "0-1" every run (deterministic admin output)

        // Only weak references from here on: the connection must be freed once closed.
        let peer: FakePeer
        let hubFD: Int32
        weak var weakClient: ClientConnection?
        do {
            let accepted = try connectClient(hub)
            peer = accepted.peer
            weakClient = accepted.client
            hubFD = accepted.fds.0
        }
        var deliveries: [(record: DeliveryRecord, expected: Int)] = []
        var published = 0

        let pump = { () throws(HarnessFailure) in try self.pump([peer]) }
        let head = prefix(scenario, open: openHead)
        if !head.isEmpty {
            try peer.write(head, pump: pump)
            try pump()
        }
        for piece in Self.reads(input) {
            try peer.write(UnsafeRawBufferPointer(rebasing: input[piece]), pump: pump)
            try pump()
            try checkRegistry(hub, weakClient)
            if publishing {
                for broadcast in [true, false] {
                    let channel = broadcast ? 0 : 1
                    // What the registry should do: the connection gets it when it is upgraded, subscribed to the
                    // channel, and (for an account event) of that account.
                    var expected = 0
                    if let c = weakClient, c.phase == .webSocket, c.mode == .hub, c.channels.contains(channel),
                       broadcast || c.account == AccountID(Self.account) {
                        expected = 1
                    }
                    published += 1
                    deliveries.append((publish(hub, broadcast: broadcast, n: published), expected))
                }
                try pump()
            }
        }
        try pump()
        try checkRegistry(hub, weakClient)

        // Checkpoint: the input is consumed and the loop is idle.
        let phase = weakClient?.phase
        let eofAtCheckpoint = peer.eof
        let receivedAtCheckpoint = peer.received.count
        let result = try checkClientOutput(peer: peer, scenario: scenario, openHead: openHead, hub: hub,
                                           phase: phase, deliveries: deliveries)

        // The client goes away: the hub must close and leave nothing behind.
        peer.shutdownWrite()
        try pump()
        guard peer.eof else { throw HarnessFailure("the hub did not close after the client's EOF") }
        if eofAtCheckpoint && peer.received.count != receivedAtCheckpoint {
            throw HarnessFailure("the hub sent bytes after closing")
        }
        peer.close()
        try pump()
        if weakClient != nil { throw HarnessFailure("the ClientConnection was not freed after close (a reference cycle or a leftover reference)") }
        try checkClosed(hubFD)
        try checkIdle(hub, "after close")
        return result
    }

    private func checkRegistry(_ hub: HarnessHub, _ client: ClientConnection?) throws(HarnessFailure) {
        let inRegistry = hub.context.registry.totalSubscriptions
        let own = client?.channels.count ?? 0
        guard inRegistry == own else {
            throw HarnessFailure("registry holds \(inRegistry) subscriptions, the connection lists \(own)")
        }
    }

    /// Checks everything the hub wrote to a client, at the checkpoint.
    private func checkClientOutput(peer: FakePeer, scenario: ClientScenario, openHead: Bool, hub: HarnessHub,
                                   phase: ClientConnection.Phase?, deliveries: [(record: DeliveryRecord, expected: Int)])
        throws(HarnessFailure) -> ClientRunResult {
        var result = ClientRunResult()
        result.hubClosedTCP = peer.eof
        let out = peer.received
        let sent = peer.sent

        // What the client sent: does it hold a complete request head (or one the parser refuses)?
        var request: HTTPRequestHead? = nil
        var headEnd = 0
        var requestRefused = false
        // A first byte of 22 is a TLS handshake record at this plain port: refused at once (400 TLS_NOT_ENABLED).
        let tlsHello = sent.first == 22
        if tlsHello {
            requestRefused = true
        } else if scenario != .raw && !openHead, let known = prefixHeads[Int(scenario.rawValue)] {
            (request, headEnd) = known  // the prefix is the whole head: no need to parse it again
        } else {
            var requestParser = HTTPRequestParser()
            do {
                if case .complete(let h, let consumed) = try requestParser.parse(sent) {
                    request = h
                    headEnd = consumed
                }
            } catch {
                requestRefused = true
            }
        }

        if out.isEmpty {
            if request != nil || requestRefused {
                if !peer.eof { throw HarnessFailure("a complete request head got no answer (\(sent.count) bytes sent)") }
            } else if peer.eof {
                throw HarnessFailure("the hub closed during an incomplete request head")
            }
            if scenario != .raw && !openHead { throw HarnessFailure("scenario \(scenario) got no response") }
            for d in deliveries where (d.record.delivered?.first ?? 0) != 0 { throw HarnessFailure("an event was delivered before the handshake") }
            return result
        }

        var responseParser = HTTPResponseParser()
        let responseHead: HTTPResponseHead
        let responseLength: Int
        do {
            guard case .complete(let h, let consumed) = try responseParser.parse(out) else {
                throw HarnessFailure("an incomplete response head: \(Self.show(out))")
            }
            responseHead = h
            responseLength = consumed
        } catch let failure as HarnessFailure {
            throw failure
        } catch {
            throw HarnessFailure("the hub's response does not parse (\(error)): \(Self.show(out))")
        }
        result.status = responseHead.status
        if tlsHello && (responseHead.status != 400 || out.firstRange(of: Array("TLS_NOT_ENABLED".utf8)) == nil) {
            throw HarnessFailure("a TLS hello at a plain port got \(Self.show(out))")
        }
        if request == nil && !requestRefused {
            throw HarnessFailure("a response (\(responseHead.status)) to an incomplete request head")
        }

        if !openHead {
            let expected: Int?
            switch scenario {
            case .raw: expected = nil
            case .wsHeaderToken, .wsQueryToken, .echo, .echoDeflate, .echoDeflateNoContext: expected = 101
            case .wsBadToken: expected = 401
            case .wsNoToken: expected = 101  // first-message auth
            }
            if let expected, responseHead.status != expected {
                throw HarnessFailure("scenario \(scenario): status \(responseHead.status), expected \(expected)")
            }
        }

        guard responseHead.status == 101 else {
            // A plain answer: its body (none for HEAD), then the hub closes TCP.
            let body = out.count - responseLength
            let declared = responseHead.headers[first: "Content-Length"].flatMap { Int($0) } ?? 0
            if body != declared && body != 0 { throw HarnessFailure("response body of \(body) bytes, Content-Length \(declared)") }
            if !peer.eof { throw HarnessFailure("the hub kept TCP open after HTTP \(responseHead.status)") }
            for d in deliveries where (d.record.delivered?.first ?? 0) != 0 { throw HarnessFailure("an event was delivered without an upgrade") }
            return result
        }

        // 101: the request must have been a valid upgrade, answered exactly.
        guard let request, let upgrade = try? WebSocketHandshake.validateUpgrade(request) else {
            throw HarnessFailure("101 for a request that is not a valid upgrade")
        }
        let echoMode = request.path == "/echo"
        if !echoMode && request.path != "/ws" { throw HarnessFailure("101 on path \(request.path)") }
        guard responseHead.headers.values("Sec-WebSocket-Accept") == [WebSocketHandshake.acceptValue(forKey: upgrade.key)] else {
            throw HarnessFailure("wrong Sec-WebSocket-Accept")
        }
        var deflate: PerMessageDeflateParameters? = nil
        let answer = responseHead.headers.values("Sec-WebSocket-Extensions")
        if echoMode, let (parameters, value) = PerMessageDeflate.negotiate(offers: upgrade.extensions, configuration: PerMessageDeflateConfiguration()) {
            guard answer == [value] else { throw HarnessFailure("extensions answer \(answer), expected \(value)") }
            deflate = parameters
        } else if !answer.isEmpty {
            throw HarnessFailure("an extension (\(answer)) that was not negotiable")
        }
        if scenario != .raw && !openHead {
            // What a strict client that made this offer accepts.
            do {
                let agreed = try ClientHandshake.verify(responseHead, key: Self.key, offeredSubprotocols: [], deflate: Self.offer(for: scenario))
                if (agreed.deflate != nil) != (Self.offer(for: scenario) != nil) { throw HarnessFailure("deflate offered but not agreed, or the reverse") }
            } catch let failure as HarnessFailure {
                throw failure
            } catch {
                throw HarnessFailure("a client rejects the 101: \(error)")
            }
        }

        // The hub's frames.
        let server = try decodeServerFrames(Array(out[responseLength...]), deflate: deflate)
        result.messages = server.messages.map(\.payload)
        result.closeCode = server.closeCode

        // The client's frames, as the hub must have read them.
        let limit = echoMode ? hub.configuration.maxEchoMessageBytes : hub.configuration.maxMessageBytes
        let client = Self.decodeClientFrames(Array(sent[headEnd...]), limit: limit, deflate: deflate, stopAtBinary: !echoMode)
        func failure(_ what: String) -> HarnessFailure {
            HarnessFailure(what + " [hub: \(server.messages.count) messages, \(server.pongs.count) pongs, close \(server.closeCode.map(String.init) ?? "none"), "
                           + "TCP \(peer.eof ? "closed" : "open"), phase \(phase.map { "\($0)" } ?? "gone"); client: \(client.messages.count) messages, "
                           + "\(client.pings.count) pings, then \(client.stop); \(sent.count) bytes sent, \(out.count) received]")
        }

        // Hub-initiated closes that need no client fault: a slow consumer (4008), abuse of the rate limit (1008); on a
        // /ws session opened without a token (first-message auth), the refusals of that first message: expired
        // (4001), anything else (4003), the account's connection limit (4029), no auth in time (4408).
        let firstMessageAuth = !echoMode && request.headers.values("Authorization").isEmpty && request.queryValue("access_token") == nil
        let authRefusals: Set<UInt16> = [4001, 4003, 4029, 4408]
        let hubInitiated = server.closeCode == 4008 || (server.closeCode == 1008 && !echoMode)
            || (firstMessageAuth && server.closeCode.map(authRefusals.contains) == true)
        // /echo has no rate limit, so its 1008 can only be the echo of a client's own close with 1008 (the hub replies
        // with the code it received, RFC 6455 5.5.1; found by the Client target: seed_regress_echo_close_1008_echoed).
        if server.closeCode == 1008 && echoMode && client.stop != .close(1008) { throw failure("/echo closed with 1008") }

        switch client.stop {
        case .none:
            if let code = server.closeCode, !hubInitiated { throw failure("the hub closed (\(code)) though the client did nothing wrong") }
        case .close:
            if server.closeCode == nil { throw failure("no close frame in answer to the client's close") }
            if !peer.eof { throw failure("TCP left open after the close handshake (RFC 6455 5.5.1)") }
        case .violation(let code):
            if !hubInitiated {
                guard server.closeCode == code else {
                    throw failure("violation answered with close \(server.closeCode.map(String.init) ?? "none"), expected \(code)")
                }
            }
            if !peer.eof && !(hubInitiated && phase == .closing) { throw failure("TCP left open after failing the connection (RFC 6455 7.1.7)") }
        case .binaryOnWS:
            if !hubInitiated && server.closeCode != CloseCode.unsupportedData.rawValue {
                throw failure("a binary message on /ws answered with close \(server.closeCode.map(String.init) ?? "none"), expected 1003")
            }
            if !peer.eof && !(hubInitiated && phase == .closing) { throw failure("TCP left open after failing the connection") }
        }
        if server.closeCode != nil && !peer.eof && phase != .closing {
            throw failure("a close frame was sent but the connection neither closed nor waits for the client's (phase \(String(describing: phase)))")
        }

        // Pongs: one per ping, same payload, unless the hub closed on its own first.
        if !hubInitiated && server.pongs != client.pings {
            throw failure("\(client.pings.count) pings answered by \(server.pongs.count) pongs (or different payloads)")
        }

        if echoMode {
            let echoed = server.messages.map(\.payload)
            let expected = client.messages.map(\.payload)
            if hubInitiated ? !expected.starts(with: echoed) : echoed != expected {
                throw failure("/echo sent \(echoed.count) messages back for \(expected.count) (or different ones)")
            }
            if server.messages.map(\.text) != client.messages.prefix(server.messages.count).map(\.text) {
                throw failure("/echo changed a message's opcode")
            }
        } else {
            // /ws: every message is a JSON object with a type; one reply per text message; events in seq order.
            var replies = 0
            var events = 0
            var lastSeq: [String: Int64] = [:]
            for message in server.messages {
                guard message.text else { throw failure("/ws sent a binary message") }
                let info = try Self.wsMessageInfo(message.payload)
                if info.type == Self.eventType {
                    events += 1
                    guard let seq = info.seq else { throw failure("an event without seq") }
                    let stream = info.channel + (info.broadcast ? "/*" : "/acc")
                    if let last = lastSeq[stream], seq <= last { throw failure("seq \(seq) after \(last) on \(stream)") }
                    lastSeq[stream] = seq
                } else if info.type != "token_expiring" {
                    replies += 1
                }
            }
            let texts = client.messages.count
            if hubInitiated ? replies > texts : replies != texts {
                throw failure("\(replies) replies to \(texts) text messages")
            }
            let counted = deliveries.reduce(0) { $0 + ($1.record.delivered?.first ?? 0) }
            if deliveries.contains(where: { $0.record.delivered == nil }) { throw failure("a publish never completed") }
            for d in deliveries {
                let n = d.record.delivered?.first ?? 0
                if n > d.expected || (n < d.expected && server.closeCode != 4008) {
                    throw failure("an event was delivered to \(n) connections where the subscriptions say \(d.expected)")
                }
            }
            if server.closeCode != 4008 && events != counted {
                throw failure("the broker counted \(counted) deliveries, the client got \(events) events")
            }
        }
        return result
    }

    struct ServerMessage: Equatable {
        var text: Bool
        var payload: [UInt8]
    }

    struct ServerStream {
        var messages: [ServerMessage] = []
        var pongs: [[UInt8]] = []
        var closeCode: UInt16?
    }

    /// Decodes what the hub sent after its 101 as a strict client would.
    private func decodeServerFrames(_ bytes: [UInt8], deflate: PerMessageDeflateParameters?) throws(HarnessFailure) -> ServerStream {
        var reader = MessageReader(configuration: MessageReaderConfiguration(role: .client, maxFrameSize: 64 << 20, maxMessageSize: 64 << 20),
                                   decompressor: deflate.map { PerMessageInflater(parameters: $0, role: .client) })
        var stream = ServerStream()
        var copy = bytes
        let consumed: Int
        do {
            consumed = try copy.withUnsafeMutableBytes { raw in Result { () throws(ProtocolViolation) -> Int in
                try reader.read(raw) { message in
                    switch message {
                    case .text(let p): stream.messages.append(ServerMessage(text: true, payload: Array(p)))
                    case .binary(let p): stream.messages.append(ServerMessage(text: false, payload: Array(p)))
                    case .ping: break
                    case .pong(let p): stream.pongs.append(Array(p))
                    case .close(let code, _):
                        stream.closeCode = code ?? CloseCode.noStatusReceived.rawValue
                        return .stop
                    }
                    return .continue
                }
            } }.get()
        } catch {
            throw HarnessFailure("the hub sent an invalid frame: \(error)")
        }
        if stream.closeCode != nil && consumed < bytes.count {
            throw HarnessFailure("\(bytes.count - consumed) bytes after the hub's close frame")
        }
        return stream
    }

    enum ClientStop: Equatable {
        case none
        /// The client's close frame, with its status code (nil: none).
        case close(UInt16?)
        case violation(UInt16)
        case binaryOnWS
    }

    struct ClientStream {
        var messages: [ServerMessage] = []
        var pings: [[UInt8]] = []
        var stop = ClientStop.none
    }

    /// Decodes what the client sent after its head as the hub's reader does, up to where the hub stops reading.
    static func decodeClientFrames(_ bytes: [UInt8], limit: Int, deflate: PerMessageDeflateParameters?, stopAtBinary: Bool) -> ClientStream {
        var reader = MessageReader(configuration: MessageReaderConfiguration(role: .server, maxFrameSize: limit, maxMessageSize: limit),
                                   decompressor: deflate.map { PerMessageInflater(parameters: $0, role: .server) })
        var stream = ClientStream()
        var copy = bytes
        do {
            _ = try copy.withUnsafeMutableBytes { raw in Result { () throws(ProtocolViolation) -> Int in
                try reader.read(raw) { message in
                    switch message {
                    case .text(let p): stream.messages.append(ServerMessage(text: true, payload: Array(p)))
                    case .binary(let p):
                        if stopAtBinary {
                            stream.stop = .binaryOnWS
                            return .stop
                        }
                        stream.messages.append(ServerMessage(text: false, payload: Array(p)))
                    case .ping(let p): stream.pings.append(Array(p))
                    case .pong: break
                    case .close(let code, _):
                        stream.stop = .close(code)
                        return .stop
                    }
                    return .continue
                }
            } }.get()
        } catch {
            stream.stop = .violation(error.closeCode.rawValue)
        }
        return stream
    }

    struct WSMessageInfo {
        var type = ""
        var seq: Int64?
        var channel = ""
        var broadcast = false
    }

    /// The fields of a /ws message the checks need; throws if it is not a JSON object with a string `type`.
    static func wsMessageInfo(_ payload: [UInt8]) throws(HarnessFailure) -> WSMessageInfo {
        var info = WSMessageInfo()
        var hasType = false
        let ok: Bool = payload.withUnsafeBytes { raw in
            do {
                try JSONScanner.forEachMember(in: raw) { key, value in
                    if key.stringEquals("type", in: raw) && value.kind == .string {
                        info.type = JSONScanner.decodeString(value, in: raw)
                        hasType = true
                    } else if key.stringEquals("seq", in: raw) {
                        info.seq = JSONScanner.int64(value, in: raw)
                    } else if key.stringEquals("channel", in: raw) && value.kind == .string {
                        info.channel = JSONScanner.decodeString(value, in: raw)
                    } else if key.stringEquals("broadcast", in: raw) {
                        info.broadcast = value.kind == .true
                    }
                }
                return true
            } catch {
                return false
            }
        }
        guard ok, hasType else { throw HarnessFailure("/ws message is not a JSON object with a type: \(show(payload))") }
        return info
    }

    static func show(_ bytes: [UInt8]) -> String {
        let head = bytes.prefix(200).map { b -> String in
            (0x20..<0x7F).contains(b) ? String(UnicodeScalar(b)) : "\\x" + String(b, radix: 16)
        }.joined()
        return "\"\(head)\"" + (bytes.count > 200 ? "…(\(bytes.count) bytes)" : "")
    }

    // MARK: Unix-socket target

    /// One Unix-socket connection: byte 0 = small limits (bit 0), a /ws client of `acc_fuzz` subscribed to
    /// `wallet_updates` is connected meanwhile (bit 1: admin views list it, `disconnect` reaches it, publishes are
    /// delivered to it), the harness publishes a broadcast and an account event after every read (bit 2, for
    /// `tail`), the socket is closed at once at the end instead of half-closed (bit 3). The rest is the byte stream,
    /// cut into reads.
    ///
    /// Invariants (docs/PROTOCOL.md section 2): every reply is one JSON object per line with `ok`, one per request
    /// line (blank lines are not requests), in order (each carries its request's `id`), until a `tail` request;
    /// after the tail's reply only event lines; the hub closes when the client does, and nothing is left: the
    /// `SocketConnection` (and any tail) is freed, no timers, no descriptors, the /ws client closes cleanly too.
    @discardableResult
    func runSocket(_ input: UnsafeRawBufferPointer) throws(HarnessFailure) -> SocketRunResult {
        guard let flags = input.first else { return SocketRunResult() }
        let hub = hubs[Int(flags & 1)]
        let withClient = flags & 2 != 0
        let publishing = flags & 4 != 0
        let abrupt = flags & 8 != 0
        try checkIdle(hub, "before the run")
        hub.context.nextSerial = 1

        var companion: (peer: FakePeer, client: ClientConnection)? = nil
        var companionFD: Int32 = -1
        if withClient {
            let (peer, client, fds) = try connectClient(hub)
            companionFD = fds.0
            var hello = prefix(.wsHeaderToken)
            hello += Self.clientFrame(.text, Array(#"{"type":"subscribe","channels":["wallet_updates"],"id":1}"#.utf8))
            try peer.write(hello) { () throws(HarnessFailure) in try self.pump([peer]) }
            try pump([peer])
            guard client.phase == .webSocket, client.channels.count == 1 else {
                throw HarnessFailure("the /ws client did not get upgraded and subscribed: \(Self.show(peer.received))")
            }
            companion = (peer, client)
        }
        weak let weakCompanion = companion?.client
        let companionReceivedBefore = companion?.peer.received.count ?? 0

        let pair = try socketPair()
        SocketAcceptor(context: hub.context).accepted(fd: pair.hub, peer: "unix", on: loop)
        let peer = FakePeer(fd: pair.peer, hubFD: pair.hub, scratch: scratch)
        weak let weakHandler = (loop.registered(fd: pair.hub) as? Connection)?.handler as? SocketConnection
        if weakHandler == nil { throw HarnessFailure("the socket acceptor did not register a SocketConnection") }
        // A second socket connection that publishes (the backend), so tails and the ledger see its events.
        var publisher: FakePeer? = nil
        var publisherFD: Int32 = -1
        if publishing {
            let pair = try socketPair()
            SocketAcceptor(context: hub.context).accepted(fd: pair.hub, peer: "unix", on: loop)
            publisher = FakePeer(fd: pair.peer, hubFD: pair.hub, scratch: scratch)
            publisherFD = pair.hub
        }
        let peers = [peer] + (companion.map { [$0.peer] } ?? []) + (publisher.map { [$0] } ?? [])
        let pump = { () throws(HarnessFailure) in try self.pump(peers) }

        var published = 0
        for piece in Self.reads(input) {
            try peer.write(UnsafeRawBufferPointer(rebasing: input[piece]), pump: pump)
            try pump()
            if let publisher {
                published += 1
                let lines = #"{"op":"publish","channel":"wallet_updates","broadcast":true,"type":"fuzz_event","data":{"n":\#(published)}}"#
                    + "\n" + #"{"op":"publish","channel":"wallet_updates","account":"acc_fuzz","type":"fuzz_event","data":null}"# + "\n"
                try publisher.write(Array(lines.utf8), pump: pump)
                try pump()
            }
        }
        try pump()

        let result = try checkSocketOutput(peer: peer, hub: hub, publishing: publishing)
        if let publisher {
            // The backend's publishes are all acknowledged, whatever the other connection did.
            let acks = publisher.received.split(separator: 0x0A)
            guard acks.count == 2 * published, acks.allSatisfy({ $0.starts(with: Array(#"{"ok":true,"seq":"#.utf8)) }) else {
                throw HarnessFailure("the publisher got \(acks.count) replies for \(2 * published) publishes: \(Self.show(publisher.received))")
            }
            publisher.close()
            try pump()
            try checkClosed(publisherFD)
        }

        if abrupt {
            peer.close()
        } else {
            peer.shutdownWrite()
            try pump()
            guard peer.eof else { throw HarnessFailure("the hub did not close the socket after the client's EOF") }
            peer.close()
        }
        try pump()
        if weakHandler != nil { throw HarnessFailure("the SocketConnection was not freed after close") }
        try checkClosed(pair.hub)

        if let (clientPeer, _) = companion {
            // Whatever the admin requests did to it, its stream is still valid frames, and it closes cleanly.
            let frames = try decodeServerFrames(Array(clientPeer.received[companionReceivedBefore...]), deflate: nil)
            for message in frames.messages { _ = try Self.wsMessageInfo(message.payload) }
            clientPeer.shutdownWrite()
            try pump()
            guard clientPeer.eof else { throw HarnessFailure("the /ws client was not closed after its EOF") }
            clientPeer.close()
        }
        companion = nil
        try pump()
        if weakCompanion != nil { throw HarnessFailure("the /ws client's ClientConnection was not freed") }
        if withClient { try checkClosed(companionFD) }
        try checkIdle(hub, "after close")
        return result
    }

    /// What the client asked on the socket, as docs/PROTOCOL.md section 2 counts requests.
    private struct SocketRequests {
        var ids: [String?] = []
        var tailRequested = false
        /// A line over the limit somewhere: its handling (one error, the rest skipped) is not modelled here.
        var overLong = false
    }

    private func socketRequests(_ sent: [UInt8], hub: HarnessHub) -> SocketRequests {
        let maxLineBytes = hub.configuration.maxLineBytes
        var requests = SocketRequests()
        var start = 0
        while let newline = sent[start...].firstIndex(of: 0x0A) {
            var end = newline
            if end > start && sent[end - 1] == 0x0D { end -= 1 }
            let line = Array(sent[start..<end])
            // The raw length (CR included) counts: the hub may have judged the line before its newline arrived.
            if newline - start > maxLineBytes { requests.overLong = true; return requests }
            start = newline + 1
            if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { continue }
            do {
                let parsed = try SocketRequest.parse(line: line)
                requests.ids.append(parsed.id?.text)
                if case .tail(let channel, _) = parsed.request, hub.core.channelIndex[channel] != nil {
                    requests.tailRequested = true
                    return requests
                }
            } catch {
                requests.ids.append(error.id?.text)
            }
        }
        if sent.count - start > maxLineBytes { requests.overLong = true }
        return requests
    }

    private func checkSocketOutput(peer: FakePeer, hub: HarnessHub, publishing: Bool) throws(HarnessFailure) -> SocketRunResult {
        var result = SocketRunResult()
        result.hubClosed = peer.eof
        let out = peer.received
        var start = 0
        while let newline = out[start...].firstIndex(of: 0x0A) {
            result.lines.append(Array(out[start..<newline]))
            start = newline + 1
        }
        if start < out.count && !peer.eof { throw HarnessFailure("a partial reply line at rest: \(Self.show(Array(out[start...])))") }

        let requests = socketRequests(peer.sent, hub: hub)
        var replyIDs: [String?] = []
        var tailing = false
        var events = 0
        for line in result.lines {
            var ok: Bool? = nil
            var event = false
            var id: String? = nil
            var tailingReply = false
            let valid: Bool = line.withUnsafeBytes { raw in
                do {
                    try JSONScanner.forEachMember(in: raw) { key, value in
                        if key.stringEquals("ok", in: raw) {
                            ok = value.kind == .true ? true : value.kind == .false ? false : nil
                        } else if key.stringEquals("event", in: raw) {
                            event = value.kind == .object
                        } else if key.stringEquals("id", in: raw) {
                            id = String(decoding: raw[value.range], as: UTF8.self)
                        } else if key.stringEquals("tailing", in: raw) {
                            tailingReply = true
                        }
                    }
                    return true
                } catch {
                    return false
                }
            }
            guard valid else { throw HarnessFailure("a reply line that is not a JSON object: \(Self.show(line))") }
            if event {
                guard tailing else { throw HarnessFailure("an event line before any tail: \(Self.show(line))") }
                events += 1
                continue
            }
            guard ok != nil else { throw HarnessFailure("a reply without ok: \(Self.show(line))") }
            if tailing { throw HarnessFailure("a reply after the tail started: \(Self.show(line))") }
            replyIDs.append(id)
            if tailingReply && ok == true { tailing = true }
        }
        if !publishing && events > 0 { throw HarnessFailure("\(events) event lines with nothing published") }
        if !requests.overLong {
            let expected = requests.ids
            if peer.eof ? !expected.starts(with: replyIDs) : replyIDs != expected {
                throw HarnessFailure("replies (ids \(replyIDs)) do not answer the requests (ids \(expected)) one by one, in order")
            }
            if tailing != requests.tailRequested && !peer.eof {
                throw HarnessFailure("tail requested: \(requests.tailRequested), tailing: \(tailing)")
            }
        }
        return result
    }
}
