import Glibc
import WSProtocol

/// One connection on the Unix socket: the backend publishing, or `hubctl`.
///
/// Newline-delimited requests, one reply line each, in request order, pipelining allowed. Lines are parsed in
/// place in the read buffer (an incomplete last line is left to the engine, which hands it back in front of the
/// next read). The publishes of one read go to the broker as one batch. Replies wait in a FIFO of slots so a
/// fast reply never overtakes a slower one before it.
///
/// All socket connections live on loop 0 (see `HubServer`), which also owns the publish ledger and the tails.
final class SocketConnection: ConnectionHandler {
    /// One reply, possibly not known yet.
    final class Slot {
        var bytes: [UInt8]?
        init(_ bytes: [UInt8]? = nil) { self.bytes = bytes }
    }

    let context: LoopContext
    var connection: Connection!
    private var slots: [Slot] = []
    private var slotHead = 0
    private var drafts: [EventDraft] = []
    private var draftSlots: [(slot: Slot, id: RawJSON?)] = []
    private var skippingLongLine = false
    private(set) var tail: (channel: Int, account: AccountID?)?
    /// The tail starts receiving events only once every reply before it, and its own `tailing` reply, is written:
    /// events must not overtake earlier replies, and publishes sent before the tail request are not tailed.
    private var tailAwaitingStart = false
    private var paused = false

    /// Past this many unanswered requests or queued reply bytes, stop reading until the client catches up.
    static let maxPendingReplies = 65_536
    static let maxQueuedReplyBytes = 1 << 20

    init(context: LoopContext) {
        self.context = context
    }

    var hub: HubCore { context.hub }
    private var pendingCount: Int { slots.count - slotHead }

    // MARK: ConnectionHandler

    func connectionReadable(_ connection: Connection, _ bytes: UnsafeMutableRawBufferPointer) -> Int {
        guard tail == nil else { return bytes.count }  // a tailing connection accepts no further requests
        let base = bytes.baseAddress!
        let count = bytes.count
        var start = 0
        while start < count, let found = memchr(base + start, 0x0A, count - start) {
            let newline = base.distance(to: found)
            var end = newline
            if end > start && base.load(fromByteOffset: end - 1, as: UInt8.self) == 0x0D { end -= 1 }
            if skippingLongLine {
                skippingLongLine = false
            } else if end - start > hub.configuration.maxLineBytes {
                replyError(.lineTooLong, "line of \(end - start) bytes exceeds the limit of \(hub.configuration.maxLineBytes)", id: nil)
            } else {
                handleLine(UnsafeRawBufferPointer(start: base + start, count: end - start))
            }
            start = newline + 1
            if tail != nil { start = count; break }
        }
        if count - start > hub.configuration.maxLineBytes {
            // No newline in sight and already too long: answer now and drop the rest of this line as it arrives.
            if !skippingLongLine {
                replyError(.lineTooLong, "line exceeds the limit of \(hub.configuration.maxLineBytes) bytes", id: nil)
                skippingLongLine = true
            }
            start = count
        }
        submitDrafts()
        flushReplies()
        return start
    }

    func connectionWritable(_ connection: Connection) {
        resumeIfCaughtUp()
    }

    func connectionClosed(_ connection: Connection, reason: CloseReason) {
        if tail != nil { context.ledger?.removeTail(self) }
        self.connection = nil
    }

    // MARK: Requests

    private func handleLine(_ line: UnsafeRawBufferPointer) {
        // Blank lines (e.g. a trailing "\n\n") are not requests.
        if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { return }
        let parsed: ParsedSocketRequest
        do {
            parsed = try SocketRequest.parse(line: line)
        } catch {
            return append(Slot(replyLine { SocketReplies.error(error, into: &$0) }))
        }
        let id = parsed.id
        switch parsed.request {
        case .publish(let request):
            publish(request, line: line, id: id)
        case .stats:
            pending { hub, done in hub.statsJSON(id: id, done) }
        case .channels:
            pending { hub, done in hub.channelsJSON(id: id, done) }
        case .channel(let name, let account):
            guard let index = hub.channelIndex[name] else { return replyUnknownChannel(name, id: id) }
            pending { hub, done in hub.channelJSON(index, account: account, id: id, done) }
        case .connections(let account, let channel, let limit):
            var channelIndex: Int? = nil
            if let channel {
                guard let index = hub.channelIndex[channel] else { return replyUnknownChannel(channel, id: id) }
                channelIndex = index
            }
            pending { hub, done in hub.connectionsJSON(account: account, channel: channelIndex, limit: limit, id: id, done) }
        case .disconnect(let target, let code, let reason):
            let slot = Slot()
            append(slot)
            let loop = context.loop
            let me = LoopBound(self)
            let box = LoopOwned(slot)
            hub.disconnect(target, code: code, reason: reason) { count in
                loop.execute {
                    if count == 0, case .connection(let cid) = target {
                        box.value.bytes = replyLine {
                            SocketReplies.error(SocketRequestError(.notFound, "no connection with id \"\(cid)\"", id: id), into: &$0)
                        }
                    } else {
                        box.value.bytes = replyLine { SocketReplies.disconnected(count, id: id, into: &$0) }
                    }
                    me.value?.flushReplies()
                }
            }
        case .history(let channel, let account, let since):
            guard let index = hub.channelIndex[channel] else { return replyUnknownChannel(channel, id: id) }
            append(Slot(hub.historyJSON(StreamKey(channel: index, account: account), since: since, id: id)))
        case .tail(let channel, let account):
            guard let index = hub.channelIndex[channel] else { return replyUnknownChannel(channel, id: id) }
            submitDrafts()  // publishes before the tail request are not tailed (see `tailAwaitingStart`)
            append(Slot(replyLine { SocketReplies.tailing(channel: channel, id: id, into: &$0) }))
            tail = (index, account)
            tailAwaitingStart = true
        }
    }

    private func publish(_ request: PublishRequest, line: UnsafeRawBufferPointer, id: RawJSON?) {
        if hub.isShuttingDown {
            return replyError(.shuttingDown, "the hub is shutting down and accepts no more publishes", id: id)
        }
        guard let channel = hub.channelIndex[request.channel] else { return replyUnknownChannel(request.channel, id: id) }
        do {
            try request.validate(isConfigured: { _ in true }, maxEventBytes: hub.configuration.maxEventBytes, id: id)
        } catch {
            return append(Slot(replyLine { SocketReplies.error(error, into: &$0) }))
        }
        let account: AccountID?
        switch request.target {
        case .account(let a): account = a
        case .broadcast: account = nil
        }
        let slot = Slot()
        append(slot)
        drafts.append(EventDraft(channel: channel, account: account, type: request.type, data: request.dataBytes(in: line),
                                 idempotencyKey: request.idempotencyKey.map { ExactString($0) }))
        draftSlots.append((slot, id))
    }

    /// Hands this read's publishes to the broker as one batch (the line bytes are still valid here).
    private func submitDrafts() {
        guard !drafts.isEmpty else { return }
        let waiting = LoopOwned(draftSlots)
        let me = LoopBound(self)
        let context = LoopBound(self.context)
        let loop = self.context.loop
        hub.broker.publish(drafts) { outcome in
            loop.execute {
                // The ledger counts the batch even when its publisher has gone away meanwhile.
                context.value?.ledger?.record(outcome.events, delivered: outcome.delivered)
                var w = JSONWriter(capacity: 48)
                for (entry, reply) in zip(waiting.value, outcome.replies) {
                    w.reset()
                    SocketReplies.published(seq: reply.seq, delivered: reply.delivered, duplicate: reply.duplicate, id: entry.id, into: &w)
                    entry.slot.bytes = w.takeBytes()
                }
                me.value?.flushReplies()
            }
        }
        drafts.removeAll(keepingCapacity: true)
        draftSlots.removeAll(keepingCapacity: true)
    }

    /// A reply another part of the hub produces later (admin views gathered from every loop).
    private func pending(_ start: (HubCore, @escaping @Sendable ([UInt8]) -> Void) -> Void) {
        let slot = Slot()
        append(slot)
        let loop = context.loop
        let me = LoopBound(self)
        let box = LoopOwned(slot)
        start(hub) { line in
            loop.execute {
                box.value.bytes = line
                me.value?.flushReplies()
            }
        }
    }

    private func replyUnknownChannel(_ name: String, id: RawJSON?) {
        replyError(.unknownChannel, "channel \"\(name)\" is not configured (configured: \(hub.channelNames.joined(separator: ", ")))", id: id)
    }

    private func replyError(_ code: SocketErrorCode, _ message: String, id: RawJSON?) {
        append(Slot(replyLine { SocketReplies.error(SocketRequestError(code, message, id: id), into: &$0) }))
    }

    // MARK: Replies

    private func append(_ slot: Slot) {
        slots.append(slot)
    }

    /// Writes every reply at the head of the FIFO that is known, in one write.
    func flushReplies() {
        guard let connection else { return }
        var out: [UInt8] = []
        while slotHead < slots.count, let bytes = slots[slotHead].bytes {
            out.append(contentsOf: bytes)
            slotHead += 1
        }
        if slotHead > 1024 && slotHead * 2 > slots.count {
            slots.removeFirst(slotHead)
            slotHead = 0
        }
        if !out.isEmpty { _ = out.withUnsafeBytes { connection.write(copying: $0) } }
        if tailAwaitingStart && slotHead == slots.count {
            // Every earlier publish has completed (and was recorded without this tail): start tailing.
            tailAwaitingStart = false
            context.ledger?.addTail(self)
        }
        if !paused && (pendingCount > Self.maxPendingReplies || connection.queuedBytes > Self.maxQueuedReplyBytes) {
            paused = true
            connection.pauseReading()
        } else {
            resumeIfCaughtUp()
        }
    }

    private func resumeIfCaughtUp() {
        guard paused, let connection, pendingCount <= Self.maxPendingReplies / 2,
              connection.queuedBytes <= Self.maxQueuedReplyBytes / 2 else { return }
        paused = false
        connection.resumeReading()
    }

    // MARK: Tail

    /// Writes one tail line; a tail that cannot keep up is closed.
    func sendTailLine(_ line: [UInt8]) {
        guard let connection else { return }
        if connection.queuedBytes > Self.maxQueuedReplyBytes {
            connection.close(.abort)
            return
        }
        _ = line.withUnsafeBytes { connection.write(copying: $0) }
    }
}
