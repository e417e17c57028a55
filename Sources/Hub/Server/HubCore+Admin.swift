import Glibc
import HubCluster
import HubEngine
import HubJSON
import HubRouting
import Synchronization
import WSProtocol

/// The admin requests' replies (docs/PROTOCOL.md 2.2): each gathers from every loop, and from the other nodes in
/// cluster mode, then writes the fields after `"ok":true`.
extension HubCore {
    func statsJSON(id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        clusterView { [self] view in self.statsJSON(id: id, clusterView: view, done) }
    }

    private func statsJSON(id: RawJSON?, clusterView: ClusterView?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        gather({ LoopSnapshot(context: $0, includeLatency: false) }) { [self] snapshots in
            var w = JSONWriter(capacity: 2048)
            SocketReplies.beginOK(into: &w)
            w.key("stats"); w.beginObject()
            w.field("version", HubVersion.string)
            w.field("uptimeSeconds", wallClockSeconds() - startedAt)
            w.field("pid", Int(getpid()))
            w.field("listen", listenAddress)
            w.field("socket", configuration.socketPath)
            w.field("auth", authDescription)
            w.key("threads"); w.beginArray()
            for s in snapshots {
                w.beginObject(); w.field("index", s.index); w.field("connections", s.counters.upgraded); w.field("busy", s.busy); w.endObject()
            }
            w.endArray()
            let total = snapshots.reduce(into: LoopSnapshot.Totals()) { $0.add($1) }
            w.key("connections"); w.beginObject()
            w.field("open", total.counters.upgraded); w.field("handshaking", total.counters.handshaking); w.field("limit", maxConnections)
            w.endObject()
            w.field("subscriptions", total.subscriptions)
            w.key("messages"); w.beginObject()
            w.field("in", total.counters.messagesIn); w.field("out", total.counters.messagesOut)
            w.field("inPerSecond", total.rates.messagesIn); w.field("outPerSecond", total.rates.messagesOut)
            w.endObject()
            w.key("bytes"); w.beginObject()
            w.field("in", total.engine.bytesIn); w.field("out", total.engine.bytesOut)
            w.field("inPerSecond", total.rates.bytesIn); w.field("outPerSecond", total.rates.bytesOut)
            w.endObject()
            let ledger = snapshots.first?.ledger
            w.key("publishes"); w.beginObject()
            w.field("total", ledger?.totalPublished ?? 0); w.field("perSecond", ledger?.rate ?? 0); w.field("delivered", ledger?.totalDelivered ?? 0)
            w.endObject()
            w.key("drops"); w.beginObject()
            w.field("slowConsumerCloses", total.counters.slowConsumerCloses)
            w.field("rateLimited", total.counters.rateLimited)
            w.field("rejectedConnections", total.counters.rejectedConnections + total.engine.shedConnections)
            w.field("protocolErrors", total.counters.protocolErrors)
            w.endObject()
            w.key("authFailures"); w.beginObject()
            for (reason, n) in total.counters.authFailures.sorted(by: { $0.key < $1.key }) { w.key(reason); w.int(n) }
            w.endObject()
            w.key("descriptors"); w.beginObject()
            w.field("open", openDescriptorCount()); w.field("limit", descriptorLimit)
            w.endObject()
            w.key("tls"); w.beginObject()
            w.field("handshakes", total.engine.tlsHandshakes); w.field("handshakeFailures", total.engine.tlsHandshakeFailures)
            w.field("plaintextRefused", total.engine.tlsPlaintextRefused)
            w.field("helloOnPlainPort", total.counters.tlsHelloOnPlainPort)
            w.field("refusingInTLS", total.counters.busyTLSAnswers)
            w.field("recordLayerConnections", total.engine.tlsRecordLayerConnections)
            w.endObject()
            let history = broker.statistics()
            w.key("history"); w.beginObject()
            w.field("epoch", history.epoch)
            w.field("bytes", history.historyBytes); w.field("limitBytes", history.historyLimitBytes)
            w.field("events", history.events); w.field("streams", history.streams)
            w.field("evictions", history.evictions); w.field("expirations", history.expirations)
            w.field("forgottenStreams", history.forgottenStreams)
            w.field("idempotencyKeys", history.idempotencyKeys); w.field("duplicates", history.duplicates)
            w.key("recoveries"); w.beginObject()
            for (i, label) in RecoveryOutcome.labels.enumerated() { w.key(label); w.int(total.counters.recoveries[i]) }
            w.endObject()
            w.field("replayedEvents", total.counters.replayedEvents)
            w.endObject()
            if let cluster = history.cluster {
                w.key("cluster"); w.beginObject()
                w.field("node", cluster.nodeID)
                w.field("connected", cluster.connected); w.field("subscribed", cluster.subscribed)
                if let error = cluster.lastError { w.field("lastError", error) }
                w.field("published", cluster.published); w.field("publishFailures", cluster.publishFailures)
                w.field("publishScripts", cluster.publishScriptCalls)
                w.field("received", cluster.received); w.field("ignored", cluster.ignored)
                w.field("gaps", cluster.gaps); w.field("filledEvents", cluster.filledEvents); w.field("unfillable", cluster.unfillable)
                w.field("undecodable", cluster.undecodable)
                w.field("epochChanges", cluster.epochChanges); w.field("reconnects", cluster.reconnects)
                w.field("followedStreams", cluster.followedStreams)
                if let clusterView {
                    w.field("nodes", clusterView.nodes)
                    w.field("clusterConnections", clusterView.connections)
                }
                w.endObject()
            }
            w.endObject()
            SocketReplies.finishOK(id: id, into: &w)
            done(w.takeBytes())
        }
    }

    func channelsJSON(id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        clusterView { [self] cluster in self.channelsJSON(id: id, cluster: cluster, done) }
    }

    private func channelsJSON(id: RawJSON?, cluster: ClusterView?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        gather({ ChannelSnapshot(context: $0, channel: nil, account: nil) }) { [self] snapshots in
            var w = JSONWriter(capacity: 1024)
            SocketReplies.beginOK(into: &w)
            if let cluster { w.field("clusterNodes", cluster.nodes) }
            w.key("channels"); w.beginArray()
            for (i, name) in channelNames.enumerated() {
                let merged = ChannelSnapshot.merge(snapshots, channel: i)
                let ledger = snapshots.first?.ledger?.channels[i]
                w.beginObject()
                w.field("name", name)
                w.field("subscribers", merged.subscribers)
                if let cluster { w.field("clusterSubscribers", cluster.subscriptions[name] ?? 0) }
                w.field("accounts", merged.accounts.count)
                w.field("published", ledger?.published ?? 0)
                w.field("publishedPerSecond", ledger?.rate ?? 0)
                w.field("delivered", ledger?.delivered ?? 0)
                w.key("lastEventAt"); if let t = ledger?.lastEventAt { w.double(t) } else { w.null() }
                w.endObject()
            }
            w.endArray()
            SocketReplies.finishOK(id: id, into: &w)
            done(w.takeBytes())
        }
    }

    func channelJSON(_ channel: Int, account: AccountID?, id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        gather({ ChannelSnapshot(context: $0, channel: channel, account: account) }) { [self] snapshots in
            let merged = ChannelSnapshot.merge(snapshots, channel: channel)
            let ledger = snapshots.first?.ledger?.channels[channel]
            var w = JSONWriter(capacity: 2048)
            SocketReplies.beginOK(into: &w)
            w.key("channel"); w.beginObject()
            w.field("name", channelNames[channel])
            w.field("subscribers", merged.subscribers)
            w.field("accounts", merged.accounts.count)
            w.field("published", ledger?.published ?? 0)
            w.field("delivered", ledger?.delivered ?? 0)
            w.key("lastEventAt"); if let t = ledger?.lastEventAt { w.double(t) } else { w.null() }
            w.key("topAccounts"); w.beginArray()
            let top = merged.accounts.filter { account == nil || $0.key == account }
                .sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }.prefix(10)
            for (name, n) in top {
                w.beginObject(); w.field("account", name.string); w.field("subscribers", n); w.endObject()
            }
            w.endArray()
            w.key("recentEvents"); w.beginArray()
            for e in ledger?.recent ?? [] where account == nil || e.account == account {
                w.beginObject()
                w.field("type", e.type)
                w.key("account"); if let a = e.account { w.string(a.string) } else { w.null() }
                w.field("broadcast", e.account == nil)
                w.field("seq", e.seq); w.field("size", e.size); w.field("delivered", e.delivered); w.field("at", e.at)
                w.endObject()
            }
            w.endArray()
            w.endObject()
            SocketReplies.finishOK(id: id, into: &w)
            done(w.takeBytes())
        }
    }

    func connectionsJSON(account: AccountID?, channel: Int?, limit: Int, id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        gather({ context -> (matching: Int, oldest: [ConnectionInfo]) in
            let matching = context.clients.values.filter { c in
                c.phase == .webSocket && !c.awaitingAuth && (account == nil || c.account == account) && (channel == nil || c.channels.contains(channel!))
            }
            // Only a loop's `limit` oldest can be among the `limit` oldest of all: copy no more than those.
            let oldest = matching.sorted { $0.connectedAt < $1.connectedAt }.prefix(limit).map { ConnectionInfo($0) }
            return (matching.count, oldest)
        }) { [self] perLoop in
            let total = perLoop.reduce(0) { $0 + $1.matching }
            let listed = perLoop.flatMap(\.oldest).sorted { $0.connectedAt < $1.connectedAt }.prefix(limit)
            var w = JSONWriter(capacity: 4096)
            SocketReplies.beginOK(into: &w)
            w.field("total", total)
            w.key("connections"); w.beginArray()
            for c in listed {
                w.beginObject()
                w.field("id", c.id)
                w.field("account", c.account.string)
                w.field("remote", c.remote)
                w.key("platform"); if let p = c.platform { w.string(p) } else { w.null() }
                w.key("appVersion"); if let v = c.appVersion { w.string(v) } else { w.null() }
                w.key("channels"); w.beginArray(); for ch in c.channels { w.string(channelNames[ch]) }; w.endArray()
                w.field("connectedAt", c.connectedAt)
                w.field("queuedBytes", c.queuedBytes)
                w.field("messagesIn", c.messagesIn)
                w.field("messagesOut", c.messagesOut)
                w.endObject()
            }
            w.endArray()
            SocketReplies.finishOK(id: id, into: &w)
            done(w.takeBytes())
        }
    }

    /// Events retained more than this are listed in pages (`more`, then `since` = the last seq shown).
    static let historyPageSize = 1000

    /// `{"ok":true,"history":{...}}`: one stream's retained events after `since`, oldest first.
    /// `nodes`: the cluster's live nodes, each with what it says of itself; one line for a hub without `--broker`.
    func nodesJSON(id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        guard let clusterNode else {
            var w = JSONWriter(capacity: 64)
            SocketReplies.beginOK(into: &w)
            w.field("cluster", false)
            w.key("nodes"); w.beginArray(); w.endArray()
            SocketReplies.finishOK(id: id, into: &w)
            return done(w.takeBytes())
        }
        let me = clusterNode.nodeID
        clusterNode.listNodes { result in
            var w = JSONWriter(capacity: 1024)
            switch result {
            case .failure(let failure):
                SocketReplies.error(code: .brokerUnavailable, message: failure.message, id: id, into: &w)
            case .success(let nodes):
                SocketReplies.beginOK(into: &w)
                w.field("cluster", true)
                w.field("node", me)
                w.key("nodes"); w.beginArray()
                for node in nodes {
                    w.beginObject()
                    w.field("id", node.id)
                    w.field("self", node.id == me)
                    w.field("ageMillis", node.ageMillis)
                    // What another node wrote: embedded only if it is valid JSON (Redis is not trusted to hold ours).
                    w.key("info")
                    let info = Array(node.info.utf8)
                    let valid = info.withUnsafeBytes { (try? JSONScanner.validate($0)) != nil }
                    if valid { w.raw(info) } else { w.null() }
                    w.endObject()
                }
                w.endArray()
                SocketReplies.finishOK(id: id, into: &w)
            }
            done(w.takeBytes())
        }
    }

    /// What this node says of itself in the cluster registry: where it listens, its connections, and its
    /// subscriptions per channel (so any node can show the whole cluster).
    func nodeInfoJSON(_ done: @escaping @Sendable (String) -> Void) {
        gather({ context in (0..<context.hub.channelNames.count).map { context.registry.subscriberCount(channel: $0) } }) { [self] perLoop in
            var w = JSONWriter(capacity: 256)
            w.beginObject()
            w.field("listen", listenAddress)
            w.field("socket", configuration.socketPath)
            w.field("version", HubVersion.string)
            w.field("pid", Int(getpid()))
            w.field("connections", clientCount)
            w.field("startedAt", startedAt)
            w.key("subscriptions"); w.beginObject()
            for (i, name) in channelNames.enumerated() {
                w.key(name); w.int(perLoop.reduce(0) { $0 + ($1.indices.contains(i) ? $1[i] : 0) })
            }
            w.endObject()
            w.endObject()
            done(String(decoding: w.bytes, as: UTF8.self))
        }
    }

    /// Cluster mode: `local` (an admin reply of this node) with the same request's replies from every other live node
    /// appended as `"cluster":{"nodes":[{"node":ID,"reply":{…}}],"missing":[IDs that did not answer in 2 s]}`.
    /// Without a cluster, `local` unchanged.
    func withOtherNodes(_ local: [UInt8], asking request: [UInt8], _ done: @escaping @Sendable ([UInt8]) -> Void) {
        guard let clusterNode, local.count >= 2, local[local.count - 2] == UInt8(ascii: "}"), local.last == 0x0A,
              local.starts(with: Array(#"{"ok":true"#.utf8)) else { return done(local) }
        clusterNode.ask(request) { replies, missing in
            // `local` without its closing "}\n", then the cluster member and the close again.
            var w = JSONWriter(capacity: local.count + 64 + replies.reduce(0) { $0 + $1.reply.count + 32 })
            local.withUnsafeBytes { w.raw(UnsafeRawBufferPointer(rebasing: $0.dropLast(2))) }
            Self.writeCluster(replies, missing: missing, into: &w)
            w.endObject()
            w.newline()
            done(w.takeBytes())
        }
    }

    /// Another node asks for this node's own view (cluster-wide `connections` and `channel`) or action
    /// (`disconnect`): answered like a local admin request, without asking further.
    func answerOtherNode(_ line: [UInt8], _ done: @escaping @Sendable ([UInt8]) -> Void) {
        let parsed: ParsedSocketRequest
        do {
            parsed = try SocketRequest.parse(line: line)
        } catch {
            return done(replyLine { SocketReplies.error(error, into: &$0) })
        }
        func notConfigured() -> [UInt8] {
            replyLine { SocketReplies.error(code: .unknownChannel, message: "channel is not configured on this node", id: nil, into: &$0) }
        }
        switch parsed.request {
        case .connections(let account, let channel, let limit):
            let index = channel.flatMap { channelIndex[$0] }
            if channel != nil && index == nil { return done(notConfigured()) }
            connectionsJSON(account: account, channel: index, limit: limit, id: nil, done)
        case .channel(let name, let account):
            guard let index = channelIndex[name] else { return done(notConfigured()) }
            channelJSON(index, account: account, id: nil, done)
        case .disconnect(let target, let code, let reason, _):
            disconnect(target, code: code, reason: reason) { count in
                done(Self.disconnectReply(count, target: target, node: nil, id: nil))
            }
        default:
            done(replyLine { SocketReplies.error(code: .unknownOp, message: "nodes answer only connections, channel and disconnect", id: nil, into: &$0) })
        }
    }

    /// The live nodes' own counts (cluster mode), for the cluster-wide lines of `stats` and `channels`; nil when this
    /// hub is not in a cluster or Redis cannot be asked.
    func clusterView(_ done: @escaping @Sendable (ClusterView?) -> Void) {
        guard let clusterNode else { return done(nil) }
        clusterNode.listNodes { result in
            guard case .success(let nodes) = result else { return done(nil) }
            var view = ClusterView(nodes: nodes.count)
            for node in nodes {
                let info = Array(node.info.utf8)
                info.withUnsafeBytes { bytes in
                    try? JSONScanner.forEachMember(in: bytes) { key, value in
                        let name = JSONScanner.decodeString(key, in: bytes)
                        if name == "connections", let n = JSONScanner.int64(value, in: bytes) {
                            view.connections += Int(clamping: n)
                        } else if name == "subscriptions" {
                            try? JSONScanner.forEachMember(of: value, in: bytes) { channel, count in
                                if let n = JSONScanner.int64(count, in: bytes) {
                                    view.subscriptions[JSONScanner.decodeString(channel, in: bytes), default: 0] += Int(clamping: n)
                                }
                            }
                        }
                    }
                }
            }
            done(view)
        }
    }

    func historyJSON(_ key: StreamKey, since: UInt64, id: RawJSON?) -> [UInt8] {
        historyJSON(view: broker.history(key, after: since), key: key, id: id)
    }

    /// `history` in cluster mode: the stream's retained events are read from Redis.
    func clusterHistoryJSON(_ key: StreamKey, since: UInt64, id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        guard let clusterNode else { return done(historyJSON(key, since: since, id: id)) }
        clusterNode.readHistory(key, after: since, limit: Self.historyPageSize + 1) { [self] result in
            switch result {
            case .success(let view):
                done(historyJSON(view: view, key: key, id: id))
            case .failure(let failure):
                done(replyLine { SocketReplies.error(code: .brokerUnavailable, message: failure.message, id: id, into: &$0) })
            }
        }
    }

    private func historyJSON(view: StreamHistory?, key: StreamKey, id: RawJSON?) -> [UInt8] {
        let events = view?.events ?? []
        let shown = events.prefix(Self.historyPageSize)
        var w = JSONWriter(capacity: 256 + 96 * shown.count)
        SocketReplies.beginOK(into: &w)
        w.key("history"); w.beginObject()
        w.field("channel", channelNames[key.channel])
        w.key("account"); if let a = key.account { w.string(a.string) } else { w.null() }
        w.field("broadcast", key.account == nil)
        w.key("epoch"); if let view { w.string(view.epoch) } else { w.null() }
        w.field("seq", view?.seq ?? 0)
        w.key("events"); w.beginArray()
        let (wallNow, monotonicNow) = (wallClockSeconds(), monotonicNanos())
        for e in shown {
            w.beginObject()
            w.field("seq", e.seq); w.field("type", e.type); w.field("at", e.wallTime(wallNow: wallNow, monotonicNow: monotonicNow))
            w.field("size", e.frame.count)
            w.endObject()
        }
        w.endArray()
        w.field("more", events.count > shown.count)
        w.endObject()
        SocketReplies.finishOK(id: id, into: &w)
        return w.takeBytes()
    }

    /// Closes the matching connections with `code`; `done` gets how many were closed.
    func disconnect(_ target: DisconnectTarget, code: UInt16, reason: String, _ done: @escaping @Sendable (Int) -> Void) {
        let text = reason.isEmpty && code == 1000 ? "disconnected by operator" : reason
        gather({ context in
            var matched: [ClientConnection] = []
            switch target {
            case .connection(let id):
                matched = context.clients.values.filter { $0.id == id && $0.phase == .webSocket }
            case .account(let account):
                matched = context.clients.values.filter { $0.account == account && $0.mode == .hub && $0.phase == .webSocket && !$0.awaitingAuth }
            }
            for c in matched { c.close(code: CloseCode(code), reason: text) }
            return matched.count
        }) { counts in done(counts.reduce(0, +)) }
    }
}
