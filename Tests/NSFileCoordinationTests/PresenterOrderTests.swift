import Foundation
import NSFileCoordination
import Testing
import TestSupport

/// Registers `presenters` for the duration of `body`.
func withRegistered<T>(_ presenters: [any NSFilePresenter], isolation: isolated (any Actor)? = #isolation,
                       _ body: () async throws -> T) async rethrows -> T {
    for presenter in presenters { NSFileCoordinator.addFilePresenter(presenter) }
    defer { for presenter in presenters { NSFileCoordinator.removeFilePresenter(presenter) } }
    return try await body()
}

/// Runs `body`, which coordinates with the blocking forms, on a thread of its own (they
/// block it); the error it was given.
func blocking(_ body: @escaping @Sendable (NSErrorPointer) -> Void) async throws -> NSError? {
    try await offThePool {
        var error: NSError?
        body(&error)
        return error
    }
}

/// `name`'s events and the marks (entries without a presenter's prefix), in order.
func sequence(of name: String, marks: Set<String>, in all: [String]) -> [String] {
    all.filter { marks.contains($0) || $0.hasPrefix("\(name):") }
}

@Suite("NSFilePresenter: Apple's messages, in Apple's order, on the presenter's queue")
struct PresenterOrderTests {
    @Test("read: relinquish to the reader, save, the read, then the reacquirer")
    func read() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        try await withRegistered([Document("P", url: file, journal: journal)]) {
            let error = try await blocking { error in
                NSFileCoordinator().coordinate(readingItemAt: file, error: error) { _ in journal.append("read") }
            }
            #expect(error == nil)
            #expect(try await journal.waitAsync { events(of: "P", in: $0).contains("reacquire") })
        }
        #expect(sequence(of: "P", marks: ["read"], in: journal.all) == ["P:relinquishToReader", "P:save", "read", "P:reacquire"])
    }

    @Test("read withoutChanges: the presenter is not asked to save")
    func readWithoutChanges() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        try await withRegistered([Document("P", url: file, journal: journal)]) {
            _ = try await blocking { error in
                NSFileCoordinator().coordinate(readingItemAt: file, options: .withoutChanges, error: error) { _ in journal.append("read") }
            }
            #expect(try await journal.waitAsync { events(of: "P", in: $0).contains("reacquire") })
        }
        #expect(sequence(of: "P", marks: ["read"], in: journal.all) == ["P:relinquishToReader", "read", "P:reacquire"])
    }

    @Test("write: relinquish to the writer, save, the write, didChange, the reacquirer; the directory hears of its subitem")
    func write() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        try await withRegistered([Document("P", url: file, journal: journal), Document("D", url: scratch.url, journal: journal)]) {
            let error = try await blocking { error in
                NSFileCoordinator().coordinate(writingItemAt: file, error: error) { url in
                    journal.append("write")
                    try? writeFixture(Data("new".utf8), toPath: url.path)
                }
            }
            #expect(error == nil)
            #expect(try await journal.waitAsync { events(of: "P", in: $0).contains("reacquire") && events(of: "D", in: $0).contains("reacquire") })
        }
        let all = journal.all
        #expect(sequence(of: "P", marks: ["write"], in: all) == ["P:relinquishToWriter", "P:save", "write", "P:didChange", "P:reacquire"])
        #expect(sequence(of: "D", marks: ["write"], in: all)
                == ["D:relinquishToWriter", "D:save", "write", "D:subitemDidChange:doc.txt", "D:reacquire"])
    }

    @Test("a write that makes a file: the directory hears subitemDidAppear")
    func creation() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.url.appendingPathComponent("new.txt")
        try await withRegistered([Document("D", url: scratch.url, journal: journal)]) {
            _ = try await blocking { error in
                NSFileCoordinator().coordinate(writingItemAt: file, error: error) { url in try? writeFixture(Data("hi".utf8), toPath: url.path) }
            }
            #expect(try await journal.waitAsync { events(of: "D", in: $0).contains("reacquire") })
        }
        #expect(events(of: "D", in: journal.all) == ["relinquishToWriter", "save", "subitemDidAppear:new.txt", "reacquire"])
    }

    @Test("filePresenters lists the registered presenters in the order added; a second add registers nothing more")
    func registration() {
        let scratch = Scratch(), journal = Journal()
        let (first, second) = (Document("A", url: scratch.file("a"), journal: journal), Document("B", url: scratch.file("b"), journal: journal))
        NSFileCoordinator.addFilePresenter(first)
        NSFileCoordinator.addFilePresenter(second)
        NSFileCoordinator.addFilePresenter(first)
        let mine = { NSFileCoordinator.filePresenters.filter { $0 === first || $0 === second } }
        #expect(mine().count == 2 && mine().first === first && mine().last === second)
        NSFileCoordinator.removeFilePresenter(first)
        #expect(mine().count == 1 && mine().first === second)
        NSFileCoordinator.removeFilePresenter(second)
        #expect(mine().isEmpty)
    }

    @Test("delete: the item's presenter accommodates the deletion, the directory's the subitem's, before the accessor")
    func delete() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        try await withRegistered([Document("P", url: file, journal: journal), Document("D", url: scratch.url, journal: journal)]) {
            let error = try await blocking { error in
                NSFileCoordinator().coordinate(writingItemAt: file, options: .forDeleting, error: error) { url in
                    journal.append("delete")
                    try? FileManager.default.removeItem(at: url)
                }
            }
            #expect(error == nil)
            #expect(try await journal.waitAsync { events(of: "P", in: $0).contains("reacquire") && events(of: "D", in: $0).contains("reacquire") })
        }
        let all = journal.all
        #expect(sequence(of: "P", marks: ["delete"], in: all) == ["P:relinquishToWriter", "P:accommodateDeletion", "delete", "P:reacquire"])
        #expect(sequence(of: "D", marks: ["delete"], in: all)
                == ["D:relinquishToWriter", "D:accommodateSubitemDeletion:doc.txt", "delete", "D:reacquire"])
        #expect(!FileManager.default.fileExists(atPath: file.path))
    }

    @Test("move: the item's presenter hears didMove after the accessor, the directory the subitem's move; writers then find it at its new place")
    func move() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        let destination = scratch.url.appendingPathComponent("moved.txt")
        let document = Document("P", url: file, journal: journal)
        try await withRegistered([document, Document("D", url: scratch.url, journal: journal)]) {
            let error = try await blocking { error in
                let coordinator = NSFileCoordinator()
                coordinator.coordinate(writingItemAt: file, options: .forMoving, writingItemAt: destination, options: .forReplacing,
                                       error: error) { from, to in
                    coordinator.item(at: from, willMoveTo: to)
                    try? FileManager.default.moveItem(at: from, to: to)
                    coordinator.item(at: from, didMoveTo: to)
                    journal.append("moved")
                }
            }
            #expect(error == nil)
            #expect(try await journal.waitAsync { events(of: "P", in: $0).contains("reacquire") && events(of: "D", in: $0).contains("reacquire") })
            #expect(sequence(of: "P", marks: ["moved"], in: journal.all)
                    == ["P:relinquishToWriter", "P:save", "moved", "P:didMove:moved.txt", "P:reacquire"])
            #expect(events(of: "D", in: journal.all).contains("subitemDidMove:doc.txt->moved.txt"))
            #expect(document.presentedItemURL?.lastPathComponent == "moved.txt")
            // A writer of the new place reaches the presenter.
            _ = try await blocking { error in NSFileCoordinator().coordinate(writingItemAt: destination, error: error) { _ in } }
            #expect(try await journal.waitAsync { events(of: "P", in: $0).filter { $0 == "reacquire" }.count == 2 })
        }
        #expect(events(of: "P", in: journal.all).suffix(4) == ["relinquishToWriter", "save", "didChange", "reacquire"])
    }

    @Test("a coordinator made with a presenter never messages it; coordinators made for one presenter share a purpose")
    func ownCoordinator() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        let document = Document("P", url: file, journal: journal)
        try await withRegistered([document]) {
            let own = NSFileCoordinator(filePresenter: document)
            #expect(own.purposeIdentifier == NSFileCoordinator(filePresenter: document).purposeIdentifier)
            #expect(own.purposeIdentifier != NSFileCoordinator().purposeIdentifier)
            _ = try await blocking { error in
                own.coordinate(writingItemAt: file, error: error) { _ in journal.append("own write") }
                own.coordinate(readingItemAt: file, error: error) { _ in journal.append("own read") }
                NSFileCoordinator().coordinate(writingItemAt: file, error: error) { _ in journal.append("other write") }
            }
            #expect(try await journal.waitAsync { events(of: "P", in: $0).contains("reacquire") })
        }
        // Messages run in the order sent: any about the own accesses would come first.
        #expect(sequence(of: "P", marks: ["own write", "own read", "other write"], in: journal.all)
                == ["own write", "own read", "P:relinquishToWriter", "P:save", "other write", "P:didChange", "P:reacquire"])
    }

    @Test("every message runs on the presenter's queue and alone, even on a queue that runs operations side by side")
    func onTheQueueOneAtATime() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        let queue = OperationQueue()
        #expect(queue.maxConcurrentOperationCount != 1)
        let readers = 8
        try await withRegistered([Document("P", url: file, journal: journal, queue: queue, busy: 0.005)]) {
            // Readers on threads of their own, so that the queue's pool has threads to spare.
            _ = try await offThePool {
                let done = DispatchGroup()
                for _ in 0 ..< readers {
                    done.enter()
                    Thread.detachNewThread {
                        var error: NSError?
                        NSFileCoordinator().coordinate(readingItemAt: file, error: &error) { _ in }
                        done.leave()
                    }
                }
                done.wait()
            }
            #expect(try await journal.waitAsync { events(of: "P", in: $0).filter { $0 == "reacquire" }.count == readers })
        }
        let mine = events(of: "P", in: journal.all)
        #expect(!mine.contains { $0.hasPrefix("off-queue") || $0.hasPrefix("overlap") }, "\(mine)")
        #expect(mine.filter { $0 == "relinquishToReader" }.count == readers)
        #expect(mine.filter { $0 == "save" }.count == readers)
    }

    @Test("a presenter added while it presents nothing (an untitled document) is messaged once its own coordinator's write names its item, as Apple's are; adding it again then does nothing more")
    func untitledThenSaved() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.url.appendingPathComponent("saved.txt")
        let document = Document("U", url: nil, journal: journal)
        NSFileCoordinator.addFilePresenter(document)
        defer { NSFileCoordinator.removeFilePresenter(document) }
        // Saved for the first time: the document's own coordinator writes, and it takes the name.
        let own = NSFileCoordinator(filePresenter: document)
        #expect(try await blocking { error in
            own.coordinate(writingItemAt: file, error: error) { url in
                try? Data("first".utf8).write(to: url)
                document.present(url)
            }
        } == nil)
        NSFileCoordinator.addFilePresenter(document)
        #expect(NSFileCoordinator.filePresenters.filter { $0 === document }.count == 1)
        journal.append("other write")
        let other = coordinator(presenterTimeout: .seconds(10))
        #expect(try await blocking { error in other.coordinate(writingItemAt: file, error: error) { _ in } } == nil)
        #expect(try await journal.waitAsync(seconds: 20) { events(of: "U", in: $0).contains("reacquire") }, "\(journal.all)")
        #expect(sequence(of: "U", marks: ["other write"], in: journal.all).starts(with: ["other write", "U:relinquishToWriter"]), "\(journal.all)")
    }

    @Test("a message cancelled on the presenter's queue (cancelAllOperations) does not silence the presenter: later messages still come")
    func cancelledMessage() async throws {
        let scratch = Scratch(), journal = Journal()
        let file = scratch.file("doc.txt")
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        try await withRegistered([Document("P", url: file, journal: journal, queue: queue)]) {
            // The first write's relinquish waits on the suspended queue, and is cancelled there;
            // the writer goes on at its presenter timeout.
            queue.isSuspended = true
            let writer = coordinator(presenterTimeout: .milliseconds(300))
            let first = Task { try await blocking { error in writer.coordinate(writingItemAt: file, error: error) { _ in journal.append("first write") } } }
            #expect(try await journal.waitAsync { $0.contains("first write") })
            queue.cancelAllOperations()
            queue.isSuspended = false
            _ = try await first.value
            journal.append("second")
            let second = coordinator(presenterTimeout: .seconds(10))
            _ = try await blocking { error in second.coordinate(writingItemAt: file, error: error) { _ in journal.append("second write") } }
            let heard = try await journal.waitAsync(seconds: 20) { all in
                let after = all.drop { $0 != "second" }
                return after.contains("P:relinquishToWriter") && after.contains("P:reacquire")
            }
            #expect(heard, "the presenter heard nothing after its cancelled message: \(journal.all)")
        }
    }

    @Test("prepare: each presenter is asked once for the batch; the coordinations inside do not ask again, the write inside still tells")
    func prepareWithNestedCoordinations() async throws {
        let scratch = Scratch(), journal = Journal()
        let (a, b, c) = (scratch.file("a.txt"), scratch.file("b.txt"), scratch.file("c.txt"))
        let presenters = [Document("A", url: a, journal: journal), Document("B", url: b, journal: journal), Document("C", url: c, journal: journal)]
        try await withRegistered(presenters) {
            let error = try await blocking { error in
                let coordinator = NSFileCoordinator()
                coordinator.prepare(forReadingItemsAt: [a, b], writingItemsAt: [c], error: error) { done in
                    var inner: NSError?
                    for url in [a, b, a] {
                        coordinator.coordinate(readingItemAt: url, error: &inner) { _ in journal.append("read") }
                    }
                    coordinator.coordinate(writingItemAt: c, error: &inner) { _ in journal.append("write") }
                    journal.append(inner == nil ? "batch done" : "batch failed: \(inner!)")
                    done()
                }
            }
            #expect(error == nil)
            #expect(try await journal.waitAsync { all in ["A", "B", "C"].allSatisfy { events(of: $0, in: all).contains("reacquire") } })
        }
        let all = journal.all
        #expect(all.filter { $0 == "read" }.count == 3 && all.contains("batch done"))
        #expect(sequence(of: "A", marks: ["batch done"], in: all) == ["A:relinquishToReader", "A:save", "batch done", "A:reacquire"])
        #expect(sequence(of: "B", marks: ["batch done"], in: all) == ["B:relinquishToReader", "B:save", "batch done", "B:reacquire"])
        #expect(sequence(of: "C", marks: ["write"], in: all) == ["C:relinquishToWriter", "C:save", "write", "C:didChange", "C:reacquire"])
    }
}
