// swift-tools-version: 6.1
import PackageDescription

// Micro-benchmarks for the WSProtocol codec. Run:
//   swift run -c release --package-path Benchmarks CodecBench
let package = Package(
    name: "Benchmarks",
    dependencies: [
        .package(name: "Hub", path: ".."),
    ],
    targets: [
        .executableTarget(
            name: "CodecBench",
            dependencies: [.product(name: "WSProtocol", package: "Hub")]
        ),
    ]
)
