import CZlib
import Foundation
import Glibc
import HubEngine
import HubSupport
import Synchronization
import WSProtocol

/// What a graceful stop saves of the local broker: the epoch, every stream's numbering, the retained events in
/// publish order, and the idempotency keys. Plain data, so it can be checked before anything is trusted.
package struct SavedBrokerState: Equatable {
    package struct Stream: Equatable {
        /// Index into `channelNames`.
        var channel: Int
        var account: String?
        var generation: UInt64
        var lastSeq: UInt64
    }

    package struct Event: Equatable {
        /// Index into `streams`.
        var stream: Int
        var seq: UInt64
        var wallTime: Double
        var type: String
        /// The JSON payload (the frame header is rebuilt on load).
        var payload: [UInt8]
        /// Where `data` sits in `payload`.
        var dataStart: Int
        var dataEnd: Int
    }

    package struct IdempotencyKey: Equatable {
        var channel: Int
        var account: String?
        var key: String
        var seq: UInt64
        var delivered: Int
        var wallTime: Double
    }

    package var hubEpoch: String
    var nextGeneration: UInt64
    package var savedAt: Double
    var channelNames: [String]
    package var streams: [Stream] = []
    package var events: [Event] = []
    package var keys: [IdempotencyKey] = []
}

/// The state file: `HUBSTATE`, a version, the payload's length and CRC-32, then the payload (little-endian integers,
/// strings and byte strings prefixed with their u32 length). Written to a temporary file, synced, then renamed.
package enum StateFile {
    static let fileName = "recovery.state"
    static let magic: [UInt8] = Array("HUBSTATE".utf8)
    static let version: UInt32 = 1
    static let headerSize = 8 + 4 + 4 + 8 + 4
    /// The highest seq a saved stream may have: 2^53 - 1, the largest integer every JSON client (JavaScript's
    /// `Number`) holds exactly. A hub publishing a million events a second to one stream reaches it in 285 years.
    static let maxSeq: UInt64 = (1 << 53) - 1
    static let maxGeneration: UInt64 = 1 << 62

    package struct Invalid: Error, CustomStringConvertible {
        package let description: String
        init(_ description: String) { self.description = description }
    }

    package static func path(in directory: String) -> String {
        directory.hasSuffix("/") ? directory + fileName : directory + "/" + fileName
    }

    // MARK: Encoding

    package static func encode(_ state: SavedBrokerState) -> [UInt8] {
        var w = ByteWriter()
        w.string(state.hubEpoch)
        w.u64(state.nextGeneration)
        w.f64(state.savedAt)
        w.u32(UInt32(state.channelNames.count))
        for name in state.channelNames { w.string(name) }
        w.u32(UInt32(state.streams.count))
        for s in state.streams {
            w.u32(UInt32(s.channel))
            w.optionalString(s.account)
            w.u64(s.generation)
            w.u64(s.lastSeq)
        }
        w.u32(UInt32(state.events.count))
        for e in state.events {
            w.u32(UInt32(e.stream))
            w.u64(e.seq)
            w.f64(e.wallTime)
            w.string(e.type)
            w.bytes(e.payload)
            w.u32(UInt32(e.dataStart))
            w.u32(UInt32(e.dataEnd))
        }
        w.u32(UInt32(state.keys.count))
        for k in state.keys {
            w.u32(UInt32(k.channel))
            w.optionalString(k.account)
            w.string(k.key)
            w.u64(k.seq)
            w.u64(UInt64(max(0, k.delivered)))
            w.f64(k.wallTime)
        }
        var file = ByteWriter()
        file.raw(magic)
        file.u32(version)
        file.u32(0)
        file.u64(UInt64(w.bytes.count))
        file.u32(crc32(w.bytes))
        file.raw(w.bytes)
        return file.bytes
    }

    static func crc32(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBufferPointer { buffer in
            var crc = CZlib.crc32(0, nil, 0)
            var offset = 0
            while offset < buffer.count {  // zlib takes a uInt length: feed it in chunks
                let n = min(buffer.count - offset, 1 << 30)
                crc = CZlib.crc32(crc, buffer.baseAddress.map { $0 + offset }, uInt(n))
                offset += n
            }
            return UInt32(truncatingIfNeeded: crc)
        }
    }

    // MARK: Decoding

    /// Checks the magic, version, length and checksum, then every count and range against the bytes present:
    /// a corrupt or foreign file is an error, never a crash or a huge allocation.
    static func decode(_ file: [UInt8]) throws(Invalid) -> SavedBrokerState {
        guard file.count >= headerSize else { throw Invalid("too short to be a state file (\(file.count) bytes)") }
        guard Array(file[0..<8]) == magic else { throw Invalid("not a hub state file (wrong magic)") }
        var header = ByteReader(file[8..<headerSize])
        let fileVersion = try header.u32()
        guard fileVersion == version else { throw Invalid("state file version \(fileVersion), this hub reads version \(version)") }
        _ = try header.u32()
        let length = try header.u64()
        let checksum = try header.u32()
        guard length == UInt64(file.count - headerSize) else {
            throw Invalid("payload length \(length) does not match the file (\(file.count - headerSize) bytes): truncated?")
        }
        let payload = Array(file[headerSize...])
        guard crc32(payload) == checksum else { throw Invalid("checksum mismatch: the file is corrupt") }
        var r = ByteReader(payload[...])
        var state = SavedBrokerState(hubEpoch: try r.string(), nextGeneration: try r.u64(), savedAt: try r.f64(), channelNames: [])
        guard !state.hubEpoch.isEmpty, !state.hubEpoch.utf8.contains(UInt8(ascii: ".")) else { throw Invalid("bad epoch") }
        guard state.nextGeneration <= maxGeneration else { throw Invalid("next generation \(state.nextGeneration) out of range") }
        for _ in 0..<(try r.count(minimumBytesEach: 4)) { state.channelNames.append(try r.string()) }
        for _ in 0..<(try r.count(minimumBytesEach: 21)) {
            let stream = SavedBrokerState.Stream(channel: Int(try r.u32()), account: try r.optionalString(),
                                                 generation: try r.u64(), lastSeq: try r.u64())
            guard stream.channel < state.channelNames.count else { throw Invalid("stream with channel index \(stream.channel) out of range") }
            // Numbering must be able to go on: a seq at the edge would wrap (or leave what JSON clients hold exactly).
            guard stream.lastSeq <= maxSeq, stream.generation <= maxGeneration else {
                throw Invalid("a stream's numbering is out of range (seq \(stream.lastSeq), generation \(stream.generation))")
            }
            state.streams.append(stream)
        }
        for _ in 0..<(try r.count(minimumBytesEach: 36)) {
            let event = SavedBrokerState.Event(stream: Int(try r.u32()), seq: try r.u64(), wallTime: try r.f64(), type: try r.string(),
                                               payload: try r.bytes(), dataStart: Int(try r.u32()), dataEnd: Int(try r.u32()))
            guard event.stream < state.streams.count else { throw Invalid("event of stream index \(event.stream) out of range") }
            guard event.seq <= state.streams[event.stream].lastSeq else { throw Invalid("an event's seq is past its stream's") }
            // `data` is the payload's last member: it ends right before the closing brace.
            guard event.payload.count >= 2, event.dataEnd == event.payload.count - 1, event.dataStart <= event.dataEnd else {
                throw Invalid("event data range out of its payload")
            }
            state.events.append(event)
        }
        for _ in 0..<(try r.count(minimumBytesEach: 33)) {
            let key = SavedBrokerState.IdempotencyKey(channel: Int(try r.u32()), account: try r.optionalString(), key: try r.string(),
                                                      seq: try r.u64(), delivered: Int(clamping: try r.u64()), wallTime: try r.f64())
            guard key.channel < state.channelNames.count else { throw Invalid("key with channel index \(key.channel) out of range") }
            guard key.seq <= maxSeq else { throw Invalid("an idempotency key's seq is out of range") }
            state.keys.append(key)
        }
        guard r.isAtEnd else { throw Invalid("\(r.remaining) unexpected bytes after the last record") }
        return state
    }

    // MARK: Loading and saving

    /// The saved state in `directory`, if there is a trustworthy one, consumed: the file is removed before the
    /// state is returned, so a crash after this start can never resume the same numbering a second time (its next
    /// seqs would repeat ones this run gives out). A file that cannot be removed is not used: the hub starts a new
    /// epoch and says why. A file that cannot be read, is corrupt, foreign or unsafe (not a regular file, a symlink,
    /// writable by others) is logged and moved aside to `recovery.state.rejected` (never retried, kept for inspection).
    package static func load(directory: String, log: (String) -> Void) -> SavedBrokerState? {
        let target = path(in: directory)
        let state: SavedBrokerState
        do throws(Invalid) {
            guard let bytes = try read(directory: directory, maximumBytes: 1 << 34) else { return nil }
            state = try decode(bytes)
        } catch {
            let aside = target + ".rejected"
            let moved = rename(target, aside) == 0
            let why = moved ? "moved it to \(aside)" : "could not move it aside (\(String(cString: strerror(errno))))"
            log("recovery: ignoring the state file \(target): \(error.description); \(why); starting with a new epoch")
            return nil
        }
        guard unlink(target) == 0 else {
            log("recovery: not resuming \(target): it cannot be removed (\(String(cString: strerror(errno)))), and a state "
                + "that survives its own start would be resumed again after a crash, repeating seqs; starting with a new "
                + "epoch. Make the state directory writable by the hub")
            return nil
        }
        syncDirectory(directory)
        return state
    }

    // MARK: Files

    /// Writes `bytes` to `<directory>/recovery.state` through a temporary file (mode 0600), fsync and rename.
    package static func write(_ bytes: [UInt8], directory: String) throws(Invalid) {
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw Invalid("cannot create \(directory): \(String(cString: strerror(errno)))")
        }
        let target = path(in: directory)
        let temporary = target + ".tmp"
        // A leftover temporary (or anything planted under its name: a FIFO, a symlink) is replaced, never opened.
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Invalid("cannot create \(temporary): \(String(cString: strerror(errno)))") }
        var written = 0
        let ok = bytes.withUnsafeBytes { buffer -> Bool in
            while written < buffer.count {
                let n = Glibc.write(fd, buffer.baseAddress.map { $0 + written }, buffer.count - written)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return false }
                written += n
            }
            return true
        }
        let error = errno
        guard ok, fsync(fd) == 0 else {
            close(fd)
            unlink(temporary)
            throw Invalid("cannot write \(temporary): \(String(cString: strerror(error)))")
        }
        close(fd)
        guard rename(temporary, target) == 0 else {
            let e = errno
            unlink(temporary)
            throw Invalid("cannot rename \(temporary) to \(target): \(String(cString: strerror(e)))")
        }
        syncDirectory(directory)
    }

    /// Makes a rename or unlink in `directory` durable.
    static func syncDirectory(_ directory: String) {
        let dir = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dir >= 0 { _ = fsync(dir); close(dir) }
    }

    /// The file's bytes, or nil when there is none. Refused before anything is read: a symlink, anything but a
    /// regular file, a file that another user owns or that group or others may write (`SecretFile.ownershipProblem`),
    /// and a file whose size is not what its header says (a sparse file with a valid header is not read whole).
    static func read(directory: String, maximumBytes: Int) throws(Invalid) -> [UInt8]? {
        let target = path(in: directory)
        // O_NOFOLLOW: a symlink fails with ELOOP instead of being followed. O_NONBLOCK: a FIFO or a device opens at
        // once, to be refused below, instead of blocking the start before the hub listens or logs anything.
        let fd = open(target, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        if fd < 0 {
            let code = errno
            if code == ENOENT { return nil }
            if code == ELOOP { throw Invalid("it is a symbolic link (the hub resumes only a regular file it wrote itself)") }
            throw Invalid("cannot open it: \(String(cString: strerror(code)))")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw Invalid("cannot stat it: \(String(cString: strerror(errno)))") }
        guard (info.st_mode & S_IFMT) == S_IFREG else { throw Invalid("it is not a regular file") }
        if let unsafe = FileTrust.ownershipProblem(info) { throw Invalid(unsafe) }
        let size = Int(info.st_size)
        guard size <= maximumBytes else { throw Invalid("it is \(size) bytes, more than this hub would save") }
        guard size >= headerSize else { throw Invalid("too short to be a state file (\(size) bytes)") }
        var header = [UInt8](repeating: 0, count: headerSize)
        try readFully(fd, into: &header, at: 0)
        guard Array(header[0..<8]) == magic else { throw Invalid("not a hub state file (wrong magic)") }
        var fields = ByteReader(header[8...])
        _ = try fields.u32()
        _ = try fields.u32()
        let length = try fields.u64()
        guard length == UInt64(size - headerSize) else {
            throw Invalid("payload length \(length) does not match the file (\(size - headerSize) bytes): truncated?")
        }
        var bytes = [UInt8](repeating: 0, count: size)
        try readFully(fd, into: &bytes, at: 0)
        return bytes
    }

    private static func readFully(_ fd: Int32, into bytes: inout [UInt8], at offset: Int) throws(Invalid) {
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress.map { $0 + done }, $0.count - done, off_t(offset + done)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw Invalid("cannot read it\(n < 0 ? ": " + String(cString: strerror(errno)) : " (it shrank)")") }
            done += n
        }
    }
}

/// Little-endian output for the state file.
struct ByteWriter {
    private(set) var bytes: [UInt8] = []

    mutating func raw(_ b: [UInt8]) { bytes.append(contentsOf: b) }
    mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func f64(_ v: Double) { u64(v.bitPattern) }
    mutating func bytes(_ b: [UInt8]) { u32(UInt32(b.count)); raw(b) }
    mutating func string(_ s: String) { bytes(Array(s.utf8)) }
    mutating func optionalString(_ s: String?) {
        if let s { bytes.append(1); string(s) } else { bytes.append(0) }
    }
}

/// Bounds-checked little-endian input: every read throws `StateFile.Invalid` past the end.
struct ByteReader {
    private let data: ArraySlice<UInt8>
    private var position: Int

    init(_ data: ArraySlice<UInt8>) {
        self.data = data
        position = data.startIndex
    }

    var remaining: Int { data.endIndex - position }
    var isAtEnd: Bool { position == data.endIndex }

    private mutating func take(_ n: Int) throws(StateFile.Invalid) -> ArraySlice<UInt8> {
        guard n >= 0, remaining >= n else { throw StateFile.Invalid("truncated record at byte \(position - data.startIndex)") }
        defer { position += n }
        return data[position..<(position + n)]
    }

    mutating func u8() throws(StateFile.Invalid) -> UInt8 { try take(1).first ?? 0 }

    mutating func u32() throws(StateFile.Invalid) -> UInt32 {
        try take(4).reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
    }

    mutating func u64() throws(StateFile.Invalid) -> UInt64 {
        try take(8).reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
    }

    mutating func f64() throws(StateFile.Invalid) -> Double { Double(bitPattern: try u64()) }

    mutating func bytes() throws(StateFile.Invalid) -> [UInt8] { Array(try take(Int(try u32()))) }

    mutating func string() throws(StateFile.Invalid) -> String {
        let b = try bytes()
        guard let s = String(validating: b, as: UTF8.self) else { throw StateFile.Invalid("a string is not valid UTF-8") }
        return s
    }

    mutating func optionalString() throws(StateFile.Invalid) -> String? {
        switch try u8() {
        case 0: return nil
        case 1: return try string()
        case let flag: throw StateFile.Invalid("bad optional flag \(flag)")
        }
    }

    /// A record count, checked against the bytes left (each record takes at least `minimumBytesEach`).
    mutating func count(minimumBytesEach: Int) throws(StateFile.Invalid) -> Int {
        let n = Int(try u32())
        guard n <= remaining / max(1, minimumBytesEach) else { throw StateFile.Invalid("a count of \(n) records exceeds the file") }
        return n
    }
}

// MARK: - LocalBroker ⇄ saved state

extension LocalBroker {
    /// Everything a restart needs to go on with the same numbering: call once the loops have stopped (nothing is
    /// published any more, and every in-flight publish has completed).
    package func exportState() -> SavedBrokerState {
        state.withLock { s in
            var saved = SavedBrokerState(hubEpoch: epoch, nextGeneration: s.history.nextGeneration, savedAt: wallClockSeconds(),
                                         channelNames: channelNames)
            let (streams, events) = s.history.exportStreams()
            var index: [ObjectIdentifier: Int] = [:]
            for stream in streams {
                index[ObjectIdentifier(stream)] = saved.streams.count
                saved.streams.append(.init(channel: stream.key.channel, account: stream.key.account?.string,
                                           generation: stream.generation, lastSeq: stream.lastSeq))
            }
            let (wallNow, monotonicNow) = (wallClockSeconds(), monotonicNanos())
            for (stream, event) in events {
                guard let i = index[ObjectIdentifier(stream)] else { continue }
                let payload = event.payload
                let payloadStart = event.frame.count - payload.count
                saved.events.append(.init(stream: i, seq: event.seq, wallTime: event.wallTime(wallNow: wallNow, monotonicNow: monotonicNow),
                                          type: event.type, payload: Array(payload),
                                          dataStart: event.dataRange.lowerBound - payloadStart,
                                          dataEnd: event.dataRange.upperBound - payloadStart))
            }
            for entry in s.idempotency.exportEntries() {
                saved.keys.append(.init(channel: entry.stream.channel, account: entry.stream.account?.string, key: entry.key.string,
                                        seq: entry.seq, delivered: entry.delivered ?? 0, wallTime: entry.wallTime))
            }
            return saved
        }
    }

    /// Restores a saved state into a fresh broker state. Channels are matched by name (a channel no longer configured
    /// is dropped with its streams); a stream whose saved events are not consecutive up to its last seq keeps its
    /// numbering but not its events; events older than the TTL and keys older than the window are dropped.
    static func restore(_ saved: SavedBrokerState, into s: inout State, channelNames: [String]) {
        let now = monotonicNanos()
        let wallNow = wallClockSeconds()
        let current = ChannelIndex(channelNames)
        let channelMap = saved.channelNames.map { current[$0] }
        func key(_ channel: Int, _ account: String?) -> StreamKey? {
            guard channel < channelMap.count, let mapped = channelMap[channel] else { return nil }
            return StreamKey(channel: mapped, account: account.map { AccountID($0) })
        }
        func age(_ wallTime: Double) -> UInt64 {
            let seconds = wallNow - wallTime
            guard seconds > 0, seconds.isFinite else { return 0 }
            return seconds >= 1e9 ? UInt64.max / 2 : UInt64(seconds * 1e9)
        }

        var streams: [StreamState?] = []
        for saved in saved.streams {
            guard let k = key(saved.channel, saved.account), s.history.stream(k) == nil else { streams.append(nil); continue }
            streams.append(s.history.restoreStream(k, generation: saved.generation, lastSeq: saved.lastSeq, now: now))
        }
        // Which streams' events can be trusted: consecutive seqs ending at the stream's last seq.
        var expected = [UInt64?](repeating: nil, count: streams.count)
        var consistent = [Bool](repeating: true, count: streams.count)
        for event in saved.events {
            if let previous = expected[event.stream], event.seq != previous &+ 1 { consistent[event.stream] = false }
            expected[event.stream] = event.seq
        }
        for (i, last) in expected.enumerated() where last != nil && last != saved.streams[i].lastSeq { consistent[i] = false }

        var keeping = [Bool](repeating: false, count: streams.count)
        for event in saved.events {
            guard consistent[event.stream], let stream = streams[event.stream] else { continue }
            let eventAge = age(event.wallTime)
            // Expired events are a prefix of their stream: once one is kept, the rest are (contiguity).
            if !keeping[event.stream] && eventAge >= s.history.limits.ttlNanos { continue }
            keeping[event.stream] = true
            let frame = event.payload.withUnsafeBytes { SharedBytes.frame(opcode: .text, $0) }
            let offset = frame.count - event.payload.count
            let retained = RetainedEvent(frame: frame, seq: event.seq, acceptedAt: now > eventAge ? now - eventAge : 0,
                                         dataStart: offset + event.dataStart)
            s.history.restoreEvent(retained, in: stream, now: now)
        }
        s.history.finishRestore(now: now)

        for k in saved.keys {
            guard let stream = key(k.channel, k.account) else { continue }
            let keyAge = age(k.wallTime)
            guard keyAge < s.idempotency.windowNanos else { continue }
            s.idempotency.insert(stream, ExactString(k.key), seq: k.seq, delivered: k.delivered,
                                 now: now > keyAge ? now - keyAge : 0, wallTime: k.wallTime)
        }
    }
}
