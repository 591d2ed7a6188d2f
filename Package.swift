// swift-tools-version:6.0
// FileCoordination: Apple's file coordination model (NSFileCoordinator / NSFilePresenter)
// for Linux, async-native and cross-process.
import PackageDescription

let package = Package(
    name: "FileCoordination",
    products: [
        .library(name: "FileCoordination", targets: ["FileCoordination"]),
        // Apple's NSFileCoordinator API over FileCoordination (Linux; empty on Apple's
        // systems, whose Foundation has its own).
        .library(name: "NSFileCoordination", targets: ["NSFileCoordination"]),
        // The etcd space (coordination across hosts), with its own HTTP client and TLS: a
        // product of its own, so that the local library neither contains nor links them.
        .library(name: "FileCoordinationEtcd", targets: ["FileCoordinationEtcd"]),
        .executable(name: "filecoord", targets: ["filecoord"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        // Counters and timers for operators (docs/design.md, "Metrics and logging"); the
        // application chooses the backend.
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        // `swift package generate-documentation` (the catalog is FileCoordination.docc).
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // libinotifytools (Debian: libinotifytools0-dev). It ships no pkg-config file;
        // the module map links `inotifytools` itself.
        .systemLibrary(
            name: "CInotifyTools",
            providers: [.apt(["libinotifytools0-dev"])]
        ),
        // Thin C wrappers for calls Swift cannot make directly (variadic open/fcntl,
        // preadv2 flags, O_TMPFILE, OFD locks).
        .target(name: "CFileCoordinationShims"),
        // The tool's own C code: starting `exec`'s command, passing signals on to it,
        // signals caught into a pipe.
        .target(name: "CFilecoordCommand"),
        // Every system call the library makes that can fail: EINTR retried, errno returned,
        // files of the space opened and checked in one place, and faults injected for tests.
        .target(
            name: "SystemCalls",
            dependencies: ["CFileCoordinationShims", .product(name: "SystemPackage", package: "swift-system")]
        ),
        .target(
            name: "AsyncFileIO",
            dependencies: [
                "CFileCoordinationShims", "SystemCalls",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "FileWatching",
            dependencies: ["CInotifyTools", "CFileCoordinationShims", "AsyncFileIO", "SystemCalls",
                           .product(name: "CoreMetrics", package: "swift-metrics"),
                           .product(name: "SystemPackage", package: "swift-system")]
        ),
        .target(
            name: "FileCoordination",
            dependencies: [
                "AsyncFileIO", "FileWatching", "CFileCoordinationShims", "SystemCalls",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // An adapter over FileCoordination's public API only.
        .target(
            name: "NSFileCoordination",
            dependencies: [.target(name: "FileCoordination", condition: .when(platforms: [.linux]))]
        ),
        // TLS for the etcd space: the system's OpenSSL, loaded with dlopen on first use.
        .target(name: "CFileCoordinationTLS"),
        .target(
            name: "FileCoordinationEtcd",
            dependencies: [
                "FileCoordination", "AsyncFileIO", "SystemCalls", "CFileCoordinationTLS",
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .executableTarget(
            name: "filecoord",
            dependencies: [
                "AsyncFileIO",
                "FileCoordination",
                "FileCoordinationEtcd",
                "CFileCoordinationShims",
                "CFilecoordCommand",
                "SystemCalls",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Test set-up shared by the test targets (not a product).
        .target(name: "TestSupport", dependencies: ["AsyncFileIO"], path: "Tests/TestSupport"),
        // Each test target declares every module it imports.
        .testTarget(name: "AsyncFileIOTests", dependencies: ["AsyncFileIO", "CFileCoordinationShims", "SystemCalls", "TestSupport", .product(name: "SystemPackage", package: "swift-system")]),
        .testTarget(name: "FileWatchingTests", dependencies: ["AsyncFileIO", "FileWatching", "CInotifyTools", "CFileCoordinationShims", "TestSupport",
                                                               .product(name: "MetricsTestKit", package: "swift-metrics"),
                                                               .product(name: "SystemPackage", package: "swift-system")]),
        .testTarget(name: "FileCoordinationTests", dependencies: ["AsyncFileIO", "FileCoordination", "CFileCoordinationShims", "SystemCalls", "TestSupport",
                                                                   .product(name: "Logging", package: "swift-log"),
                                                                   .product(name: "CoreMetrics", package: "swift-metrics"),
                                                                   .product(name: "MetricsTestKit", package: "swift-metrics"),
                                                                   .product(name: "SystemPackage", package: "swift-system")]),
        // Apple-style presenters and coordinators; other processes are `filecoord` and
        // this test binary again.
        .testTarget(name: "NSFileCoordinationTests", dependencies: ["NSFileCoordination", "FileCoordination", "filecoord", "TestSupport"]),
        .testTarget(name: "FileCoordinationEtcdTests", dependencies: ["FileCoordination", "FileCoordinationEtcd",
                                                                       .product(name: "SystemPackage", package: "swift-system")]),
        .testTarget(name: "filecoordTests", dependencies: ["AsyncFileIO", "FileCoordination", "FileCoordinationEtcd", "filecoord", "SystemCalls", "TestSupport",
                                                          .product(name: "ArgumentParser", package: "swift-argument-parser"),
                                                          .product(name: "MetricsTestKit", package: "swift-metrics"),
                                                          .product(name: "SystemPackage", package: "swift-system")]),
    ]
)
