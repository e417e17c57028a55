// Codec micro-benchmarks: decode+unmask through MessageReader, encode, UTF-8 validation, raw unmasking.
// Each measurement runs `repetitions` timed rounds of at least ~40 ms and reports the median, by the
// wall clock (ContinuousClock) and by thread CPU time (fairer when the machine is shared).
import Glibc
import WSProtocol

let repetitions = 7
let clock = ContinuousClock()
var sink = 0  // printed at the end so nothing is optimised away

/// Thread CPU time in ns: unlike the wall clock it does not count time the scheduler gave to other
/// processes, so it is the fairer per-core figure on a shared machine.
func cpuNanoseconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return Double(ts.tv_sec) * 1e9 + Double(ts.tv_nsec)
}

/// Last measurement's median CPU ns per call (see `measure`).
var lastCPU = 0.0

/// Times `body` over `repetitions` rounds of >= ~40 ms; returns the median wall-clock (ContinuousClock)
/// ns per call and stores the median thread-CPU ns per call in `lastCPU`.
@MainActor func measure(_ body: () -> Void) -> Double {
    var calls = 1
    while true {
        let t = clock.measure { for _ in 0..<calls { body() } }
        if t >= .milliseconds(40) || calls >= 1 << 24 { break }
        calls *= 2
    }
    var wall: [Double] = []
    var cpu: [Double] = []
    for _ in 0..<repetitions {
        let c0 = cpuNanoseconds()
        let t = clock.measure { for _ in 0..<calls { body() } }
        cpu.append((cpuNanoseconds() - c0) / Double(calls))
        let ns = Double(t.components.seconds) * 1e9 + Double(t.components.attoseconds) / 1e9
        wall.append(ns / Double(calls))
    }
    wall.sort()
    cpu.sort()
    lastCPU = cpu[cpu.count / 2]
    return wall[wall.count / 2]
}

func pad(_ s: String, _ width: Int) -> String { s.count >= width ? s : s + String(repeating: " ", count: width - s.count) }
func report(_ name: String, _ value: String, _ cpuValue: String, _ target: String = "") {
    print(pad(name, 50), pad(value, 16), pad(cpuValue, 16), target)
}
func gbps(bytes: Int, ns: Double) -> String { String(format2(Double(bytes) / ns)) + " GB/s" }
func format2(_ x: Double) -> String {
    let r = (x * 100).rounded() / 100
    return String(r)
}

// Key bytes and payload are ASCII, so the payload stays valid text whether it is currently masked or
// not: decoding the same buffer again re-masks it, and every pass is equally valid work.
let key: UInt32 = 0x1A2B_3C4D

func maskedStream(payloadSize: Int, opcode: Opcode, totalBytes: Int) -> (wire: [UInt8], frames: Int) {
    let payload = (0..<payloadSize).map { UInt8(0x20 + $0 % 90) }
    let frames = max(1, totalBytes / (payloadSize + 14))
    var wire: [UInt8] = []
    wire.reserveCapacity(frames * (payloadSize + 14))
    for _ in 0..<frames { FrameEncoder.encode(opcode: opcode, payload: payload, maskKey: key, into: &wire) }
    return (wire, frames)
}

print("CodecBench (median of \(repetitions) rounds; the machine may be shared, numbers are noisy)")
print(pad("name", 50), pad("wall clock", 16), pad("thread CPU", 16), "target")

// 1. Decode + unmask through MessageReader (server role), many frames per buffer.
for (size, opcode, label) in [(16, Opcode.text, "16 B text"), (16, .binary, "16 B binary"), (1024, .text, "1 KiB text"),
                              (1024, .binary, "1 KiB binary"), (65536, .text, "64 KiB text"), (65536, .binary, "64 KiB binary")] {
    var (wire, frames) = maskedStream(payloadSize: size, opcode: opcode, totalBytes: 1 << 20)
    var reader = MessageReader(configuration: MessageReaderConfiguration(role: .server))
    let ns = wire.withUnsafeMutableBytes { raw in
        measure {
            var n = 0
            let consumed = try! reader.read(raw) { message in
                if case .text(let p) = message { n &+= p.count } else if case .binary(let p) = message { n &+= p.count }
                return .continue
            }
            sink &+= n &+ consumed
        }
    }
    report("decode+unmask \(label) (MessageReader)", gbps(bytes: size * frames, ns: ns), gbps(bytes: size * frames, ns: lastCPU),
           size >= 65536 ? ">= 2 GB/s" : "")
    report("  ns per \(label) frame", format2(ns / Double(frames)) + " ns", format2(lastCPU / Double(frames)) + " ns",
           size == 16 && opcode == .text ? "< 100 ns" : "")
}

// 2. Encode cost per frame.
do {
    let payloadSize = 64
    var buffer = [UInt8](repeating: 0x41, count: FrameEncoder.maxServerHeaderSize + payloadSize)
    let ns = buffer.withUnsafeMutableBytes { raw in
        measure {
            for _ in 0..<100 {
                sink &+= FrameEncoder.writeHeader(into: raw, endingAt: FrameEncoder.maxServerHeaderSize, opcode: .text, payloadLength: payloadSize)
            }
        }
    }
    report("encode: writeHeader in place (64 B payload)", format2(ns / 100) + " ns/frame", format2(lastCPU / 100) + " ns/frame")
    let payload = [UInt8](repeating: 0x41, count: payloadSize)
    var out: [UInt8] = []
    out.reserveCapacity(1 << 16)
    let ns2 = measure {
        out.removeAll(keepingCapacity: true)
        for _ in 0..<100 { FrameEncoder.encode(opcode: .text, payload: payload, into: &out) }
        sink &+= out.count
    }
    report("encode: whole frame appended (64 B, server)", format2(ns2 / 100) + " ns/frame", format2(lastCPU / 100) + " ns/frame")
    let ns3 = measure {
        out.removeAll(keepingCapacity: true)
        for _ in 0..<100 { FrameEncoder.encode(opcode: .text, payload: payload, maskKey: key, into: &out) }
        sink &+= out.count
    }
    report("encode: whole frame appended (64 B, masked)", format2(ns3 / 100) + " ns/frame", format2(lastCPU / 100) + " ns/frame")
}

// 3. UTF-8 validation.
do {
    let size = 1 << 20
    let ascii = (0..<size).map { UInt8(0x20 + $0 % 90) }
    var mixed: [UInt8] = []
    let sample = Array("Hello κόσμε — € 𝄞 日本語テキスト ".utf8)
    while mixed.count < size { mixed += sample }
    var cyrillic: [UInt8] = []
    let sample2 = Array("Съешь же ещё этих мягких французских булок ".utf8)
    while cyrillic.count < size { cyrillic += sample2 }
    var cjk: [UInt8] = []
    let sample3 = Array("日本語のテキストを検証します。中文文本的验证速度。".utf8)
    while cjk.count < size { cjk += sample3 }
    var emoji: [UInt8] = []
    let sample4 = Array("😀🎉🚀👍🏽🌍🔥🧪𝄞 ".utf8)
    while emoji.count < size { emoji += sample4 }
    for (label, bytes) in [("ASCII", ascii), ("mixed multi-byte", mixed), ("Cyrillic (mostly 2-byte)", cyrillic),
                           ("CJK (3-byte)", cjk), ("emoji (mostly 4-byte)", emoji)] {
        let ns = bytes.withUnsafeBytes { raw in
            measure { var v = UTF8Validator(); sink &+= v.validate(raw) && v.isComplete ? 1 : 0 }
        }
        report("UTF-8 validate 1 MiB \(label)", gbps(bytes: bytes.count, ns: ns), gbps(bytes: bytes.count, ns: lastCPU),
               ">= 2 GB/s")
    }
}

// 4. Raw applyMask.
for size in [1 << 10, 64 << 10, 1 << 20] {
    var bytes = [UInt8](repeating: 0x55, count: size + 1)
    let ns = bytes.withUnsafeMutableBytes { raw in
        let unaligned = UnsafeMutableRawBufferPointer(rebasing: raw[1...])
        return measure { sink &+= applyMask(unaligned, key: key, phase: 1) }
    }
    report("applyMask \(size >> 10) KiB (unaligned)", gbps(bytes: size, ns: ns), gbps(bytes: size, ns: lastCPU), size >= 65536 ? ">= 2 GB/s" : "")
}

// 5. permessage-deflate (DeflateBench.swift).
runDeflateBenchmarks()

print("(checksum \(sink & 0xFFFF))")
