import Foundation
import SystemPackage
import Testing
import TestSupport
@testable import FileWatching

/// A fresh directory; removed at the end.
final class WatchedDirectory: Sendable {
    let path: FilePath
    init() {
        path = FilePath(NSTemporaryDirectory()).appending("filecoord-watch-\(getpid())-\(UInt64.random(in: 0 ... .max))")
        try! FileManager.default.createDirectory(atPath: path.string, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path.string) }
    func at(_ relative: String) -> FilePath { path.appending(relative) }
}

func touch(_ path: FilePath, _ content: String? = nil) {
    let fd = open(path.string, O_CREAT | O_WRONLY | O_APPEND, 0o644)
    if let content { _ = content.withCString { write(fd, $0, strlen($0)) } }
    close(fd)
}

@Suite("FileWatcher")
struct FileWatcherTests {
    @Test("created, modified, attributes, deleted, for changes made by anyone")
    func basicEvents() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        let file = dir.at("a.txt")
        touch(file)
        touch(file, "more")
        touch(file, "and more")
        chmod(file.string, 0o600)
        unlink(file.string)
        let events = try await watcher.settle()
        #expect(events == [
            FileEvent(.created, file), FileEvent(.modified, file),
            FileEvent(.attributesChanged, file), FileEvent(.deleted, file),
        ], "consecutive writes are one modified event")
        watcher.cancel()
    }

    @Test("a rename inside the tree is one moved event; moving out is deleted, moving in created")
    func renames() async throws {
        let dir = WatchedDirectory(), outside = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("sub").string, withIntermediateDirectories: true)
        touch(dir.at("one"))
        touch(outside.at("visitor"))
        let watcher = try await FileWatcher(watching: dir.path)
        rename(dir.at("one").string, dir.at("sub/two").string)
        rename(dir.at("sub/two").string, outside.at("gone").string)
        rename(outside.at("visitor").string, dir.at("arrived").string)
        let events = try await watcher.settle()
        #expect(events == [
            FileEvent(.moved, dir.at("one"), destination: dir.at("sub/two")),
            FileEvent(.deleted, dir.at("sub/two")),
            FileEvent(.created, dir.at("arrived")),
        ])
        watcher.cancel()
    }

    @Test("mkdir -p then touch, at once: the new subtree is watched and scanned, nothing is missed (200 times)")
    func mkdirRace() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        for round in 0 ..< 200 {
            let leaf = dir.at("r\(round)/b/c")
            try FileManager.default.createDirectory(atPath: leaf.string, withIntermediateDirectories: true)
            touch(leaf.appending("f"))
        }
        let created = Set(try await watcher.settle().filter { $0.kind == .created }.map(\.path))
        for round in 0 ..< 200 {
            for path in ["r\(round)", "r\(round)/b", "r\(round)/b/c", "r\(round)/b/c/f"] {
                #expect(created.contains(dir.at(path)), "missed \(path)")
            }
        }
        #expect(await watcher.watchCount() == 1 + 3 * 200, "the root and every new directory are watched")
        watcher.cancel()
    }

    @Test("a subtree moved out of the tree is no longer watched under its old path")
    func movedAwaySubtree() async throws {
        let dir = WatchedDirectory(), outside = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("tree/inner").string, withIntermediateDirectories: true)
        let watcher = try await FileWatcher(watching: dir.path)
        #expect(await watcher.watchCount() == 3)
        let before = await watcher.tree.watchDescriptors()
        rename(dir.at("tree").string, outside.at("tree").string)
        touch(outside.at("tree/inner/after-the-move"))
        let events = try await watcher.settle()
        #expect(events == [FileEvent(.deleted, dir.at("tree"), isDirectory: true)])
        #expect(await watcher.watchCount() == 1)
        let moved = Set(before).subtracting(await watcher.tree.watchDescriptors())
        #expect(moved.count == 2)
        for wd in moved { #expect(await !InotifyThread.shared.isWatching(wd)) }
        #expect(KernelWatches.count(on: [outside.at("tree"), outside.at("tree/inner")]) == 0)
        watcher.cancel()
    }

    @Test("a consumer that falls behind loses events and gets a resync, with nothing else broken")
    func overflowResync() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path, bufferLimit: 10)
        for index in 0 ..< 50 { touch(dir.at("burst\(index)")) }
        let events = try await watcher.settle()
        #expect(events.count == 11)
        #expect(events.last?.kind == .resync)
        // Afterwards the watcher works as before.
        touch(dir.at("later"))
        #expect(try await watcher.settle() == [FileEvent(.created, dir.at("later"))])
        watcher.cancel()
    }

    @Test("iterating delivers events; cancel() removes every watch and ends the sequence")
    func iterationAndCancel() async throws {
        let dir = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("x/y").string, withIntermediateDirectories: true)
        let watcher = try await FileWatcher(watching: dir.path)
        let descriptors = await watcher.tree.watchDescriptors()
        #expect(descriptors.count == 3)
        for wd in descriptors { #expect(await InotifyThread.shared.isWatching(wd)) }
        let consumer = Task {
            var seen: [FileEvent] = []
            for try await event in watcher { seen.append(event) }
            return seen
        }
        touch(dir.at("x/y/z"))
        try await watcher.sync()
        watcher.cancel()
        #expect(try await consumer.value == [FileEvent(.created, dir.at("x/y/z"))])
        // The kernel no longer holds any of them (other tests' watches come and go, so
        // the process's count is not compared).
        for wd in descriptors { #expect(await !InotifyThread.shared.isWatching(wd)) }
        #expect(await watcher.watchCount() == 0)
    }

    @Test("a watched file: appends are modified; an editor's save-by-rename is modified; deletion is deleted")
    func singleFile() async throws {
        let dir = WatchedDirectory()
        let file = dir.at("doc.txt")
        touch(file, "v1")
        touch(dir.at("unrelated"))
        let watcher = try await FileWatcher(watching: file)
        touch(file, "appended")
        touch(dir.at("unrelated"), "noise")
        #expect(try await watcher.settle() == [FileEvent(.modified, file)], "other files in the directory are not reported")
        touch(dir.at(".doc.txt.swp"), "v2")
        rename(dir.at(".doc.txt.swp").string, file.string)
        #expect(try await watcher.settle() == [FileEvent(.modified, file)], "a save by rename is a change, not a deletion")
        unlink(file.string)
        #expect(try await watcher.settle() == [FileEvent(.deleted, file)])
        watcher.cancel()
    }

    @Test("a settle interval coalesces a burst: each item and kind once, in first-seen order")
    func coalescing() async throws {
        let dir = WatchedDirectory()
        let (a, b) = (dir.at("a"), dir.at("b"))
        touch(a)
        touch(b)
        let watcher = try await FileWatcher(watching: dir.path, settle: .milliseconds(50))
        var events = watcher.makeAsyncIterator()
        // Interleaved, so that the plain one-in-a-row merging cannot fold them.
        for round in 0 ..< 20 {
            touch(a, "\(round)")
            touch(b, "\(round)")
        }
        try await watcher.sync()
        #expect(try await events.next() == FileEvent(.modified, a))
        #expect(try await events.next() == FileEvent(.modified, b))
        // Nothing else was held back: the burst became two events.
        #expect(watcher.tree.buffer.drain().isEmpty)
        watcher.cancel()
    }

    @Test("a consumer cancelled while the settle interval runs leaves the events it took for the next consumer")
    func cancelledWhileSettling() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path, settle: .seconds(30))
        touch(dir.at("a"))
        try await watcher.sync()
        let settling = Task { try await watcher.first(timeout: .seconds(60)) { _ in true } }
        // No event says the consumer took it: the buffer looked at every millisecond, 10 s at most.
        for _ in 0 ..< 10_000 where watcher.tree.buffer.bufferedCount > 0 {
            try await Task.sleep(for: .milliseconds(1)) // ok: bounded, see above
        }
        settling.cancel()
        await #expect(throws: CancellationError.self) { _ = try await settling.value }
        // Taken from what the first settled: no second interval to wait for.
        let event = try await watcher.first(timeout: .seconds(5)) { _ in true }
        #expect(event == FileEvent(.created, dir.at("a")))
        watcher.cancel()
    }

    @Test("watching a missing path names it")
    func missing() async throws {
        let dir = WatchedDirectory()
        let error = await #expect(throws: FileCoordinationError.self) { _ = try await FileWatcher(watching: dir.at("nope")) }
        #expect(error?.code == .notFound)
    }

    @Test("running out of inotify watches is a clear error naming the limit")
    func watchLimitMessage() {
        let error = InotifyThread.watchError(FilePath("/big/tree"), .noSpace)
        #expect(error.code == .watchLimitReached)
        #expect(error.description.contains("fs.inotify.max_user_watches"))
        #expect(error.description.hasPrefix("/big/tree: inotify_add_watch failed"))
    }
}

import AsyncFileIO
