import Testing
@testable import Hub

@Test func versionIsSemver() {
    #expect(HubVersion.string.split(separator: ".").count == 3)
}
