import HubEngine
import HubRouting

/// Which live events a connection writes while its subscribes are being answered: the rule that makes a
/// subscribe's replay and the live events meet with no gap and no duplicate (docs/PROTOCOL.md 1.6). A value:
/// events and answers in, decisions out, no socket and no broker, so `SubscribeFloorsTests` drives it alone.
///
/// A floor is one stream of one subscribe: events numbered at or below its `seq` are already the client's (replayed,
/// or numbered before the subscription took effect), so they are skipped, and the first event above it retires it
/// (a stream reaches a loop in seq order, so nothing at or below can follow). A holding floor stands for a subscribe
/// waiting for a broker that answers later: its streams' events are held until the answer says where they start.
struct SubscribeFloors {
    struct Floor: Equatable {
        let channel: Int
        let broadcast: Bool
        /// `holding`: the subscribe waits for the broker's answer.
        let seq: UInt64
        /// The subscribe's token (a loop-wide counter, so later subscribes have larger ones).
        let token: Int
        static let holding = UInt64.max
    }

    enum Decision: Equatable {
        /// Write it.
        case pass
        /// The client has it already.
        case skip
        /// Keep it until the waiting subscribe's answer (`keep`, then `answered`).
        case hold
    }

    private(set) var floors: [Floor] = []
    /// Live events held for a waiting subscribe, in arrival order, and their frames' bytes.
    private(set) var held: [PublishedEvent] = []
    private(set) var heldBytes = 0

    var isEmpty: Bool { floors.isEmpty && held.isEmpty && heldBytes == 0 }

    /// Subscribe `token` waits for the broker: both streams of each of `channels` hold their events.
    mutating func hold(channels: [Int], token: Int) {
        for channel in channels {
            floors.append(Floor(channel: channel, broadcast: false, seq: Floor.holding, token: token))
            floors.append(Floor(channel: channel, broadcast: true, seq: Floor.holding, token: token))
        }
    }

    /// The floors of an answered subscribe (its streams' positions when they were read).
    mutating func add(_ new: [Floor]) {
        if floors.isEmpty { floors = new } else { floors.append(contentsOf: new) }
    }

    /// What to do with a live event of stream (`channel`, `broadcast`) numbered `seq`. An event above the stream's
    /// floors retires them. Several floors of one stream (a channel subscribed again): a holding one holds, else the
    /// highest decides.
    mutating func decide(channel: Int, broadcast: Bool, seq: UInt64) -> Decision {
        var highest: UInt64? = nil
        for floor in floors where floor.channel == channel && floor.broadcast == broadcast {
            if floor.seq == Floor.holding { return .hold }
            highest = max(highest ?? 0, floor.seq)
        }
        guard let highest else { return .pass }
        if seq <= highest { return .skip }
        retire { $0.channel == channel && $0.broadcast == broadcast }
        return .pass
    }

    /// The client has `event` already: it is at or below a floor of its stream.
    func covers(_ event: PublishedEvent) -> Bool {
        let broadcast = event.account == nil
        return floors.contains { $0.channel == event.channel && $0.broadcast == broadcast && event.seq <= $0.seq }
    }

    /// Holds `event` (after `decide` said `.hold`). False when the held bytes pass `cap`: the client is too slow,
    /// and the caller closes it.
    mutating func keep(_ event: PublishedEvent, cap: Int) -> Bool {
        heldBytes += event.frame.count
        guard heldBytes <= cap else { return false }
        held.append(event)
        return true
    }

    /// The broker answered subscribe `token`: its holding floors go, and the events held meanwhile are handed back in
    /// arrival order (the caller writes those the answer's floors do not `cover`, or none if the subscribe failed).
    mutating func answered(token: Int) -> [PublishedEvent] {
        let events = held
        held = []
        heldBytes = 0
        retire { $0.token == token }
        return events
    }

    /// Every floor of subscribes up to `token` goes: the loop has run every delivery that was in its inbox when
    /// their positions were read, so each later event is above them.
    mutating func retire(upTo token: Int) {
        retire { $0.token <= token }
    }

    /// The client left `channel`: its floors go.
    mutating func retire(channel: Int) {
        retire { $0.channel == channel }
    }

    /// The last floor gone frees the array's buffer too (`removeAll(where:)` keeps it): an idle connection that once
    /// subscribed carries no floor storage.
    private mutating func retire(where shouldRetire: (Floor) -> Bool) {
        guard !floors.isEmpty else { return }
        floors.removeAll(where: shouldRetire)
        if floors.isEmpty { floors = [] }
    }
}
