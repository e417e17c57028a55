import COpenSSL
import Glibc
import HubSupport

public struct SecretFileError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String
    init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The HS256 secret on disk. The file's text is the secret (surrounding ASCII whitespace ignored),
/// so the same file can be shared verbatim with the REST API that issues the tokens.
public enum SecretFile {
    public static let fileName = "jwt-secret"
    /// Files larger than this are not secrets; refuse rather than read them.
    public static let maximumFileBytes = 64 * 1024

    public struct Loaded: Sendable, Equatable {
        public let secret: [UInt8]
        public let path: String
        /// `true` when this call generated the file.
        public let created: Bool
        /// `true` when group or others can read the file: the hub should log a warning.
        public let groupOrWorldReadable: Bool
    }

    /// Reads a secret file. Throws if it is missing, not a regular file, too large, or empty after trimming.
    public static func read(path: String, what: String = "secret file") throws(SecretFileError) -> Loaded {
        switch readFile(path: path, what: what) {
        case .success(let loaded): return loaded
        case .failure(let failure): throw failure.error
        }
    }

    /// Returns `<stateDirectory>/jwt-secret`, creating the directory (0700) and the file (0600,
    /// 32 random bytes from `RAND_bytes`, written as 64 hex characters) if missing. The file is
    /// written to a temporary name and published with `link(2)`, so concurrent starters never
    /// see a partial file and never overwrite each other: the loser reads the winner's secret.
    public static func loadOrCreate(stateDirectory: String) throws(SecretFileError) -> Loaded {
        try makeDirectories(stateDirectory)
        let path = stateDirectory.hasSuffix("/") ? stateDirectory + fileName : stateDirectory + "/" + fileName
        for _ in 0..<3 {
            switch readFile(path: path) {
            case .success(let loaded): return loaded
            case .failure(let failure) where failure.errnoValue == ENOENT:
                if let created = try create(path: path, directory: stateDirectory) { return created }
                // Lost a race: another process published first. Loop to read its file.
            case .failure(let failure): throw failure.error
            }
        }
        throw SecretFileError("could not create or read \(path)")
    }

    // MARK: - Implementation

    private struct ReadFailure: Error {
        let error: SecretFileError
        let errnoValue: Int32
    }

    /// Checks a file that another library opens itself (the TLS certificate and key): a regular file, not blocking
    /// (a FIFO), not writable by others. Throws what is wrong.
    public static func checkTrusted(path: String, what: String) throws(SecretFileError) {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { throw SecretFileError("cannot read the \(what) \(path): \(describe(errno))") }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw SecretFileError("cannot stat \(what) \(path): \(describe(errno))") }
        guard info.st_mode & S_IFMT == S_IFREG else { throw SecretFileError("\(what) \(path) is not a regular file") }
        if let problem = FileTrust.ownershipProblem(info) { throw SecretFileError("\(what) \(path) is refused: \(problem)") }
    }

    private static func readFile(path: String, what: String = "secret file") -> Result<Loaded, ReadFailure> {
        // O_NONBLOCK: a FIFO at the path opens at once (and is refused below) instead of blocking the start.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        if fd < 0 {
            let code = errno
            return .failure(ReadFailure(error: SecretFileError("cannot open \(what) \(path): \(describe(code))"), errnoValue: code))
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            return .failure(ReadFailure(error: SecretFileError("cannot stat \(what) \(path): \(describe(code))"), errnoValue: code))
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            return .failure(ReadFailure(error: SecretFileError("\(what) \(path) is not a regular file"), errnoValue: 0))
        }
        if let problem = FileTrust.ownershipProblem(info) {
            return .failure(ReadFailure(error: SecretFileError("\(what) \(path) is refused: \(problem)"), errnoValue: 0))
        }
        guard info.st_size <= maximumFileBytes else {
            return .failure(ReadFailure(error: SecretFileError("\(what) \(path) is larger than \(maximumFileBytes) bytes"), errnoValue: 0))
        }
        var contents: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                let code = errno
                if code == EINTR { continue }
                return .failure(ReadFailure(error: SecretFileError("cannot read \(what) \(path): \(describe(code))"), errnoValue: code))
            }
            if n == 0 { break }
            contents.append(contentsOf: buffer[..<n])
            if contents.count > maximumFileBytes {
                return .failure(ReadFailure(error: SecretFileError("\(what) \(path) is larger than \(maximumFileBytes) bytes"), errnoValue: 0))
            }
        }
        let secret = trimmingWhitespace(contents)
        // Scrub the read buffers; the returned secret is the only copy we keep.
        for index in contents.indices { contents[index] = 0 }
        for index in buffer.indices { buffer[index] = 0 }
        guard !secret.isEmpty else {
            return .failure(ReadFailure(error: SecretFileError("\(what) \(path) is empty"), errnoValue: 0))
        }
        let readable = info.st_mode & (S_IRGRP | S_IROTH) != 0
        return .success(Loaded(secret: secret, path: path, created: false, groupOrWorldReadable: readable))
    }

    static func trimmingWhitespace(_ bytes: [UInt8]) -> [UInt8] {
        func isSpace(_ b: UInt8) -> Bool { b == 0x20 || (0x09...0x0D).contains(b) }
        guard let start = bytes.firstIndex(where: { !isSpace($0) }),
              let end = bytes.lastIndex(where: { !isSpace($0) }) else { return [] }
        return Array(bytes[start...end])
    }

    /// Writes a new secret under a temporary name and links it into place.
    /// Returns `nil` if another process published the file first.
    private static func create(path: String, directory: String) throws(SecretFileError) -> Loaded? {
        var random = [UInt8](repeating: 0, count: 32)
        guard RAND_bytes(&random, Int32(random.count)) == 1 else {
            throw SecretFileError("RAND_bytes failed; cannot generate a secret")
        }
        let hexDigits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        for byte in random {
            text.append(hexDigits[Int(byte >> 4)])
            text.append(hexDigits[Int(byte & 0xF)])
        }
        for index in random.indices { random[index] = 0 }
        let secret = text
        text.append(UInt8(ascii: "\n"))

        var suffix = [UInt8](repeating: 0, count: 8)
        _ = RAND_bytes(&suffix, Int32(suffix.count))
        let temporary = path + ".tmp-\(getpid())-" + suffix.map { String($0, radix: 16) }.joined()
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode_t(0o600))
        if fd < 0 {
            throw SecretFileError("cannot create \(temporary): \(describe(errno))")
        }
        defer { unlink(temporary) }
        var ok = fchmod(fd, 0o600) == 0
        var written = 0
        while ok, written < text.count {
            let n = text.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + written, $0.count - written) }
            if n < 0, errno == EINTR { continue }
            if n <= 0 { ok = false; break }
            written += n
        }
        if ok { ok = fsync(fd) == 0 }
        let writeErrno = errno
        close(fd)
        guard ok else { throw SecretFileError("cannot write \(temporary): \(describe(writeErrno))") }

        if link(temporary, path) != 0 {
            let code = errno
            if code == EEXIST { return nil }
            throw SecretFileError("cannot publish \(path): \(describe(code))")
        }
        let dirFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dirFD >= 0 {
            _ = fsync(dirFD)
            close(dirFD)
        }
        return Loaded(secret: secret, path: path, created: true, groupOrWorldReadable: false)
    }

    /// `mkdir -p` with mode 0700 for every directory it creates (umask notwithstanding).
    private static func makeDirectories(_ directory: String) throws(SecretFileError) {
        guard !directory.isEmpty else { throw SecretFileError("state directory path is empty") }
        var prefix = directory.hasPrefix("/") ? "/" : ""
        for component in directory.split(separator: "/", omittingEmptySubsequences: true) {
            prefix += component
            if mkdir(prefix, 0o700) == 0 {
                _ = chmod(prefix, 0o700)
            } else {
                let code = errno
                var info = stat()
                guard code == EEXIST, stat(prefix, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
                    throw SecretFileError("cannot create state directory \(prefix): \(describe(code))")
                }
            }
            prefix += "/"
        }
    }

    private static func describe(_ code: Int32) -> String {
        String(cString: strerror(code))
    }
}
