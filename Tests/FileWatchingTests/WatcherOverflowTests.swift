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
        #expect(output.contains("Test run with 2 tests"), "\(output)")
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
        try await offThePool { try waitForCreation(in: dir.path, prefix: ".filecoord-sync-") }
        release()
        try await within(.seconds(150), "sync after an overflow") { try await syncing.value }
        let events = try await within(.seconds(60), "settle") { try await watcher.settle() }
        #expect(events.last?.kind == .resync)
        #expect(events.filter { $0.kind == .created }.count == count)
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

/// Blocks until an entry whose name starts with `prefix` is created in `directory`, as
/// seen by an inotify instance of its own (the library's is stalled meanwhile); throws
/// `ETIMEDOUT` when none is within 120 s.
func waitForCreation(in directory: FilePath, prefix: String) throws {
    let fd = inotify_init1(Int32(IN_CLOEXEC))
    guard fd >= 0 else { throw FixtureError(path: directory.string, operation: "inotify_init1", errno: errno) }
    defer { close(fd) }
    guard inotify_add_watch(fd, directory.string, UInt32(IN_CREATE)) >= 0 else {
        throw FixtureError(path: directory.string, operation: "inotify_add_watch", errno: errno)
    }
    // Made before the watch existed: already there.
    if let names = try? FileManager.default.contentsOfDirectory(atPath: directory.string),
       names.contains(where: { $0.hasPrefix(prefix) }) { return }
    var buffer = [UInt8](repeating: 0, count: 64 * 1024)
    let deadline = ContinuousClock.now + .seconds(120)
    while true {
        let left = deadline - ContinuousClock.now
        var ready = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard left > .zero, poll(&ready, 1, Int32(left.components.seconds * 1000 + 1)) != 0 else {
            throw FixtureError(path: directory.string, operation: "wait for a creation of \(prefix)*", errno: ETIMEDOUT)
        }
        let length = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if length < 0 && errno == EINTR { continue }
        guard length > 0 else { throw FixtureError(path: directory.string, operation: "read", errno: errno) }
        var offset = 0
        while offset < length {
            let (nameLength, name) = buffer.withUnsafeBytes { raw -> (Int, String) in
                let event = raw.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
                let start = offset + MemoryLayout<inotify_event>.size
                let bytes = raw[start ..< start + Int(event.len)].prefix { $0 != 0 }
                return (Int(event.len), String(decoding: bytes, as: UTF8.self))
            }
            if name.hasPrefix(prefix) { return }
            offset += MemoryLayout<inotify_event>.size + nameLength
        }
    }
}
