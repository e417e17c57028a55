import Foundation
import Glibc
import Hub

extension Coordinator {
    func mb(_ bytes: Int) -> Double { (Double(bytes) / 1_048_576 * 10).rounded() / 10 }
    func r(_ v: Double, _ places: Double = 10) -> Double { (v * places).rounded() / places }

    /// Ramp phase shared by every scenario; records its numbers under `ramp_*` keys.
    func ramp(count: Int, rate: Double, slowShare: Double = 0, churnRate: Double = 0, churnLifetimeMs: Int = 1000,
              trackEvents: Bool = false, storm: StormSpec? = nil) {
        let before = server()
        result["server_rss_before_mb"] = mb(before.rssBytes)
        result["target_connections"] = count
        result["connect_rate"] = rate
        spawn(count: count, rate: rate, slowShare: slowShare, churnRate: churnRate, churnLifetimeMs: churnLifetimeMs, trackEvents: trackEvents,
              storm: storm)
        let ramp = waitRamp(count: count, rate: rate)
        let after = server()
        rssBeforeRamp = before.rssBytes
        let t = progressTotals()
        result["attempted"] = t.attempted
        result["established"] = t.everEstablished
        result["failed"] = t.failedTotal
        result["failed_by_reason"] = t.failed
        result["ramp_seconds"] = r(ramp.seconds, 100)
        result["time_to_n_seconds"] = ramp.reachedAt.map { r($0, 100) } ?? NSNull()
        result["handshakes_per_second"] = r(Double(t.everEstablished) / max(ramp.seconds, 0.001), 1)
        result["server_rss_after_ramp_mb"] = mb(after.rssBytes)
        result["rss_per_connection_bytes"] = t.everEstablished > 0 ? (after.rssBytes - before.rssBytes) / t.everEstablished : 0
        result["server_cpu_ramp_seconds"] = r(after.cpuSeconds - before.cpuSeconds, 100)
        result["server_cpu_us_per_handshake"] = t.everEstablished > 0 ? r((after.cpuSeconds - before.cpuSeconds) * 1e6 / Double(t.everEstablished)) : 0
        result["generator_cpu_ramp_seconds"] = r(generatorCPU(), 100)
        note(String(format: "  [%@ %@] ramp: %d/%d open in %.2fs, %d failed %@", scenario, target.name, t.open, count, ramp.seconds,
                    t.failedTotal, t.failed.description))
    }

    // MARK: connections

    func runConnections() {
        let n = options.int("n", 19_000)
        let rate = options.double("rate", 5000)
        let hold = options.double("hold", 3)
        ramp(count: n, rate: rate)
        let s0 = server()
        let g0 = generatorCPU()
        usleep(UInt32(hold * 1_000_000))
        let s1 = server()
        let snaps = stopAll()
        let t = Totals(snaps)
        result["open_after_hold"] = t.open
        result["closed_by_reason"] = t.closed
        result["handshake_latency"] = t.handshake.summary()
        result["server_rss_idle_mb"] = mb(s1.rssBytes)
        // After the hold: what an idle connection keeps, once a handshake burst's transient memory is gone (the hub
        // trims its heap after a burst; a server that does not shows the same number as right after the ramp).
        let established = result["established"] as? Int ?? 0
        result["rss_per_idle_connection_bytes"] = established > 0 ? (s1.rssBytes - rssBeforeRamp) / established : 0
        // Per second of hold: without one (`--hold 0`, set-up only) there is no idle phase to report, and a
        // division by zero would put an infinity in the JSON, which JSONSerialization traps on.
        if hold > 0 {
            result["server_cpu_idle_percent"] = r((s1.cpuSeconds - s0.cpuSeconds) / hold * 100)
            result["machine_cpu_idle_phase_percent"] = MachineSample.busyPercent(s0.machine, s1.machine)
            result["generator_cpu_idle_percent"] = r((generatorCPU(snaps) - g0) / hold * 100)
        }
    }

    // MARK: broadcast

    func runBroadcast() {
        let n = options.int("n", 10_000)
        let intervalMs = options.double("interval-ms", 10)
        let duration = options.double("duration", 10)
        ramp(count: n, rate: options.double("rate", 5000), trackEvents: true)
        let publisher = makePublisher()
        publisher.configure(accountSpan: 0, accountPrefix: "acc_", paddingBytes: options.int("payload", 0))
        _ = snapAll()
        let recipients = progressTotals().open
        let s0 = server(), g0 = generatorCPU(), p0 = publisher.snapshot(), r0 = redisCPU()
        let rate = 1000 / intervalMs
        let tStart = monotonicNanos()
        publisher.setRate(rate)
        watch(seconds: duration, publisher: publisher, label: "broadcast")
        publisher.setRate(0)
        let p1 = publisher.snapshot(), r1 = redisCPU()
        let measured = seconds(since: tStart)
        if redisPID != nil {
            result["redis_cpu_percent"] = r((r1 - r0) / measured * 100)
            result["redis_cpu_us_per_event"] = p1.acked > p0.acked ? r((r1 - r0) * 1e6 / Double(p1.acked - p0.acked), 100) : 0
        }
        drain()
        let s1 = server()
        let snaps = snapAll()
        let g1 = generatorCPU(snaps)
        let t = Totals(snaps)
        deliveryResults(t: t, p0: p0, p1: p1, s0: s0, s1: s1, g0: g0, g1: g1, duration: measured, recipients: recipients, rate: rate)
        var last = Histogram()
        for (_, v) in t.events { last.record(v.0) }
        result["last_subscriber_latency"] = last.summary()
        result["events_seen"] = t.events.count
        _ = stopAll()
    }

    func deliveryResults(t: Totals, p0: PublishStats, p1: PublishStats, s0: ProcSample, s1: ProcSample, g0: Double, g1: Double,
                         duration: Double, recipients: Int, rate: Double) {
        let published = p1.acked - p0.acked
        let expected = Double(published) * Double(recipients)
        result["recipients"] = recipients
        result["publish_rate_offered"] = rate
        result["published"] = published
        result["publish_errors"] = p1.errors - p0.errors
        result["publish_skipped"] = p1.skipped - p0.skipped
        result["server_reported_delivered"] = p1.delivered - p0.delivered
        result["expected_deliveries"] = expected
        result["received"] = t.received
        result["lost"] = max(0, expected - Double(t.received))
        result["deliveries_per_second"] = r(Double(t.received) / duration, 1)
        result["latency"] = t.latency.summary()
        result["server_cpu_seconds"] = r(s1.cpuSeconds - s0.cpuSeconds, 100)
        result["server_cpu_percent"] = r((s1.cpuSeconds - s0.cpuSeconds) / duration * 100)
        result["server_cpu_us_per_delivery"] = t.received > 0 ? r((s1.cpuSeconds - s0.cpuSeconds) * 1e6 / Double(t.received), 100) : 0
        result["generator_cpu_seconds"] = r(g1 - g0, 100)
        result["generator_cpu_percent"] = r((g1 - g0) / duration * 100)
        result["machine_cpu_percent"] = MachineSample.busyPercent(s0.machine, s1.machine)
        result["server_rss_end_mb"] = mb(s1.rssBytes)
        result["closed_by_reason"] = t.closed
    }

    // MARK: per-account

    func runPerAccount() {
        let n = options.int("n", 10_000)
        let stepsText = options.string("steps", "10000,25000,50000,100000,150000,200000")
        let steps = stepsText.split(separator: ",").compactMap { Double($0) }
        let stepSeconds = options.double("step-seconds", 3)
        ramp(count: n, rate: options.double("rate", 5000))
        let publisher = makePublisher(connections: 4, window: 65_536)
        publisher.configure(accountSpan: n, accountPrefix: "acc_", paddingBytes: 0)
        var rows: [[String: Any]] = []
        var best: Double? = nil
        let recipients = progressTotals().open
        for rate in steps {
            publisher.setRate(rate)
            usleep(200_000)  // settle at the new rate before measuring
            let first = snapAll()
            let tStart = monotonicNanos()
            let s0 = server(), g0 = generatorCPU(first), p0 = publisher.snapshot(), r0 = redisCPU(), n0 = serverCPUByProcess()
            watch(seconds: stepSeconds, publisher: publisher, label: "\(Int(rate))/s")
            let p1 = publisher.snapshot(), s1 = server(), r1 = redisCPU(), n1 = serverCPUByProcess()
            let snaps = snapAll()
            let dt = seconds(since: tStart)
            let g1 = generatorCPU(snaps)
            var t = Totals(snaps)
            t.received -= Totals(first).received  // counters are cumulative, histograms per snapshot
            let achieved = Double(p1.acked - p0.acked) / dt
            let lat = t.latency.summary()
            var row: [String: Any] = [
                "rate_offered": rate, "publish_rate_achieved": r(achieved, 1),
                "deliveries_per_second": r(Double(t.received) / dt, 1),
                "latency": lat,
                "server_cpu_percent": r((s1.cpuSeconds - s0.cpuSeconds) / dt * 100),
                "server_cpu_us_per_delivery": t.received > 0 ? r((s1.cpuSeconds - s0.cpuSeconds) * 1e6 / Double(t.received), 100) : 0,
                "generator_cpu_percent": r((g1 - g0) / dt * 100),
                "machine_cpu_percent": MachineSample.busyPercent(s0.machine, s1.machine),
                "publish_errors": p1.errors - p0.errors, "publish_skipped": p1.skipped - p0.skipped,
            ]
            if serverPIDs.count > 1 {
                row["server_cpu_percent_by_process"] = zip(n0, n1).map { r(($1 - $0) / dt * 100) }
            }
            if redisPID != nil {
                row["redis_cpu_percent"] = r((r1 - r0) / dt * 100)
                row["redis_cpu_us_per_event"] = p1.acked > p0.acked ? r((r1 - r0) * 1e6 / Double(p1.acked - p0.acked), 100) : 0
            }
            rows.append(row)
            let p99 = lat["p99_ms"] ?? 0
            note(String(format: "  [per-account %@] %.0f/s offered: %.0f/s published, %.0f/s delivered, p99 %.2f ms", target.name,
                        rate, achieved, Double(t.received) / dt, p99))
            if p99 < 10 && achieved >= 0.9 * rate && Double(t.received) / dt >= 0.9 * rate * Double(recipients) / Double(n) {
                best = rate
            }
            if p99 > 1000 || achieved < 0.5 * rate { break }
        }
        publisher.setRate(0)
        let pEnd = publisher.snapshot()
        drain()
        let snaps = stopAll()
        let t = Totals(snaps)
        result["steps"] = rows
        result["best_rate_p99_under_10ms"] = best ?? NSNull()
        result["published"] = pEnd.acked
        result["received_total"] = t.received
        result["recipients"] = recipients
        result["lost"] = max(0, Double(pEnd.acked) * Double(recipients) / Double(n) - Double(t.received))
        result["closed_by_reason"] = t.closed
    }

    // MARK: churn

    func runChurn() {
        let n = options.int("n", 5000)
        let churnRate = options.double("churn-rate", 500)
        let lifetime = options.int("lifetime-ms", 1000)
        let eventRate = options.double("event-rate", 5000)
        let duration = options.double("duration", 10)
        ramp(count: n, rate: options.double("rate", 5000), churnRate: churnRate, churnLifetimeMs: lifetime)
        let publisher = makePublisher(connections: 4, window: 65_536)
        publisher.configure(accountSpan: n, accountPrefix: "acc_", paddingBytes: 0)
        let first = snapAll()
        let c0 = Totals(first)
        let recipients = c0.open
        let s0 = server(), g0 = generatorCPU(first), p0 = publisher.snapshot()
        let tStart = monotonicNanos()
        publisher.setRate(eventRate)
        watch(seconds: duration, publisher: publisher, label: "churn")
        publisher.setRate(0)
        let p1 = publisher.snapshot()
        let measured = seconds(since: tStart)
        drain()
        let s1 = server()
        let snaps = snapAll()
        let g1 = generatorCPU(snaps)
        let t = Totals(snaps)
        deliveryResults(t: t, p0: p0, p1: p1, s0: s0, s1: s1, g0: g0, g1: g1, duration: measured, recipients: 1, rate: eventRate)
        result["expected_deliveries"] = Double(p1.acked - p0.acked) * Double(recipients) / Double(n)
        result["lost"] = max(0, Double(p1.acked - p0.acked) * Double(recipients) / Double(n) - Double(t.received))
        result["churn_rate_offered"] = churnRate
        result["churn_lifetime_ms"] = lifetime
        result["churn_attempted"] = t.churnAttempted - c0.churnAttempted
        result["churn_established"] = t.churnEstablished - c0.churnEstablished
        result["churn_handshakes_per_second"] = r(Double(t.churnEstablished - c0.churnEstablished) / seconds(since: tStart), 1)
        result["failed_by_reason"] = t.failed
        result["stable_open_at_end"] = t.open
        result["handshake_latency"] = t.handshake.summary()
        _ = stopAll()
    }

    // MARK: slow

    func runSlow() {
        let n = options.int("n", 1000)
        let share = options.double("slow-share", 0.1)
        let intervalMs = options.double("interval-ms", 10)
        let duration = options.double("duration", 20)
        ramp(count: n, rate: options.double("rate", 5000), slowShare: share)
        let publisher = makePublisher()
        publisher.configure(accountSpan: 0, accountPrefix: "acc_", paddingBytes: options.int("payload", 4096))
        let first = snapAll()
        let t0 = Totals(first)
        let slowAtStart = t0.slowOpen
        let recipients = t0.open - t0.slowOpen
        let s0 = server(), g0 = generatorCPU(first), p0 = publisher.snapshot()
        let rate = 1000 / intervalMs
        publisher.setRate(rate)
        var series: [[String: Any]] = []
        var all = Histogram()
        var maxRSS = s0.rssBytes
        let start = monotonicNanos()
        var early = Histogram(), late = Histogram()
        while seconds(since: start) < duration {
            usleep(1_000_000)
            let snaps = snapAll()
            let t = Totals(snaps)
            let s = server()
            maxRSS = max(maxRSS, s.rssBytes)
            all.merge(t.latency)
            let el = seconds(since: start)
            if el <= 3 { early.merge(t.latency) }
            if el > duration - 5 { late.merge(t.latency) }
            let lat = t.latency.summary()
            series.append(["t": r(el, 10), "server_rss_mb": mb(s.rssBytes), "slow_open": t.slowOpen, "open": t.open,
                           "p50_ms": lat["p50_ms"] ?? 0, "p99_ms": lat["p99_ms"] ?? 0])
            note(String(format: "  [slow %@] %.0fs: RSS %.1f MB, %d of %d slow still open, others p99 %.2f ms", target.name, el,
                        mb(s.rssBytes), t.slowOpen, slowAtStart, lat["p99_ms"] ?? 0))
        }
        publisher.setRate(0)
        let p1 = publisher.snapshot()
        drain()
        let s1 = server()
        let snaps = snapAll()
        let g1 = generatorCPU(snaps)
        var t = Totals(snaps)
        all.merge(t.latency)
        t.latency = all
        deliveryResults(t: t, p0: p0, p1: p1, s0: s0, s1: s1, g0: g0, g1: g1, duration: duration, recipients: recipients, rate: rate)
        result["slow_at_start"] = slowAtStart
        result["slow_open_at_end"] = t.slowOpen
        result["slow_closed"] = slowAtStart - t.slowOpen
        result["server_rss_max_mb"] = mb(maxRSS)
        result["others_latency_first_3s"] = early.summary()
        result["others_latency_last_5s"] = late.summary()
        result["series"] = series
        result["payload_bytes"] = options.int("payload", 4096)
        if let admin = options.optional("admin-socket"), let client = try? AdminClient(socketPath: admin),
           let reply = try? client.request(#"{"op":"stats"}"#),
           let json = try? JSONSerialization.jsonObject(with: Data(reply)) as? [String: Any],
           let stats = json["stats"] as? [String: Any], let drops = stats["drops"] as? [String: Any] {
            result["hub_slow_consumer_closes"] = drops["slowConsumerCloses"] ?? NSNull()
        }
        _ = stopAll()
    }

    // MARK: publish

    func runPublish() {
        let n = options.int("n", 1000)
        let duration = options.double("duration", 5)
        ramp(count: n, rate: options.double("rate", 5000))
        let publisher = makePublisher(connections: options.int("publish-connections", 4), window: options.int("window", 16_384))
        publisher.configure(accountSpan: 2 * n, accountPrefix: "acc_", paddingBytes: 0)
        let first = snapAll()
        let s0 = server(), g0 = generatorCPU(first), p0 = publisher.snapshot()
        let tStart = monotonicNanos()
        publisher.setRate(0, unlimited: true)
        watch(seconds: duration, publisher: publisher, label: "publish")
        let p1 = publisher.snapshot()
        let s1 = server()
        let measured = seconds(since: tStart)
        publisher.setRate(0)
        drain()
        let snaps = snapAll()
        let g1 = generatorCPU(snaps)
        let t = Totals(snaps)
        let acked = p1.acked - p0.acked
        result["publishes_per_second"] = r(Double(acked) / measured, 1)
        result["published"] = acked
        result["publish_errors"] = p1.errors - p0.errors
        result["server_reported_delivered"] = p1.delivered - p0.delivered
        result["received"] = t.received
        let pEnd = publisher.snapshot()
        result["lost"] = max(0, Int(pEnd.delivered - p0.delivered) - Int(t.received))
        result["latency"] = t.latency.summary()
        result["server_cpu_percent"] = r((s1.cpuSeconds - s0.cpuSeconds) / measured * 100)
        result["server_cpu_us_per_publish"] = acked > 0 ? r((s1.cpuSeconds - s0.cpuSeconds) * 1e6 / Double(acked), 100) : 0
        result["generator_cpu_percent"] = r((g1 - g0) / measured * 100)
        result["machine_cpu_percent"] = MachineSample.busyPercent(s0.machine, s1.machine)
        result["publish_requests"] = p1.requests - p0.requests
        _ = stopAll()
    }

    // MARK: reconnect-storm (hub only: resumes with `since`)

    /// `--n` clients (one account each) all drop at once and resubscribe with `since` after `--away-ms` while
    /// `--event-rate` account events/s flow to them and to `--control` clients that stay connected. Reports the
    /// time until every storm client had its `subscribed` reply (recovered or not), the events replayed, the
    /// outcomes, seq gaps/duplicates seen by the clients, and the control clients' latency before and during the storm.
    func runReconnectStorm() {
        let n = options.int("n", 10_000)
        let control = options.int("control", 1000)
        let eventRate = options.double("event-rate", 10_000)
        let awayMs = options.int("away-ms", 2000)
        let baseline = options.double("baseline", 3)
        let timeout = options.double("storm-timeout", 60)
        ramp(count: n + control, rate: options.double("rate", 5000),
             storm: StormSpec(control: control, awayMs: awayMs, rate: options.double("storm-rate", 0)))
        let publisher = makePublisher(connections: 4, window: 65_536)
        publisher.configure(accountSpan: n + control, accountPrefix: "acc_", paddingBytes: options.int("payload", 0))
        publisher.setRate(eventRate)
        _ = snapAll()
        let b0 = server(), pb0 = publisher.snapshot()
        watch(seconds: baseline, publisher: publisher, label: "before")
        let before = Totals(snapAll())  // resets the histograms: what follows is the storm
        let b1 = server(), pb1 = publisher.snapshot()
        let stormClients = progressTotals().open - control
        let g0 = generatorCPU(), p0 = publisher.snapshot()
        let stormAt = monotonicNanos()
        for w in workers { w.send("storm") }
        var lastPrint = 0.0
        var finished = false
        while seconds(since: stormAt) < timeout {
            usleep(50_000)
            let t = progressTotals()
            let done = t.recovered + t.notRecoveredTotal + t.reconnectFailed
            let el = seconds(since: stormAt)
            if el - lastPrint >= 1 {
                lastPrint = el
                note(String(format: "  [reconnect-storm %@] %.1fs: %d dropped, %d reconnected, %d recovered, %d not, %d failed, %llu replayed",
                            target.name, el, t.stormDropped, t.reconnected, t.recovered, t.notRecoveredTotal, t.reconnectFailed, t.replayed))
            }
            if t.stormDropped >= stormClients && done >= t.stormDropped { finished = true; break }
        }
        usleep(1_000_000)  // the control clients' latency right after the storm still counts
        let s1 = server(), p1 = publisher.snapshot()
        let stormSeconds = seconds(since: stormAt)
        let during = snapAll()
        let g1 = generatorCPU(during)
        let d = Totals(during)
        publisher.setRate(0)
        let pEnd = publisher.snapshot()
        drain()
        let t = Totals(stopAll())
        let lastDone = during.map(\.lastRecoveryDoneAt).max() ?? 0
        result["storm_clients"] = stormClients
        result["control_clients"] = control
        result["away_ms"] = awayMs
        result["event_rate_offered"] = eventRate
        result["storm_finished"] = finished
        result["storm_dropped"] = d.stormDropped
        result["reconnected"] = d.reconnected
        result["recovered"] = d.recovered
        result["not_recovered_by_reason"] = d.notRecovered
        result["reconnect_failed"] = d.reconnectFailed
        result["events_replayed"] = d.replayed
        result["time_to_all_recovered_seconds"] = finished && lastDone > stormAt ? r(Double(lastDone - stormAt) / 1e9, 1000) : NSNull()
        result["time_after_away_seconds"] = finished && lastDone > stormAt ? r(Double(lastDone - stormAt) / 1e9 - Double(awayMs) / 1000, 1000) : NSNull()
        result["resume_latency"] = d.recovery.summary()
        result["seq_gaps"] = t.gaps
        result["seq_duplicates"] = t.duplicates
        result["control_latency_before"] = before.latency.summary()
        result["control_latency_during"] = d.latency.summary()
        result["published_before_rate"] = r(Double(pb1.acked - pb0.acked) / baseline, 1)
        result["published_during_rate"] = r(Double(p1.acked - p0.acked) / stormSeconds, 1)
        result["published"] = pEnd.acked
        result["publish_errors"] = pEnd.errors
        result["publish_skipped"] = pEnd.skipped
        result["server_cpu_percent_before"] = r((b1.cpuSeconds - b0.cpuSeconds) / baseline * 100)
        result["server_cpu_percent_during"] = r((s1.cpuSeconds - b1.cpuSeconds) / stormSeconds * 100)
        result["server_rss_end_mb"] = mb(s1.rssBytes)
        result["generator_cpu_percent"] = r((g1 - g0) / stormSeconds * 100)
        result["machine_cpu_percent"] = MachineSample.busyPercent(b1.machine, s1.machine)
        result["failed_by_reason"] = t.failed
        result["closed_by_reason"] = t.closed
        if let admin = options.optional("admin-socket"), let client = try? AdminClient(socketPath: admin),
           let reply = try? client.request(#"{"op":"stats"}"#),
           let json = try? JSONSerialization.jsonObject(with: Data(reply)) as? [String: Any],
           let stats = json["stats"] as? [String: Any], let history = stats["history"] as? [String: Any] {
            result["hub_recoveries"] = history["recoveries"] ?? NSNull()
            result["hub_replayed_events"] = history["replayedEvents"] ?? NSNull()
        }
        note(String(format: "  [reconnect-storm %@] %d clients: all answered in %@ s, %d recovered, %@ not, %llu replayed, control p99 %.2f ms before, %.2f ms during",
                    target.name, stormClients, "\(result["time_to_all_recovered_seconds"] ?? "-")", d.recovered, d.notRecovered.description,
                    d.replayed, before.latency.summary()["p99_ms"] ?? 0, d.latency.summary()["p99_ms"] ?? 0))
    }
}
