import AsyncFileIO
import Foundation
import SystemPackage
import Testing
import TestSupport
@testable import FileWatching

/// The API a test author reaches for: settle, bounded waits, filters, relative paths,
/// scoped watchers and leak counts.
@Suite("FileWatcher for test authors")
struct WatcherAPITests {
    @Test("settle() returns exactly what happened, with paths relative to the root")
    func settleAndRelativePaths() async throws {
        let dir = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("sub").string, withIntermediateDirectories: true)
        let watcher = try await FileWatcher(watching: dir.path)
        touch(dir.at("sub/a.txt"))
        rename(dir.at("sub/a.txt").string, dir.at("b.txt").string)
        let events = try await watcher.settle()
        #expect(events.map(\.relativePath) == ["sub/a.txt", "sub/a.txt"])
        #expect(events.last?.relativeDestination == "b.txt")
        #expect(try await watcher.settle().isEmpty, "nothing happened since")
        watcher.cancel()
    }

    @Test("next(timeout:) and first(timeout:where:) are bounded, and a failed wait lists what it saw")
    func boundedWaits() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        let quiet = await #expect(throws: FileCoordinationError.self) { _ = try await watcher.next(timeout: .milliseconds(50)) }
        #expect(quiet?.code == .timedOut)
        touch(dir.at("a"))
        touch(dir.at("b"))
        let found = try await watcher.first(timeout: .seconds(30)) { $0.relativePath == "b" }
        #expect(found == FileEvent(.created, dir.at("b")))
        touch(dir.at("c"))
        try await watcher.sync() // c's event is buffered before the short wait starts
        let missed = await #expect(throws: FileCoordinationError.self) {
            _ = try await watcher.first(timeout: .milliseconds(300)) { $0.relativePath == "never" }
        }
        #expect(missed?.code == .timedOut)
        #expect(missed?.message.contains("events seen: 1: created c") == true, "\(String(describing: missed))")
        watcher.cancel()
        #expect(try await watcher.next(timeout: .seconds(30)) == nil, "a stopped watcher ends its sequence")
        let stopped = await #expect(throws: FileCoordinationError.self) { try await watcher.sync() }
        #expect(stopped?.code == .cancelled)
    }

    @Test("sync(timeout:) on a directory the process cannot write fails with the cause instead of waiting")
    func syncInReadOnlyDirectory() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        // Root writes anywhere: a file watcher whose directory is gone cannot write its marker.
        try FileManager.default.createDirectory(atPath: dir.at("d").string, withIntermediateDirectories: true)
        touch(dir.at("d/f"))
        let fileWatcher = try await FileWatcher(watching: dir.at("d/f"))
        try FileManager.default.removeItem(atPath: dir.at("d").string)
        let error = await #expect(throws: (any Error).self) { try await fileWatcher.sync(timeout: .seconds(30)) }
        #expect(error != nil)
        watcher.cancel()
    }

    @Test("filters: kinds, include and exclude patterns, subtrees, hidden files")
    func filters() async throws {
        let dir = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("src/gen").string, withIntermediateDirectories: true)
        let filter = FileEventFilter(kinds: [.created, .deleted], include: ["*.swift"], exclude: ["*/gen/*"],
                                     subtrees: ["src"], includeHidden: false)
        let watcher = try await FileWatcher(watching: dir.path, filter: filter)
        for name in ["src/a.swift", "src/gen/b.swift", "src/.hidden.swift", "src/c.txt", "top.swift"] {
            touch(dir.at(name))
        }
        touch(dir.at("src/a.swift"), "modified: not a kind asked for")
        unlink(dir.at("src/a.swift").string)
        #expect(try await watcher.settle() == [
            FileEvent(.created, dir.at("src/a.swift")), FileEvent(.deleted, dir.at("src/a.swift")),
        ])
        watcher.cancel()
    }

    @Test("a resync says why events were lost and how many; a rescan's deletions say which were directories")
    func resyncDetails() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path, bufferLimit: 3)
        for index in 0 ..< 5 { touch(dir.at("f\(index)")) }
        let events = try await watcher.settle()
        #expect(events.count == 4)
        #expect(events.last?.resync == FileEvent.Resync(cause: .buffer, lostEvents: 2))
        #expect(events.last?.description.contains("buffer overflow (2 events lost)") == true)
    }

    @Test("withFileWatcher cancels its watcher when the body ends, even by throwing; processWatchCount sees the kernel's watches")
    func scopedWatcher() async throws {
        let dir = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("a/b").string, withIntermediateDirectories: true)
        struct Planned: Error {}
        let directories = [dir.path, dir.at("a"), dir.at("a/b")]
        await #expect(throws: Planned.self) {
            try await withFileWatcher(watching: dir.path) { watcher in
                #expect(KernelWatches.count(on: directories) == 3)
                #expect(await FileWatcher.processWatchCount() >= 3)
                touch(dir.at("a/b/f"))
                #expect(try await watcher.settle() == [FileEvent(.created, dir.at("a/b/f"))])
                throw Planned()
            }
        }
        _ = await FileWatcher.processWatchCount() // after the cancellation on the watcher thread
        #expect(KernelWatches.count(on: directories) == 0)
    }

    @Test("a watched bind mount unmounted: sync() fails at once, naming the cause, and the sequence ends",
          .enabled(if: getuid() == 0))
    func unmountedBindMount() async throws {
        let source = WatchedDirectory(), mountPoint = WatchedDirectory()
        guard try await runToEnd(["mount", "--bind", source.path.string, mountPoint.path.string]).status == 0 else {
            Issue.record("mount --bind failed: this test needs a root that may mount")
            return
        }
        let watcher = try await FileWatcher(watching: mountPoint.path)
        touch(mountPoint.at("inside"))
        #expect(try await watcher.settle() == [FileEvent(.created, mountPoint.at("inside"))])
        #expect(try await runToEnd(["umount", mountPoint.path.string]).status == 0)
        // The kernel sends no event when a bind mount goes (its file system stays).
        let error = await #expect(throws: FileCoordinationError.self) {
            try await within(.seconds(30), "sync after the unmount") { try await watcher.sync() }
        }
        #expect(error?.code == .notFound, "\(String(describing: error))")
        #expect(error?.message.contains("replaced") == true, "\(String(describing: error))")
        #expect(try await watcher.next(timeout: .seconds(30)) == nil, "the sequence has ended")
    }
}
