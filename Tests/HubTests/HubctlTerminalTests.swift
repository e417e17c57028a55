import Foundation
import Testing

/// Behaviour on a real terminal, through script(1) for a pseudo-terminal. Skipped (noted) without script.
@Suite struct HubctlTerminalTests {
    static let script = "/usr/bin/script"
    static var hasScript: Bool { FileManager.default.isExecutableFile(atPath: script) }

    static func onTerminal(_ command: String, environment: [String: String] = [:], input: String? = nil,
                           inputDelay: useconds_t = 0) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: script)
        process.arguments = ["-qfc", command, "/dev/null"]
        var env = ProcessInfo.processInfo.environment
        env["NO_COLOR"] = nil
        env["TERM"] = "xterm"
        env.merge(environment) { _, new in new }
        process.environment = env
        let out = Pipe(), inp = Pipe()
        process.standardOutput = out
        process.standardInput = inp
        try process.run()
        if let input {
            usleep(inputDelay)
            inp.fileHandleForWriting.write(Data(input.utf8))
        }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        try? inp.fileHandleForWriting.close()
        return String(decoding: data, as: UTF8.self)
    }

    @Test func colourOnlyOnATerminalWithoutNoColor() throws {
        guard Self.hasScript else { print("skipped: no \(Self.script)"); return }
        let hub = FakeHub(replies: ["channels": HubctlCommandTests.channelsReply])
        defer { hub.stop() }
        let base = "\(HubctlRun.binary) --socket \(hub.path) channels"
        #expect(try Self.onTerminal(base).contains("\u{1B}[1mCHANNEL\u{1B}[0m"))
        #expect(!(try Self.onTerminal(base + " --no-color").contains("\u{1B}[")))
        #expect(!(try Self.onTerminal(base, environment: ["NO_COLOR": "1"]).contains("\u{1B}[")))
    }

    @Test func liveTopUsesTheAlternateScreenAndRestoresOnQ() throws {
        guard Self.hasScript else { print("skipped: no \(Self.script)"); return }
        let hub = FakeHub(replies: ["stats": HubctlCommandTests.statsReply, "channels": HubctlCommandTests.channelsReply,
                                    "connections": HubctlCommandTests.connectionsReply])
        defer { hub.stop() }
        let output = try Self.onTerminal("\(HubctlRun.binary) --socket \(hub.path) top; echo exit=$?",
                                         input: "q", inputDelay: 1_500_000)
        let enter = try #require(output.range(of: "\u{1B}[?1049h\u{1B}[?25l"))
        let leave = try #require(output.range(of: "\u{1B}[?25h\u{1B}[?1049l"))
        #expect(enter.upperBound <= leave.lowerBound)
        #expect(output[enter.upperBound..<leave.lowerBound].contains("busiest channels"))
        #expect(output.contains("exit=0"))
    }
}
