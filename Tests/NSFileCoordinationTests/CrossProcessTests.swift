import Foundation
import NSFileCoordination
import Testing
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// A presenter that lets go of its item late: it answers a writer's relinquish a while
/// after being asked, from another thread, as a document that first finishes an edit.
final class SlowToLetGo: NSObject, NSFilePresenter, @unchecked Sendable {
    // Unchecked: every stored property is immutable.
    let presentedItemURL: URL?
    let presentedItemOperationQueue = OperationQueue()
    let journal: Journal
    /// Where "released" and "reacquired" are appended (another process appends there too).
    let orderFile: String
    let delay: TimeInterval

    init(url: URL, journal: Journal, orderFile: String, delay: TimeInterval) {
        presentedItemURL = url
        self.journal = journal
        self.orderFile = orderFile
        self.delay = delay
    }

    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        journal.append(OperationQueue.current === presentedItemOperationQueue ? "asked on queue" : "asked off queue")
        let (orderFile, journal, queue) = (orderFile, journal, presentedItemOperationQueue)
        DispatchQueue.global().asyncAfter(deadline: .now() + delay) { // ok: the presenter is slow to let go, on purpose
            appendLine("released", to: orderFile)
            writer {
                journal.append(OperationQueue.current === queue ? "reacquired on queue" : "reacquired off queue")
                appendLine("reacquired", to: orderFile)
            }
        }
    }
}

/// A document that saves through a coordinator made for it when asked, as `NSDocument`
/// does: "saved", then "saved 2", ... (which save a reader read). With `autosave`, the
/// save instead starts a slower write of its own beside it and returns: "auto" written,
/// then after that many seconds "autosaved".
final class SavingDocument: NSObject, NSFilePresenter, @unchecked Sendable {
    // Unchecked: every stored property is immutable.
    let presentedItemURL: URL?
    let presentedItemOperationQueue = OperationQueue()
    let journal: Journal
    let autosave: Double?

    init(url: URL, journal: Journal, autosave: Double? = nil) {
        presentedItemURL = url
        self.journal = journal
        self.autosave = autosave
    }

    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        let url = presentedItemURL!
        if let seconds = autosave {
            let started = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                var error: NSError?
                NSFileCoordinator(filePresenter: self).coordinate(writingItemAt: url, error: &error) { url in
                    try? Data("auto".utf8).write(to: url)
                    started.signal()
                    Thread.sleep(forTimeInterval: seconds) // ok: a write that takes a while, on purpose
                    try? Data("autosaved".utf8).write(to: url)
                }
            }
            started.wait()
            return completionHandler(nil)
        }
        var error: NSError?
        NSFileCoordinator(filePresenter: self).coordinate(writingItemAt: url, error: &error) { url in
            let count = journal.all.count
            let text = count == 0 ? "saved" : "saved \(count + 1)"
            journal.append((try? Data(text.utf8).write(to: url)) == nil ? "not saved" : text)
        }
        completionHandler(error)
    }
}

@Suite("NSFileCoordinator across processes", .timeLimit(.minutes(3)))
struct NSCrossProcessTests {
    /// Runs `body` with a ``SavingDocument`` of a file holding "old", added and published
    /// in this process's space: the space's directory, the file, the document's journal
    /// and the scratch directory that holds the file.
    func withSavingDocument(autosave: Double? = nil, _ body: (String, URL, Journal, Scratch) async throws -> Void) async throws {
        let scratch = Scratch(), journal = Journal()
        let space = try await joinedSpace(scratch)
        let file = scratch.file("doc.txt", "old")
        let document = SavingDocument(url: file, journal: journal, autosave: autosave)
        NSFileCoordinator.addFilePresenter(document)
        defer { NSFileCoordinator.removeFilePresenter(document) }
        #expect(try await waitForStatus(space: space) { listsPresenter($0, of: resolved(file)) }, "the presenter was never published")
        try await body(space, file, journal, scratch)
    }

    @Test("a coordination in another process asks the document here to save: it saves through its own coordinator while that coordination waits, and the command reads what it saved",
          arguments: ["--read", "--write"])
    func saveThroughOwnCoordinator(access: String) async throws {
        try await withSavingDocument { space, file, journal, _ in
            let started = ContinuousClock.now
            let (status, output) = try await runToEnd([filecoordBinary, "exec", "--space", space, access, file.path,
                                                       "--presenter-timeout", "20", "--", "cat", file.path])
            #expect(status == 0, "\(output)")
            #expect(ContinuousClock.now - started < .seconds(10), "the save waited for the coordination that asked for it")
            #expect(output == "saved", "the command ran before the save")
            #expect(journal.all == ["saved"])
        }
    }

    @Test("a writer in another process waits until the presenter here calls the block it was given")
    func writerWaitsForLateRelinquish() async throws {
        let scratch = Scratch(), journal = Journal()
        let space = try await joinedSpace(scratch)
        let file = scratch.file("doc.txt", "old")
        let order = scratch.path + "/order"
        let presenter = SlowToLetGo(url: file, journal: journal, orderFile: order, delay: 1)
        NSFileCoordinator.addFilePresenter(presenter)
        defer { NSFileCoordinator.removeFilePresenter(presenter) }
        #expect(try await waitForStatus(space: space) { listsPresenter($0, of: resolved(file)) }, "the presenter was never published")
        let (status, output) = try await runToEnd([filecoordBinary, "exec", "--space", space, "--write", file.path, "--",
                                                   "sh", "-c", "echo writer >> '\(order)'"], includeStandardError: true)
        #expect(status == 0, "\(output)")
        #expect(try await journal.waitAsync { $0.contains { $0.hasPrefix("reacquired") } })
        #expect(lines(of: order) == ["released", "writer", "reacquired"])
        #expect(journal.all == ["asked on queue", "reacquired on queue"])
    }

    @Test("a write the document started under the save's loan ends before the coordination that asked for the save goes on")
    func loanCoversItsWritesToTheirEnd() async throws {
        try await withSavingDocument(autosave: 1) { space, file, _, _ in
            let (status, output) = try await runToEnd([filecoordBinary, "exec", "--space", space, "--write", file.path,
                                                       "--presenter-timeout", "20", "--", "cat", file.path])
            #expect(status == 0)
            #expect(output == "autosaved", "the command ran while the document's write went on")
        }
    }

    @Test("a reader asks the document to save while a reader of another process is in its accessor: the save's write waits for that reader, which reads what was there")
    func noLoanBesideAnotherReader() async throws {
        try await withSavingDocument { space, file, journal, scratch in
            let fifo = scratch.path + "/release"
            #expect(mkfifo(fifo, 0o600) == 0)
            // A reader in its accessor until told to go; then it reads the file.
            let reading = try Child([filecoordBinary, "exec", "--space", space, "--read", file.path, "--presenter-timeout", "20", "--", "sh", "-c",
                                     "echo in; timeout 300 sh -c 'read x < \"$0\"' \"$0\"; cat \"$1\"; echo", fifo, file.path])
            // It asked the document to save first.
            #expect(try await reading.lines.waitAsync { $0 == ["in"] })
            #expect(journal.all == ["saved"])
            // A second reader asks the document to save (and gives up on it after 2 s).
            let asking = Task { try await runToEnd([filecoordBinary, "exec", "--space", space, "--read", file.path,
                                                    "--presenter-timeout", "2", "--", "true"], includeStandardError: true) }
            #expect(try await journal.waitAsync(seconds: 5) { $0.count > 1 } == false, "the save wrote while a reader of another process read: \(journal.all)")
            _ = try await runToEnd(["sh", "-c", "echo go > '\(fifo)'"])
            #expect(try await reading.wait() == 0)
            #expect(reading.lines.all == ["in", "saved"], "the reader read what the second save wrote")
            _ = try await asking.value
            #expect(try await journal.waitAsync(seconds: 20) { $0 == ["saved", "saved 2"] }, "the second save never wrote: \(journal.all)")
        }
    }

    @Test("cancel() ends a coordination waiting for another process's claim: NSUserCancelledError, and the accessor never runs")
    func cancelWhileWaitingOnAnotherProcess() async throws {
        let scratch = Scratch()
        let space = try await joinedSpace(scratch)
        let file = scratch.file("held.txt")
        let fifo = scratch.path + "/release"
        #expect(mkfifo(fifo, 0o600) == 0)
        // Holds the write claim until told to go (or 300 s, should the test fail first).
        let holder = try Child([filecoordBinary, "exec", "--space", space, "--write", file.path, "--", "sh", "-c",
                                "echo held; exec timeout 300 sh -c 'read x < \"$0\"' \"$0\"", fifo])
        #expect(try await holder.lines.waitAsync { $0 == ["held"] })

        let coordinator = NSFileCoordinator()
        let ran = Shared(false)
        let waiting = Task {
            try await blocking { error in
                coordinator.coordinate(writingItemAt: file, error: error) { _ in ran.value = true }
            }
        }
        #expect(try await waitForStatus(space: space) { listsThisProcessWaiting($0) }, "the coordination never waited")
        coordinator.cancel()
        let error = try await waiting.value
        #expect(error?.domain == NSCocoaErrorDomain)
        #expect(error?.code == NSUserCancelledError)
        #expect(!ran.value)

        _ = try await runToEnd(["sh", "-c", "echo go > '\(fifo)'"])
        #expect(try await holder.wait() == 0)
        // The claim is free again for this process.
        let after = try await blocking { error in NSFileCoordinator().coordinate(writingItemAt: file, error: error) { _ in ran.value = true } }
        #expect(after == nil && ran.value)
    }
}
