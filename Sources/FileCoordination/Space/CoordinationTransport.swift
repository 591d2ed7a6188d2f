import AsyncFileIO
import SystemPackage

/// What coordination needs from the other processes that share its items: claims they
/// see, the presenters they registered, messages to them, and leaving. The coordination
/// center reaches other processes only through this protocol. ``CoordinationSpace`` (a
/// directory of OFD locks and inotify mailboxes) is its implementation; coordination
/// across hosts plugs in here.
///
/// Claims are identified by the in-process request that holds them (its raw number):
/// the rules of the process have granted them already, and the transport makes other
/// processes see them.
package protocol CoordinationTransport: AnyObject, Sendable {
    /// Where the space is, for messages (a directory, for ``CoordinationSpace``).
    var address: String { get }

    // MARK: Claims

    /// Takes `claims` for request `id` when nothing in another process is in the way;
    /// never waits and never suspends (a caller on the main actor stays there).
    func takeClaimsNow(_ claims: [CoordinationRules.Claim], for id: UInt64) -> Bool

    /// Takes `claims` for request `id`, waiting for other processes to let go; calls
    /// `whenWaiting` where it is about to wait (perhaps more than once: the claim
    /// deadline counts from the first). Throws when ``cancelWaiting(for:)`` is called, or
    /// when the claims cannot be had.
    func takeClaims(_ claims: [CoordinationRules.Claim], for id: UInt64, whenWaiting: @escaping @Sendable () -> Void) async throws

    /// Whether ``takeClaimsForBatch(_:for:opening:)`` with `opening` can take `claims` at
    /// all (a process with few descriptors may not hold every claim file open at once).
    func batchCanTake(_ claims: [CoordinationRules.Claim]) -> Bool

    /// ``takeClaimsNow(_:for:)`` for a batch's worker; with `opening` (on an I/O thread
    /// only) it may block to open what the claims need.
    func takeClaimsForBatch(_ claims: [CoordinationRules.Claim], for id: UInt64, opening: Bool) -> Bool

    /// Whether ``takeClaimsForBatch(_:for:opening:)`` can ever take claims (false where
    /// every claim is a round trip to a server): the batch's consumer asks only then.
    var takesClaimsForBatch: Bool { get }

    /// Ends a wait of ``takeClaims(_:for:whenWaiting:)``.
    func cancelWaiting(for id: UInt64)

    /// Gives back what request `id` took (nothing when it took nothing).
    func releaseClaims(of id: UInt64)

    // MARK: Fencing

    /// Whether claims can stop holding while they are held (an etcd lease can be lost):
    /// accessors then run through ``accessorStarts(_:task:)`` and ``accessorEnds(_:)``.
    var fencesClaims: Bool { get }

    /// An accessor of request `id` starts; if the claims stop holding, `task` is cancelled.
    /// The task's reference is dropped by ``accessorEnds(_:)``, before the accessor's
    /// task can end.
    func accessorStarts(_ id: UInt64, task: AccessorTask)

    /// The accessor of request `id` returned; whether its claims held throughout.
    func accessorEnds(_ id: UInt64) async -> Bool

    /// The fencing token of request `id`'s claims (an etcd revision), when they have one.
    func fencingToken(of id: UInt64) -> Int64?

    // MARK: Batches

    /// Before a batch's workers claim: false when they must open claim files themselves
    /// (``takeClaimsForBatch(_:for:opening:)``).
    func prepareForBatch() async throws -> Bool

    /// How many of `paths` (normalized bytes), from the first, one claim can cover; nil
    /// when there is no such limit.
    func readsFitting(_ paths: some Collection<[UInt8]>) -> Int?

    // MARK: Other processes' presenters

    /// Whether the presenters of other processes, as last read, are current.
    var otherPresentersAreCurrent: Bool { get }
    func refreshOtherPresenters() async
    var otherPresenterCount: Int { get }
    /// Whether an access at the path with these bytes concerns any of them.
    func otherPresentersConcern(_ key: PathKey) -> Bool
    func otherPresenters(for path: FilePath, subtree: Bool) -> PresenterRegistry.Concerned
    /// Follows a coordinated move until their processes publish the new paths.
    func moveOtherPresenters(from source: FilePath, to destination: FilePath) -> [PresenterRegistry.Moved]

    // MARK: This process's presenters

    /// Makes a presenter of this process known to the others; false when it cannot hear
    /// their requests (no watch to be had).
    func publish(_ presenter: any FilePresenter, at path: FilePath) async -> Bool
    func withdraw(_ presenter: any FilePresenter) async

    // MARK: Messages and membership

    /// Returns once every message posted so far is written.
    func messagesWritten() async
    /// Leaves: this process's claims, presenters and mailbox go.
    func leave() async
}

extension CoordinationTransport {
    package var fencesClaims: Bool { false }
    package func accessorStarts(_ id: UInt64, task: AccessorTask) {}
    package func accessorEnds(_ id: UInt64) async -> Bool { true }
    package func fencingToken(of id: UInt64) -> Int64? { nil }
}

/// The task running an accessor, to cancel when its claims stop holding. Valid only
/// between ``CoordinationTransport/accessorStarts(_:task:)`` and
/// ``CoordinationTransport/accessorEnds(_:)``, while the task is suspended inside its
/// accessor; cancelling a task is safe from any thread.
package struct AccessorTask: @unchecked Sendable {
    let task: UnsafeCurrentTask
    package func cancel() { task.cancel() }
}
