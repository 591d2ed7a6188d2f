#if !canImport(Darwin)
import Foundation

/// An object that presents a file or directory and wants to hear about other code's
/// access to it (Apple's `NSFilePresenter`, with Apple's signatures).
///
/// Register it with ``NSFileCoordinator/addFilePresenter(_:)``. Coordinators in this
/// process and, through the coordination space, in other processes then message it in
/// Apple's order: before a read, ``relinquishPresentedItem(toReader:)`` and
/// ``savePresentedItemChanges(completionHandler:)``; before a write,
/// ``relinquishPresentedItem(toWriter:)`` and the save (or, for a deletion,
/// ``accommodatePresentedItemDeletion(completionHandler:)``); after a write,
/// ``presentedItemDidChange()`` or ``presentedItemDidMove(to:)``; last, the reacquirer
/// the presenter handed back.
///
/// Every message runs on ``presentedItemOperationQueue``, one at a time and in the order
/// sent, even on a queue that runs several operations at once. A relinquish lasts until
/// the presenter calls the block it was given; a save or an accommodation, until it calls
/// its completion handler. A presenter that never answers holds a coordinator up to the
/// presenter timeout (``NSFileCoordinator/presenterTimeout``), not forever.
///
/// Apple's optional requirements have defaults here that do what Apple does for a
/// presenter that does not implement them: relinquish at once with no reacquirer, report
/// success, ignore the notification. The completion-handler methods' defaults call the
/// `async` forms, so a presenter may implement either, as on Apple's systems.
///
/// Never called: the version callbacks (Linux keeps no file versions), the ubiquity
/// callbacks (there is no iCloud), and ``accommodatePresentedItemEviction(completionHandler:)``
/// (nothing evicts a local file). ``primaryPresentedItemURL`` is never read: there is no
/// sandbox to extend.
public protocol NSFilePresenter: NSObjectProtocol {
    /// The presented item. Read when the presenter is registered; coordinated moves keep
    /// the registration up to date (update the property in ``presentedItemDidMove(to:)``).
    var presentedItemURL: URL? { get }

    /// The queue every message to this presenter runs on.
    var presentedItemOperationQueue: OperationQueue { get }

    /// A related item that gives access to this one. Never read here.
    var primaryPresentedItemURL: URL? { get }

    /// Another coordinator is about to read the item: stop writing it, then call `reader`
    /// with a block to run once the read is done (or nil). The reader waits until then.
    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void)

    /// Another coordinator is about to write the item: stop using it, then call `writer`
    /// with a block to run once the write is done (or nil). The writer waits until then.
    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void)

    /// Save unsaved changes now, then call `completionHandler` (with the error, if saving failed).
    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void)

    /// The item is about to be deleted: let go of it, then call `completionHandler`.
    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void)

    /// The item is about to be evicted from local storage. Never called.
    func accommodatePresentedItemEviction(completionHandler: @escaping @Sendable ((any Error)?) -> Void)

    /// The item moved (a coordinated move, or a rename by any program).
    func presentedItemDidMove(to newURL: URL)

    /// The item's contents or attributes changed.
    func presentedItemDidChange()

    /// The item's ubiquity attributes changed. Never called.
    func presentedItemDidChangeUbiquityAttributes(_ attributes: Set<URLResourceKey>)

    /// The ubiquity attributes this presenter wants to hear about. Never read.
    var observedPresentedItemUbiquityAttributes: Set<URLResourceKey> { get }

    /// A version of the item was added. Never called.
    func presentedItemDidGain(_ version: NSFileVersion)

    /// A version of the item was removed. Never called.
    func presentedItemDidLose(_ version: NSFileVersion)

    /// A version conflict of the item was resolved. Never called.
    func presentedItemDidResolveConflict(_ version: NSFileVersion)

    /// Directory presenters: an item inside is about to be deleted; call
    /// `completionHandler` once ready.
    func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void)

    /// Directory presenters: an item appeared inside.
    func presentedSubitemDidAppear(at url: URL)

    /// Directory presenters: an item inside moved.
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL)

    /// Directory presenters: an item inside changed.
    func presentedSubitemDidChange(at url: URL)

    /// Directory presenters: a version of an item inside was added. Never called.
    func presentedSubitem(at url: URL, didGain version: NSFileVersion)

    /// Directory presenters: a version of an item inside was removed. Never called.
    func presentedSubitem(at url: URL, didLose version: NSFileVersion)

    /// Directory presenters: a version conflict of an item inside was resolved. Never called.
    func presentedSubitem(at url: URL, didResolveConflict version: NSFileVersion)

    /// ``savePresentedItemChanges(completionHandler:)`` as `async` (Apple's import of it).
    func savePresentedItemChanges() async throws

    /// ``accommodatePresentedItemDeletion(completionHandler:)`` as `async`.
    func accommodatePresentedItemDeletion() async throws

    /// ``accommodatePresentedItemEviction(completionHandler:)`` as `async`. Never called.
    func accommodatePresentedItemEviction() async throws

    /// ``accommodatePresentedSubitemDeletion(at:completionHandler:)`` as `async`.
    func accommodatePresentedSubitemDeletion(at url: URL) async throws
}

extension NSFilePresenter {
    /// Default: none.
    public var primaryPresentedItemURL: URL? { nil }
    /// Default: relinquish at once, with no reacquirer.
    public func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) { reader(nil) }
    /// Default: relinquish at once, with no reacquirer.
    public func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) { writer(nil) }
    /// Default: the `async` form's answer (which by default is success).
    public func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        answer(completionHandler) { try await $0.savePresentedItemChanges() }
    }
    /// Default: the `async` form's answer (which by default is success).
    public func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        answer(completionHandler) { try await $0.accommodatePresentedItemDeletion() }
    }
    /// Default: the `async` form's answer (which by default is success).
    public func accommodatePresentedItemEviction(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        answer(completionHandler) { try await $0.accommodatePresentedItemEviction() }
    }
    /// Default: the `async` form's answer (which by default is success).
    public func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        answer(completionHandler) { try await $0.accommodatePresentedSubitemDeletion(at: url) }
    }
    /// Default: nothing unsaved.
    public func savePresentedItemChanges() async throws {}
    /// Default: nothing to let go of.
    public func accommodatePresentedItemDeletion() async throws {}
    /// Default: nothing to let go of.
    public func accommodatePresentedItemEviction() async throws {}
    /// Default: nothing to let go of.
    public func accommodatePresentedSubitemDeletion(at url: URL) async throws {}
    /// Default: nothing to do.
    public func presentedItemDidMove(to newURL: URL) {}
    /// Default: nothing to do.
    public func presentedItemDidChange() {}
    /// Default: nothing to do.
    public func presentedItemDidChangeUbiquityAttributes(_ attributes: Set<URLResourceKey>) {}
    /// Default: none.
    public var observedPresentedItemUbiquityAttributes: Set<URLResourceKey> { [] }
    /// Default: nothing to do.
    public func presentedItemDidGain(_ version: NSFileVersion) {}
    /// Default: nothing to do.
    public func presentedItemDidLose(_ version: NSFileVersion) {}
    /// Default: nothing to do.
    public func presentedItemDidResolveConflict(_ version: NSFileVersion) {}
    /// Default: nothing to do.
    public func presentedSubitemDidAppear(at url: URL) {}
    /// Default: nothing to do.
    public func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) {}
    /// Default: nothing to do.
    public func presentedSubitemDidChange(at url: URL) {}
    /// Default: nothing to do.
    public func presentedSubitem(at url: URL, didGain version: NSFileVersion) {}
    /// Default: nothing to do.
    public func presentedSubitem(at url: URL, didLose version: NSFileVersion) {}
    /// Default: nothing to do.
    public func presentedSubitem(at url: URL, didResolveConflict version: NSFileVersion) {}

    /// Runs an `async` form in a task and hands its outcome to the completion handler,
    /// as Apple's thunk does for a presenter that implements the `async` form.
    private func answer(_ completionHandler: @escaping @Sendable ((any Error)?) -> Void,
                        _ body: @escaping @Sendable (any NSFilePresenter) async throws -> Void) {
        // The presenter itself need not be Sendable: its `async` form runs as Apple runs
        // it, on the global executor, while the presenter waits for the answer.
        let presenter = UncheckedPresenter<any NSFilePresenter>(self)
        Task {
            do {
                try await body(presenter.value)
                completionHandler(nil)
            } catch {
                completionHandler(error)
            }
        }
    }
}

/// A presenter carried to the task or queue that messages it; its own contract (every
/// message on its queue, one at a time) is what makes that safe.
struct UncheckedPresenter<Presenter>: @unchecked Sendable {
    let value: Presenter
    init(_ value: Presenter) { self.value = value }
}
#endif
