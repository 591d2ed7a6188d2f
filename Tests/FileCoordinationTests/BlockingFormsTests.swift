import Foundation
import Testing
import TestSupport
@testable import FileCoordination

/// The forms for code that cannot await: a move reported from a blocking or queue-based
/// accessor, a batch prepared from a thread, a presenter's coordinator with its own purpose.
@Suite("Blocking and queue-based forms")
struct BlockingFormsTests {
    @Test("a move reported from a blocking accessor reaches the presenters after the accessor returns; the registry follows it")
    func moveFromBlockingAccessor() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("old.txt")
        let destination = box.url.appendingPathComponent("new.txt")
        let presenter = Recorder("P", url: file, log: log)
        try await withPresenters([presenter, Recorder("D", url: box.url, log: log)]) {
            let coordinator = FileCoordinator()
            try await offThePool {
                try coordinator.coordinateBlocking(writingItemAt: file, options: .forMoving,
                                                   writingItemAt: destination, options: .forReplacing) { from, to in
                    try FileManager.default.moveItem(at: from, to: to)
                    coordinator.itemBlocking(at: from, didMoveTo: to)
                    log.append("reported")
                }
            }
            let events = log.all
            #expect(events.filter { $0.hasPrefix("P:") || $0 == "reported" }.suffix(3)
                    == ["reported", "P:didMove:\(destination.path)", "P:reacquire"])
            #expect(events.contains("D:subitemDidMove:old.txt->new.txt"))
            log.clear()
            try await FileCoordinator().coordinate(writingItemAt: destination) { _ in }
            #expect(log.all.contains("P:relinquishToWriter"), "the presenter is found at its new place")
        }
    }

    @Test("a move reported from a queue-based accessor reaches the presenter after the accessor returns")
    func moveFromQueueAccessor() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("old.txt")
        let destination = box.url.appendingPathComponent("new.txt")
        try await withPresenters([Recorder("P", url: file, log: log)]) {
            let coordinator = FileCoordinator()
            let (from, to) = (FileAccessIntent.writingIntent(with: file, options: .forMoving),
                              FileAccessIntent.writingIntent(with: destination, options: .forReplacing))
            let queue = OperationQueue()
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                coordinator.coordinate(with: [from, to], queue: queue) { error in
                    #expect(error == nil)
                    try? FileManager.default.moveItem(at: from.url, to: to.url)
                    coordinator.itemBlocking(at: from.url, didMoveTo: to.url)
                    log.append("reported")
                    done.resume()
                }
            }
            // The accessor has returned; its coordination ends on its own task.
            for _ in 0 ..< 500 where !log.all.contains("P:reacquire") {
                try await Task.sleep(for: .milliseconds(10)) // ok: the coordination ends after the accessor, with no event to await
            }
            #expect(log.all.filter { $0.hasPrefix("P:") || $0 == "reported" }.suffix(3)
                    == ["reported", "P:didMove:\(destination.path)", "P:reacquire"])
        }
    }

    @Test("prepareBlocking asks each presenter once; the blocking coordinations inside the batch do not ask again")
    func prepareFromThread() async throws {
        let box = Sandbox(), log = EventLog()
        let (a, b) = (box.file("a.txt"), box.file("b.txt"))
        try await withPresenters([Recorder("A", url: a, log: log), Recorder("B", url: b, log: log)]) {
            let coordinator = FileCoordinator()
            try await offThePool {
                try coordinator.prepareBlocking(forReadingItemsAt: [a, b], writingItemsAt: []) { _ in
                    for url in [a, b, a] {
                        try coordinator.coordinateBlocking(readingItemAt: url) { _ in log.append("read \(url.lastPathComponent)") }
                    }
                }
            }
        }
        let events = log.all
        #expect(events.filter { $0 == "A:relinquishToReader" }.count == 1)
        #expect(events.filter { $0 == "B:relinquishToReader" }.count == 1)
        #expect(events.filter { $0.hasPrefix("read") } == ["read a.txt", "read b.txt", "read a.txt"])
        #expect(events.suffix(2).sorted() == ["A:reacquire", "B:reacquire"], "the reacquirers run once the batch is done")
    }

    @Test("a presenter's coordinator with its own purpose keeps that purpose and never messages its presenter")
    func presenterWithPurpose() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("mine.txt")
        let presenter = Recorder("P", url: file, log: log)
        try await withPresenters([presenter]) {
            let coordinator = FileCoordinator(filePresenter: presenter, purposeIdentifier: "sync-engine")
            #expect(coordinator.purposeIdentifier == "sync-engine")
            try await coordinator.coordinate(writingItemAt: file) { _ in log.append("write") }
        }
        #expect(log.all == ["write"])
    }

    @Test("forUploading in the blocking form: the accessor gets a snapshot, removed afterwards; a missing item fails, the accessor never runs")
    func uploadingFromBlockingAccessor() async throws {
        let box = Sandbox()
        let file = box.file("doc.txt", "draft")
        let coordinator = FileCoordinator()
        let (given, content) = try await offThePool {
            var seen: (URL, String)?
            try coordinator.coordinateBlocking(readingItemAt: file, options: .forUploading) { url in
                seen = (url, (try? String(contentsOf: url, encoding: .utf8)) ?? "")
            }
            return seen!
        }
        #expect(given.path != file.path && content == "draft")
        let missing = box.url.appendingPathComponent("missing.txt")
        let error = await #expect(throws: FileCoordinationError.self) {
            try await offThePool { try coordinator.coordinateBlocking(readingItemAt: missing, options: .forUploading) { _ in Issue.record("ran") } }
        }
        #expect(error?.code == .notFound)
    }

    @Test("forUploading in the queue-based form: the intent's url is the snapshot while the accessor runs")
    func uploadingFromQueueAccessor() async throws {
        let box = Sandbox()
        let file = box.file("doc.txt", "draft")
        let intent = FileAccessIntent.readingIntent(with: file, options: .forUploading)
        let seen = try await withCheckedThrowingContinuation { (done: CheckedContinuation<(URL, String), any Error>) in
            FileCoordinator().coordinate(with: [intent], queue: OperationQueue()) { error in
                if let error { return done.resume(throwing: error) }
                done.resume(returning: (intent.url, (try? String(contentsOf: intent.url, encoding: .utf8)) ?? ""))
            }
        }
        #expect(seen.0.path != file.path && seen.1 == "draft")
    }
}
