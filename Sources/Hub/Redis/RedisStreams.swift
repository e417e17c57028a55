import HubRouting
import WSProtocol

/// Numbering, history and fan-out of event streams kept in Redis: the Redis side of the cluster broker
/// (`RedisBroker`), tested against a real redis-server.
///
/// **Keys.** Every stream belongs to one of `shards` fan-out shards (FNV-1a of its identity). All keys of a stream
/// and its shard's fan-out channel share the shard's hash tag `{N}`, so one script touches one Redis Cluster slot and
/// may `SPUBLISH` to that shard's channel:
/// - `P:{N}:m:ID` — a hash: `epoch` (random per numbering, set by the first publish), `seq` (the last number);
/// - `P:{N}:h:ID` — a Redis Stream, the history: entry ID `SEQ-0` (so "after seq S" is the range `(S-0 +`), one
///   field `e` with the event;
/// - `P:{N}:s:ID` — the stream's own pub/sub channel (layout `streams`, the default): a node subscribes to the
///   streams its connections follow (`SUBSCRIBE`, or `SSUBSCRIBE` with sharded pub/sub);
/// - `P:{N}:fan` — the shard's channel (layout `shards`): every node subscribes to all of them;
/// - `P:{N}:p:ID` — a hash: node id → how many of its connections follow the stream (presence, for `delivered`).
///
/// ID is `a:LEN:CHANNEL:ACCOUNT` for an account stream, `b:LEN:CHANNEL` for a broadcast stream (LEN is the channel
/// name's byte count, so no channel or account spelling can make two streams share a key).
///
/// **Publish** is one script call per batch of events (`publishScript`); for each event: create the stream with the
/// caller's candidate epoch if it has none (or if another Redis process numbered it and this one may have lost what it
/// acknowledged: `epochFunction`), `HINCRBY` the seq, `XADD` with `MAXLEN ~ size`, refresh both keys' TTL, publish the
/// message (`ClusterWire`) on the stream's (or shard's) channel, sum the presence counts of live nodes, answer
/// `[seq, epoch, 0, delivered]`. With an idempotency key (a fourth key, `P:{N}:i:…`, same slot), a key seen within
/// its window answers the first publish's `[seq, epoch, 1, delivered]` and does nothing else; a new one is stored
/// with the window as its TTL. A stream whose keys vanished (TTL, FLUSHALL, a Redis restart without persistence)
/// starts again at 1 under a new epoch: a client resuming with the old epoch is told `epoch_changed`.
///
/// **Read** is one script too, so its parts agree: the epoch, the last seq, the first retained seq, and up to
/// `limit` entries after a position.
public struct RedisStreams: Sendable {
    public let prefix: String
    public let shards: Int
    /// Entries kept per stream (at least; `MAXLEN ~` trims by whole stream nodes).
    public let historySize: Int
    /// Milliseconds a stream's keys live after its last publish (0: forever).
    public let ttlMillis: Int
    /// `SPUBLISH` (Redis 7 sharded pub/sub, for Redis Cluster) instead of `PUBLISH`.
    public let sharded: Bool
    /// Where events are published: one channel per stream (a node subscribes to the streams it serves and receives
    /// only those), or one channel per shard (every node receives every event and filters).
    public let layout: FanoutLayout

    public enum FanoutLayout: String, Sendable, CaseIterable {
        /// `P:{N}:s:ID`, one channel per stream.
        case streams
        /// `P:{N}:fan`, `shards` channels.
        case shards
    }

    public init(prefix: String = "hub", shards: Int = 16, historySize: Int = 100, ttlMillis: Int = 0, sharded: Bool = false,
                layout: FanoutLayout = .shards) {
        self.prefix = prefix
        self.shards = max(1, shards)
        self.historySize = max(0, historySize)
        self.ttlMillis = max(0, ttlMillis)
        self.sharded = sharded
        self.layout = layout
    }

    /// A stream as Redis knows it. Equal and hashed by the bytes of its names (`ExactString`), never by `String`'s
    /// canonical equivalence: two accounts spelled NFC and NFD are two streams.
    public struct Stream: Sendable, Hashable {
        public let channel: String
        /// nil: the channel's broadcast stream.
        public let account: String?

        public init(channel: String, account: String?) {
            self.channel = channel
            self.account = account
        }

        var id: String {
            if let account { return "a:\(channel.utf8.count):\(channel):\(account)" }
            return "b:\(channel.utf8.count):\(channel)"
        }

        /// The id as a key: by bytes.
        var exactID: ExactString { ExactString(id) }

        public static func == (a: Stream, b: Stream) -> Bool {
            ExactString(a.channel) == ExactString(b.channel) && a.account.map { ExactString($0) } == b.account.map { ExactString($0) }
        }

        public func hash(into hasher: inout Hasher) {
            hasher.combine(ExactString(channel))
            hasher.combine(account.map { ExactString($0) })
        }
    }

    public func shard(of stream: Stream) -> Int { shard(ofID: stream.id) }

    private func shard(ofID id: String) -> Int {
        var hash: UInt32 = 2_166_136_261
        for b in id.utf8 {
            hash ^= UInt32(b)
            hash = hash &* 16_777_619
        }
        return Int(hash % UInt32(shards))
    }

    /// A stream's ID, shard and key prefix `P:{N}:`, worked out once per call.
    private struct Located {
        let id: String
        let shard: Int
        let base: String
    }

    private func locate(_ stream: Stream) -> Located {
        let id = stream.id
        let shard = shard(ofID: id)
        return Located(id: id, shard: shard, base: "\(prefix):{\(shard)}:")
    }

    public func metaKey(_ stream: Stream) -> String { metaKey(locate(stream)) }
    public func historyKey(_ stream: Stream) -> String { historyKey(locate(stream)) }
    private func metaKey(_ s: Located) -> String { s.base + "m:" + s.id }
    private func historyKey(_ s: Located) -> String { s.base + "h:" + s.id }
    public func fanoutChannel(shard: Int) -> String { "\(prefix):{\(shard)}:fan" }
    /// The channel a stream's events are published on (with the `streams` layout).
    public func streamChannel(_ stream: Stream) -> String { streamChannel(locate(stream)) }
    private func streamChannel(_ s: Located) -> String { s.base + "s:" + s.id }
    public var fanoutChannels: [String] { (0..<shards).map { fanoutChannel(shard: $0) } }

    // MARK: Scripts

    /// The stream's epoch (`mk` its meta hash, `hk` its history), created with `candidate` if there is none.
    /// `server` is `RUNID/always` or `RUNID/lossy` (`RedisConnection.serverIdentity`). A stream last numbered by
    /// another Redis process may have been rewound (restored from an older snapshot, or the last second of an
    /// `everysec` append-only file lost in a crash): unless this Redis keeps everything it acknowledged, the stream
    /// starts a new numbering under a new epoch (with a candidate: a publish, or a subscribe that follows it), so no
    /// seq is ever given to two events.
    static let epochFunction = """
        local function current(mk, hk, candidate, server)
          local sep = string.find(server, '/', 1, true)
          local run = string.sub(server, 1, sep - 1)
          local meta = redis.call('HMGET', mk, 'epoch', 'run')
          local epoch = meta[1]
          if epoch and meta[2] ~= run then
            if string.sub(server, sep + 1) == 'always' then
              redis.call('HSET', mk, 'run', run)
            elseif candidate then
              redis.call('DEL', hk)
              epoch = false
            end
          end
          if not epoch and candidate then
            epoch = candidate
            redis.call('HSET', mk, 'epoch', epoch, 'seq', 0, 'run', run)
          end
          return epoch
        end

        """

    /// A batch of publishes in one script call: what Redis pays per call (reading the command, entering Lua,
    /// writing the reply) is paid once per batch. ARGV[1..10] are shared (candidate epoch, history size, TTL,
    /// `PUBLISH`/`SPUBLISH`, server identity, idempotency window, node registry key, its staleness, the listed live
    /// nodes, their time); then four per event (its key count, channel, stream id, event), with its 3 or 4 keys in
    /// KEYS in the same order. Each event runs under `pcall`: one that fails (a key of the wrong type) answers
    /// `{0, error, 2, 0}` and the others go on. The reply is four items per event: seq, epoch, duplicate, delivered.
    static let publishScript = epochFunction + """
        local cutoff = nil
        if ARGV[7] ~= '' and tonumber(ARGV[8]) > 0 then
          local t = redis.call('TIME')
          cutoff = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[8])
        end
        local listed = nil
        if ARGV[9] ~= '' then
          listed = {}
          for id in string.gmatch(ARGV[9], '[^,]+') do listed[id] = true end
        end
        local asOf = tonumber(ARGV[10])
        local fresh = {}
        local function alive(node, at)
          if listed and not listed[node] then
            if at == '' or tonumber(at) <= asOf then return false end
          end
          if cutoff then
            if fresh[node] == nil then
              local beat = redis.call('ZSCORE', ARGV[7], node)
              fresh[node] = (beat and tonumber(beat) >= cutoff) or false
            end
            return fresh[node]
          end
          return true
        end
        local function one(k, a)
          local mk, hk, pk = KEYS[k], KEYS[k + 1], KEYS[k + 2]
          local ik = nil
          if ARGV[a] == '4' then ik = KEYS[k + 3] end
          if ik then
            local prior = redis.call('GET', ik)
            if prior then
              local x = string.find(prior, ' ', 1, true)
              local y = string.find(prior, ' ', x + 1, true)
              return tonumber(string.sub(prior, 1, x - 1)), string.sub(prior, x + 1, y - 1), 1, tonumber(string.sub(prior, y + 1))
            end
          end
          local epoch = current(mk, hk, ARGV[1], ARGV[5])
          local seq = redis.call('HINCRBY', mk, 'seq', 1)
          if tonumber(ARGV[2]) > 0 then
            redis.call('XADD', hk, 'MAXLEN', '~', ARGV[2], seq .. '-0', 'e', ARGV[a + 3])
          end
          if tonumber(ARGV[3]) > 0 then
            redis.call('PEXPIRE', mk, ARGV[3])
            redis.call('PEXPIRE', hk, ARGV[3])
          end
          redis.call(ARGV[4], ARGV[a + 1], #epoch .. ':' .. epoch .. seq .. ':' .. #ARGV[a + 2] .. ':' .. ARGV[a + 2] .. ARGV[a + 3])
          local delivered = 0
          local present = redis.call('HGETALL', pk)
          for i = 1, #present, 2 do
            local count, at = string.match(present[i + 1], '^(%d+):?(%d*)$')
            if count then
              if alive(present[i], at) then
                delivered = delivered + tonumber(count)
              else
                redis.call('HDEL', pk, present[i])
              end
            end
          end
          if ik then
            redis.call('SET', ik, seq .. ' ' .. epoch .. ' ' .. delivered, 'PX', ARGV[6])
          end
          return seq, epoch, 0, delivered
        end
        local out = {}
        local k, a = 1, 11
        while a <= #ARGV do
          local ok, seq, epoch, duplicate, delivered = pcall(one, k, a)
          if ok then
            out[#out + 1] = seq
            out[#out + 1] = epoch
            out[#out + 1] = duplicate
            out[#out + 1] = delivered
          else
            local message = seq
            if type(message) == 'table' then message = message.err or message.ok end
            out[#out + 1] = 0
            out[#out + 1] = tostring(message)
            out[#out + 1] = 2
            out[#out + 1] = 0
          end
          k = k + tonumber(ARGV[a])
          a = a + 4
        end
        return out
        """

    static let presenceScript = """
        if ARGV[2] == '0' then return redis.call('HDEL', KEYS[1], ARGV[1]) end
        local t = redis.call('TIME')
        return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
        """

    static let readScript = epochFunction + """
        local candidate = nil
        if ARGV[3] ~= '' then candidate = ARGV[3] end
        local epoch = current(KEYS[1], KEYS[2], candidate, ARGV[5])
        if not epoch then return {false, 0, 0, {}} end
        if epoch == candidate and tonumber(ARGV[4]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
        local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
        local oldest = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
        local first = 0
        if #oldest > 0 then first = tonumber(string.match(oldest[1][1], '^(%d+)-')) end
        local entries = {}
        if tonumber(ARGV[2]) > 0 then
          entries = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1] .. '-0', '+', 'COUNT', ARGV[2])
        end
        return {epoch, seq, first, entries}
        """

    // MARK: Publish

    /// The reply of a publish: the event's number in its stream, and the stream's epoch; for a repeated idempotency
    /// key, the first publish's, with `duplicate` set (and nothing numbered, kept or published again).
    public struct Numbered: Sendable, Equatable {
        public let seq: UInt64
        public let epoch: String
        public var duplicate = false
        /// The connections subscribed to the stream cluster-wide when it was numbered: the sum of the live nodes'
        /// counts in the stream's presence hash (for a duplicate, the first publish's).
        public var delivered = 0
    }

    public func idempotencyKey(_ stream: Stream, _ key: String) -> String { idempotencyKey(locate(stream), key) }

    private func idempotencyKey(_ s: Located, _ key: String) -> String { s.base + "i:\(s.id.utf8.count):\(s.id):\(key)" }

    /// One event of a `publish` batch.
    public struct Publication: Sendable {
        public let event: String
        public let stream: Stream
        public let idempotencyKey: String?

        public init(_ event: String, to stream: Stream, idempotencyKey: String? = nil) {
            self.event = event
            self.stream = stream
            self.idempotencyKey = idempotencyKey
        }
    }

    /// Numbers `event` in `stream`, keeps it in the history and publishes it on the stream's shard channel: a batch
    /// of one.
    public func publish(_ event: String, to stream: Stream, candidateEpoch: String, idempotencyKey key: String? = nil,
                        windowMillis: Int = 300_000, liveness: RedisNodes? = nil, liveNodes: (ids: [String], asOf: Int64)? = nil,
                        on redis: any RedisLink,
                        completion: @escaping (Result<Numbered, RedisError>) -> Void) {
        publish([Publication(event, to: stream, idempotencyKey: key)], candidateEpoch: candidateEpoch, windowMillis: windowMillis,
                liveness: liveness, liveNodes: liveNodes, on: redis) { result in
            completion(result.flatMap { $0.first ?? .failure(RedisError(.protocolError, "an empty publish reply")) })
        }
    }

    /// Numbers each event in its stream, keeps it in the history and publishes it, in order, with one script call.
    /// On a Redis Cluster every stream of a batch must be in one shard (one slot).
    /// `candidateEpoch` becomes the epoch of a stream that has none yet (pass a fresh random one; streams created by
    /// one batch share it, each under its own numbering).
    /// With an idempotency key, a repeat of the key in this stream within `windowMillis` is answered with the first
    /// publish's seq and epoch (the key lives in Redis, so a retry through another node is recognised too).
    /// `liveness`: the node registry whose heartbeats decide which nodes' presence counts are live (nil: all are;
    /// with Redis Cluster the registry lives in another slot, so the script cannot consult it). `liveNodes`: instead,
    /// the ids of the live nodes as the registry listed them at Redis time `asOf` (ms; the caller's copy, refreshed at
    /// each heartbeat): a presence field of a node not listed counts only if it was written after `asOf` (a node that
    /// joined since; fields written with `setPresence(stamped: true)` carry their time), and is removed otherwise.
    /// The outer failure is the call's (nothing ran, or its answer was lost); an inner one is one event's script
    /// error (`.scriptFailed`: it may have been numbered before it failed).
    public func publish(_ batch: [Publication], candidateEpoch: String, windowMillis: Int = 300_000, liveness: RedisNodes? = nil,
                        liveNodes: (ids: [String], asOf: Int64)? = nil, on redis: any RedisLink,
                        completion: @escaping (Result<[Result<Numbered, RedisError>], RedisError>) -> Void) {
        var keys: [String] = []
        keys.reserveCapacity(batch.count * 3)
        var arguments = [candidateEpoch, String(historySize), String(ttlMillis), sharded ? "SPUBLISH" : "PUBLISH",
                         RedisConnection.serverIdentityArgument, String(max(1, windowMillis)),
                         liveness?.beatsKey ?? "", String(liveness?.staleMillis ?? 0),
                         (liveNodes?.ids ?? []).joined(separator: ","), String(liveNodes?.asOf ?? 0)]
        arguments.reserveCapacity(arguments.count + batch.count * 4)
        for p in batch {
            let s = locate(p.stream)
            keys.append(metaKey(s))
            keys.append(historyKey(s))
            keys.append(presenceKey(s))
            if let key = p.idempotencyKey { keys.append(idempotencyKey(s, key)) }
            arguments.append(p.idempotencyKey == nil ? "3" : "4")
            arguments.append(layout == .streams ? streamChannel(s) : fanoutChannel(shard: s.shard))
            arguments.append(s.id)
            arguments.append(p.event)
        }
        let count = batch.count
        RedisScript.publish.run(on: redis, keys: keys, arguments: arguments) { result in
            completion(result.flatMap { value in Self.parsePublished(value, count: count) })
        }
    }

    static func parsePublished(_ value: RESPValue, count: Int) -> Result<[Result<Numbered, RedisError>], RedisError> {
        guard let items = value.elements, items.count == 4 * count else {
            return .failure(RedisError(.protocolError, "unexpected publish reply \(value)"))
        }
        var out: [Result<Numbered, RedisError>] = []
        out.reserveCapacity(count)
        for i in 0..<count {
            let base = 4 * i
            guard let seq = items[base].int, let text = items[base + 1].string, let flag = items[base + 2].int,
                  let delivered = items[base + 3].int else {
                return .failure(RedisError(.protocolError, "unexpected publish reply \(value)"))
            }
            if flag == 2 {
                out.append(.failure(RedisError(.scriptFailed, "the publish script failed: \(text)")))
            } else if seq > 0 {
                out.append(.success(Numbered(seq: UInt64(seq), epoch: text, duplicate: flag == 1, delivered: Int(clamping: delivered))))
            } else {
                return .failure(RedisError(.protocolError, "unexpected publish reply \(value)"))
            }
        }
        return .success(out)
    }

    // MARK: Presence

    /// `P:{N}:p:ID`, a hash of node id → how many of that node's connections follow the stream.
    public func presenceKey(_ stream: Stream) -> String { presenceKey(locate(stream)) }
    private func presenceKey(_ s: Located) -> String { s.base + "p:" + s.id }

    /// Sets this node's count of connections following `stream` (0 removes the node's field). `stamped`: the field
    /// is `COUNT:MS`, with Redis's time of the write (see `publish`'s `liveNodes`); otherwise `COUNT`.
    public func setPresence(_ stream: Stream, node: String, count: Int, stamped: Bool = false, on redis: any RedisLink,
                            completion: @escaping (Result<RESPValue, RedisError>) -> Void = { _ in }) {
        let key = presenceKey(stream)
        if stamped {
            RedisScript.presence.run(on: redis, keys: [key], arguments: [node, String(max(0, count))], completion: completion)
        } else if count > 0 {
            redis.send(["HSET", key, node, String(count)], reply: completion)
        } else {
            redis.send(["HDEL", key, node], reply: completion)
        }
    }

    // MARK: Read

    /// What a read of a stream found, all at one instant.
    public struct Read: Sendable, Equatable {
        /// nil: Redis has no such stream (never published, expired, or lost).
        public let epoch: String?
        /// The last seq.
        public let seq: UInt64
        /// The oldest retained seq (0: none retained).
        public let firstRetained: UInt64
        /// Entries after the position asked for, oldest first: (seq, event).
        public let entries: [Entry]
    }

    public struct Entry: Sendable, Equatable {
        public let seq: UInt64
        /// The event as the publisher encoded it (`ClusterWire` event).
        public let event: [UInt8]
    }

    /// Reads the stream's position and up to `limit` entries after `after` (limit 0: the position only). With
    /// `createEpoch`, a stream Redis does not have is created at seq 0 with that epoch (a subscription starts
    /// following it, so its numbering is fixed from now on).
    public func read(_ stream: Stream, after: UInt64, limit: Int, createEpoch: String? = nil, on redis: any RedisLink,
                     completion: @escaping (Result<Read, RedisError>) -> Void) {
        let s = locate(stream)
        let arguments = [String(after), String(max(0, limit)), createEpoch ?? "", String(ttlMillis), RedisConnection.serverIdentityArgument]
        RedisScript.read.run(on: redis, keys: [metaKey(s), historyKey(s)], arguments: arguments) { result in
            completion(result.flatMap(Self.parseRead))
        }
    }

    static func parseRead(_ value: RESPValue) -> Result<Read, RedisError> {
        func bad() -> Result<Read, RedisError> { .failure(RedisError(.protocolError, "unexpected read reply")) }
        guard let items = value.elements, items.count == 4, let seq = items[1].int, seq >= 0,
              let first = items[2].int, first >= 0, let list = items[3].elements else { return bad() }
        let epoch: String?
        switch items[0] {
        case .null, .boolean(false): epoch = nil  // Lua false: nil under RESP3, a null bulk under RESP2
        default:
            guard let e = items[0].string else { return bad() }
            epoch = e
        }
        var entries: [Entry] = []
        entries.reserveCapacity(list.count)
        for entry in list {
            // [ "SEQ-0", ["e", EVENT] ]
            guard let parts = entry.elements, parts.count == 2, let id = parts[0].string, let fields = parts[1].elements,
                  fields.count == 2, case .bulk(let event) = fields[1],
                  let dash = id.firstIndex(of: "-"), let seq = UInt64(id[..<dash]) else { return bad() }
            entries.append(Entry(seq: seq, event: event))
        }
        return .success(Read(epoch: epoch, seq: UInt64(seq), firstRetained: UInt64(first), entries: entries))
    }

    // MARK: Fan-out messages

    /// One message from a fan-out channel.
    public struct Message: Sendable, Equatable {
        public let epoch: String
        public let seq: UInt64
        /// The stream's ID as in its keys (`a:…` or `b:…`), by bytes.
        public let streamID: ExactString
        /// The event as the publisher encoded it (`ClusterWire` event).
        public let event: [UInt8]
    }

    /// Parses a push message (`message`/`smessage`, channel, payload) from a fan-out channel; nil for any other push,
    /// and for a payload that is not a `ClusterWire` message with a UTF-8 epoch and id.
    public func message(from push: RESPValue) -> Message? {
        guard case .push(let items) = push, items.count == 3, let kind = items[0].string,
              kind == "message" || kind == "smessage", case .bulk(let payload) = items[2] else { return nil }
        return payload.withUnsafeBytes { bytes -> Message? in
            guard let m = ClusterWire.message(bytes),
                  let epoch = String(validating: bytes[m.epoch], as: UTF8.self),
                  let id = String(validating: bytes[m.streamID], as: UTF8.self) else { return nil }
            return Message(epoch: epoch, seq: m.seq, streamID: ExactString(id), event: Array(bytes[m.event]))
        }
    }
}

/// A Lua script run with `EVALSHA`, loaded on first use and again after `NOSCRIPT` (a restarted or flushed Redis).
struct RedisScript: Sendable {
    let source: String
    let sha1: String

    init(_ source: String) {
        self.source = source
        // Redis names a cached script by the lowercase hex SHA-1 of its source.
        sha1 = SHA1.hash(Array(source.utf8)).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }

    static let publish = RedisScript(RedisStreams.publishScript)
    static let read = RedisScript(RedisStreams.readScript)
    static let presence = RedisScript(RedisStreams.presenceScript)

    func run(on redis: any RedisLink, keys: [String], arguments: [String], completion: @escaping (Result<RESPValue, RedisError>) -> Void) {
        let tail = [String(keys.count)] + keys + arguments
        redis.send(["EVALSHA", sha1] + tail) { result in
            if case .failure(let error) = result, error.kind == .server, error.message.hasPrefix("NOSCRIPT") {
                // EVAL runs it and caches it under the same SHA-1 for the next EVALSHA.
                redis.send(["EVAL", source] + tail, reply: completion)
            } else {
                completion(result)
            }
        }
    }
}
