// libFuzzer target for the cluster wire format's decoder (Sources/Hub/Redis/ClusterWire.swift): what a node reads
// from a Redis fan-out channel, which anything that can publish on Redis can write. Built by `Fuzz/run ClusterWire
// SECONDS` together with the files on the `fuzz-sources:` line below (so no `import` of them).
// fuzz-sources: Sources/Hub/Redis/ClusterWire.swift Tests/HubTests/Support/ClusterWireScenario.swift
//
// Invariants (ClusterWireScenario.swift; `swift test` replays the corpus, Tests/HubTests/Corpus/clusterwire/):
// no crash; a decoded message re-encodes to the same bytes, and so does the event inside it.

import Glibc

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzClusterWire(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    if let problem = ClusterWireScenario.run(Array(UnsafeBufferPointer(start: data, count: size))) {
        fputs("ClusterWire fuzz invariant failed: \(problem)\n", stderr)
        abort()
    }
    return 0
}
