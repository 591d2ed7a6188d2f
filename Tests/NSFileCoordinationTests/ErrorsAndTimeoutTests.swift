import Foundation
import NSFileCoordination
import Testing
import TestSupport

/// A presenter that implements the `async` form of the save, as Apple's Swift import
/// allows, instead of the completion-handler form.
final class AsyncSaver: NSObject, NSFilePresenter, @unchecked Sendable {
    // Unchecked: every stored property is immutable.
    let presentedItemURL: URL?
    let presentedItemOperationQueue = OperationQueue()
    let journal: Journal
    init(url: URL, journal: Journal) {
        presentedItemURL = url
        self.journal = journal
    }
    func savePresentedItemChanges() async throws { journal.append("saved (async)") }
}

/// A presenter that answers a writer's relinquish only after `delay`, or never (nil).
final class LateAnswer: NSObject, NSFilePresenter, @unchecked Sendable {
    // Unchecked: every stored property is immutable.
    let presentedItemURL: URL?
    let presentedItemOperationQueue = OperationQueue()
    let journal: Journal
    let delay: TimeInterval?
    init(url: URL, journal: Journal, delay: TimeInterval?) {
        presentedItemURL = url
        self.journal = journal
        self.delay = delay
    }
    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        guard let delay else { return }
        let journal = journal
        DispatchQueue.global().asyncAfter(deadline: .now() + delay) { // ok: a presenter slow to answer, on purpose
            journal.append("released")
            writer(nil)
        }
    }
}

/// A coordinator made while ``NSFileCoordinator/presenterTimeout`` is `timeout`.
func coordinator(presenterTimeout timeout: Duration?) -> NSFileCoordinator {
    let before = NSFileCoordinator.presenterTimeout
    NSFileCoordinator.presenterTimeout = timeout
    defer { NSFileCoordinator.presenterTimeout = before }
    return NSFileCoordinator()
}

@Suite("NSFileCoordinator: errors as Cocoa's, and the presenter timeout")
struct ErrorsAndTimeoutTests {
    @Test("coordinate(readingItemAt:error:) called from more tasks at once than the cooperative pool has threads, as ported code calls it: every call ends (no presenter to ask)",
          .timeLimit(.minutes(1)))
    func blockingFromManyTasks() async throws {
        let scratch = Scratch()
        let file = scratch.file("doc.txt")
        let (ended, callers) = try await Self.callFromManyTasks {
            var error: NSError?
            NSFileCoordinator().coordinate(readingItemAt: file, error: &error) { _ in }
        }
        #expect(ended == callers, "\(ended) of \(callers) calls ended: the pool's threads all wait for work that needs them")
    }

    /// Calls `coordinate` from more tasks at once than the cooperative pool has threads,
    /// each blocking its pool thread inside the call, as ported code does: how many of the
    /// calls ended within 20 s, and of how many.
    static func callFromManyTasks(_ coordinate: @escaping @Sendable () -> Void) async throws -> (ended: Int, callers: Int) {
        let callers = ProcessInfo.processInfo.activeProcessorCount * 4
        let finished = Shared(0)
        let count = NSLock()
        for _ in 0 ..< callers {
            Task.detached {
                coordinate()
                count.withLock { finished.value += 1 }
            }
        }
        let ended = try await offThePool { () -> Int in
            for _ in 0 ..< 2_000 where count.withLock({ finished.value }) < callers { usleep(10_000) } // ok: polling from a thread of its own, bounded
            return count.withLock { finished.value }
        }
        return (ended, callers)
    }

    @Test("coordinate(writingItemAt:error:) called from more tasks at once than the cooperative pool has threads, with a presenter to ask: every call ends, and the presenter is asked by each",
          .timeLimit(.minutes(1)))
    func blockingFromManyTasksWithPresenter() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        let document = Document("D", url: file, journal: journal)
        NSFileCoordinator.addFilePresenter(document)
        defer { NSFileCoordinator.removeFilePresenter(document) }
        // Registered (addFilePresenter returns before): a first write asks it.
        _ = try await offThePool {
            var error: NSError?
            NSFileCoordinator().coordinate(writingItemAt: file, error: &error) { _ in }
        }
        #expect(events(of: "D", in: journal.all).contains("relinquishToWriter"))
        let (ended, callers) = try await Self.callFromManyTasks {
            var error: NSError?
            NSFileCoordinator().coordinate(writingItemAt: file, error: &error) { _ in }
        }
        #expect(ended == callers, "\(ended) of \(callers) calls ended: the presenter's messages need the pool's threads, which the calls hold")
        #expect(events(of: "D", in: journal.all).filter { $0 == "relinquishToWriter" }.count == callers + 1)
    }

    @Test("after cancel(), every later coordination of that coordinator fails with NSUserCancelledError and never runs its block, as Apple's does")
    func cancelIsForGood() async throws {
        let scratch = Scratch()
        let file = scratch.file("doc.txt")
        let coordinator = NSFileCoordinator()
        coordinator.cancel()
        let ran = Shared(false)
        let errors = try await offThePool { () -> [NSError?] in
            var results: [NSError?] = []
            var error: NSError?
            coordinator.coordinate(readingItemAt: file, error: &error) { _ in ran.value = true }
            results.append(error)
            error = nil
            coordinator.coordinate(writingItemAt: file, error: &error) { _ in ran.value = true }
            results.append(error)
            error = nil
            coordinator.coordinate(readingItemAt: file, writingItemAt: file, error: &error) { _, _ in ran.value = true }
            results.append(error)
            error = nil
            coordinator.prepare(forReadingItemsAt: [file], writingItemsAt: [], error: &error) { done in ran.value = true; done() }
            results.append(error)
            return results
        }
        #expect(!ran.value, "a block ran after cancel()")
        #expect(errors.map { $0?.domain } == Array(repeating: NSCocoaErrorDomain, count: 4))
        #expect(errors.map { $0?.code } == Array(repeating: NSUserCancelledError, count: 4))
        let queued = try await offThePool { () -> NSError? in
            let done = DispatchSemaphore(value: 0)
            let outcome = Shared<NSError?>(nil)
            coordinator.coordinate(with: [.readingIntent(with: file)], queue: OperationQueue()) { error in
                outcome.value = error.map { $0 as NSError }
                done.signal()
            }
            _ = done.wait(timeout: .now() + 30)
            return outcome.value
        }
        #expect(queued?.code == NSUserCancelledError)
    }

    @Test("a presenter's failed save is the coordination's error, and the accessor never runs")
    func presenterRefusal() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        let refusal = NSError(domain: NSCocoaErrorDomain, code: NSFileWriteNoPermissionError)
        try await withRegistered([Document("P", url: file, journal: journal, saveError: refusal)]) {
            let error = try await blocking { error in
                NSFileCoordinator().coordinate(writingItemAt: file, error: error) { _ in journal.append("write") }
            }
            #expect(error?.domain == NSCocoaErrorDomain)
            #expect(error?.code == NSFileWriteNoPermissionError)
            #expect(try await journal.waitAsync { events(of: "P", in: $0).contains("reacquire") }, "the presenter gets its item back")
        }
        #expect(!journal.all.contains("write"))
    }

    @Test("a file error is Cocoa's: a snapshot of a missing file is NSFileReadNoSuchFileError with its path")
    func missingFile() async throws {
        let scratch = Scratch()
        let missing = scratch.url.appendingPathComponent("missing.txt")
        let ran = Shared(false)
        let error = try await blocking { error in
            NSFileCoordinator().coordinate(readingItemAt: missing, options: .forUploading, error: error) { _ in ran.value = true }
        }
        #expect(error?.domain == NSCocoaErrorDomain)
        #expect(error?.code == NSFileReadNoSuchFileError)
        #expect((error?.userInfo[NSFilePathErrorKey] as? String)?.hasSuffix("/missing.txt") == true)
        #expect(!ran.value)
    }

    @Test("a presenter that implements the async form of the save is asked to save")
    func asyncSave() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        try await withRegistered([AsyncSaver(url: file, journal: journal)]) {
            _ = try await blocking { error in NSFileCoordinator().coordinate(readingItemAt: file, error: error) { _ in journal.append("read") } }
        }
        #expect(journal.all == ["saved (async)", "read"])
    }

    @Test("the presenter timeout: a presenter that never answers holds a writer only that long; nil waits for the answer, as Apple's do")
    func presenterTimeout() async throws {
        #expect(NSFileCoordinator.presenterTimeout == .seconds(30))
        let scratch = Scratch(), journal = Journal()
        let (silent, slow) = (scratch.file("silent.txt"), scratch.file("slow.txt"))
        try await withRegistered([LateAnswer(url: silent, journal: journal, delay: nil),
                                  LateAnswer(url: slow, journal: journal, delay: 1.5)]) {
            let bounded = coordinator(presenterTimeout: .milliseconds(300))
            let error = try await blocking { error in bounded.coordinate(writingItemAt: silent, error: error) { _ in journal.append("wrote silent") } }
            #expect(error == nil)
            let forever = coordinator(presenterTimeout: nil)
            _ = try await blocking { error in forever.coordinate(writingItemAt: slow, error: error) { _ in journal.append("wrote slow") } }
        }
        #expect(journal.all == ["wrote silent", "released", "wrote slow"])
        #expect(NSFileCoordinator.presenterTimeout == .seconds(30))
    }
}
