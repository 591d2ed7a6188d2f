import Foundation
import Synchronization
import SystemPackage
import Testing
import TestSupport
@testable import FileWatching

/// Kernel queue overflows. A process has one inotify queue, so an overflow reaches every
/// watcher of the process: these tests run in a child process of their own (this test
/// binary again, filtered to them), where they cannot disturb the rest of the suite, and
/// one at a time (each holds the one watcher thread while it fills the queue).
@Suite("FileWatcher after a kernel queue overflow", .serialized)
struct WatcherOverflowTests {
    static let childVariable = "FILECOORD_ISOLATED_OVERFLOW_TESTS"
    static var inChild: Bool { ProcessInfo.processInfo.environment[childVariable] != nil }

    @Test("in a process of their own, the overflow tests pass")
    func isolated() async throws {
        guard !Self.inChild else { return }
        let binary = try #require(ProcessInfo.processInfo.arguments.first)
        let (status, output) = try await runToEnd(
            [binary, "--testing-library", "swift-testing", "--filter", "WatcherOverflowTests/child"],
            environment: [Self.childVariable: "1"], includeStandardError: true)
        #expect(status == 0, "\(output)")
        #expect(output.contains("Test run with 3 tests"), "\(output)")
    }

    /// Holds the watcher thread (every watcher of the process waits) until `release`.
    static func stallWatcherThread() -> @Sendable () -> Void {
        let gate = DispatchSemaphore(value: 0)
        InotifyThread.shared.perform { _ in gate.wait() }
        return { gate.signal() }
    }

    static var maxQueuedEvents: Int {
        (try? String(contentsOfFile: "/proc/sys/fs/inotify/max_queued_events", encoding: .utf8))
            .flatMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) } ?? 16384
    }

    @Test("sync() returns after an overflow that lost its marker", .enabled(if: inChild))
    func childSyncAfterOverflow() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        let release = Self.stallWatcherThread()
        let count = Self.maxQueuedEvents + 500
        try await offThePool { for index in 0 ..< count { touch(dir.at("f\(index)")) } }
        // The marker's creation comes after the queue is full: the kernel drops its event.
        // The watcher drains the full queue and rescans every file before the resync
        // answers the marker: with the whole suite beside it on two cores that passes the
        // default 30 s, which is not what this test is about.
        let syncing = Task { try await watcher.sync(timeout: .seconds(120)) }
        try await offThePool { try waitForCreation(in: dir.path.string, within: .seconds(120)) { $0.hasPrefix(".filecoord-sync-") } }
        release()
        try await within(.seconds(150), "sync after an overflow") { try await syncing.value }
        let events = try await within(.seconds(60), "settle") { try await watcher.settle() }
        #expect(events.last?.kind == .resync)
        #expect(events.filter { $0.kind == .created }.count == count)
        watcher.cancel()
    }

    @Test("a command sent while the kernel's queue is full (the doorbell's event dropped) is run once the overflow is read", .enabled(if: inChild))
    func childCommandAfterOverflow() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        let release = Self.stallWatcherThread()
        let count = Self.maxQueuedEvents + 500
        try await offThePool { for index in 0 ..< count { touch(dir.at("f\(index)")) } }
        // Its doorbell rings into a full queue: the kernel drops that event.
        let ran = DispatchSemaphore(value: 0)
        InotifyThread.shared.perform { _ in ran.signal() }
        release()
        // It runs after the full queue is drained and the directory rescanned: with the
        // whole suite beside it on two cores that has taken more than 30 s, as above.
        let done = try await offThePool { ran.wait(timeout: .now() + 120) == .success }
        #expect(done, "the command sent while the queue was full did not run within 120 s")
        watcher.cancel()
    }

    @Test("the resync is delivered when the buffer is exactly full at the rescan", .enabled(if: inChild))
    func childResyncWithFullBuffer() async throws {
        let dir = WatchedDirectory()
        let count = Self.maxQueuedEvents + 500
        // Each file is reported once, by its event or by the rescan: the buffer fills up
        // exactly, and only the resync is left over.
        let watcher = try await FileWatcher(watching: dir.path, bufferLimit: count)
        let release = Self.stallWatcherThread()
        try await offThePool { for index in 0 ..< count { touch(dir.at("f\(index)")) } }
        release()
        // Draining the full queue and rescanning every file passes the default 30 s with
        // the whole suite beside it on two cores, as in the test above.
        let events = try await within(.seconds(150), "settle") { try await watcher.settle(timeout: .seconds(120)) }
        #expect(events.count == count + 1)
        #expect(events.last?.kind == .resync)
        watcher.cancel()
    }
}
