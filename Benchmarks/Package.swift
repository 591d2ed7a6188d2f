// swift-tools-version:6.0
// `make bench`: FileCoordination measured beside its peers in one run (C pread pool,
// Foundation, swift-nio's file system). A separate package, so that swift-nio never
// weighs on the library's own build.
import PackageDescription

let package = Package(
    name: "FileCoordinationBenchmarks",
    dependencies: [
        .package(name: "FileCoordination", path: ".."),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
    ],
    targets: [
        .target(name: "CPeers"),
        .executableTarget(
            name: "filecoord-bench",
            dependencies: [
                "CPeers",
                .product(name: "FileCoordination", package: "FileCoordination"),
                .product(name: "NSFileCoordination", package: "FileCoordination"),
                .product(name: "FileCoordinationEtcd", package: "FileCoordination"),
                .product(name: "_NIOFileSystem", package: "swift-nio"),
            ]
        ),
    ]
)
