import Foundation
import Testing
@testable import FileCoordination

@Suite("Presenter messages, in Apple's order")
struct PresenterOrderTests {
    @Test("read: relinquish to reader, save, the read, reacquire")
    func read() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("doc.txt")
        let presenter = Recorder("P", url: file, log: log)
        try await withPresenters([presenter]) {
            try await FileCoordinator().coordinate(readingItemAt: file) { _ in log.append("read") }
        }
        #expect(log.all == ["P:relinquishToReader", "P:save", "read", "P:reacquire"])
    }

    @Test("read withoutChanges: the presenter is not asked to save")
    func readWithoutChanges() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("doc.txt")
        try await withPresenters([Recorder("P", url: file, log: log)]) {
            try await FileCoordinator().coordinate(readingItemAt: file, options: .withoutChanges) { _ in log.append("read") }
        }
        #expect(log.all == ["P:relinquishToReader", "read", "P:reacquire"])
    }

    @Test("write: relinquish to writer, save, the write, didChange, reacquire; the directory hears of the subitem")
    func write() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("doc.txt")
        let item = Recorder("P", url: file, log: log)
        let folder = Recorder("D", url: box.url, log: log)
        try await withPresenters([item, folder]) {
            try await FileCoordinator().coordinate(writingItemAt: file) { url in
                log.append("write")
                try await Data("new".utf8).asyncWrite(to: url)
            }
        }
        let events = log.all
        for name in ["P", "D"] {
            let mine = events.filter { $0.hasPrefix("\(name):") || $0 == "write" }
            let expected = name == "P"
                ? ["P:relinquishToWriter", "P:save", "write", "P:didChange", "P:reacquire"]
                : ["D:relinquishToWriter", "D:save", "write", "D:subitemDidChange:doc.txt", "D:reacquire"]
            #expect(mine == expected)
        }
    }

    @Test("a write that creates a file: the directory hears subitemDidAppear")
    func creation() async throws {
        let box = Sandbox(), log = EventLog()
        let folder = Recorder("D", url: box.url, log: log)
        let file = box.url.appendingPathComponent("new.txt")
        try await withPresenters([folder]) {
            try await FileCoordinator().coordinate(writingItemAt: file) { url in try await Data("hi".utf8).asyncWrite(to: url) }
        }
        #expect(log.all == ["D:relinquishToWriter", "D:save", "D:subitemDidAppear:new.txt", "D:reacquire"])
    }

    @Test("delete: the item's presenter accommodates the deletion, the directory's the subitem deletion, before the accessor")
    func delete() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("gone.txt")
        try await withPresenters([Recorder("P", url: file, log: log), Recorder("D", url: box.url, log: log)]) {
            try await FileCoordinator().coordinate(writingItemAt: file, options: .forDeleting) { url in
                log.append("delete")
                try FileManager.default.removeItem(at: url)
            }
        }
        let events = log.all
        #expect(events.filter { $0.hasPrefix("P:") || $0 == "delete" } == ["P:relinquishToWriter", "P:accommodateDeletion", "delete", "P:reacquire"])
        #expect(events.filter { $0.hasPrefix("D:") || $0 == "delete" } == ["D:relinquishToWriter", "D:accommodateSubitemDeletion:gone.txt", "delete", "D:reacquire"])
    }

    @Test("move: presenters of the item and inside it hear didMove, containers the subitem move, then reacquire")
    func move() async throws {
        let box = Sandbox(), log = EventLog()
        let folder = box.directory("old")
        let inner = box.file("old/inner.txt")
        let destination = box.url.appendingPathComponent("new")
        try await withPresenters([Recorder("F", url: folder, log: log), Recorder("I", url: inner, log: log),
                                  Recorder("R", url: box.url, log: log)]) {
            let coordinator = FileCoordinator()
            try await coordinator.coordinate(writingItemAt: folder, options: .forMoving,
                                             writingItemAt: destination, options: .forReplacing) { from, to in
                coordinator.item(at: from, willMoveTo: to)
                try FileManager.default.moveItem(at: from, to: to)
                log.append("moved")
                await coordinator.item(at: from, didMoveTo: to)
                log.append("reported")
            }
            let events = log.all
            let newPath = destination.path
            #expect(events.filter { $0.hasPrefix("F:") || $0 == "moved" }.suffix(3) == ["moved", "F:didMove:\(newPath)", "F:reacquire"])
            #expect(events.contains("I:didMove:\(newPath)/inner.txt"))
            #expect(events.contains("R:subitemDidMove:old->new"))
            #expect(events.firstIndex(of: "reported")! < events.firstIndex(of: "F:didMove:\(newPath)")!,
                    "move messages are delivered after the accessor returns")
            // The registry followed the move: a write at the new place reaches the inner presenter.
            log.clear()
            try await FileCoordinator().coordinate(writingItemAt: destination.appendingPathComponent("inner.txt")) { _ in }
            #expect(log.all.contains("I:relinquishToWriter"))
        }
    }

    @Test("a presenter is never told about its own coordinator's accesses")
    func ownCoordinator() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("mine.txt")
        let presenter = Recorder("P", url: file, log: log)
        try await withPresenters([presenter]) {
            try await FileCoordinator(filePresenter: presenter).coordinate(writingItemAt: file) { _ in log.append("write") }
        }
        #expect(log.all == ["write"])
    }

    @Test("a presenter that refuses fails the coordination with its error; the accessor never runs; claims are released")
    func refusal() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("busy.txt")
        let refuser = Recorder("X", url: file, log: log, behavior: .refuseWriters)
        let other = Recorder("D", url: box.url, log: log)
        await withPresenters([refuser, other]) {
            let error = await #expect(throws: FileCoordinationError.self) {
                try await FileCoordinator().coordinate(writingItemAt: file) { _ in log.append("write") }
            }
            #expect(error?.code == .presenterFailed)
            #expect(error?.cause is Recorder.Refusal)
            #expect(error?.message.contains("document is busy") == true)
        }
        #expect(!log.all.contains("write"))
        #expect(log.all.contains("D:reacquire"), "presenters that did relinquish get their item back")
        // Nothing is left held: the next write goes straight through.
        try await FileCoordinator().coordinate(writingItemAt: file) { _ in log.append("second write") }
        #expect(log.all.last == "second write")
    }

    @Test("a hung presenter: the timeout policy proceeds with the write, or fails it", arguments: [PresenterTimeoutPolicy.Action.proceed, .fail])
    func hungPresenter(action: PresenterTimeoutPolicy.Action) async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("hung.txt")
        try await withPresenters([Recorder("H", url: file, log: log, behavior: .hangOnWriters)]) {
            let coordinator = FileCoordinator()
            coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .milliseconds(200), action: action))
            let started = ContinuousClock.now
            switch action {
            case .proceed:
                try await coordinator.coordinate(writingItemAt: file) { _ in log.append("write") }
                #expect(log.all.contains("write"))
            case .fail:
                let error = await #expect(throws: FileCoordinationError.self) {
                    try await coordinator.coordinate(writingItemAt: file) { _ in log.append("write") }
                }
                #expect(error?.code == .timedOut)
                #expect(!log.all.contains("write"))
            }
            #expect(ContinuousClock.now - started >= .milliseconds(200))
        }
    }

    @Test("prepare messages each presenter once for a batch of coordinations")
    func prepare() async throws {
        let box = Sandbox(), log = EventLog()
        let a = box.file("a.txt"), b = box.file("b.txt")
        try await withPresenters([Recorder("A", url: a, log: log), Recorder("B", url: b, log: log)]) {
            let coordinator = FileCoordinator()
            try await coordinator.prepare(forReadingItemsAt: [a, b], writingItemsAt: []) { _ in
                try await coordinator.coordinate(readingItemAt: a) { _ in log.append("read a") }
                try await coordinator.coordinate(readingItemAt: b) { _ in log.append("read b") }
            }
        }
        let events = log.all
        #expect(events.filter { $0 == "A:relinquishToReader" }.count == 1)
        #expect(events.filter { $0 == "B:relinquishToReader" }.count == 1)
        #expect(events.firstIndex(of: "read b")! < events.firstIndex(of: "A:reacquire")!)
    }
}
