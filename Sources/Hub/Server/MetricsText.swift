import HubEngine
import HubRouting

/// Prometheus text exposition (format 0.0.4) for `GET /metrics`.
enum MetricsText {
    static func render(snapshots: [LoopSnapshot], channelNames: [String], maxConnections: Int,
                       descriptorLimit: Int, openDescriptors: Int, broker: BrokerStatistics) -> String {
        var total = LoopSnapshot.Totals()
        var latency = LatencyHistogram()
        for s in snapshots {
            total.add(s)
            if let l = s.latency { latency.merge(l) }
        }
        let ledger = snapshots.first?.ledger
        var out = ""
        func metric(_ name: String, _ type: String, _ help: String, _ samples: [(labels: String, value: String)]) {
            out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
            for s in samples { out += "\(name)\(s.labels) \(s.value)\n" }
        }
        func one(_ value: Int) -> [(labels: String, value: String)] { [("", String(value))] }
        func perChannel(_ values: [Int]) -> [(labels: String, value: String)] {
            channelNames.enumerated().map { ("{channel=\"\(escape($0.element))\"}", String(values.indices.contains($0.offset) ? values[$0.offset] : 0)) }
        }

        metric("hub_connections", "gauge", "Open WebSocket connections.", one(total.counters.upgraded))
        metric("hub_connections_handshaking", "gauge", "TCP connections that have not completed the HTTP handshake.", one(total.counters.handshaking))
        metric("hub_connection_limit", "gauge", "Client connections beyond which new clients get HTTP 503.", one(maxConnections))
        var subscribers = Array(repeating: 0, count: channelNames.count)
        for s in snapshots { for i in subscribers.indices { subscribers[i] += s.subscribersPerChannel[i] } }
        metric("hub_subscriptions", "gauge", "Subscribed connections per channel.", perChannel(subscribers))
        metric("hub_messages_in_total", "counter", "WebSocket data messages received from clients.", one(total.counters.messagesIn))
        metric("hub_messages_out_total", "counter", "WebSocket messages (events and replies) queued to clients.", one(total.counters.messagesOut))
        metric("hub_bytes_in_total", "counter", "Bytes read from sockets.", one(total.engine.bytesIn))
        metric("hub_bytes_out_total", "counter", "Bytes written to sockets.", one(total.engine.bytesOut))
        metric("hub_events_published_total", "counter", "Events accepted on the publish socket, per channel.", perChannel(ledger?.publishedPerChannel ?? []))
        metric("hub_event_deliveries_total", "counter", "Event copies handed to connections, per channel.", perChannel(ledger?.deliveredPerChannel ?? []))
        metric("hub_slow_consumer_closes_total", "counter", "Connections closed with 4008 for exceeding the outbound queue cap.", one(total.counters.slowConsumerCloses))
        metric("hub_rate_limited_total", "counter", "Client messages refused by the rate limit.", one(total.counters.rateLimited))
        metric("hub_rejected_connections_total", "counter", "Connections refused at the connection or descriptor limit.",
               one(total.counters.rejectedConnections + total.engine.shedConnections))
        metric("hub_protocol_errors_total", "counter", "WebSocket connections closed for protocol violations.", one(total.counters.protocolErrors))
        metric("hub_tls_handshakes_total", "counter", "TLS handshakes completed.", one(total.engine.tlsHandshakes))
        metric("hub_tls_record_layer_connections_total", "counter",
               "TLS 1.3 connections handed from OpenSSL to the hub's own record layer after the handshake.", one(total.engine.tlsRecordLayerConnections))
        metric("hub_tls_handshake_failures_total", "counter", "TLS handshakes failed (bad hello, old protocol version, no common cipher, peer gone, timed out excluded).",
               one(total.engine.tlsHandshakeFailures))
        metric("hub_tls_plaintext_refused_total", "counter", "Plain HTTP sent to a TLS port (answered 400 TLS_REQUIRED in the clear).", one(total.engine.tlsPlaintextRefused))
        metric("hub_tls_hello_on_plain_port_total", "counter", "TLS ClientHellos sent to a plain port (answered 400 TLS_NOT_ENABLED in the clear).",
               one(total.counters.tlsHelloOnPlainPort))
        metric("hub_auth_failures_total", "counter", "Refused tokens by reason.",
               total.counters.authFailures.sorted { $0.key < $1.key }.map { ("{reason=\"\(escape($0.key))\"}", String($0.value)) })
        metric("hub_recoveries_total", "counter", "Resumes (subscribe with since) by outcome, per channel.",
               RecoveryOutcome.labels.enumerated().map { ("{outcome=\"\($0.element)\"}", String(total.counters.recoveries[$0.offset])) })
        metric("hub_replayed_events_total", "counter", "Events replayed from history to resuming connections.", one(total.counters.replayedEvents))
        metric("hub_history_bytes", "gauge", "Bytes of the history ring in use: entries not yet overwritten (each its frame + 32), live or not.", one(broker.historyBytes))
        metric("hub_history_limit_bytes", "gauge", "The history memory cap (--history-memory).", one(broker.historyLimitBytes))
        metric("hub_history_events", "gauge", "Events retained in history.", one(broker.events))
        metric("hub_history_streams", "gauge", "Streams the hub keeps a sequence number for.", one(broker.streams))
        metric("hub_history_evictions_total", "counter", "Live events the history ring (--history-memory) overwrote, oldest first.", one(broker.evictions))
        metric("hub_history_expirations_total", "counter", "Events dropped from history after --history-ttl.", one(broker.expirations))
        metric("hub_idempotent_duplicates_total", "counter", "Publishes not delivered again because their idempotencyKey was seen.", one(broker.duplicates))
        if let cluster = broker.cluster {
            metric("hub_broker_up", "gauge", "Cluster mode: 1 while both Redis connections (commands, fan-out) are up.", one(cluster.healthy ? 1 : 0))
            metric("hub_broker_publishes_total", "counter", "Cluster mode: events numbered in Redis through this node.", one(cluster.published))
            metric("hub_broker_publish_failures_total", "counter", "Cluster mode: publishes refused with BROKER_UNAVAILABLE.", one(cluster.publishFailures))
            metric("hub_broker_publish_scripts_total", "counter", "Cluster mode: publish script calls sent to Redis (each numbers a batch of events).",
                   one(cluster.publishScriptCalls))
            metric("hub_broker_publish_round_trip_seconds_sum", "counter", "Cluster mode: summed time from a publish request's events queued to their last reply.",
                   [("", String(Double(cluster.publishNanos) / 1e9))])
            metric("hub_broker_publish_round_trip_seconds_count", "counter", "Cluster mode: publish requests answered through Redis.", one(cluster.publishRoundTrips))
            metric("hub_broker_publish_round_trip_max_seconds", "gauge", "Cluster mode: the longest publish request round trip.",
                   [("", String(Double(cluster.publishMaxNanos) / 1e9))])
            metric("hub_broker_messages_total", "counter", "Cluster mode: fan-out messages received from Redis.", one(cluster.received))
            metric("hub_broker_gaps_total", "counter", "Cluster mode: gaps in a stream's numbering seen by this node (filled from history).", one(cluster.gaps))
            metric("hub_broker_filled_events_total", "counter", "Cluster mode: events read from history to fill gaps.", one(cluster.filledEvents))
            metric("hub_broker_unfillable_events_total", "counter", "Cluster mode: events a gap fill found trimmed from history.", one(cluster.unfillable))
            metric("hub_broker_undecodable_events_total", "counter", "Cluster mode: events of followed streams this node could not decode (another version's, or damaged).",
                   one(cluster.undecodable))
            metric("hub_broker_reconnects_total", "counter", "Cluster mode: Redis connections lost and re-established.", one(cluster.reconnects))
        }
        metric("hub_open_fds", "gauge", "Open file descriptors.", one(openDescriptors))
        metric("hub_max_fds", "gauge", "The open-file limit.", one(descriptorLimit))

        out += "# HELP hub_publish_to_write_seconds Time from publish acceptance to the event being queued for a connection.\n"
        out += "# TYPE hub_publish_to_write_seconds histogram\n"
        var cumulative: UInt64 = 0
        let bounds: [Double] = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1]
        var bucketIndex = 0
        for bound in bounds {
            let limit = UInt64(bound * 1e9)
            while bucketIndex < latency.counts.count && LatencyHistogram.upperBound(ofBucket: bucketIndex) <= limit {
                cumulative += latency.counts[bucketIndex]
                bucketIndex += 1
            }
            out += "hub_publish_to_write_seconds_bucket{le=\"\(bound)\"} \(cumulative)\n"
        }
        out += "hub_publish_to_write_seconds_bucket{le=\"+Inf\"} \(latency.total)\n"
        out += "hub_publish_to_write_seconds_sum \(Double(latency.sumNanoseconds) / 1e9)\n"
        out += "hub_publish_to_write_seconds_count \(latency.total)\n"
        return out
    }

    static func escape(_ s: String) -> String {
        s.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"").replacing("\n", with: "\\n")
    }
}
