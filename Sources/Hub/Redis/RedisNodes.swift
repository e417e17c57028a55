/// The registry of hub nodes in a cluster, kept in Redis with heartbeats (for `hubctl nodes`, the cluster-wide admin
/// views, and which nodes' presence counts are live).
///
/// Two keys under one hash tag (one Redis Cluster slot): `P:{nodes}:beats`, a sorted set of node ids scored by their
/// last heartbeat, and `P:{nodes}:info`, a hash of node id → the node's own description (JSON: address, version,
/// connections…). Times are Redis's own clock (`TIME` inside the scripts), so nodes whose clocks disagree still agree
/// on ages. A node is live while its last heartbeat is younger than `staleMillis`; each heartbeat also drops the
/// nodes that went stale (a crashed node disappears within `staleMillis` of its last beat).
public struct RedisNodes: Sendable {
    public let prefix: String
    public let staleMillis: Int

    public init(prefix: String = "hub", staleMillis: Int = 5_000) {
        self.prefix = prefix
        self.staleMillis = max(1, staleMillis)
    }

    public var beatsKey: String { "\(prefix):{nodes}:beats" }
    public var infoKey: String { "\(prefix):{nodes}:info" }

    public struct Node: Sendable, Equatable {
        public let id: String
        /// Milliseconds since its last heartbeat, on Redis's clock.
        public let ageMillis: Int64
        public let info: String
    }

    static let heartbeatScript = """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZADD', KEYS[1], now, ARGV[1])
        redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
        local cutoff = now - tonumber(ARGV[3])
        local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff)
        for _, id in ipairs(dead) do redis.call('HDEL', KEYS[2], id) end
        redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff)
        return now
        """

    static let listScript = """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        local beats = redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf', 'WITHSCORES')
        local out = {}
        for i = 1, #beats, 2 do
          local info = redis.call('HGET', KEYS[2], beats[i]) or ''
          table.insert(out, {beats[i], now - tonumber(beats[i + 1]), info})
        end
        return out
        """

    static let liveScript = """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        return {now, redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')}
        """

    static let leaveScript = """
        redis.call('ZREM', KEYS[1], ARGV[1])
        redis.call('HDEL', KEYS[2], ARGV[1])
        return 1
        """

    private static let heartbeat = RedisScript(heartbeatScript)
    private static let list = RedisScript(listScript)
    private static let leave = RedisScript(leaveScript)
    private static let liveIDs = RedisScript(liveScript)

    /// The ids of the live nodes and Redis's time when they were listed (ms).
    public func live(on redis: any RedisLink, completion: @escaping (Result<(ids: [String], asOf: Int64), RedisError>) -> Void) {
        Self.liveIDs.run(on: redis, keys: [beatsKey, infoKey], arguments: [String(staleMillis)]) { result in
            completion(result.flatMap { value in
                guard let items = value.elements, items.count == 2, let now = items[0].int, let list = items[1].elements else {
                    return .failure(RedisError(.protocolError, "unexpected live nodes reply \(value)"))
                }
                return .success((list.compactMap(\.string), now))
            })
        }
    }

    /// Records that `id` is alive, with its description; replies Redis's time in ms.
    public func heartbeat(id: String, info: String, on redis: any RedisLink, completion: @escaping (Result<Int64, RedisError>) -> Void) {
        Self.heartbeat.run(on: redis, keys: [beatsKey, infoKey], arguments: [id, info, String(staleMillis)]) { result in
            completion(result.flatMap { value in
                guard let now = value.int else { return .failure(RedisError(.protocolError, "unexpected heartbeat reply \(value)")) }
                return .success(now)
            })
        }
    }

    /// The live nodes, sorted by id.
    public func nodes(on redis: any RedisLink, completion: @escaping (Result<[Node], RedisError>) -> Void) {
        Self.list.run(on: redis, keys: [beatsKey, infoKey], arguments: [String(staleMillis)]) { result in
            completion(result.flatMap { value in
                guard let rows = value.elements else { return .failure(RedisError(.protocolError, "unexpected nodes reply")) }
                var nodes: [Node] = []
                for row in rows {
                    guard let fields = row.elements, fields.count == 3, let id = fields[0].string, let age = fields[1].int,
                          let info = fields[2].string else { return .failure(RedisError(.protocolError, "unexpected nodes row")) }
                    nodes.append(Node(id: id, ageMillis: age, info: info))
                }
                return .success(nodes.sorted { $0.id < $1.id })
            })
        }
    }

    /// Removes `id` at once (a graceful stop).
    public func leave(id: String, on redis: any RedisLink, completion: @escaping (Result<Void, RedisError>) -> Void) {
        Self.leave.run(on: redis, keys: [beatsKey, infoKey], arguments: [id]) { result in
            completion(result.map { _ in () })
        }
    }
}
