import HubCluster
import HubEngine
import HubRouting

/// What has been published, per channel, and who is tailing: owned by loop 0, where every Unix-socket
/// connection lives, so it is updated when a batch completes without any lock.
final class PublishLedger {
    /// A tail on another node (cluster mode): this node's matching events are forwarded to it, at most
    /// `forwardPerSecond` lines a second (the rest are counted and reported in one `skipped` line), until it ends
    /// or its lease (`leaseNanos`, renewed every `renewNanos` by its node) runs out.
    struct RemoteTail {
        var node: String
        var id: UInt64
        var channel: Int
        var account: AccountID?
        var expiresAt: UInt64
        var sentThisSecond = 0
        var skipped = 0
    }

    /// How the ledger reaches the other nodes (set by the hub in cluster mode).
    struct TailLinks {
        let nodeID: String
        /// Tells the other nodes of a local tail (`.start`, also to renew it) or its end (`.stop`).
        let announce: (TailMessage) -> Void
        /// Sends one line to the node whose tail asked for it.
        let forward: (_ node: String, _ message: TailMessage) -> Void
    }

    static let forwardPerSecond = 1_000
    static let leaseNanos: UInt64 = 15_000_000_000
    static let renewNanos: UInt64 = 5_000_000_000
    /// Other nodes' tails this node forwards to, at most (an operator's tails are a handful; this bounds what a
    /// runaway or foreign publisher on the control channels could make a node keep).
    static let maxRemoteTails = 256

    struct RecentEvent {
        var type: String
        var account: AccountID?
        var seq: UInt64
        var size: Int
        var delivered: Int
        var at: Double
    }

    struct ChannelRecord {
        var published = 0
        var delivered = 0
        var lastEventAt: Double?
        var recent: [RecentEvent] = []  // ring of `recentLimit`, oldest overwritten
        var recentNext = 0
    }

    static let recentLimit = 20
    // `record` runs for every batch: the fields it touches skip Swift's run-time exclusivity check
    // (`@exclusivity(unchecked)`; docs/ENGINE.md says when that is safe). Each of their accesses is one
    // statement that calls nothing while it lasts (`update` is static and only writes the record).
    @exclusivity(unchecked) private(set) var channels: [ChannelRecord]
    @exclusivity(unchecked) private(set) var totalPublished = 0
    @exclusivity(unchecked) private(set) var totalDelivered = 0
    @exclusivity(unchecked) private var tails: [(id: UInt64, connection: SocketConnection)] = []
    private var nextTailID: UInt64 = 0
    /// Cluster mode: the other nodes' tails this node forwards its events to, and how it reaches them.
    @exclusivity(unchecked) private(set) var remoteTails: [RemoteTail] = []
    var cluster: TailLinks?
    private var lastRenewal: UInt64 = 0
    /// (monotonic ns, total published, per-channel published): one sample per second, 11 kept.
    private var samples: [(at: UInt64, total: Int, perChannel: [Int])] = []
    let channelNames: [String]

    init(channelNames: [String]) {
        self.channelNames = channelNames
        channels = Array(repeating: ChannelRecord(), count: channelNames.count)
    }

    func record(_ events: [PublishedEvent], delivered: [Int]) {
        for (i, event) in events.enumerated() {
            let n = delivered[i]
            totalPublished += 1
            totalDelivered += n
            let recent = RecentEvent(type: event.type, account: event.account, seq: event.seq, size: event.frame.count,
                                     delivered: n, at: event.wallTime)
            // In place: a copy of the record would share its `recent` ring, and writing to it would copy the ring
            // (20 events, two strings each) on every event.
            Self.update(&channels[event.channel], with: recent)
        }
        guard !tails.isEmpty || !remoteTails.isEmpty else { return }
        let node = cluster?.nodeID
        for (i, event) in events.enumerated() {
            var cached: [UInt8]? = nil
            func line() -> [UInt8] {
                if let cached { return cached }
                let made = replyLine {
                    SocketReplies.tailEvent(type: event.type, channel: channelNames[event.channel], account: event.account?.string,
                                            seq: event.seq, delivered: delivered[i], at: event.wallTime, node: node,
                                            data: event.data, into: &$0)
                }
                cached = made
                return made
            }
            for (_, tail) in tails {
                guard let filter = tail.tail, filter.channel == event.channel else { continue }
                if let account = filter.account, account != event.account { continue }
                tail.sendTailLine(line())
            }
            guard let cluster else { continue }
            for r in remoteTails.indices where remoteTails[r].channel == event.channel {
                if let account = remoteTails[r].account, account != event.account { continue }
                if remoteTails[r].sentThisSecond >= Self.forwardPerSecond {
                    remoteTails[r].skipped += 1
                    continue
                }
                remoteTails[r].sentThisSecond += 1
                cluster.forward(remoteTails[r].node, .line(id: remoteTails[r].id, from: cluster.nodeID, bytes: line()))
            }
        }
    }

    private static func update(_ record: inout ChannelRecord, with recent: RecentEvent) {
        record.published += 1
        record.delivered += recent.delivered
        record.lastEventAt = recent.at
        if record.recent.count < recentLimit {
            record.recent.append(recent)
        } else {
            record.recent[record.recentNext] = recent
        }
        record.recentNext = (record.recentNext + 1) % recentLimit
    }

    /// The channel's recent events, newest first.
    func recentEvents(channel: Int) -> [RecentEvent] {
        let record = channels[channel]
        guard record.recent.count == Self.recentLimit else { return record.recent.reversed() }
        let ordered = record.recent[record.recentNext...] + record.recent[..<record.recentNext]
        return ordered.reversed()
    }

    /// A local tail starts; in cluster mode the other nodes are told, so they forward their events to it.
    func addTail(_ connection: SocketConnection) {
        nextTailID += 1
        tails.append((nextTailID, connection))
        if let cluster, let filter = connection.tail {
            cluster.announce(.start(id: nextTailID, from: cluster.nodeID, channel: channelNames[filter.channel],
                                    account: filter.account?.string))
        }
    }

    func removeTail(_ connection: SocketConnection) {
        guard let i = tails.firstIndex(where: { $0.connection === connection }) else { return }
        let id = tails.remove(at: i).id
        if let cluster { cluster.announce(.stop(id: id, from: cluster.nodeID)) }
    }

    /// Another node's tail message (cluster mode).
    func received(_ message: TailMessage, now: UInt64) {
        switch message {
        case .start(let id, let node, let channelName, let account):
            guard let channel = channelNames.firstIndex(where: { ExactString($0) == ExactString(channelName) }) else { return }  // not configured here
            let expiresAt = now + Self.leaseNanos
            if let r = remoteTails.firstIndex(where: { $0.node == node && $0.id == id }) {
                remoteTails[r].expiresAt = expiresAt
            } else if remoteTails.count < Self.maxRemoteTails {
                remoteTails.append(RemoteTail(node: node, id: id, channel: channel, account: account.map { AccountID($0) },
                                              expiresAt: expiresAt))
            }
        case .stop(let id, let node):
            remoteTails.removeAll { $0.node == node && $0.id == id }
        case .line(let id, _, let bytes):
            // Exactly one line (what another node's ledger writes), so nothing can be spliced into the tail's stream.
            guard bytes.count > 1, bytes.firstIndex(of: 0x0A) == bytes.count - 1 else { return }
            tails.first { $0.id == id }?.connection.sendTailLine(bytes)
        }
    }

    func sample(now: UInt64) {
        if let cluster {
            // Once a second: report what each remote tail skipped, drop expired leases, renew our own.
            for r in remoteTails.indices {
                if remoteTails[r].skipped > 0 {
                    let line = replyLine {
                        SocketReplies.tailSkipped(node: cluster.nodeID, channel: channelNames[remoteTails[r].channel],
                                                  events: remoteTails[r].skipped, perSecond: Self.forwardPerSecond, into: &$0)
                    }
                    cluster.forward(remoteTails[r].node, .line(id: remoteTails[r].id, from: cluster.nodeID, bytes: line))
                }
                remoteTails[r].sentThisSecond = 0
                remoteTails[r].skipped = 0
            }
            remoteTails.removeAll { $0.expiresAt <= now }
            if now >= lastRenewal + Self.renewNanos {
                lastRenewal = now
                for (id, connection) in tails {
                    guard let filter = connection.tail else { continue }
                    cluster.announce(.start(id: id, from: cluster.nodeID, channel: channelNames[filter.channel],
                                            account: filter.account?.string))
                }
            }
        }
        samples.append((now, totalPublished, channels.map(\.published)))
        if samples.count > 11 { samples.removeFirst(samples.count - 11) }
    }

    /// Publishes per second over the sampled window (up to 10 s); `channel` nil for all channels.
    func publishRate(channel: Int?) -> Double {
        guard let first = samples.first, let last = samples.last, last.at > first.at else { return 0 }
        let seconds = Double(last.at - first.at) / 1e9
        if let channel { return Double(last.perChannel[channel] - first.perChannel[channel]) / seconds }
        return Double(last.total - first.total) / seconds
    }
}
