import Foundation

/// Something that presents a file or directory to a user (a document window, a cache, a
/// build graph) and wants to hear about other code's access to it, before and after.
///
/// Register a presenter with ``FileCoordinator/addFilePresenter(_:)-6x6ht``. Whenever another
/// coordinator, in this process or (with a coordination space) in another, coordinates
/// access to the presented item, to something inside a presented directory, or (for a
/// directory presenter) to the directory itself, the presenter is messaged in Apple's
/// order:
///
/// - reads: ``relinquishPresentedItem(toReader:)``, then ``savePresentedItemChanges()``
///   (unless the reader passed `withoutChanges`), then the read, then the reacquirer
///   returned by `relinquish`;
/// - writes: ``relinquishPresentedItem(toWriter:)``, then
///   ``accommodatePresentedItemDeletion()`` (deleting) or ``savePresentedItemChanges()``,
///   then the write, then the `did…` messages, then the reacquirer.
///
/// A presenter is never messaged about its own coordinator's operations. A callback that
/// throws makes the coordination fail with that error. A callback that does not return
/// is handled by the coordinator's ``PresenterTimeoutPolicy``.
///
/// Requests from coordinators in other processes are served one at a time, on the
/// library's threads unless the presenter is isolated to an actor. A request that finds
/// this process idle starts on the thread that watches the coordination space, which
/// saves a thread wake-up on the way to the other process's accessor, and goes on from an
/// I/O thread after the callback's first suspension. So, as all `async` code should, a
/// callback must await rather than block its thread: one that blocks there holds up this
/// process's other notifications and its own coordinations with other processes until
/// it returns (the presenter timeout protects only the other process). A presenter whose
/// callbacks do block says so with ``presentedItemCallbacksMayBlock``.
///
/// Programs that never coordinate (an editor saving by rename, `>>` in a shell, `rm -rf`)
/// are heard too: a registered presenter's item is watched with inotify, and what changes
/// arrives after the fact as `presentedItemDidChange()`, `presentedItemDidMove(to:)`,
/// `accommodatePresentedItemDeletion()` and the subitem family. A coordinated write the
/// presenter was already told about is not reported a second time.
///
/// Every callback has a default implementation that does nothing, so a presenter
/// implements only what it needs. Presenters are classes or actors; the item's URL is
/// read once, at registration, and kept up to date by the coordinators that move it.
///
/// ```swift
/// final actor DocumentWindow: FilePresenter {
///     nonisolated let presentedItemURL: URL?
///     init(url: URL) { presentedItemURL = url }
///
///     func savePresentedItemChanges() async throws { try await saveDraft() }
///     func presentedItemDidChange() async { await reload() }
/// }
/// ```
public protocol FilePresenter: AnyObject, Sendable {
    /// The file or directory presented. Read when the presenter is registered.
    var presentedItemURL: URL? { get }

    /// Another coordinator is about to read the item: stop writing it. Return a
    /// reacquirer to run once the read is done, or nil.
    func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer?

    /// Another coordinator is about to write the item: stop using it. Return a
    /// reacquirer to run once the write (and its `did…` messages) are done, or nil.
    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer?

    /// Write unsaved changes now, so that the coming access sees them.
    func savePresentedItemChanges() async throws

    /// The item is about to be deleted: close it, forget it.
    func accommodatePresentedItemDeletion() async throws

    /// The item moved (a coordinated move, or a rename by any program).
    func presentedItemDidMove(to newURL: URL) async

    /// The item's contents or attributes changed.
    func presentedItemDidChange() async

    /// Directory presenters: an item appeared inside the directory.
    func presentedSubitemDidAppear(at url: URL) async

    /// Directory presenters: an item inside the directory changed.
    func presentedSubitemDidChange(at url: URL) async

    /// Directory presenters: an item inside the directory moved.
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) async

    /// Directory presenters: an item inside the directory is about to be deleted (or,
    /// for a deletion by a program that does not coordinate, has been deleted).
    func accommodatePresentedSubitemDeletion(at url: URL) async throws

    /// Changes were lost (the inotify queue overflowed): re-read the item. Not in
    /// Apple's protocol; the default calls ``presentedItemDidChange()``.
    func presentedItemDidLoseEvents() async

    /// Part of a presented directory is not watched: the user's inotify watch limit
    /// (`fs.inotify.max_user_watches`) was reached. `directories` are the ones newly left
    /// out, each with everything inside it; changes made there by programs that do not
    /// coordinate are not heard (coordinated access still is). Called when the watch
    /// starts and again whenever more directories are left out (created after the limit
    /// was reached). Not in Apple's protocol; the default does nothing (the library logs
    /// one warning either way).
    func presentedItemIsPartlyUnwatched(_ directories: [URL]) async

    /// Coalescing of changes made outside coordination: with an interval, a burst (a
    /// program writing the file a thousand times) reaches the presenter as one callback
    /// per item and kind. Not in Apple's protocol; the default, nil, delivers every change.
    var presentedItemSettleInterval: Duration? { get }

    /// Whether changes made outside coordination are watched in the whole subtree of a
    /// presented directory (the default, true) or in its own entries only (false: one
    /// inotify watch, however large the tree; changes deeper inside are heard only from
    /// coordinated writers). Not in Apple's protocol. Read when the watch starts.
    var presentedItemWatchesSubtree: Bool { get }

    /// Whether some of this presenter's callbacks (or its reacquirers) block their thread
    /// (synchronous file I/O, a wait on a semaphore). Requests from other processes then
    /// start on an I/O thread instead of the thread that watches the coordination space,
    /// so a blocked callback holds up only the other requests to this process's presenters
    /// (they are served one at a time), not its file notifications or its own
    /// coordinations with other processes; each request costs one thread wake-up more.
    /// Not in Apple's protocol; the default is false: callbacks are `async` and, like all
    /// async code, should await rather than block. Read at each request; an actor
    /// implements it `nonisolated`, and a subclass overrides it only if its superclass
    /// implements it.
    var presentedItemCallbacksMayBlock: Bool { get }
}

/// Runs after the access a presenter relinquished its item for.
public typealias FileReacquirer = @Sendable () async -> Void

extension FilePresenter {
    /// Default: nothing to relinquish; no reacquirer.
    public func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? { nil }
    /// Default: nothing to relinquish; no reacquirer.
    public func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? { nil }
    /// Default: nothing unsaved.
    public func savePresentedItemChanges() async throws {}
    /// Default: nothing to do.
    public func accommodatePresentedItemDeletion() async throws {}
    /// Default: nothing to do (the registry already follows the item).
    public func presentedItemDidMove(to newURL: URL) async {}
    /// Default: nothing to do.
    public func presentedItemDidChange() async {}
    /// Default: nothing to do.
    public func presentedSubitemDidAppear(at url: URL) async {}
    /// Default: nothing to do.
    public func presentedSubitemDidChange(at url: URL) async {}
    /// Default: nothing to do.
    public func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) async {}
    /// Default: nothing to do.
    public func accommodatePresentedSubitemDeletion(at url: URL) async throws {}
    /// Default: no coalescing.
    public var presentedItemSettleInterval: Duration? { nil }
    /// Default: the whole subtree.
    public var presentedItemWatchesSubtree: Bool { true }
    /// Default: the callbacks do not block.
    public var presentedItemCallbacksMayBlock: Bool { false }
    /// Default: nothing to do (the library's warning says it).
    public func presentedItemIsPartlyUnwatched(_ directories: [URL]) async {}
    /// Default: treated as a change (`presentedItemDidChange()`).
    public func presentedItemDidLoseEvents() async { await presentedItemDidChange() }
}
