// libFuzzer target for the RESP decoder (the Redis broker's reply parser). Built by `Fuzz/run RESP SECONDS`
// together with the file named on the `fuzz-sources:` line below (so no `import` of it).
// fuzz-sources: Sources/Hub/Redis/RESP.swift
//
// Input format: byte 0 picks the limits (bits 0-1). The rest is cut into reads the way FramesFuzz does (a length
// byte L, then the next L bytes; L == 0: all the rest). The stream (the reads' bytes) is decoded twice, in one read
// and in those reads, with the engine's contract around it (bytes not consumed are handed back in front of the
// next read).
// Invariants: no crash; no call makes no progress on a complete value; both decodings give the same values and
// the same error (a split stream fails exactly where the whole one does, with the same kind); a bulk never exceeds
// its limit, an aggregate never has more elements than allowed, nesting never exceeds the depth limit; after an
// error the decoder keeps failing.

import Glibc

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRESP(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let all: [RESPLimits] = [
        RESPLimits(),
        RESPLimits(maxLineBytes: 8, maxBulkBytes: 4, maxElements: 3, maxDepth: 2),
        RESPLimits(maxLineBytes: 32, maxBulkBytes: 64, maxElements: 16, maxDepth: 4),
        RESPLimits(maxLineBytes: 1, maxBulkBytes: 0, maxElements: 0, maxDepth: 1),
    ]
    let limits = all[Int(data[0] & 3)]
    let rest = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))

    var chunks: [[UInt8]] = []
    var i = 0
    while i < rest.count {
        var length = Int(rest[i]); i += 1
        if length == 0 || length > rest.count - i { length = rest.count - i }
        chunks.append(Array(rest[i..<(i + length)]))
        i += length
    }
    let whole = decode([chunks.flatMap { $0 }], limits: limits)
    let split = decode(chunks, limits: limits)
    check(split.values == whole.values || (split.values.count == whole.values.count && hasNaN(split.values)),
          "split decoding gave other values: \(split.values.count) vs \(whole.values.count)")
    check(split.error?.kind == whole.error?.kind, "split decoding failed differently: \(String(describing: split.error)) vs \(String(describing: whole.error))")
    for value in split.values { checkBounds(value, limits: limits, depth: 0) }
    return 0
}

private func decode(_ chunks: [[UInt8]], limits: RESPLimits) -> (values: [RESPValue], error: RESPError?) {
    var decoder = RESPDecoder(limits: limits)
    var held: [UInt8] = []
    var values: [RESPValue] = []
    for chunk in chunks {
        held += chunk
        var start = 0
        var rounds = 0
        while true {
            rounds += 1
            check(rounds <= held.count + 2, "decoder makes no progress")
            let result: Result<RESPDecoder.Next, RESPError> = held.withUnsafeBytes { buffer in
                do throws(RESPError) { return .success(try decoder.next(in: buffer, from: start)) } catch { return .failure(error) }
            }
            switch result {
            case .failure(let error):
                // Poisoned: the same error again, whatever comes next.
                let again: RESPError? = [UInt8]("+OK\r\n".utf8).withUnsafeBytes { buffer in
                    do throws(RESPError) { _ = try decoder.next(in: buffer, from: 0); return nil } catch { return error }
                }
                check(again == error, "a failed decoder parsed again")
                return (values, error)
            case .success(.value(let value, let next)):
                check(next > start && next <= held.count, "value without progress or past the buffer")
                values.append(value)
                start = next
            case .success(.incomplete(let keep)):
                check(keep >= start && keep <= held.count, "keep outside the buffer")
                // What is kept is an unfinished header line, never more than one line's worth.
                check(held.count - keep <= limits.maxLineBytes + 3, "kept \(held.count - keep) bytes")
                held.removeFirst(keep)
                start = -1
            }
            if start < 0 { break }
        }
    }
    return (values, nil)
}

private func checkBounds(_ value: RESPValue, limits: RESPLimits, depth: Int) {
    switch value {
    case .bulk(let b): check(b.count <= limits.maxBulkBytes, "bulk over the limit")
    case .array(let items), .push(let items), .map(let items):
        check(depth < limits.maxDepth, "nesting over the limit")
        check(items.count <= limits.maxElements, "aggregate over the limit")
        for item in items { checkBounds(item, limits: limits, depth: depth + 1) }
    default: break
    }
}

private func hasNaN(_ values: [RESPValue]) -> Bool {
    values.contains { value in
        switch value {
        case .double(let d): return d.isNaN
        case .array(let items), .push(let items), .map(let items): return hasNaN(items)
        default: return false
        }
    }
}

/// Says why on stderr, then aborts (libFuzzer saves the input).
private func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    guard !condition else { return }
    print("==== invariant broken: \(message())")
    abort()
}
