import HubCluster
import HubJSON
import HubRouting

/// Operator actions that reach across the cluster: `disconnect` on other nodes. (Cluster-wide views are
/// `withOtherNodes` in HubCore+Admin; cluster-wide tails are in `PublishLedger` and `SocketConnection`.)
extension HubCore {
    /// An operator's `disconnect`. Without a cluster, or for a connection id without `node`: this node's connections
    /// (connection ids are per node). An account without `node`: its connections on every live node, and
    /// `disconnected` is the cluster-wide total, with each other node's own reply under `cluster`. With `node`: on that
    /// node only (`NOT_FOUND` when no live node has that id).
    func operatorDisconnect(_ target: DisconnectTarget, code: UInt16, reason: String, node: String?, line: [UInt8],
                            id: RawJSON?, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        if let node {
            guard let clusterNode else {
                return done(replyLine {
                    SocketReplies.error(code: .notFound, message: "no node \(quotedForMessage(node)): this hub is not in a cluster", id: id, into: &$0)
                })
            }
            if node != clusterNode.nodeID {
                return clusterNode.ask(line, only: node) { replies, missing in
                    done(Self.relay(replies.first?.reply, from: node, missing: !missing.isEmpty, id: id))
                }
            }
        }
        disconnect(target, code: code, reason: reason) { [self] count in
            let local = Self.disconnectReply(count, target: target, node: clusterNode?.nodeID, id: id)
            guard case .account = target, node == nil, let clusterNode else { return done(local) }
            clusterNode.ask(line) { replies, missing in
                var total = count
                for (_, reply) in replies { total += Self.disconnectedCount(in: reply) ?? 0 }
                var w = JSONWriter(capacity: 256 + 96 * replies.count)
                SocketReplies.beginOK(into: &w)
                w.field("disconnected", total)
                Self.writeCluster(replies, missing: missing, into: &w)
                SocketReplies.finishOK(id: id, into: &w)
                done(w.takeBytes())
            }
        }
    }

    /// This node's `disconnect` reply: the count, or `NOT_FOUND` for a connection id that matched nothing.
    static func disconnectReply(_ count: Int, target: DisconnectTarget, node: String?, id: RawJSON?) -> [UInt8] {
        if count == 0, case .connection(let cid) = target {
            let whereText = node.map { " on node \(quotedForMessage($0)) (connection ids are per node: name another with \"node\")" } ?? ""
            return replyLine {
                SocketReplies.error(SocketRequestError(.notFound, "no connection with id \(quotedForMessage(cid))\(whereText)", id: id), into: &$0)
            }
        }
        return replyLine { SocketReplies.disconnected(count, id: id, into: &$0) }
    }

    /// Another node's `disconnect` reply, passed on under this request's `id` with `"node"` added; `NOT_FOUND`
    /// when the node is not live, `BROKER_UNAVAILABLE` when it did not answer in time.
    static func relay(_ reply: [UInt8]?, from node: String, missing: Bool, id: RawJSON?) -> [UInt8] {
        guard let reply else {
            let message = missing ? "node \(quotedForMessage(node)) did not answer within 2 s"
                                  : "no live node \(quotedForMessage(node)) (hubctl nodes lists them)"
            return replyLine { SocketReplies.error(code: missing ? .brokerUnavailable : .notFound, message: message, id: id, into: &$0) }
        }
        if let count = disconnectedCount(in: reply) {
            var w = JSONWriter(capacity: 96)
            SocketReplies.beginOK(into: &w)
            w.field("disconnected", count)
            w.field("node", node)
            SocketReplies.finishOK(id: id, into: &w)
            return w.takeBytes()
        }
        // An error reply (its code and message are the node's): kept if it is one, else reported as unreadable.
        var code: SocketErrorCode = .brokerUnavailable
        var message = "node \(quotedForMessage(node)) sent an unreadable reply"
        reply.withUnsafeBytes { bytes in
            try? JSONScanner.forEachMember(in: bytes) { key, value in
                guard JSONScanner.decodeString(key, in: bytes) == "error" else { return }
                try? JSONScanner.forEachMember(of: value, in: bytes) { k, v in
                    guard v.kind == .string else { return }
                    switch JSONScanner.decodeString(k, in: bytes) {
                    case "code": if let c = SocketErrorCode(rawValue: JSONScanner.decodeString(v, in: bytes)) { code = c }
                    case "message": message = "node \(quotedForMessage(node)): " + JSONScanner.decodeString(v, in: bytes)
                    default: break
                    }
                }
            }
        }
        return replyLine { SocketReplies.error(code: code, message: message, id: id, into: &$0) }
    }

    /// `disconnected` of an `{"ok":true,"disconnected":N}` reply; nil for anything else.
    static func disconnectedCount(in reply: [UInt8]) -> Int? {
        var ok = false, count: Int? = nil
        reply.withUnsafeBytes { bytes in
            try? JSONScanner.forEachMember(in: bytes) { key, value in
                switch JSONScanner.decodeString(key, in: bytes) {
                case "ok": ok = value.kind == .true
                case "disconnected": count = JSONScanner.int64(value, in: bytes).flatMap { $0 >= 0 ? Int(exactly: $0) : nil }
                default: break
                }
            }
        }
        return ok ? count : nil
    }

    /// `"cluster":{"nodes":[{"node":ID,"reply":{…}}],"missing":[IDs]}`: other nodes' replies, embedded only if valid
    /// JSON (another node's words). Used by `withOtherNodes` and the cluster-wide `disconnect`.
    static func writeCluster(_ replies: [(node: String, reply: [UInt8])], missing: [String], into w: inout JSONWriter) {
        w.key("cluster"); w.beginObject()
        w.key("nodes"); w.beginArray()
        for (node, reply) in replies {
            w.beginObject()
            w.field("node", node)
            w.key("reply")
            var body = reply
            while body.last == 0x0A || body.last == 0x0D { body.removeLast() }
            let valid = body.withUnsafeBytes { (try? JSONScanner.validate($0)) != nil }
            if valid { w.raw(body) } else { w.null() }
            w.endObject()
        }
        w.endArray()
        w.key("missing"); w.beginArray()
        for node in missing { w.string(node) }
        w.endArray()
        w.endObject()
    }
}
