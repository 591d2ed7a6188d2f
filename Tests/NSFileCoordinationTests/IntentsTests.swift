import Foundation
import NSFileCoordination
import Testing
import TestSupport

/// The sample of Apple's article "Improving performance and stability when accessing the
/// file system" (many files requested in parallel: one coordinator and one reading intent
/// per file, the accessors on a background queue), its statements as the article gives
/// them; its two placeholder comments are filled in (record the error, read the file).
func processInParallel(_ fileURLs: [URL], errors: Journal, contents: Journal) {
    let queue = OperationQueue()
    queue.underlyingQueue = .global(qos: .utility)

    for url in fileURLs {
        let intent = NSFileAccessIntent.readingIntent(with: url)
        let coordinator = NSFileCoordinator()
        coordinator.coordinate(with: [intent],
                               queue: queue) { error in
            if let error {
                errors.append("\(error)")
            } else {
                let text = (try? String(contentsOf: intent.url, encoding: .utf8)) ?? "unreadable"
                contents.append(text)
            }
        }
    }
}

@Suite("NSFileAccessIntent and coordinate(with:queue:byAccessor:)")
struct IntentsTests {
    @Test("the article's sample over 300 files: every accessor runs on the queue with its file")
    func articleSample() async throws {
        let scratch = Scratch()
        let count = 300
        let urls = (0 ..< count).map { scratch.file("f\($0).txt", "file \($0)") }
        let (errors, contents) = (Journal(), Journal())
        processInParallel(urls, errors: errors, contents: contents)
        #expect(try await contents.waitAsync { $0.count == count })
        #expect(errors.all.isEmpty)
        #expect(Set(contents.all) == Set((0 ..< count).map { "file \($0)" }))
    }

    @Test("several intents at once: granted together, the accessor on the given queue, each url where its item is now")
    func severalIntents() async throws {
        let scratch = Scratch(), journal = Journal()
        let (a, b, c) = (scratch.file("a.txt"), scratch.file("b.txt"), scratch.file("c.txt"))
        let destination = scratch.url.appendingPathComponent("b-moved.txt")
        let queue = OperationQueue()
        // Another coordination holds b and moves it once the intents wait for it.
        let mover = NSFileCoordinator()
        let moving = Task {
            try await blocking { error in
                mover.coordinate(writingItemAt: b, options: .forMoving, writingItemAt: destination, options: .forReplacing,
                                 error: error) { from, to in
                    journal.append("holding b")
                    _ = journal.wait { $0.contains("intents wait") }
                    try? FileManager.default.moveItem(at: from, to: to)
                    mover.item(at: from, didMoveTo: to)
                }
            }
        }
        #expect(try await journal.waitAsync { $0.contains("holding b") })
        let intents = [NSFileAccessIntent.readingIntent(with: c), .writingIntent(with: a),
                       .writingIntent(with: b, options: .forMerging)]
        NSFileCoordinator().coordinate(with: intents, queue: queue) { error in
            journal.append(error == nil ? "accessor" : "failed: \(error!)")
            journal.append(OperationQueue.current === queue ? "on queue" : "off queue")
            journal.append("urls " + intents.map(\.url.lastPathComponent).joined(separator: " "))
        }
        // Their write of a waits with them: a later reader of a waits behind it.
        #expect(try await waitsBehindAWriter(a), "the intents never waited")
        journal.append("intents wait")
        #expect(try await moving.value == nil)
        #expect(try await journal.waitAsync { $0.contains { $0.hasPrefix("urls ") } })
        #expect(journal.all.suffix(3) == ["accessor", "on queue", "urls c.txt a.txt b-moved.txt"])
    }

    @Test("options carry Apple's raw values")
    func rawValues() {
        #expect(NSFileCoordinator.ReadingOptions.withoutChanges.rawValue == 1)
        #expect(NSFileCoordinator.ReadingOptions.resolvesSymbolicLink.rawValue == 2)
        #expect(NSFileCoordinator.ReadingOptions.immediatelyAvailableMetadataOnly.rawValue == 4)
        #expect(NSFileCoordinator.ReadingOptions.forUploading.rawValue == 8)
        #expect(NSFileCoordinator.WritingOptions.forDeleting.rawValue == 1)
        #expect(NSFileCoordinator.WritingOptions.forMoving.rawValue == 2)
        #expect(NSFileCoordinator.WritingOptions.forMerging.rawValue == 4)
        #expect(NSFileCoordinator.WritingOptions.forReplacing.rawValue == 8)
        #expect(NSFileCoordinator.WritingOptions.contentIndependentMetadataOnly.rawValue == 16)
    }
}
