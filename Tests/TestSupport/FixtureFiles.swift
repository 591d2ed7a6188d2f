import AsyncFileIO
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Writes `data` to `path`, creating the file or truncating it, for test set-up.
///
/// Foundation's `Data.write(to:)` and `FileManager.createFile(atPath:contents:)` call
/// `fsync` on every file. A fixture needs no durability, and under the suite's load
/// those calls, run from tests on the cooperative pool, held both of its threads for
/// 40-50 seconds while some 28,000 fixture files were made: every other test stood
/// still, and in CI two ran past their time limit.
public func writeFixture(_ data: Data, toPath path: String, mode: mode_t = 0o644) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
    guard fd >= 0 else { throw FixtureError(path: path, operation: "open", errno: errno) }
    defer { close(fd) }
    var written = 0
    while written < data.count {
        let n = data.withUnsafeBytes { write(fd, $0.baseAddress! + written, data.count - written) }
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { throw FixtureError(path: path, operation: "write", errno: errno) }
        written += n
    }
}

/// Why a fixture could not be written.
public struct FixtureError: Error, CustomStringConvertible {
    public let path: String, operation: String, errno: Int32
    public init(path: String, operation: String, errno: Int32) {
        self.path = path
        self.operation = operation
        self.errno = errno
    }
    public var description: String { "\(operation) \(path): \(String(cString: strerror(errno)))" }
}

/// Runs `work` on a thread of its own and gives its result: for work that blocks (set-up
/// that makes thousands of files, whose system calls wait on the file system under the
/// suite's load; a wait for a child process), which would hold one of the cooperative
/// pool's threads meanwhile.
public func offThePool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            continuation.resume(with: Result { try work() })
        }
    }
}

/// Runs `arguments` (looked up by `/usr/bin/env`) to its end on a thread of its own, and
/// gives its exit status and standard output (with its standard error too, when
/// `includeStandardError`). Waiting for a child process blocks, and the cooperative pool,
/// which every test shares, must not.
public func runToEnd(_ arguments: [String], environment: [String: String] = [:],
                     includeStandardError: Bool = false) async throws -> (status: Int32, output: String) {
    try await offThePool {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        let output = Pipe()
        process.standardOutput = output
        if includeStandardError { process.standardError = output }
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text)
    }
}

/// Removes the tree at `path` on a serial queue of its own, and returns at once: for a
/// test directory's clean-up, which runs where its last reference goes (a deinit on the
/// cooperative pool) and may unlink thousands of files.
public func removeTreeLater(_ path: String) {
    remover.async {
        // Anything a test locked down is opened up first, so that its contents can go.
        _ = chmod(path, 0o755)
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// A serial queue: its work runs on libdispatch's overcommitting threads, never on the
/// cooperative pool's. Removals still queued when the test process exits are finished
/// first (the last tests' directories were left in `/tmp` otherwise).
private let remover: DispatchQueue = {
    atexit { finishRemovals() }
    return DispatchQueue(label: "test-fixture-removal")
}()

private func finishRemovals() { remover.sync {} }

/// A small seeded generator (SplitMix64): the randomized checks replay from their seed.
public struct SplitMix64: RandomNumberGenerator {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// A directory on a local disk's file system, where cached files are read on the
/// caller's thread: the package's `.build` (the system's temporary directory may be a
/// tmpfs, whose files go to the I/O threads), else `/var/tmp` or the temporary directory.
/// Nil when none is: the tests that need one are then not run.
public let localDiskBase: String? = {
    let build = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent(".build").path
    return [build, "/var/tmp", NSTemporaryDirectory()].first(where: isOnLocalDisk)
}()
