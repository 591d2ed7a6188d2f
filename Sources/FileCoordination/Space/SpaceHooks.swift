import AsyncFileIO
import SystemPackage

/// What a space needs from the process above it, handed in when the space is joined:
/// nothing below the seam reaches up to the coordination center.
package struct SpaceHooks: Sendable {
    /// This process's claims, held and waiting (its record in the space, and `status`).
    let claims: @Sendable () -> (held: [CoordinationRules.Claim], waiting: [CoordinationRules.Claim])
    /// A writer in another process relinquished `presenter`'s item at the path: its watch
    /// drops the write's own events until the suppression returned ends (nil: no watch).
    let suppress: @Sendable (_ presenter: any FilePresenter, _ path: FilePath) -> EchoSuppression?
    /// A writer in another process moved `presenter`'s item: this process follows it.
    let presenterMoved: @Sendable (_ presenter: any FilePresenter, _ from: FilePath, _ to: FilePath) async -> Void
    /// Another process's coordination, holding its claim on the item at the path, waits
    /// while `presenter` saves it: the presenter's own coordinators write it under that
    /// claim until the loan returned is revoked or ended.
    let lend: @Sendable (_ presenter: any FilePresenter, _ path: FilePath) -> ItemLoan
    /// The space `lost` can no longer serve (its etcd lease ended): when it is still the
    /// process's space, the space that `join` makes takes its place, this process's
    /// presenters published in it, and `lost` is left. Whether it took its place; throws
    /// what `join` threw.
    package let rejoin: @Sendable (_ lost: any CoordinationTransport,
                                   _ join: @Sendable (SpaceHooks) async throws -> any CoordinationTransport) async throws -> Bool

    package init(claims: @escaping @Sendable () -> (held: [CoordinationRules.Claim], waiting: [CoordinationRules.Claim]),
                 suppress: @escaping @Sendable (any FilePresenter, FilePath) -> EchoSuppression?,
                 presenterMoved: @escaping @Sendable (any FilePresenter, FilePath, FilePath) async -> Void,
                 lend: @escaping @Sendable (any FilePresenter, FilePath) -> ItemLoan,
                 rejoin: @escaping @Sendable (any CoordinationTransport,
                                              @Sendable (SpaceHooks) async throws -> any CoordinationTransport) async throws -> Bool) {
        self.claims = claims
        self.suppress = suppress
        self.presenterMoved = presenterMoved
        self.lend = lend
        self.rejoin = rejoin
    }
}

/// An item lent to a presenter's own coordinators (``SpaceHooks/lend``).
package struct ItemLoan: Sendable {
    /// Nothing more is granted under it: its asker gave up waiting, or died.
    let revoke: @Sendable () -> Void
    /// Revokes it, and returns once what was granted under it is released.
    let end: @Sendable () async -> Void

    package init(revoke: @escaping @Sendable () -> Void, end: @escaping @Sendable () async -> Void) {
        (self.revoke, self.end) = (revoke, end)
    }
}

/// A presenter watch's suppression of a remote write's own events, and the two ways it
/// ends.
package struct EchoSuppression: Sendable {
    /// Ends it once the watch has seen every event so far (a sync through inotify).
    let end: @Sendable () async -> Void
    /// Ends it on the watcher thread, at the events already read: the write's own came
    /// through the same inotify queue before the message being handled.
    let endOnWatcherThread: @Sendable () -> Void

    package init(end: @escaping @Sendable () async -> Void, endOnWatcherThread: @escaping @Sendable () -> Void) {
        self.end = end
        self.endOnWatcherThread = endOnWatcherThread
    }
}
