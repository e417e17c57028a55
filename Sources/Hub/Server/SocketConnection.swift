import Glibc
import HubEngine
import HubJSON
import HubRouting
import WSProtocol

/// One connection on the Unix socket: the backend publishing, or `hubctl`.
///
/// Newline-delimited requests, one reply line each, in request order, pipelining allowed. Lines are found in
/// place in the read buffer by `LineFramer` (an incomplete last line is left to the engine, which hands it back
/// in front of the next read). The publishes of one read go to the broker as one batch. Replies wait in a FIFO
/// of slots so a fast reply never overtakes a slower one before it. A batch's publishes share one slot (their
/// replies are one buffer, written by the batch's completion): a batch is closed, and goes to the broker, before
/// any other reply is queued behind it.
///
/// Memory is bounded per connection, whatever the peer sends and however little it reads: before each line the
/// connection checks what it already owes the peer (`owedBytes`: replies queued on the socket, replies waiting
/// their turn, and an estimate for replies still being produced, i.e. publishes in fan-out and admin views being
/// gathered from every loop) and how many admin views are being gathered. Over either bound it stops there: the
/// rest of the read stays with the engine, reading pauses, and the peer's further requests wait in the kernel
/// until replies drain. A reply larger than the room in the outbound queue goes out in pieces as the peer reads.
///
/// A peer that half-closes (`shutdown(SHUT_WR)` after its last request, as `nc -N` and `nc -q` do) gets every
/// reply it is owed, then the hub closes the connection (EOF to the peer). A tail ends when its peer's input does.
///
/// All socket connections live on loop 0 (see `HubServer`), which also owns the publish ledger and the tails.
final class SocketConnection: ConnectionHandler {
    /// One reply, or a batch's publish replies, possibly not known yet.
    final class Slot {
        /// The reply line (a batch's reply lines); released once it is entirely in the outbound queue.
        @exclusivity(unchecked) var bytes: ArraySlice<UInt8>?
        /// Bytes of `bytes` already in the outbound queue.
        @exclusivity(unchecked) var sent = 0
        /// What the slot counts in `heldBytes`: an estimate while the reply is being produced, then the bytes
        /// of it not yet in the outbound queue.
        @exclusivity(unchecked) var weight: Int
        init(_ bytes: [UInt8]) {
            self.bytes = bytes[...]
            weight = bytes.count
        }
        init(estimate: Int) {
            weight = max(estimate, SocketConnection.minimumWeight)
        }
    }

    // Every publish passes through these fields several times: they skip Swift's run-time exclusivity check
    // (`@exclusivity(unchecked)`; docs/ENGINE.md says when that is safe). Each access is one statement, or a
    // mutating call on a value (`framer`, the arrays) that calls nothing outside it while it lasts; the handlers and
    // completions that do call out only read them between such accesses.
    let context: LoopContext
    @exclusivity(unchecked) var connection: Connection!
    @exclusivity(unchecked) private var framer: LineFramer
    @exclusivity(unchecked) private var slots: [Slot] = []
    @exclusivity(unchecked) private var slotHead = 0
    /// The sum of the weights of the unwritten slots.
    @exclusivity(unchecked) private var heldBytes = 0
    /// Admin requests being gathered from the loops.
    @exclusivity(unchecked) private var gathering = 0
    /// The publishes of the batch being read, and their one slot (nil: no batch open). `draftIDs` holds each
    /// draft's echoed `id` once one of them has an id (until then it stays empty: no ids, no array per batch).
    @exclusivity(unchecked) private var drafts: [EventDraft] = []
    @exclusivity(unchecked) private var draftIDs: [RawJSON?] = []
    @exclusivity(unchecked) private var batchSlot: Slot?
    @exclusivity(unchecked) private(set) var tail: (channel: Int, account: AccountID?)?
    /// The tail starts receiving events only once every reply before it, and its own `tailing` reply, is written:
    /// events must not overtake earlier replies, and publishes sent before the tail request are not tailed.
    @exclusivity(unchecked) private var tailAwaitingStart = false
    @exclusivity(unchecked) private var paused = false
    /// The peer has sent everything (its EOF was read): close once every reply is written.
    @exclusivity(unchecked) private var inputEnded = false

    /// Take no further request while this many reply bytes are owed (queued, waiting or being produced); read
    /// again below half of it.
    static let maxOwedBytes = 1 << 20
    /// Admin views being gathered from every loop at once, per connection.
    static let maxGathering = 4
    /// The outbound queue cap of a socket connection: replies move from their slots into the queue up to it, and
    /// a tail that has more than this queued cannot keep up and is closed.
    static let maxQueuedBytes = 1 << 20
    /// The least a pending request counts (the slot, its bookkeeping and a short reply).
    static let minimumWeight = 64
    /// After the peer's EOF and the last reply: how long the peer has to read what is still queued.
    static let finishLinger = Duration.seconds(10)

    init(context: LoopContext) {
        self.context = context
        framer = LineFramer(maxLineBytes: context.hub.configuration.maxLineBytes)
    }

    var hub: HubCore { context.hub }

    /// Reply bytes owed to the peer: queued on the socket, waiting in the FIFO, or estimated for replies being
    /// produced.
    private var owedBytes: Int { heldBytes + (connection?.queuedBytes ?? 0) }
    private var mustWait: Bool { owedBytes >= Self.maxOwedBytes || gathering >= Self.maxGathering }
    private var mayResume: Bool { owedBytes <= Self.maxOwedBytes / 2 && gathering < Self.maxGathering }

    // MARK: ConnectionHandler

    func connectionReadable(_ connection: Connection, _ bytes: UnsafeMutableRawBufferPointer) -> Int {
        guard tail == nil else { return bytes.count }  // a tailing connection accepts no further requests
        let buffer = UnsafeRawBufferPointer(bytes)
        var start = 0
        scan: while tail == nil {
            if mustWait {
                // The bound is checked per line: what is left stays with the engine (and the kernel).
                pause()
                break
            }
            switch framer.next(in: buffer, from: start) {
            case .line(let range, let next):
                handleLine(UnsafeRawBufferPointer(rebasing: buffer[range]))
                start = next
            case .tooLong(let next):
                append(Slot(replyLine { SocketReplies.lineTooLong(maxLineBytes: framer.maxLineBytes, into: &$0) }))
                start = next
            case .incomplete(let keep):
                start = keep
                break scan
            }
        }
        if tail != nil { start = buffer.count }
        submitDrafts()
        flushReplies()
        return start
    }

    func connectionWritable(_ connection: Connection) {
        flushReplies()
    }

    func connectionInputEnded(_ connection: Connection) -> Bool {
        guard tail == nil else { return false }
        inputEnded = true
        flushReplies()  // closes now if nothing is owed
        return true
    }

    func connectionClosed(_ connection: Connection, reason: CloseReason) {
        if tail != nil { context.ledger?.removeTail(self) }
        self.connection = nil
    }

    // MARK: Requests

    private func handleLine(_ line: UnsafeRawBufferPointer) {
        // Blank lines (e.g. a trailing "\n\n") are not requests.
        if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { return }
        var id: RawJSON?
        let request: SocketRequest
        do {
            request = try SocketRequest.parse(line: line, id: &id)
        } catch {
            return append(Slot(replyLine { SocketReplies.error(error, into: &$0) }))
        }
        // Consumed: the publish payload moves out of the request instead of being copied out of it (its strings
        // retained, and the request and the copy each released).
        switch consume request {
        case .publish(let request):
            publish(request, line: line, id: id)
        case .stats:
            pending(estimate: 2048 + 64 * hub.contexts.count) { hub, done in hub.statsJSON(id: id, done) }
        case .channels:
            pending(estimate: 64 + 192 * hub.channelNames.count) { hub, done in hub.channelsJSON(id: id, done) }
        case .channel(let name, let account):
            guard let index = hub.channelIndex[name] else { return replyUnknownChannel(name, id: id) }
            let request = Array(line)  // cluster mode: the other nodes are asked the same
            pending(estimate: 4096) { hub, done in
                hub.channelJSON(index, account: account, id: id) { local in hub.withOtherNodes(local, asking: request, done) }
            }
        case .connections(let account, let channel, let limit):
            var channelIndex: Int? = nil
            if let channel {
                guard let index = hub.channelIndex[channel] else { return replyUnknownChannel(channel, id: id) }
                channelIndex = index
            }
            // About 250 bytes per listed connection.
            let request = Array(line)  // cluster mode: the other nodes are asked the same
            pending(estimate: 64 + 320 * min(limit, hub.clientCount)) { hub, done in
                hub.connectionsJSON(account: account, channel: channelIndex, limit: limit, id: id) { local in
                    hub.withOtherNodes(local, asking: request, done)
                }
            }
        case .disconnect(let target, let code, let reason, let node):
            let request = Array(line)  // cluster mode: the other nodes (or the one named) are asked the same
            pending(estimate: Self.minimumWeight) { hub, done in
                hub.operatorDisconnect(target, code: code, reason: reason, node: node, line: request, id: id, done)
            }
        case .nodes:
            pending(estimate: 4096) { hub, done in hub.nodesJSON(id: id, done) }
        case .history(let channel, let account, let since):
            guard let index = hub.channelIndex[channel] else { return replyUnknownChannel(channel, id: id) }
            let key = StreamKey(channel: index, account: account)
            if hub.clusterNode != nil {
                pending(estimate: 4096) { hub, done in hub.clusterHistoryJSON(key, since: since, id: id, done) }
            } else {
                append(Slot(hub.historyJSON(key, since: since, id: id)))
            }
        case .tail(let channel, let account):
            guard let index = hub.channelIndex[channel] else { return replyUnknownChannel(channel, id: id) }
            // `append` hands the open batch to the broker first: publishes before the tail request are not tailed
            // (see `tailAwaitingStart`).
            append(Slot(replyLine { SocketReplies.tailing(channel: channel, id: id, into: &$0) }))
            tail = (index, account)
            tailAwaitingStart = true
        }
    }

    private func publish(_ request: consuming PublishRequest, line: UnsafeRawBufferPointer, id: RawJSON?) {
        if hub.refusesPublishes {
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
        // Until its reply comes back, a publish counts its line: the event is in fan-out meanwhile.
        let weight = max(line.count, Self.minimumWeight)
        if let slot = batchSlot {
            slot.weight += weight
            heldBytes += weight
        } else {
            let slot = Slot(estimate: weight)
            enqueue(slot)
            batchSlot = slot
        }
        if id != nil || !draftIDs.isEmpty {
            // The first id of the batch: the drafts before it had none.
            if draftIDs.isEmpty { draftIDs.append(contentsOf: repeatElement(nil, count: drafts.count)) }
            draftIDs.append(id)
        }
        drafts.append(EventDraft(channel: channel, account: account, type: request.type, data: request.dataBytes(in: line),
                                 idempotencyKey: request.idempotencyKey.map { ExactString($0) }))
    }

    /// Hands the open batch of publishes to the broker (the line bytes are still valid here): at the end of each
    /// read, and before any other reply is queued behind the batch's slot.
    private func submitDrafts() {
        guard let slot = batchSlot else { return }
        batchSlot = nil
        // The ids in an array of their own, sized to the batch. Handing over `draftIDs` itself would share its
        // buffer, and `removeAll(keepingCapacity:)` below would then allocate a fresh one of the full capacity (the
        // largest batch seen: a large-chunk malloc that also consolidates the allocator's fast bins) for every batch.
        var ids = [RawJSON?]()
        if !draftIDs.isEmpty {
            ids.reserveCapacity(draftIDs.count)
            ids.append(contentsOf: draftIDs)
        }
        let loop = self.context.loop
        let waiting = LoopBound((slot: slot, ids: ids), loop: loop)
        let me = LoopBound(Weak(self), loop: loop)
        let context = LoopBound(Weak(self.context), loop: loop)
        hub.broker.publish(drafts) { outcome in
            // Already on this connection's loop (its own loop delivered the batch last, or nobody followed the batch's
            // streams): the replies go out now, not from a job one iteration later (an allocation and an iteration
            // less per batch). Replies cannot overtake one another either way: each waits in its slot of the FIFO.
            if loop.inEventLoop {
                Self.complete(outcome, waiting: waiting.value, me: me, context: context)
            } else {
                loop.executeBorrowable { Self.complete(outcome, waiting: waiting.value, me: me, context: context) }
            }
        }
        drafts.removeAll(keepingCapacity: true)
        draftIDs.removeAll(keepingCapacity: true)
    }

    /// A batch's outcome, on the connection's loop: the ledger records it, and every reply fills its slot.
    /// `waiting.ids`: each draft's `id`, or empty when none had one.
    private static func complete(_ outcome: PublishOutcome, waiting: (slot: Slot, ids: [RawJSON?]),
                                 me: LoopBound<Weak<SocketConnection>>, context: LoopBound<Weak<LoopContext>>) {
        // The ledger counts the batch even when its publisher has gone away meanwhile.
        context.value.object?.ledger?.record(outcome.events, delivered: outcome.delivered)
        guard let me = me.value.object else { return }
        // Every reply of the batch, in draft order, into one buffer: the batch's slot.
        let ids = waiting.ids
        var w = JSONWriter(capacity: 48 * outcome.replies.count)
        for (i, reply) in outcome.replies.enumerated() {
            let id = i < ids.count ? ids[i] : nil
            if let failure = reply.failure {
                SocketReplies.error(code: SocketErrorCode(rawValue: failure.code) ?? .brokerUnavailable, message: failure.message,
                                    id: id, into: &w)
            } else {
                SocketReplies.published(seq: reply.seq, delivered: reply.delivered, duplicate: reply.duplicate, id: id, into: &w)
            }
        }
        me.fill(waiting.slot, w.takeBytes()[...])
        me.flushReplies()
    }

    /// A reply another part of the hub produces later (admin views gathered from every loop), counted as
    /// `estimate` bytes until it is known.
    private func pending(estimate: Int, _ start: (HubCore, @escaping @Sendable ([UInt8]) -> Void) -> Void) {
        let slot = Slot(estimate: estimate)
        append(slot)
        gathering += 1
        let loop = context.loop
        let me = LoopBound(Weak(self), loop: loop)
        let box = LoopBound(slot, loop: loop)
        start(hub) { line in
            loop.execute {
                guard let me = me.value.object else { return }
                me.gathering -= 1
                me.fill(box.value, line[...])
                me.flushReplies()
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

    /// Queues a reply behind everything before it: the open batch of publishes goes to the broker first.
    private func append(_ slot: Slot) {
        submitDrafts()
        enqueue(slot)
    }

    /// Puts a slot at the end of the FIFO, counting its weight (the open batch's slot is queued here directly).
    private func enqueue(_ slot: Slot) {
        slots.append(slot)
        heldBytes += slot.weight
    }

    /// The reply of a pending slot is known: it now counts its real size.
    private func fill(_ slot: Slot, _ bytes: ArraySlice<UInt8>) {
        heldBytes += bytes.count - slot.weight
        slot.weight = bytes.count
        slot.bytes = bytes
    }

    /// Moves the known replies at the head of the FIFO into the outbound queue (up to its cap), then pauses or
    /// resumes reading.
    func flushReplies() {
        guard let connection, connection.isOpen else { return }
        while true {
            moveKnownReplies(to: connection)
            // Waiting for the queue to drain (a reply that did not fit, or reading paused): flush now, so that the
            // queue either drains here (go on) or pushes back, and then `connectionWritable` calls back once it
            // has drained (the engine does after every push-back, however the queue drains).
            let blocked = slotHead < slots.count && slots[slotHead].bytes != nil
            guard blocked || paused || mustWait, connection.queuedBytes > 0 else { break }
            connection.flush()
            guard connection.isOpen, connection.queuedBytes == 0 else { break }
        }
        guard connection.isOpen else { return }
        if inputEnded {
            // The peer sent its last request: close once every reply is queued (the queue is flushed first).
            if slotHead == slots.count { connection.close(.graceful(linger: Self.finishLinger)) }
            return
        }
        if tailAwaitingStart && slotHead == slots.count {
            // Every earlier publish has completed (and was recorded without this tail): start tailing.
            tailAwaitingStart = false
            context.ledger?.addTail(self)
        }
        if paused {
            if mayResume {
                paused = false
                connection.resumeReading()  // the engine hands back what this connection left unread
            }
        } else if mustWait {
            pause()
        }
    }

    /// The known replies at the head of the FIFO, as far as the queue has room, in one write; a reply larger
    /// than the room goes in pieces. The write's buffer is made at its final size and filled from the slots (one
    /// allocation and one copy, however many replies).
    private func moveKnownReplies(to connection: Connection) {
        let room = Self.maxQueuedBytes - connection.queuedBytes
        var end = slotHead
        var total = 0
        while total < room, end < slots.count, let bytes = slots[end].bytes {
            total += min(room - total, bytes.count - slots[end].sent)
            end += 1
        }
        // One pass copies each slot's share and retires the slots written whole (an empty buffer when `total` is 0:
        // nothing is copied, and empty replies are retired all the same).
        let chunk = SharedBytes(count: total) { out in
            var at = 0
            for slot in slots[slotHead..<end] {
                guard let bytes = slot.bytes else { break }
                let n = min(total - at, bytes.count - slot.sent)
                if n > 0 {
                    bytes.withUnsafeBytes { (out.baseAddress! + at).copyMemory(from: $0.baseAddress! + slot.sent, byteCount: n) }
                }
                at += n
                slot.sent += n
                slot.weight -= n
                heldBytes -= n
                guard slot.sent == bytes.count else { break }  // the rest once the queue has drained
                slot.bytes = nil
                slotHead += 1
            }
        }
        if total > 0 { _ = connection.write(chunk) }
        if slotHead > 1024 && slotHead * 2 > slots.count {
            slots.removeFirst(slotHead)
            slotHead = 0
        }
    }

    private func pause() {
        guard !paused, let connection else { return }
        paused = true
        connection.pauseReading()
    }

    // MARK: Tail

    /// Writes one tail line; a tail that cannot keep up (its queue over `maxQueuedBytes`) is closed.
    func sendTailLine(_ line: [UInt8]) {
        guard let connection else { return }
        if line.withUnsafeBytes({ connection.write(copying: $0) }) == .overCap {
            connection.close(.abort)
        }
    }
}
