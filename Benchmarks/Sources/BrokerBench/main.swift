// The broker's own cost of history: LocalBroker.publish with history off and on, in thread CPU time (the machine
// is shared), and the memory a retained event really takes (RSS growth per event). No sockets: fan-out goes to a
// shard that completes at once, so what differs between the runs is numbering, framing and retaining.
//   swift run -c release --package-path Benchmarks BrokerBench [off|on|one]
//   swift run -c release --package-path Benchmarks BrokerBench memory [STREAMS] [PER_STREAM] [PADDING]
import Glibc
import HubRouting

func cpuNanoseconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return Double(ts.tv_sec) * 1e9 + Double(ts.tv_nsec)
}

func rssBytes() -> Int {
    guard let f = fopen("/proc/self/statm", "r") else { return 0 }
    defer { fclose(f) }
    var size = 0, resident = 0
    _ = withUnsafeMutablePointer(to: &size) { s in withUnsafeMutablePointer(to: &resident) { r in
        withVaList([s, r]) { vfscanf(f, "%ld %ld", $0) } } }
    return resident * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// Completes every batch at once with no recipient.
struct NullShard: FanoutShard {
    func deliver(_ batch: EventBatch, done: @escaping @Sendable ([Int]) -> Void) {
        done([Int](repeating: 0, count: batch.events.count))
    }
}

let minutes: UInt64 = 60 * 1_000_000_000

func broker(size: Int, memory: Int) -> LocalBroker {
    LocalBroker(channelNames: ["wallet_updates"], shards: [NullShard(), NullShard()],
                options: LocalBrokerOptions(history: HistoryLimits(size: size, ttlNanos: 10 * minutes, memoryBytes: memory),
                                            idempotencyWindowNanos: 5 * minutes, idempotencyMaxKeys: 100_000))
}

/// Publishes `total` events in batches of 64 to `accounts` accounts (a fixed pseudo-random order), with a data
/// object like hubbench's. Returns thread-CPU ns per event.
func publish(_ b: LocalBroker, total: Int, accounts: Int, accountNames: [AccountID], sequential: Bool = false, padding: Int = 0) -> Double {
    var data = Array(#"{"t":1234567890123456,"i":1234567"#.utf8)
    if padding > 0 { data += Array(#","p":""#.utf8) + [UInt8](repeating: 0x78, count: padding) + [0x22] }
    data.append(0x7D)
    var rng: UInt64 = 0x9E3779B97F4A7C15
    // Every account is followed by a connection (on one of the two loops), as in the hub under load: the broker hands
    // a batch only to the loops that follow its streams. (Following again on a later call only raises the counts.)
    _ = b.attachNow(accountNames.prefix(accounts).enumerated().map { i, name in
        StreamRead(stream: StreamKey(channel: 0, account: name), follow: true, resume: nil, limit: 0, loop: i % 2)
    })
    let start = cpuNanoseconds()
    var sent = 0
    data.withUnsafeMutableBytes { raw in
        let buffer = UnsafeRawBufferPointer(raw)
        while sent < total {
            var drafts: [EventDraft] = []
            drafts.reserveCapacity(64)
            for _ in 0..<64 {
                rng = rng &* 6364136223846793005 &+ 1442695040888963407
                let index = sequential ? (sent + drafts.count) % accounts : Int((rng >> 33) % UInt64(accounts))
                drafts.append(EventDraft(channel: 0, account: accountNames[index], type: "bench", data: buffer))
            }
            b.publish(drafts) { _ in }
            sent += 64
        }
    }
    return (cpuNanoseconds() - start) / Double(sent)
}

let accounts = 2000
let names = (0..<200_000).map { AccountID("acc_\($0)") }
let arguments = Array(CommandLine.arguments.dropFirst())
let only = arguments.first  // "off", "on", "one": one configuration only (for perf); "memory": see below

if only == "memory" {
    // Memory: retain STREAMS x PER_STREAM events with PADDING extra bytes of data each (no eviction) and compare RSS
    // growth with the counted bytes. One case per process: memory freed by an earlier case would be reused and hide
    // the growth. Default: 2000 streams x 100 events, frames of ~200 bytes.
    //   BrokerBench memory [STREAMS] [PER_STREAM] [PADDING]
    let streams = arguments.count > 1 ? Int(arguments[1]) ?? 2000 : 2000
    let perStream = arguments.count > 2 ? Int(arguments[2]) ?? 100 : 100
    let padding = arguments.count > 3 ? Int(arguments[3]) ?? 100 : 100
    let b = broker(size: 1_000_000, memory: 1 << 40)
    let before = rssBytes()
    _ = publish(b, total: streams * perStream, accounts: min(streams, names.count), accountNames: names, sequential: true, padding: padding)
    let after = rssBytes()
    let stats = b.statistics()
    let entry = Double(stats.historyBytes) / Double(stats.events)  // frame + 32-byte header, 8-aligned
    let frame = entry - Double(HistoryLimits.perEventOverhead)
    let real = Double(after - before) / Double(stats.events)
    print("memory, \(stats.streams) streams x \(perStream) events (\(stats.events) retained), frames of ~\(Int(frame)) B: RSS growth "
          + "\(Int(real)) B/event, i.e. \(Int(real - frame)) B beyond the frame (its ring entry: \(Int(entry)) B with the "
          + "\(HistoryLimits.perEventOverhead)-byte header; the rest: its stream's index and the stream table)")
    withExtendedLifetime(b) {}
    exit(0)
}

print("LocalBroker.publish, 64-event batches, \(accounts) accounts, thread CPU ns per event (median of 5 runs of 1M events)")
var rows: [(String, Double)] = []
let configs = [("off", "history off (--history-size 0)", 0, 64 << 20), ("on", "history on (defaults: 100, 64 MiB)", 100, 64 << 20),
               ("one", "history on, 1 per stream", 1, 64 << 20)]
for (key, label, size, memory) in configs where only == nil || only == key {
    var samples: [Double] = []
    for _ in 0..<5 {
        let b = broker(size: size, memory: memory)
        _ = publish(b, total: 300_000, accounts: accounts, accountNames: names)  // warm: history full, evicting
        samples.append(publish(b, total: 1_000_000, accounts: accounts, accountNames: names))
    }
    samples.sort()
    rows.append((label, samples[2]))
    print("  \(label): \(Int(samples[2])) ns/event (min \(Int(samples[0])), max \(Int(samples[4])))")
}
if rows.count == 3 {
    print("  history on costs \(Int(rows[1].1 - rows[0].1)) ns more per event in the broker (on/off CPU ratio \(Double(Int(rows[1].1 / rows[0].1 * 100)) / 100))")
}
