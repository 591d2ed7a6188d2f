import Foundation
import NSFileCoordination

/// A presenter written as for Apple's Foundation: an `NSObject` with its own operation
/// queue, answering through the blocks it is given. It logs each message as
/// `NAME:message`, and `NAME:off-queue:message` or `NAME:overlap:message` when a message
/// runs elsewhere than on its queue or while another of its messages runs.
final class Document: NSObject, NSFilePresenter, @unchecked Sendable {
    // Unchecked: `url` and `active` are read and written under `lock` only; the rest
    // never changes.
    let name: String
    let journal: Journal
    let presentedItemOperationQueue: OperationQueue
    private let lock = NSLock()
    private var url: URL?
    private var active = 0
    /// How long each message takes (0: returns at once).
    private let busy: TimeInterval
    /// What the presenter answers to `savePresentedItemChanges`.
    private let saveError: NSError?

    /// `queue`: its operation queue (one that runs several operations at once unless given).
    init(_ name: String, url: URL?, journal: Journal, queue: OperationQueue = OperationQueue(),
         busy: TimeInterval = 0, saveError: NSError? = nil) {
        self.name = name
        self.journal = journal
        self.url = url
        self.busy = busy
        self.saveError = saveError
        presentedItemOperationQueue = queue
    }

    var presentedItemURL: URL? { lock.withLock { url } }

    /// Points it at another item (or none), as a document saved under a new name does.
    func present(_ newURL: URL?) { lock.withLock { url = newURL } }

    /// Logs a message, checking that it runs on the queue and alone.
    private func record(_ message: String) {
        let overlapping = lock.withLock {
            active += 1
            return active > 1
        }
        if OperationQueue.current !== presentedItemOperationQueue { journal.append("\(name):off-queue:\(message)") }
        if overlapping { journal.append("\(name):overlap:\(message)") }
        journal.append("\(name):\(message)")
        if busy > 0 { Thread.sleep(forTimeInterval: busy) } // ok: a presenter slow on purpose, so overlapping messages would show
        lock.withLock { active -= 1 }
    }

    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        record("relinquishToReader")
        reader { self.record("reacquire") }
    }

    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        record("relinquishToWriter")
        writer { self.record("reacquire") }
    }

    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        record("save")
        completionHandler(saveError)
    }

    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        record("accommodateDeletion")
        completionHandler(nil)
    }

    func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        record("accommodateSubitemDeletion:\(url.lastPathComponent)")
        completionHandler(nil)
    }

    func presentedItemDidMove(to newURL: URL) {
        lock.withLock { url = newURL }
        record("didMove:\(newURL.lastPathComponent)")
    }

    func presentedItemDidChange() { record("didChange") }
    func presentedSubitemDidAppear(at url: URL) { record("subitemDidAppear:\(url.lastPathComponent)") }
    func presentedSubitemDidChange(at url: URL) { record("subitemDidChange:\(url.lastPathComponent)") }
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) {
        record("subitemDidMove:\(oldURL.lastPathComponent)->\(newURL.lastPathComponent)")
    }
}

/// The events of presenter `name` in `events`, without its prefix.
func events(of name: String, in events: [String]) -> [String] {
    events.filter { $0.hasPrefix("\(name):") }.map { String($0.dropFirst(name.count + 1)) }
}
