import Foundation
import Testing
@testable import FileCoordination
import TestSupport

/// Changes made by programs that never coordinate reach registered presenters.
@Suite("Presenters hear uncoordinated changes", .timeLimit(.minutes(3)))
struct UncoordinatedChangeTests {
    /// Runs `script` with `sh -c`, off the cooperative pool.
    static func shell(_ script: String) async throws {
        let status = try await runToEnd(["sh", "-c", script]).status
        #expect(status == 0, "\(script)")
    }

    @Test("a file: an append, an editor's save by rename, a move and a deletion")
    func filePresenter() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("notes.txt", "v1")
        let presenter = Recorder("P", url: file, log: log)
        try await withPresenters([presenter]) {
            try await Self.shell("printf more >> '\(file.path)'")
            await log.waitFor("P:didChange")
            log.clear()
            try await Self.shell("cd '\(box.url.path)' && printf v2 > .notes.txt.swp && mv .notes.txt.swp notes.txt")
            await log.waitFor("P:didChange")
            #expect(!log.all.contains("P:accommodateDeletion"), "a save by rename is a change, not a deletion")
            let moved = box.url.appendingPathComponent("renamed.txt")
            try await Self.shell("mv '\(file.path)' '\(moved.path)'")
            await log.waitFor("P:didMove:\(moved.path)")
            #expect(presenter.presentedItemURL == moved)
            try await Self.shell("rm '\(moved.path)'")
            await log.waitFor("P:accommodateDeletion")
        }
    }

    @Test("a directory: subitems appear, change, move and go")
    func directoryPresenter() async throws {
        let box = Sandbox(), log = EventLog()
        let folder = box.directory("project")
        try await withPresenters([Recorder("D", url: folder, log: log)]) {
            try await Self.shell("cd '\(folder.path)' && mkdir -p src/deep && printf x > src/deep/a.c")
            await log.waitFor("D:subitemDidAppear:a.c")
            try await Self.shell("printf y >> '\(folder.path)/src/deep/a.c'")
            await log.waitFor("D:subitemDidChange:a.c")
            try await Self.shell("mv '\(folder.path)/src/deep/a.c' '\(folder.path)/src/b.c'")
            await log.waitFor("D:subitemDidMove:a.c->b.c")
            try await Self.shell("rm -rf '\(folder.path)/src'")
            await log.waitFor("D:accommodateSubitemDeletion:src")
        }
    }

    @Test("a file moved into another directory by a program that does not coordinate: its presenter hears where it went, not a deletion, and hears changes there")
    func uncoordinatedMoveElsewhere() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("before.txt", "v1")
        let moved = box.directory("elsewhere").appendingPathComponent("after.txt")
        let presenter = Recorder("P", url: file, log: log)
        try await withPresenters([presenter]) {
            try await Self.shell("mv '\(file.path)' '\(moved.path)'")
            #expect(await log.waitFor("P:didMove:\(moved.path)", within: .seconds(10)), "\(log.all)")
            #expect(!log.all.contains("P:accommodateDeletion"), "a move is not a deletion: \(log.all)")
            #expect(presenter.presentedItemURL == moved)
            log.clear()
            try await Self.shell("printf more >> '\(moved.path)'")
            #expect(await log.waitFor("P:didChange", within: .seconds(10)), "a change at the new place was not heard: \(log.all)")
            // Saved by rename there, then moved again: the file that took its place is
            // followed (once the watch has seen it: one replaced and moved away before
            // that is told as deleted).
            log.clear()
            try await Self.shell("cd '\(box.url.path)/elsewhere' && printf v2 > .after.swp && mv .after.swp after.txt")
            #expect(await log.waitFor("P:didChange", within: .seconds(10)), "\(log.all)")
            try await Self.shell("mv '\(moved.path)' '\(box.url.path)/back.txt'")
            let back = box.url.appendingPathComponent("back.txt")
            #expect(await log.waitFor("P:didMove:\(back.path)", within: .seconds(10)), "\(log.all)")
            // Deleted there, it is a deletion.
            try await Self.shell("rm '\(back.path)'")
            #expect(await log.waitFor("P:accommodateDeletion", within: .seconds(10)), "\(log.all)")
        }
    }

    @Test("a presented directory removed by a program that does not coordinate: its presenter hears the deletion")
    func directoryRemoved() async throws {
        let box = Sandbox(), log = EventLog()
        let folder = box.directory("project")
        try await withPresenters([Recorder("D", url: folder, log: log)]) {
            try await Self.shell("rm -rf '\(folder.path)'")
            #expect(await log.waitFor("D:accommodateDeletion", within: .seconds(10)), "\(log.all)")
        }
    }

    @Test("a file moved in a coordination of this process: its presenter's watch follows it, and hears changes at its new place only",
          arguments: [false, true])
    func watchFollowsCoordinatedMove(directory: Bool) async throws {
        let box = Sandbox(), log = EventLog()
        let item = directory ? box.directory("before") : box.file("before.txt", "v1")
        let moved = box.url.appendingPathComponent(directory ? "after" : "after.txt")
        let presenter = Recorder("P", url: item, log: log)
        try await withPresenters([presenter]) {
            let coordinator = FileCoordinator()
            try await coordinator.coordinate(writingItemAt: item, options: .forMoving, writingItemAt: moved, options: .forReplacing) { source, destination in
                try FileManager.default.moveItem(at: source, to: destination)
                await coordinator.item(at: source, didMoveTo: destination)
            }
            await log.waitFor("P:didMove:\(moved.path)")
            #expect(presenter.presentedItemURL == moved)
            log.clear()
            // A change at the new place is the presenter's; a new item at the old place is not.
            let change = directory ? "P:subitemDidAppear:new.txt" : "P:didChange"
            try await Self.shell(directory ? "printf x > '\(moved.path)/new.txt'" : "printf more >> '\(moved.path)'")
            #expect(await log.waitFor(change, within: .seconds(10)), "a change at the new place was not heard: \(log.all)")
            try await Self.shell(directory ? "mkdir '\(item.path)' && printf x > '\(item.path)/old.txt' && printf y > '\(moved.path)/new.txt'"
                                           : "printf other > '\(item.path)' && printf more >> '\(moved.path)'")
            let second = directory ? "P:subitemDidChange:new.txt" : "P:didChange"
            #expect(await log.waitFor(second, count: directory ? 1 : 2, within: .seconds(10)), "\(log.all)")
            // (A write may come as more than one event under load: only what they name counts.)
            #expect(log.all.allSatisfy { $0 == change || $0 == second }, "something at the old place was heard: \(log.all)")
        }
    }

    @Test("a coordinated write is not echoed by the watch, to other presenters or the writer's own")
    func noEcho() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("doc.txt")
        let own = Recorder("O", url: box.file("own.txt"), log: log)
        try await withPresenters([Recorder("P", url: file, log: log), own]) {
            try await FileCoordinator().coordinate(writingItemAt: file) { url in
                try await Data("coordinated".utf8).asyncWrite(to: url)
            }
            try await FileCoordinator(filePresenter: own).coordinate(writingItemAt: own.presentedItemURL!) { url in
                try await Data("mine".utf8).asyncWrite(to: url)
            }
            // An uncoordinated change afterwards: its didChange is the second one, and
            // nothing was heard in between (the watch's copies of the writes were dropped).
            try await Self.shell("printf z >> '\(file.path)'")
            await log.waitFor("P:didChange", count: 2)
            try await Task.sleep(for: .milliseconds(100)) // ok: gives a stray echo time to show up
            #expect(log.all.filter { $0 == "P:didChange" }.count == 2)
            #expect(log.all.filter { $0.hasPrefix("P:") } == ["P:relinquishToWriter", "P:save", "P:didChange", "P:reacquire", "P:didChange"])
            #expect(!log.all.contains { $0.hasPrefix("O:") }, "the writer's own presenter hears nothing of its write")
        }
    }

    @Test("coordinated writes that cause no event leave no suppression behind")
    func suppressionsEnd() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("doc.txt")
        let presenter = Recorder("P", url: file, log: log)
        try await withPresenters([presenter]) {
            let watch = try #require(CoordinationCenter.shared.watch(of: ObjectIdentifier(presenter)))
            for _ in 0 ..< 50 {
                try await FileCoordinator().coordinate(writingItemAt: file) { _ in }
            }
            #expect(watch.suppressionCount == 0)
            // A change after them is still heard, once.
            try await Self.shell("printf z >> '\(file.path)'")
            await log.waitFor("P:didChange", count: 51)
            #expect(watch.suppressionCount == 0)
        }
    }
}
