/// What has been published, per channel, and who is tailing: owned by loop 0, where every Unix-socket
/// connection lives, so it is updated when a batch completes without any lock.
final class PublishLedger {
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
    private(set) var channels: [ChannelRecord]
    private(set) var totalPublished = 0
    private(set) var totalDelivered = 0
    private var tails: [SocketConnection] = []
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
            var record = channels[event.channel]
            record.published += 1
            record.delivered += n
            record.lastEventAt = event.wallTime
            let recent = RecentEvent(type: event.type, account: event.account, seq: event.seq, size: event.frame.count,
                                     delivered: n, at: event.wallTime)
            if record.recent.count < Self.recentLimit {
                record.recent.append(recent)
            } else {
                record.recent[record.recentNext] = recent
            }
            record.recentNext = (record.recentNext + 1) % Self.recentLimit
            channels[event.channel] = record
        }
        guard !tails.isEmpty else { return }
        for (i, event) in events.enumerated() {
            var cached: [UInt8]? = nil
            for tail in tails {
                guard let filter = tail.tail, filter.channel == event.channel else { continue }
                if let account = filter.account, account != event.account { continue }
                let line = cached ?? replyLine {
                    SocketReplies.tailEvent(type: event.type, channel: channelNames[event.channel], account: event.account?.string,
                                            seq: event.seq, delivered: delivered[i], at: event.wallTime, data: event.data, into: &$0)
                }
                cached = line
                tail.sendTailLine(line)
            }
        }
    }

    /// The channel's recent events, newest first.
    func recentEvents(channel: Int) -> [RecentEvent] {
        let record = channels[channel]
        guard record.recent.count == Self.recentLimit else { return record.recent.reversed() }
        let ordered = record.recent[record.recentNext...] + record.recent[..<record.recentNext]
        return ordered.reversed()
    }

    func addTail(_ connection: SocketConnection) { tails.append(connection) }
    func removeTail(_ connection: SocketConnection) { tails.removeAll { $0 === connection } }

    func sample(now: UInt64) {
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
