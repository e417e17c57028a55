import Foundation
import Testing
@testable import Hub
@testable import HubEngine
@testable import HubRouting

/// `--channels` names each channel once: a repeated name is a mistake in the operator's list (a typo for
/// another channel, a merge of two lists), so the hub refuses to start instead of quietly dropping it.
@Suite struct HubConfigurationChannelTests {
    @Test(arguments: [
        (["--channels", "a,a"], [:], "--channels: channel 'a' is listed twice"),
        (["--channels", "a,b, a"], [:], "--channels: channel 'a' is listed twice"),  // names are trimmed first
        ([], ["HUB_CHANNELS": "x,y,x"], "HUB_CHANNELS: channel 'x' is listed twice"),
    ])
    func duplicateNamesAreAnError(arguments: [String], environment: [String: String], message: String) {
        #expect {
            _ = try HubConfiguration.parse(arguments: arguments, environment: environment)
        } throws: { error in
            (error as? HubConfiguration.ConfigurationError)?.message.contains(message) == true
        }
    }

    @Test func distinctNamesKeepTheirOrder() throws {
        guard case .run(let c) = try HubConfiguration.parse(arguments: ["--channels", "b,a,A"], environment: [:]) else {
            Issue.record("expected run")
            return
        }
        #expect(c.channels == ["b", "a", "A"])  // case matters: A and a are two channels
    }

    @Test func theHubExitsTwoWithTheMessage() throws {
        let r = try runShell(#"exec "$0" "$@""#, [HubProcess.executablePath, "--listen", "127.0.0.1:0", "--channels", "wallet_updates,wallet_updates",
                                                 "--socket", NSTemporaryDirectory() + "hubtest-dup-" + UUID().uuidString.prefix(8) + ".sock"])
        #expect(r.status == 2, "\(r)")
        #expect(r.stderr == "hub: --channels: channel 'wallet_updates' is listed twice: each name once\n", "\(r)")
    }
}
