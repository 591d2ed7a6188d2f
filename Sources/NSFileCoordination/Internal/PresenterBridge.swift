#if !canImport(Darwin)
import Foundation
internal import FileCoordination

/// One ``NSFilePresenter`` as the engine's `FilePresenter`: each engine callback becomes
/// the Apple message, posted on the presenter's queue (``PresenterMessages``), and
/// returns when the presenter answers (calls the block or completion handler it was
/// given). Notifications and reacquirers are posted and not waited for, as Apple's
/// coordinators send them: a presenter may coordinate a read of its own item right there,
/// which would otherwise wait for the write that is telling it.
///
/// There is one bridge per presenter object (``PresenterBridges``), so the engine knows a
/// presenter by one identity: registered, and as the presenter of the coordinators made
/// with `NSFileCoordinator(filePresenter:)`, which then never message it.
final class PresenterBridge: FilePresenter, CustomStringConvertible, @unchecked Sendable {
    // Unchecked: `presenter` is set once, in init (a weak reference is read atomically),
    // and the presenter is messaged on its own queue only, as its contract says.
    /// Weak: a presenter that keeps its coordinator would otherwise keep itself. A
    /// registered presenter is kept by ``PresenterBridges`` until it is removed.
    private(set) weak var presenter: (any NSFilePresenter)?
    private let messages = PresenterMessages()
    let description: String

    init(_ presenter: any NSFilePresenter) {
        self.presenter = presenter
        description = "the NSFilePresenter \(type(of: presenter))"
    }

    var presentedItemURL: URL? { presenter?.presentedItemURL }

    /// Posts `message` on the presenter's queue (nothing if the presenter is gone).
    private func post(_ message: @escaping @Sendable (any NSFilePresenter) -> Void) {
        guard let presenter else { return }
        let carried = UncheckedPresenter(presenter)
        messages.post(on: presenter.presentedItemOperationQueue) { message(carried.value) }
    }

    /// Posts `message` and waits until it calls its answer.
    private func ask<Answer: Sendable>(
        absent: Answer, _ message: @escaping @Sendable (any NSFilePresenter, @escaping @Sendable (Answer) -> Void) -> Void
    ) async -> Answer {
        guard presenter != nil else { return absent }
        // Not a checked continuation: a presenter that never answers leaves this task
        // suspended (the coordinator has moved on after its timeout), which is no misuse.
        return await withUnsafeContinuation { continuation in
            let answered = Answered()
            post { presenter in
                message(presenter) { answer in
                    if answered.first() { continuation.resume(returning: answer) }
                }
            }
        }
    }

    private func relinquish(
        _ message: @escaping @Sendable (any NSFilePresenter, @escaping @Sendable ((@Sendable () -> Void)?) -> Void) -> Void
    ) async -> FileReacquirer? {
        let reacquirer: (@Sendable () -> Void)? = await ask(absent: nil) { presenter, answer in message(presenter, answer) }
        guard let reacquirer else { return nil }
        // On the presenter's queue, after the messages sent before it; not waited for.
        return { [self] in post { _ in reacquirer() } }
    }

    /// Throws the error the presenter answered with.
    private func complete(
        _ message: @escaping @Sendable (any NSFilePresenter, @escaping @Sendable ((any Error)?) -> Void) -> Void
    ) async throws {
        let failure: (any Error)? = await ask(absent: nil) { presenter, answer in message(presenter, answer) }
        if let failure { throw failure }
    }

    func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? {
        await relinquish { presenter, answer in presenter.relinquishPresentedItem(toReader: answer) }
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        await relinquish { presenter, answer in presenter.relinquishPresentedItem(toWriter: answer) }
    }

    func savePresentedItemChanges() async throws {
        try await complete { presenter, answer in presenter.savePresentedItemChanges(completionHandler: answer) }
    }

    func accommodatePresentedItemDeletion() async throws {
        try await complete { presenter, answer in presenter.accommodatePresentedItemDeletion(completionHandler: answer) }
    }

    func accommodatePresentedSubitemDeletion(at url: URL) async throws {
        try await complete { presenter, answer in presenter.accommodatePresentedSubitemDeletion(at: url, completionHandler: answer) }
    }

    func presentedItemDidMove(to newURL: URL) async {
        post { $0.presentedItemDidMove(to: newURL) }
    }

    func presentedItemDidChange() async {
        post { $0.presentedItemDidChange() }
    }

    func presentedSubitemDidAppear(at url: URL) async {
        post { $0.presentedSubitemDidAppear(at: url) }
    }

    func presentedSubitemDidChange(at url: URL) async {
        post { $0.presentedSubitemDidChange(at: url) }
    }

    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) async {
        post { $0.presentedSubitem(at: oldURL, didMoveTo: newURL) }
    }
}

/// Whether an answer is the first: a presenter that calls its block twice is heard once.
private final class Answered: @unchecked Sendable {
    // Unchecked: `done` is read and written under `lock` only.
    private let lock = NSLock()
    private var done = false

    func first() -> Bool {
        lock.withLock {
            defer { done = true }
            return !done
        }
    }
}
#endif
