// swift-tools-version: 6.1
import PackageDescription

// Micro-benchmarks for the WSProtocol codec (CodecBench), the broker's history (BrokerBench), and the load generator of the benchmark suite
// (hubbench; `Benchmarks/run` builds and drives it). Run:
//   swift run -c release --package-path Benchmarks CodecBench
//   swift run -c release --package-path Benchmarks BrokerBench
//   swift build -c release --package-path Benchmarks --product hubbench
let package = Package(
    name: "Benchmarks",
    products: [
        .executable(name: "hubbench", targets: ["HubBench"]),
    ],
    dependencies: [
        .package(name: "Hub", path: ".."),
    ],
    targets: [
        .executableTarget(
            name: "CodecBench",
            dependencies: [.product(name: "WSProtocol", package: "Hub")]
        ),
        .executableTarget(
            name: "BrokerBench",
            dependencies: [.product(name: "Hub", package: "Hub")]
        ),
        .executableTarget(
            name: "HubBench",
            dependencies: [
                .product(name: "Hub", package: "Hub"),
                .product(name: "WSProtocol", package: "Hub"),
            ],
            // The load generator hands loop-bound objects to its own event loops by hand; Swift 5 mode keeps
            // that free of Sendable ceremony (it is not product code).
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
    ]
)
