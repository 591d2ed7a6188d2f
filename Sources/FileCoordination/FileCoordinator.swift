import AsyncFileIO
import Foundation
import Synchronization
import SystemCalls
import SystemPackage

/// Coordinates reading and writing of files and directories with every other coordinator
/// and presenter: Apple's `NSFileCoordinator`, async-native, for Linux.
///
/// Readers share; a writer excludes readers and writers of the same item; deleting,
/// moving or replacing a directory covers everything inside it. Before an access runs,
/// the presenters of the item (and of the directories containing it) are asked to
/// relinquish it and to save; after a write they hear what changed.
///
/// ```swift
/// let coordinator = FileCoordinator()
/// let text = try await coordinator.coordinate(readingItemAt: url) { url in
///     try await Data(asyncContentsOf: url)
/// }
/// try await coordinator.coordinate(writingItemAt: url) { url in
///     try await newText.asyncWrite(to: url)
/// }
/// ```
///
/// The accessor runs in the caller's isolation and gets the URL to use, which differs
/// from the one asked for if the item was moved while the coordination waited. Claims are
/// released when the accessor returns or throws; a coordination still waiting when its
/// task is cancelled (or ``cancel()`` is called) ends with an error and its accessor never
/// runs.
///
/// Coordinators are cheap; make one per operation or keep one per presenter.
///
/// A `Sendable` class rather than an actor: an actor would run every accessor on the
/// coordinator's own executor, serializing unrelated work and forcing callers on the
/// main actor to write `@Sendable` accessors. Here the accessor runs where the caller is,
/// and the coordinator's state lives behind locks.
public final class FileCoordinator: Sendable {
    /// The presenter this coordinator acts for: it is never messaged about this
    /// coordinator's own accesses.
    public let filePresenter: (any FilePresenter)?

    /// Coordinators with the same purpose never block each other. Unique by default; a
    /// presenter's coordinators share one derived from the presenter.
    public let purposeIdentifier: String

    private let policy: Locked<PresenterTimeoutPolicy>
    private let claimDeadline = Locked<Duration?>(nil)
    let center: CoordinationCenter
    /// Bumped by ``cancel()``: a coordination that saw another value when it started is
    /// cancelled even if it was already messaging presenters.
    let cancellations = Atomic<Int>(0)
    /// The signals of this coordinator's coordinations asking their presenters now:
    /// ``cancel()`` fires them.
    let asking = Locked<(next: UInt64, signals: [UInt64: CancelSignal])>((0, [:]))
    /// The last absolute URL this coordinator turned into a path, with the path's bytes:
    /// a coordinator used again on the same item skips the conversion (a third of an
    /// uncontended coordination's cost).
    let lastItem = Locked<(url: URL, path: FilePath, key: PathKey)?>(nil)

    /// A coordinator, optionally acting for `filePresenter`.
    public convenience init(filePresenter: (any FilePresenter)? = nil) {
        self.init(filePresenter: filePresenter, purposeIdentifier: nil, center: .shared)
    }

    /// A coordinator with an explicit purpose identifier (see ``purposeIdentifier``).
    public convenience init(purposeIdentifier: String) {
        self.init(filePresenter: nil, purposeIdentifier: purposeIdentifier, center: .shared)
    }

    /// A coordinator acting for `filePresenter` under an explicit purpose identifier: it
    /// never messages that presenter, and coordinators with the same purpose never block
    /// each other (Apple's `purposeIdentifier` set on a coordinator made with a presenter).
    public convenience init(filePresenter: (any FilePresenter)?, purposeIdentifier: String) {
        self.init(filePresenter: filePresenter, purposeIdentifier: purposeIdentifier, center: .shared)
    }

    init(filePresenter: (any FilePresenter)?, purposeIdentifier: String?, center: CoordinationCenter) {
        self.filePresenter = filePresenter
        self.center = center
        self.purposeIdentifier = purposeIdentifier ?? filePresenter.map(Self.purpose(of:))
            ?? "\(Self.purposePrefix)-\(Self.purposeCount.add(1, ordering: .relaxed).newValue)"
        policy = Locked(.default)
    }

    /// The purpose the coordinators made for `presenter` share (unless given another).
    static func purpose(of presenter: any FilePresenter) -> String {
        "presenter-\(UInt(bitPattern: ObjectIdentifier(presenter).hashValue))"
    }

    /// A default purpose is this process's random prefix and a count: unique, with no
    /// random bytes read per coordinator (a `UUID()` opens and reads `/dev/urandom`, which
    /// cost a coordinator made for one coordination more than the coordination itself).
    private static let purposePrefix = UUID().uuidString
    private static let purposeCount = Atomic<UInt64>(0)

    /// How long presenters may take to answer, and what happens when they do not.
    /// Default: ``PresenterTimeoutPolicy/default`` (30 s, then proceed with a warning).
    public var presenterTimeoutPolicy: PresenterTimeoutPolicy {
        policy.withLock { $0 }
    }

    /// Sets this coordinator's presenter timeout policy.
    public func setPresenterTimeoutPolicy(_ newValue: PresenterTimeoutPolicy) {
        policy.withLock { $0 = newValue }
    }

    /// How long a coordination may wait for conflicting claims (in this process or
    /// another) to end before it fails with `FileCoordinationError.Code.timedOut`.
    /// `nil` (the default) waits for as long as it takes, as Apple's coordinator does.
    /// Only waiting counts: a claim nothing conflicts with succeeds with any timeout,
    /// `.zero` included (a try-lock, as `flock -n`).
    public var claimTimeout: Duration? {
        claimDeadline.withLock { $0 }
    }

    /// Sets ``claimTimeout``.
    public func setClaimTimeout(_ newValue: Duration?) {
        claimDeadline.withLock { $0 = newValue }
    }

    /// Ends every coordination of this coordinator that is still waiting (for claims or
    /// for presenters) with `FileCoordinationError.Code.cancelled`; their accessors never
    /// run. Accessors already running finish normally.
    public func cancel() {
        cancellations.add(1, ordering: .relaxed)
        let signals = asking.withLock { Array($0.signals.values) }
        for signal in signals { signal.fire(FileCoordinationError.coordinatorCancelled()) }
        center.cancel(owner: ObjectIdentifier(self))
    }

    // MARK: Presenters

    /// Registers a presenter for its ``FilePresenter/presentedItemURL``. Coordinators in
    /// this process message it from now on.
    ///
    /// Its item is also watched, so that it hears changes made by programs that never
    /// coordinate. The watch starts, and the presenter is published to other processes,
    /// in the background: this returns before either is done. Until its record is in the
    /// coordination space (after the watch is in place, usually within a millisecond),
    /// coordinators in other processes do not know of it and do not ask it. From an async
    /// context, the async overload returns once both are done.
    public static func addFilePresenter(_ presenter: any FilePresenter) {
        guard let url = presenter.presentedItemURL, let lexical = try? Self.normalizedPath(url) else { return }
        // Known at once under the name given (a `..` in it taken lexically, right unless a
        // link comes before it); under its canonical path, which replaces that, as soon as
        // it is resolved (a directory new to the process takes a trip to an I/O thread).
        let given = lexical.lexicallyNormalized()
        let watch = CoordinationCenter.shared.addPresenterWatching(presenter, at: given)
        Task {
            let path = await CanonicalPaths.canonical(lexical, followingLast: true)
            if path != given { CoordinationCenter.shared.addPresenter(presenter, at: path) }
            await watch.start(at: path)
            await CoordinationCenter.shared.publish(presenter, at: path)
        }
    }

    /// Registers a presenter and returns once its item is watched and it is published in
    /// the coordination space: from then on, changes made outside coordination reach it,
    /// and coordinators in other processes message it.
    public static func addFilePresenter(_ presenter: any FilePresenter) async {
        guard let url = presenter.presentedItemURL, let lexical = try? Self.normalizedPath(url) else { return }
        let path = await CanonicalPaths.canonical(lexical, followingLast: true)
        await CoordinationCenter.shared.addPresenterWatching(presenter, at: path).start(at: path)
        await CoordinationCenter.shared.publish(presenter, at: path)
    }

    /// Unregisters a presenter; it is not messaged again (other processes stop finding it
    /// shortly after; the async overload returns once they cannot).
    public static func removeFilePresenter(_ presenter: any FilePresenter) {
        CoordinationCenter.shared.removePresenterLocally(presenter)
        Task { await CoordinationCenter.shared.transport?.withdraw(presenter) }
    }

    /// Unregisters a presenter and returns once no process can find it any more.
    public static func removeFilePresenter(_ presenter: any FilePresenter) async {
        await CoordinationCenter.shared.removePresenter(presenter)
    }

    // MARK: The coordination space

    /// Joins the coordination space at `directory` (the default space when nil), so that
    /// coordinators and presenters in every process that joined it coordinate with this
    /// one. Without a call, the process joins ``CoordinationSpace/defaultDirectory(environment:)``
    /// on its first coordination. Presenters already registered are published in it.
    ///
    /// - Throws: `FileCoordinationError` with code `.insecureSpace` when the directory
    ///   belongs to another user or is writable by others, or the error that kept it from
    ///   being created or opened.
    @discardableResult
    public static func joinCoordinationSpace(at directory: FilePath? = nil) async throws -> CoordinationSpace {
        let directory = directory ?? CoordinationSpace.defaultDirectory()
        return try await CoordinationCenter.shared.join { hooks in try await CoordinationSpace.join(directory, hooks: hooks) }
    }

    /// Leaves the coordination space: from now on this process coordinates within itself
    /// only. Its files in the space are removed.
    public static func leaveCoordinationSpace() async {
        await CoordinationCenter.shared.leaveSpace()
    }

    /// The local coordination space this process has joined, if any.
    public static var coordinationSpace: CoordinationSpace? {
        CoordinationCenter.shared.joinedSpace
    }

    /// Inside an accessor in an etcd space, its claims' fencing token: the etcd revision
    /// that created them, higher for every later grant. Storage that remembers the highest
    /// token it accepted can refuse a write carrying a lower one (a process whose lease
    /// was lost while it wrote). Nil outside an accessor, and in a local space.
    public static var fencingToken: Int64? { FencingContext.token }

    /// The presenters registered in this process.
    public static var filePresenters: [any FilePresenter] {
        CoordinationCenter.shared.presenters
    }

    // MARK: Scoped access

    /// Reads an item under a coordinated read claim.
    ///
    /// Presenters of the item (and of directories containing it) first hear
    /// ``FilePresenter/relinquishPresentedItem(toReader:)`` and, unless `options` contains
    /// ``ReadingOptions/withoutChanges``, ``FilePresenter/savePresentedItemChanges()``;
    /// their reacquirers run after `accessor`.
    public func coordinate<T>(
        readingItemAt url: URL, options: ReadingOptions = [],
        isolation: isolated (any Actor)? = #isolation,
        _ accessor: (URL) async throws -> T
    ) async throws -> T {
        try await performOne(.reading(url, options), accessor)
    }

    /// Writes an item under a coordinated write claim.
    ///
    /// Presenters first hear ``FilePresenter/relinquishPresentedItem(toWriter:)``, then
    /// ``FilePresenter/accommodatePresentedItemDeletion()`` (with ``WritingOptions/forDeleting``)
    /// or ``FilePresenter/savePresentedItemChanges()``; after `accessor` they hear the
    /// `did…` messages, then their reacquirers run.
    public func coordinate<T>(
        writingItemAt url: URL, options: WritingOptions = [],
        isolation: isolated (any Actor)? = #isolation,
        _ accessor: (URL) async throws -> T
    ) async throws -> T {
        try await performOne(.writing(url, options), accessor)
    }

    /// Reads one item and writes another in one coordination (a copy, an export). Both
    /// claims are granted together, so two such coordinations never deadlock.
    public func coordinate<T>(
        readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [],
        writingItemAt writingURL: URL, options writingOptions: WritingOptions = [],
        isolation: isolated (any Actor)? = #isolation,
        _ accessor: (URL, URL) async throws -> T
    ) async throws -> T {
        try await perform([.reading(readingURL, readingOptions), .writing(writingURL, writingOptions)]) { urls in
            try await accessor(urls[0], urls[1])
        }
    }

    /// Writes two items in one coordination (a move, a swap). Both claims are granted
    /// together, so two such coordinations never deadlock.
    public func coordinate<T>(
        writingItemAt url1: URL, options options1: WritingOptions = [],
        writingItemAt url2: URL, options options2: WritingOptions = [],
        isolation: isolated (any Actor)? = #isolation,
        _ accessor: (URL, URL) async throws -> T
    ) async throws -> T {
        try await perform([.writing(url1, options1), .writing(url2, options2)]) { urls in
            try await accessor(urls[0], urls[1])
        }
    }

    /// Coordinates any number of reading and writing intents at once (Apple's
    /// `coordinate(with:queue:byAccessor:)`, async). All claims are granted together, so
    /// coordinations over overlapping sets of items never deadlock; each intent's
    /// ``FileAccessIntent/url`` reflects moves made while waiting.
    public func coordinate<T>(
        with intents: [FileAccessIntent], isolation: isolated (any Actor)? = #isolation,
        _ accessor: () async throws -> T
    ) async throws -> T {
        let requests = intents.map(ItemRequest.init)
        return try await perform(requests, intents: intents) { _ in try await accessor() }
    }

    // MARK: Moves

    /// Announces, inside a write accessor with ``WritingOptions/forMoving``, that the item
    /// at `oldURL` is about to move to `newURL`. Kept for Apple's protocol; nothing needs
    /// to happen before the move here.
    public func item(at oldURL: URL, willMoveTo newURL: URL) {}

    /// Reports, inside a write accessor, that the item at `oldURL` moved to `newURL`.
    ///
    /// Presenters of the item and of everything inside it will hear
    /// ``FilePresenter/presentedItemDidMove(to:)`` with their new URLs; presenters of the
    /// directories that contained it or now contain it hear
    /// ``FilePresenter/presentedSubitem(at:didMoveTo:)``. Coordinations waiting for the item
    /// follow it to its new URL. Messages are delivered after the accessor returns (at
    /// once when called outside one). From an accessor that cannot await (the blocking
    /// and queue-based forms): ``itemBlocking(at:didMoveTo:)``.
    public func item(at oldURL: URL, didMoveTo newURL: URL) async {
        await reportMove(from: oldURL, to: newURL, context: CoordinationContext.current)
    }

    /// ``item(at:didMoveTo:)`` with the accessor's context (if any) read by the caller:
    /// the blocking form reads it on its own thread, where the accessor runs.
    func reportMove(from oldURL: URL, to newURL: URL, context: CoordinationContext?) async {
        guard let lexicalSource = try? Self.normalizedPath(oldURL), let lexicalDestination = try? Self.normalizedPath(newURL) else { return }
        let source = await CanonicalPaths.canonical(lexicalSource, followingLast: false)
        let destination = await CanonicalPaths.canonical(lexicalDestination, followingLast: false)
        let exclude = filePresenter.map(ObjectIdentifier.init)
        // Containers are looked up before the move, so the moved presenters are not among them.
        var containers = center.presenters(for: source, subtree: false, excluding: exclude).containers
        let moved = center.move(from: source, to: destination)
        let movedIDs = Set(moved.map(\.entry.id))
        let seen = Set(containers.map(\.id))
        containers += center.presenters(for: destination, subtree: false, excluding: exclude).containers
            .filter { !seen.contains($0.id) && !movedIDs.contains($0.id) }
        // The watches of everyone concerned will see this rename happen: it is reported
        // here, so their copies of it are dropped.
        for id in Set(moved.map(\.entry.id) + containers.map(\.id) + [exclude].compactMap { $0 }) {
            if let watch = center.watch(of: id) {
                await watch.suppress(source)
                await watch.suppress(destination)
            }
        }
        // This process's moved presenters are watched at their new places (the rename is
        // behind the old watches, which end).
        for item in moved where item.entry.endpoint.isRegisteredHere {
            await center.watch(of: item.entry.id)?.start(at: item.newPath)
        }
        var messages: [PendingMessage] = moved.filter { $0.entry.id != exclude }.map {
            .didMove($0.entry, to: $0.newPath)
        }
        messages += containers.map { .subitemDidMove($0, from: source, to: destination) }
        if let context, context.coordinator === self {
            context.recordMoved(moved.map(\.entry.id))
            context.defer(messages)
        } else {
            await deliver(messages)
        }
    }
}
