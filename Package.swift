// swift-tools-version: 6.1
import PackageDescription

/// Product code is built on no third-party packages: stdlib, Foundation, Dispatch, Glibc,
/// Synchronization, and two system libraries (OpenSSL's libcrypto, zlib).
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "Hub",
    products: [
        .library(name: "WSProtocol", targets: ["WSProtocol"]),
        .library(name: "Hub", targets: ["Hub"]),
        .library(name: "HubClient", targets: ["HubClient"]),
        .executable(name: "hub", targets: ["HubServer"]),
        .executable(name: "hubctl", targets: ["hubctl"]),
    ],
    targets: [
        .systemLibrary(name: "CZlib", path: "Sources/CZlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "COpenSSL", path: "Sources/COpenSSL", providers: [.apt(["libssl-dev"])]),
        // epoll, eventfd and accept4: Linux headers Swift's Glibc module does not import.
        .systemLibrary(name: "CLinux", path: "Sources/CLinux"),
        .target(name: "WSProtocol", dependencies: ["CZlib", "COpenSSL"], swiftSettings: strictSettings),
        .target(name: "Hub", dependencies: ["WSProtocol", "COpenSSL", "CZlib", "CLinux"], swiftSettings: strictSettings),
        .target(name: "HubClient", dependencies: ["WSProtocol", "COpenSSL"], swiftSettings: strictSettings),
        .executableTarget(name: "HubServer", dependencies: ["Hub"], swiftSettings: strictSettings),
        .executableTarget(name: "hubctl", dependencies: ["Hub"], swiftSettings: strictSettings),
        .testTarget(name: "WSProtocolTests", dependencies: ["WSProtocol"],
                    resources: [.copy("Corpus")], swiftSettings: strictSettings),
        .testTarget(name: "HubTests", dependencies: ["Hub", "HubClient", "WSProtocol", "COpenSSL", "CLinux"],
                    resources: [.copy("Corpus")], swiftSettings: strictSettings),
    ]
)
