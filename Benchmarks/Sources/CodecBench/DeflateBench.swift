import WSProtocol

/// permessage-deflate throughput: compress and decompress MB/s (of uncompressed bytes) for 1 KiB and
/// 64 KiB JSON-like messages, with and without context takeover. Each figure is the median of several
/// runs timed with ContinuousClock; every run processes about 8 MiB so short messages are not timer noise.
func runDeflateBenchmarks() {
    print("permessage-deflate (zlib level 6, memLevel 8, window 15), median of 7 runs")
    print("size      takeover  ratio   compress MB/s  decompress MB/s")
    for size in [1024, 64 * 1024] {
        for takeover in [true, false] {
            let r = benchmarkDeflate(messageSize: size, takeover: takeover)
            let label = size >= 1024 * 64 ? "64 KiB" : "1 KiB"
            print("\(deflatePad(label, 10))\(deflatePad(takeover ? "yes" : "no", 10))\(deflatePad(format(r.ratio, 3), 8))"
                + "\(deflatePad(format(r.compressMBps, 1), 15))\(format(r.decompressMBps, 1))")
        }
    }
}

struct DeflateBenchResult {
    var ratio: Double
    var compressMBps: Double
    var decompressMBps: Double
}

func benchmarkDeflate(messageSize: Int, takeover: Bool, runs: Int = 7) -> DeflateBenchResult {
    // Enough distinct messages to fill 4 windows (>= 128 KiB), so takeover cannot simply point back at an
    // identical earlier message; what it gains is the shared vocabulary, as in a real event stream.
    let distinct = max(16, (128 * 1024) / messageSize)
    let messages = (0..<distinct).map { jsonLikeMessage(size: messageSize, seed: $0) }
    let perRun = max(16, (8 << 20) / messageSize)
    let deflater = PerMessageDeflater(windowBits: 15, noContextTakeover: !takeover)
    let inflater = PerMessageInflater(noContextTakeover: !takeover)
    let clock = ContinuousClock()
    var compressTimes: [Duration] = []
    var decompressTimes: [Duration] = []
    var compressedBytes = 0
    var checksum = 0
    for _ in 0..<runs {
        var compressed: [[UInt8]] = []
        compressed.reserveCapacity(perRun)
        compressTimes.append(clock.measure {
            for i in 0..<perRun { compressed.append(deflater.compressMessage(messages[i % distinct])) }
        })
        compressedBytes = compressed.reduce(0) { $0 + $1.count }
        var output: [UInt8] = []
        output.reserveCapacity(messageSize)
        decompressTimes.append(clock.measure {
            for c in compressed {
                output.removeAll(keepingCapacity: true)
                c.withUnsafeBytes { raw in
                    do throws(ProtocolViolation) {
                        try inflater.decompressMessage(raw, into: &output, limit: messageSize)
                    } catch {
                        fatalError("benchmark data failed to inflate: \(error)")
                    }
                }
                checksum &+= output.count
            }
        })
    }
    precondition(checksum == runs * perRun * messageSize, "inflated size mismatch")
    let megabytes = Double(perRun * messageSize) / 1_000_000
    return DeflateBenchResult(ratio: Double(compressedBytes) / Double(perRun * messageSize),
                              compressMBps: megabytes / seconds(median(compressTimes)),
                              decompressMBps: megabytes / seconds(median(decompressTimes)))
}

/// A hub-event-like JSON payload of exactly `size` bytes (deterministic per seed).
func jsonLikeMessage(size: Int, seed: Int) -> [UInt8] {
    var state = UInt64(seed) &* 0x9E3779B97F4A7C15 &+ 1
    func next() -> Int {
        state ^= state << 13; state ^= state >> 7; state ^= state << 17
        return Int(truncatingIfNeeded: state & 0xFFFF)
    }
    var s = "["
    while s.utf8.count < size {
        s += "{\"channel\":\"orders.\(next() % 40)\",\"event\":\"updated\",\"id\":\(next()),\"ts\":17\(next())\(next() % 1000),"
        s += "\"data\":{\"price\":\(next() % 5000).\(next() % 100),\"qty\":\(next() % 90),\"user\":\"u\(next())\",\"note\":\"ok\"}},"
    }
    return Array(s.utf8.prefix(size))
}

private func median(_ values: [Duration]) -> Duration { values.sorted()[values.count / 2] }

private func seconds(_ d: Duration) -> Double {
    let c = d.components
    return max(1e-9, Double(c.seconds) + Double(c.attoseconds) / 1e18)
}

private func format(_ x: Double, _ decimals: Int) -> String {
    var scale = 1
    for _ in 0..<decimals { scale *= 10 }
    let scaled = Int(x * Double(scale) + 0.5)  // x >= 0; avoids libm
    guard decimals > 0 else { return String(scaled) }
    let frac = String(scaled % scale)
    return "\(scaled / scale)." + String(repeating: "0", count: decimals - frac.count) + frac
}

private func deflatePad(_ s: String, _ width: Int) -> String {
    s.count >= width ? s + " " : s + String(repeating: " ", count: width - s.count)
}
