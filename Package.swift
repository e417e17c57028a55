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
        .library(name: "Hub",
                 targets: ["Hub", "HubCluster", "HubRouting", "HubAuth", "HubJSON", "HubEngine", "HubSupport"]),
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
        // Hub's parts, each a module that sees only the ones below it (docs/ARCHITECTURE.md draws them). `package`
        // is what one part grants another; `public` is the library's API.
        .target(name: "HubSupport", path: "Sources/Hub/Support", swiftSettings: strictSettings),
        .target(name: "HubEngine", dependencies: ["HubSupport", "COpenSSL", "CLinux"],
                path: "Sources/Hub/Engine", swiftSettings: strictSettings),
        .target(name: "HubJSON", dependencies: ["HubSupport"],
                path: "Sources/Hub/JSON", swiftSettings: strictSettings),
        .target(name: "HubAuth", dependencies: ["HubJSON", "HubSupport", "WSProtocol", "COpenSSL"],
                path: "Sources/Hub/Auth", swiftSettings: strictSettings),
        .target(name: "HubRouting", dependencies: ["HubEngine", "HubJSON", "HubSupport", "WSProtocol", "CZlib"],
                path: "Sources/Hub/Routing", swiftSettings: strictSettings),
        .target(name: "HubCluster", dependencies: ["HubRouting", "HubEngine", "HubJSON", "HubSupport", "WSProtocol"],
                path: "Sources/Hub/Redis", swiftSettings: strictSettings),
        // The server that composes them: client and socket connections, the protocol messages, admin.
        .target(name: "Hub",
                dependencies: ["HubCluster", "HubRouting", "HubAuth", "HubJSON", "HubEngine", "HubSupport",
                               "WSProtocol", "COpenSSL", "CZlib", "CLinux"],
                exclude: ["Support", "Engine", "JSON", "Auth", "Routing", "Redis"], swiftSettings: strictSettings),
        .target(name: "HubClient", dependencies: ["WSProtocol", "COpenSSL"], swiftSettings: strictSettings),
        .executableTarget(name: "HubServer", dependencies: ["Hub"], swiftSettings: strictSettings),
        .executableTarget(name: "hubctl", dependencies: ["Hub", "HubAuth"], swiftSettings: strictSettings),
        .testTarget(name: "WSProtocolTests", dependencies: ["WSProtocol"],
                    resources: [.copy("Corpus")], swiftSettings: strictSettings),
        .testTarget(name: "HubTests",
                    dependencies: ["Hub", "HubCluster", "HubRouting", "HubAuth", "HubJSON", "HubEngine", "HubSupport",
                                   "HubClient", "WSProtocol", "COpenSSL", "CLinux"],
                    resources: [.copy("Corpus")], swiftSettings: strictSettings),
    ]
)
