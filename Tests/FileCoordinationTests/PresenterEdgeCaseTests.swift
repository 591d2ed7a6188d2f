@testable import FileCoordination
import Foundation
import Testing
import TestSupport

/// What a presenter still hears when an accessor returns nil, or when it answers late.
@Suite("Presenter edge cases")
struct PresenterEdgeCaseTests {
    /// A document that saves its unsaved text through a coordinator made for it, as an
    /// editor's document does (Apple's `NSDocument` included).
    final class SavingDocument: FilePresenter {
        let url: URL
        let log: EventLog
        var presentedItemURL: URL? { url }
        init(url: URL, log: EventLog) { (self.url, self.log) = (url, log) }
        func savePresentedItemChanges() async throws {
            try await FileCoordinator(filePresenter: self).coordinate(writingItemAt: url) { url in
                try Data("saved".utf8).write(to: url)
            }
            log.append("saved")
        }
    }

    @Test("a presenter asked to save by a reader writes through its own coordinator: the write goes in while the reader waits for the save, as Apple's does",
          .timeLimit(.minutes(1)), arguments: [false, true])
    func saveThroughOwnCoordinator(writer: Bool) async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("doc.txt", "old")
        let document = SavingDocument(url: file, log: log)
        try await withPresenters([document]) {
            let coordinator = FileCoordinator()
            coordinator.setPresenterTimeoutPolicy(.init(timeout: .seconds(20), action: .proceed))
            let started = ContinuousClock.now
            let text = try await writer
                ? coordinator.coordinate(writingItemAt: file) { url in try String(contentsOf: url, encoding: .utf8) }
                : coordinator.coordinate(readingItemAt: file) { url in try String(contentsOf: url, encoding: .utf8) }
            #expect(ContinuousClock.now - started < .seconds(10), "the save waited for the coordination that asked for it")
            #expect(text == "saved", "the accessor ran before the save")
        }
    }

    @Test("an accessor returning nil still counts as done: presenters hear didChange")
    func nilResult() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("n.txt")
        try await withPresenters([Recorder("P", url: file, log: log)]) {
            let result: Int? = try await FileCoordinator().coordinate(writingItemAt: file) { _ in nil }
            #expect(result == nil)
        }
        #expect(log.all.contains("P:didChange"))
    }

    /// Answers relinquish-to-writer only after a delay (a slow presenter, on purpose).
    final class SlowPresenter: FilePresenter {
        let presentedItemURL: URL?
        let reacquired: AsyncStream<Void>.Continuation
        init(url: URL, reacquired: AsyncStream<Void>.Continuation) {
            presentedItemURL = url
            self.reacquired = reacquired
        }
        func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
            try? await Task.sleep(for: .milliseconds(400)) // ok: models a presenter slower than the timeout
            return { [reacquired] in reacquired.yield() }
        }
    }

    @Test("a presenter that answers after the timeout still gets its item back")
    func lateAnswer() async throws {
        let box = Sandbox()
        let file = box.file("slow.txt")
        let (reacquired, continuation) = AsyncStream.makeStream(of: Void.self)
        try await withPresenters([SlowPresenter(url: file, reacquired: continuation)]) {
            let coordinator = FileCoordinator()
            coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .milliseconds(50), action: .proceed))
            try await coordinator.coordinate(writingItemAt: file) { _ in }
            // The write went ahead without the answer; the late reacquirer still runs.
            for await _ in reacquired { break }
        }
    }

    @Test("a writer whose task is cancelled during its accessor still tells its presenters of the change and gives them their item back")
    func cancelledDuringAccessor() async {
        let box = Sandbox(), log = EventLog()
        let file = box.file("cancelled.txt")
        await withPresenters([Recorder("P", url: file, log: log), Recorder("Q", url: file, log: log)]) {
            let writer = Task {
                try await FileCoordinator().coordinate(writingItemAt: file) { url in
                    try Data("new".utf8).write(to: url)
                    withUnsafeCurrentTask { $0?.cancel() }
                }
            }
            _ = await writer.result
        }
        for name in ["P", "Q"] {
            #expect(log.all.filter { $0.hasPrefix(name + ":") } == ["\(name):relinquishToWriter", "\(name):save", "\(name):didChange", "\(name):reacquire"],
                    "\(log.all)")
        }
    }

    /// Saves only when told to, and says when it started saving.
    final class HeldSaver: FilePresenter {
        let presentedItemURL: URL?
        let log: EventLog
        let saving: AsyncStream<Void>.Continuation
        let release: AsyncStream<Void>
        init(url: URL, log: EventLog, saving: AsyncStream<Void>.Continuation, release: AsyncStream<Void>) {
            (presentedItemURL, self.log, self.saving, self.release) = (url, log, saving, release)
        }
        func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
            return { [log] in log.append("reacquire") }
        }
        func savePresentedItemChanges() async throws {
            saving.yield()
            for await _ in release { break }
        }
    }

    @Test("a writer cancelled while its presenter saves fails, and the presenter gets its item back before the coordination ends")
    func cancelledWhileSaving() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("saving.txt")
        let (saving, savingContinuation) = AsyncStream.makeStream(of: Void.self)
        let (release, releaseContinuation) = AsyncStream.makeStream(of: Void.self)
        let presenter = HeldSaver(url: file, log: log, saving: savingContinuation, release: release)
        await withPresenters([presenter]) {
            let writer = Task { try await FileCoordinator().coordinate(writingItemAt: file) { _ in log.append("accessor") } }
            for await _ in saving { break }
            writer.cancel()
            let outcome = await writer.result
            #expect(throws: CancellationError.self) { try outcome.get() }
            // Given back before the coordination ended, while the save still runs.
            #expect(log.all == ["reacquire"])
            releaseContinuation.yield()
        }
    }

    @Test("a writer cancelled during an accessor that creates nothing tells the directory's presenter of no new subitem")
    func cancelledCreatingNothing() async {
        let box = Sandbox(), log = EventLog()
        let directory = box.directory("d")
        let file = directory.appendingPathComponent("new.txt")
        await withPresenters([Recorder("D", url: directory, log: log)]) {
            let writer = Task {
                try await FileCoordinator().coordinate(writingItemAt: file) { _ in withUnsafeCurrentTask { $0?.cancel() } }
            }
            _ = await writer.result
        }
        #expect(!log.all.contains("D:subitemDidAppear:new.txt"), "\(log.all)")
        #expect(!FileManager.default.fileExists(atPath: file.path))
    }

    /// A presenter whose reacquirer waits for `gate` (a new one each time) between two log lines.
    final class GatedReacquirer: FilePresenter {
        let presentedItemURL: URL?
        let log: EventLog
        let gate = Locked(Gate())
        init(url: URL, log: EventLog) { (presentedItemURL, self.log) = (url, log) }
        func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
            let gate = self.gate.withLock { $0 }
            return { [log] in
                log.append("reacquire begins")
                await gate.wait()
                log.append("reacquire ends")
            }
        }
    }

    @Test("prepare returns once the batch's reacquirers have run, also when the accessor called its completion handler first (50 tries)")
    func prepareWaitsForReacquirers() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("batch.txt")
        let presenter = GatedReacquirer(url: file, log: log)
        try await withPresenters([presenter]) {
            for _ in 0 ..< 50 {
                log.clear()
                let gate = Gate()
                presenter.gate.withLock { $0 = gate }
                try await FileCoordinator().prepare(forReadingItemsAt: [], writingItemsAt: [file]) { done in
                    done()
                    await log.waitFor("reacquire begins")
                    gate.open()
                }
                log.append("prepare returned")
                #expect(log.all == ["reacquire begins", "reacquire ends", "prepare returned"])
                if log.all.last != "prepare returned" || log.all.count != 3 { break }
            }
        }
    }

    @Test("cancel() ends a coordination waiting for a presenter that does not answer, at once, not at the presenter timeout",
          .timeLimit(.minutes(1)))
    func cancelWhileAsking() async {
        let box = Sandbox(), log = EventLog()
        let file = box.file("asked.txt")
        await withPresenters([Recorder("H", url: file, log: log, behavior: .hangOnWriters)]) {
            let coordinator = FileCoordinator()
            // Without cancel(), the wait would end at the timeout, with `.timedOut`.
            coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .seconds(20), action: .fail))
            let writer = Task { try await coordinator.coordinate(writingItemAt: file) { _ in log.append("accessor") } }
            await log.waitFor("H:relinquishToWriter")
            coordinator.cancel()
            // The test's time limit cancels the writer too, should cancel() not end it.
            let error = await #expect(throws: FileCoordinationError.self) {
                try await withTaskCancellationHandler { try await writer.value } onCancel: { writer.cancel() }
            }
            #expect(error?.code == .cancelled)
            #expect(!log.all.contains("accessor"))
        }
    }

    @Test("a writer whose accessor writes, then throws, tells its presenters of the change as any writer does")
    func throwingAccessorTells() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("thrown.txt")
        struct Failed: Error {}
        await withPresenters([Recorder("P", url: file, log: log)]) {
            _ = await #expect(throws: Failed.self) {
                try await FileCoordinator().coordinate(writingItemAt: file) { url in
                    try Data("half".utf8).write(to: url)
                    throw Failed()
                }
            }
        }
        #expect(log.all == ["P:relinquishToWriter", "P:save", "P:didChange", "P:reacquire"], "\(log.all)")
    }
}
