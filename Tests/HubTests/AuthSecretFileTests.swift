import Foundation
import Glibc
import Testing
@testable import Hub
@testable import HubAuth
@testable import HubCluster
@testable import HubJSON
@testable import HubRouting

private func mode(_ path: String) -> mode_t {
    var info = stat()
    guard stat(path, &info) == 0 else { return 0xFFFF }
    return info.st_mode & 0o777
}

private func write(_ text: String, to path: String, mode: mode_t) throws {
    try Data(text.utf8).write(to: URL(fileURLWithPath: path))
    chmod(path, mode)
}

@Test func secretFileTrimsSurroundingWhitespace() throws {
    let directory = AuthFixtures.makeTemporaryDirectory("secret-read")
    let path = directory + "/s"
    try write("  \n\tmy secret value\r\n\n", to: path, mode: 0o600)
    let loaded = try SecretFile.read(path: path)
    #expect(loaded.secret == Array("my secret value".utf8))
    #expect(!loaded.groupOrWorldReadable)
    #expect(!loaded.created)
}

@Test func secretFileFlagsGroupOrWorldReadable() throws {
    let directory = AuthFixtures.makeTemporaryDirectory("secret-perm")
    for (fileMode, flagged) in [(mode_t(0o644), true), (0o640, true), (0o604, true), (0o600, false), (0o400, false)] {
        let path = directory + "/s\(fileMode)"
        try write("value", to: path, mode: fileMode)
        #expect(try SecretFile.read(path: path).groupOrWorldReadable == flagged, "mode \(String(fileMode, radix: 8))")
    }
}

@Test func secretFileRejectsEmptyMissingAndDirectories() throws {
    let directory = AuthFixtures.makeTemporaryDirectory("secret-bad")
    try write(" \n\t \n", to: directory + "/empty", mode: 0o600)
    #expect { try SecretFile.read(path: directory + "/empty") } throws: { ($0 as? SecretFileError)?.message.contains("empty") == true }
    #expect { try SecretFile.read(path: directory + "/missing") } throws: { ($0 as? SecretFileError)?.message.contains("No such file") == true }
    #expect(throws: SecretFileError.self) { try SecretFile.read(path: directory) }
    try write(String(repeating: "x", count: SecretFile.maximumFileBytes + 1), to: directory + "/big", mode: 0o600)
    #expect(throws: SecretFileError.self) { try SecretFile.read(path: directory + "/big") }
}

@Test func loadOrCreateCreatesDirectoryAndFileThenReuses() throws {
    let base = AuthFixtures.makeTemporaryDirectory("secret-create")
    let stateDirectory = base + "/state/hub"
    let first = try SecretFile.loadOrCreate(stateDirectory: stateDirectory)
    #expect(first.created)
    #expect(first.path == stateDirectory + "/jwt-secret")
    #expect(mode(stateDirectory) == 0o700)
    #expect(mode(base + "/state") == 0o700)
    #expect(mode(first.path) == 0o600)
    #expect(first.secret.count == 64)
    #expect(first.secret.allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains($0) })
    #expect(try SecretFile.read(path: first.path).secret == first.secret)
    // Usable as an HS256 key.
    #expect(throws: Never.self) { try JWTVerifier(key: .hmacSecret(first.secret)) }

    let second = try SecretFile.loadOrCreate(stateDirectory: stateDirectory)
    #expect(!second.created)
    #expect(second.secret == first.secret)
    let leftovers = try FileManager.default.contentsOfDirectory(atPath: stateDirectory)
    #expect(leftovers == ["jwt-secret"])

    let elsewhere = try SecretFile.loadOrCreate(stateDirectory: base + "/other")
    #expect(elsewhere.secret != first.secret)
}

@Test func loadOrCreateReusesAnExistingDirectoryAndOperatorSecret() throws {
    let directory = AuthFixtures.makeTemporaryDirectory("secret-existing")
    try write("operator-chosen-secret\n", to: directory + "/jwt-secret", mode: 0o600)
    let loaded = try SecretFile.loadOrCreate(stateDirectory: directory)
    #expect(!loaded.created)
    #expect(loaded.secret == Array("operator-chosen-secret".utf8))
    try write("\n", to: directory + "/jwt-secret", mode: 0o600)
    #expect(throws: SecretFileError.self) { try SecretFile.loadOrCreate(stateDirectory: directory) }
}

@Test func concurrentLoadOrCreateAgreesOnOneSecret() async throws {
    let stateDirectory = AuthFixtures.makeTemporaryDirectory("secret-race") + "/state"
    let results = try await withThrowingTaskGroup(of: SecretFile.Loaded.self) { group in
        for _ in 0..<16 {
            group.addTask { try SecretFile.loadOrCreate(stateDirectory: stateDirectory) }
        }
        var all: [SecretFile.Loaded] = []
        for try await result in group { all.append(result) }
        return all
    }
    #expect(Set(results.map(\.secret)).count == 1)
    #expect(results.filter(\.created).count == 1)
    #expect(try FileManager.default.contentsOfDirectory(atPath: stateDirectory) == ["jwt-secret"])
}
