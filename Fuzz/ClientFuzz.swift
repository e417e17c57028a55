// libFuzzer target for a whole client connection: the real `ClientConnection` (HTTP head, /ws with its token
// scenarios, /echo with and without permessage-deflate, frames, close) behind a socketpair on a caller-driven
// event loop. The driver and its invariants live in Tests/HubTests/Support/ConnectionHarness.swift (compiled in
// here by `Fuzz/run Client SECONDS`, and into the test run that replays Tests/HubTests/Corpus/client/).
// Input: byte 0 picks the scenario (see `ConnectionHarness.runClient`), the rest is cut into reads by its own bytes.

import Glibc

nonisolated(unsafe) private var harness: ConnectionHarness? = nil

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzClient(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    if harness == nil {
        signal(SIGPIPE, SIG_IGN)  // as the hub does at startup
        do {
            let h = try ConnectionHarness()
            h.checkDescriptors = true
            harness = h
        } catch {
            fail("harness setup: \(error)")
        }
    }
    guard let h = harness else { return 0 }
    do {
        try h.runClient(UnsafeRawBufferPointer(start: data, count: size))
    } catch {
        fail("invariant broken: \(error)")
    }
    return 0
}

/// Says why on stderr, then aborts (libFuzzer saves the input as a crash artifact). Not `preconditionFailure`:
/// an -O build drops its message.
private func fail(_ message: String) -> Never {
    let text = Array("\n==== \(message)\n".utf8)
    _ = text.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    abort()
}
