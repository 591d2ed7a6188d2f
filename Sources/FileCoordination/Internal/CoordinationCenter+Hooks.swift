import AsyncFileIO
import SystemPackage

extension CoordinationCenter {
    /// What the process's space calls back, whichever center joined it: the process's
    /// center (``shared``), as the space is the process's (tests' private centers share it).
    package static var spaceHooks: SpaceHooks { shared.hooks }

    /// What a space serving this center calls back: its claims, its presenters' watches,
    /// following a presenter moved by another process, lending an item to a presenter's
    /// own coordinators, and taking the place of a lost space.
    package var hooks: SpaceHooks {
        SpaceHooks(
            claims: { [self] in statusClaims() },
            suppress: { [self] presenter, path in
                guard let watch = watch(of: ObjectIdentifier(presenter)) else { return nil }
                let token = watch.beginSuppressing(path)
                return EchoSuppression(end: { await watch.endSuppressing(token) },
                                       endOnWatcherThread: { watch.endSuppressingOnWatcherThread(token) })
            },
            presenterMoved: { [self] presenter, from, to in await presenterMoved(presenter, from: from, to: to) },
            lend: { [self] presenter, path in lend(presenter, path) },
            rejoin: { lost, join in try await Self.replace(lost, with: join) })
    }
}
