import Foundation
import SystemPackage
import Testing
import TestSupport
@testable import FileWatching

/// What a test author does to a watched directory (reused names, `mkdir -p` races, links,
/// cancellation, several consumers), each of which once broke the watcher.
@Suite("FileWatcher under a test author's fixtures")
struct WatcherDefectTests {
    @Test("a directory name deleted and made again is watched again, and so is one renamed away and reused")
    func reusedDirectoryName() async throws {
        let dir = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("dd").string, withIntermediateDirectories: true)
        let watcher = try await FileWatcher(watching: dir.path)

        try FileManager.default.removeItem(atPath: dir.at("dd").string)
        try FileManager.default.createDirectory(atPath: dir.at("dd/x").string, withIntermediateDirectories: true)
        touch(dir.at("dd/f"))
        let first = try await within(.seconds(30), "settle") { try await watcher.settle() }
        #expect(first.first == FileEvent(.deleted, dir.at("dd"), isDirectory: true))
        #expect(Set(first.dropFirst()) == [
            FileEvent(.created, dir.at("dd"), isDirectory: true),
            FileEvent(.created, dir.at("dd/x"), isDirectory: true), FileEvent(.created, dir.at("dd/f")),
        ])
        touch(dir.at("dd/g"))
        touch(dir.at("dd/x/h"))
        #expect(try await within(.seconds(30), "settle") { try await watcher.settle() } == [
            FileEvent(.created, dir.at("dd/g")), FileEvent(.created, dir.at("dd/x/h")),
        ], "the new dd and dd/x are watched")

        rename(dir.at("dd").string, dir.at("ee").string)
        try FileManager.default.createDirectory(atPath: dir.at("dd/x").string, withIntermediateDirectories: true)
        _ = try await within(.seconds(30), "settle") { try await watcher.settle() }
        touch(dir.at("ee/in-ee"))
        touch(dir.at("ee/x/in-ee-x"))
        touch(dir.at("dd/in-dd"))
        touch(dir.at("dd/x/in-dd-x"))
        #expect(try await within(.seconds(30), "settle") { try await watcher.settle() } == [
            FileEvent(.created, dir.at("ee/in-ee")), FileEvent(.created, dir.at("ee/x/in-ee-x")),
            FileEvent(.created, dir.at("dd/in-dd")), FileEvent(.created, dir.at("dd/x/in-dd-x")),
        ], "changes are reported where they happened")

        watcher.cancel()
        _ = await watcher.watchCount() // runs after the cancellation on the watcher thread
        let directories = ["", "dd", "dd/x", "ee", "ee/x"].map { $0.isEmpty ? dir.path : dir.at($0) }
        #expect(KernelWatches.count(on: directories) == 0, "no kernel watch is left after cancel()")
    }

    @Test("entries named like unnamed temporaries (#42) are entries: found when listed and reported when made; an atomic write's unnamed temporary is not")
    func hashDigitNames() async throws {
        let dir = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("#1").string, withIntermediateDirectories: true)
        let watcher = try await FileWatcher(watching: dir.path)
        touch(dir.at("#1/inside"))
        try FileManager.default.createDirectory(atPath: dir.at("#2").string, withIntermediateDirectories: true)
        touch(dir.at("#3"))
        #expect(try await within(.seconds(30), "settle") { try await watcher.settle() } == [
            FileEvent(.created, dir.at("#1/inside")), FileEvent(.created, dir.at("#2"), isDirectory: true), FileEvent(.created, dir.at("#3")),
        ])
        touch(dir.at("#2/deeper"))
        try await Data("atomic".utf8).asyncWrite(to: dir.at("written"))
        #expect(try await within(.seconds(30), "settle") { try await watcher.settle() } == [
            FileEvent(.created, dir.at("#2/deeper")), FileEvent(.created, dir.at("written")),
        ], "#2 is watched, and the write's temporary is not reported")
    }

    @Test("a rename out of what is watched, whose second half never comes, is reported as a deletion at once, with no other event to push it out",
          arguments: [false, true])
    func renameOutIsDeletion(directory: Bool) async throws {
        let dir = WatchedDirectory(), outside = WatchedDirectory()
        touch(dir.at("f"))
        // A watched file's directory is watched for its name only: a subdirectory there is
        // as far out of reach as another directory.
        try FileManager.default.createDirectory(atPath: dir.at("o").string, withIntermediateDirectories: true)
        let watcher = try await FileWatcher(watching: directory ? dir.path : dir.at("f"))
        let destination = directory ? outside.at("f") : dir.at("o/f")
        #expect(rename(dir.at("f").string, destination.string) == 0)
        // No sync: its cookie is an event of its own, which would carry the lone half out.
        let event = try await watcher.next(timeout: .seconds(20))
        #expect(event == FileEvent(.deleted, dir.at("f")), "a lone half of a rename was held back")
        watcher.cancel()
    }

    @Test("mkdir -p racing the watcher: every item is reported once, and no watch is left after cancel()")
    func mkdirRaceIsExact() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        // As a shell script does it: each mkdir -p makes three directories within
        // microseconds, while the watcher is adding the first one's watch and listing it.
        let script = "cd \"$1\" && for i in $(seq 0 199); do mkdir -p r$i/b/c && touch r$i/b/c/f; done"
        #expect(try await runToEnd(["sh", "-c", script, "sh", dir.path.string]).status == 0)
        let events = try await within(.seconds(60), "settle") { try await watcher.settle() }
        var seen: [FileEvent: Int] = [:]
        for event in events { seen[event, default: 0] += 1 }
        #expect(seen.filter { $0.value > 1 }.isEmpty, "duplicated: \(seen.filter { $0.value > 1 })")
        // touch(1) sets the new file's times: seen when c's watch came before it.
        #expect(events.filter { $0.kind == .created }.count == 4 * 200)
        #expect(events.allSatisfy { $0.kind == .created || ($0.kind == .attributesChanged && $0.path.lastComponent == "f") })
        watcher.cancel()
        _ = await watcher.watchCount()
        let directories = [dir.path] + (0 ..< 200).flatMap { round in
            ["r\(round)", "r\(round)/b", "r\(round)/b/c"].map { dir.at($0) }
        }
        #expect(KernelWatches.count(on: directories) == 0, "no kernel watch is left after cancel()")
    }

    @Test("a directory renamed, and its name reused, before the watcher read their events: both are watched")
    func renamedBeforeRead() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        let gate = DispatchSemaphore(value: 0)
        InotifyThread.shared.perform { _ in gate.wait() } // the watcher reads nothing meanwhile
        try FileManager.default.createDirectory(atPath: dir.at("a").string, withIntermediateDirectories: true)
        touch(dir.at("a/f"))
        rename(dir.at("a").string, dir.at("b").string)
        try FileManager.default.createDirectory(atPath: dir.at("a").string, withIntermediateDirectories: true)
        touch(dir.at("a/g"))
        gate.signal()
        let events = try await within(.seconds(30), "settle") { try await watcher.settle() }
        var model: [String: Bool] = [:]
        for event in events { #expect(WatcherModelCheck.apply(event, to: &model) == nil, "\(events)") }
        #expect(model == WatcherModelCheck.listTree(dir.path), "\(events)")
        touch(dir.at("b/h"))
        touch(dir.at("a/i"))
        #expect(try await within(.seconds(30), "settle") { try await watcher.settle() } == [
            FileEvent(.created, dir.at("b/h")), FileEvent(.created, dir.at("a/i")),
        ])
        watcher.cancel()
    }

    @Test("watchers of two files in one directory sync at once, each on its own marker")
    func twoWatchersOneDirectory() async throws {
        let dir = WatchedDirectory()
        touch(dir.at("one"))
        touch(dir.at("two"))
        let first = try await FileWatcher(watching: dir.at("one"))
        let second = try await FileWatcher(watching: dir.at("two"))
        for _ in 0 ..< 20 {
            async let a: Void = first.sync(timeout: .seconds(30))
            async let b: Void = second.sync(timeout: .seconds(30))
            _ = try await (a, b)
        }
        first.cancel()
        second.cancel()
        let markers = try FileManager.default.contentsOfDirectory(atPath: dir.path.string).filter { $0.hasPrefix(".filecoord-sync-") }
        #expect(markers.isEmpty, "no marker is left behind")
    }

    @Test("a symbolic link to a directory as the root watches the directory")
    func symbolicLinkRoot() async throws {
        let dir = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("real/sub").string, withIntermediateDirectories: true)
        symlink(dir.at("real").string, dir.at("link").string)
        let watcher = try await FileWatcher(watching: dir.at("link"))
        touch(dir.at("real/f"))
        touch(dir.at("real/sub/g"))
        #expect(try await within(.seconds(30), "settle") { try await watcher.settle() } == [
            FileEvent(.created, dir.at("link/f")), FileEvent(.created, dir.at("link/sub/g")),
        ], "reported under the path the watcher was given")
        watcher.cancel()
    }

    @Test("cancelling the task that iterates removes the watches")
    func cancellingTheIteratingTask() async throws {
        let dir = WatchedDirectory()
        try FileManager.default.createDirectory(atPath: dir.at("a/b").string, withIntermediateDirectories: true)
        let watcher = try await FileWatcher(watching: dir.path)
        let directories = [dir.path, dir.at("a"), dir.at("a/b")]
        #expect(KernelWatches.count(on: directories) == 3)
        let consumer = Task { for try await _ in watcher {} }
        touch(dir.at("a/b/f"))
        try await watcher.sync()
        consumer.cancel()
        _ = await consumer.result
        _ = await watcher.watchCount() // runs after the removal on the watcher thread
        #expect(KernelWatches.count(on: directories) == 0)
    }

    @Test("two tasks iterating one watcher: each event reaches one of them, and cancel() ends both")
    func twoConsumers() async throws {
        let dir = WatchedDirectory()
        let watcher = try await FileWatcher(watching: dir.path)
        let consumers = (0 ..< 2).map { _ in
            Task { () -> [FileEvent] in
                var seen: [FileEvent] = []
                for try await event in watcher { seen.append(event) }
                return seen
            }
        }
        for index in 0 ..< 10 { touch(dir.at("f\(index)")) }
        try await watcher.sync()
        watcher.cancel()
        var all: [FileEvent] = []
        for consumer in consumers {
            all += try await within(.seconds(30), "a consumer's iteration") { try await consumer.value }
        }
        #expect(Set(all) == Set((0 ..< 10).map { FileEvent(.created, dir.at("f\($0)")) }))
        #expect(all.count == 10)
    }
}
