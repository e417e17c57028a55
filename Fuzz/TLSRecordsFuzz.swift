// libFuzzer target for the hub's TLS 1.3 record layer (Sources/Hub/Engine/TLSRecords.swift), which opens whatever
// a client sends after the handshake. Built by `Fuzz/run TLSRecords SECONDS` together with the files on the
// `fuzz-sources:` line below (so no `import` of them).
// fuzz-sources: Sources/Hub/Engine/TLSRecords.swift Sources/Hub/Engine/Syscall.swift Tests/HubTests/Support/TLSRecordScenario.swift
//
// The input is a client's session: records sealed with the client's keys (application data with padding,
// KeyUpdates, alerts, records of forbidden types, raw bytes), written over a socketpair in pieces and read by the
// server's layer. The input format and the invariants are in TLSRecordScenario.swift; `swift test` replays the
// corpus (Tests/HubTests/Corpus/tlsrecords/) through the same code.

import Glibc

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTLSRecords(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    if let problem = TLSRecordScenario.run(Array(UnsafeBufferPointer(start: data, count: size))) {
        fputs("TLSRecords fuzz invariant failed: \(problem)\n", stderr)
        abort()
    }
    return 0
}
