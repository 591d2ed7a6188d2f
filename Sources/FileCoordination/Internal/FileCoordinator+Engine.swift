@_spi(FileCoordinationInternal) import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

extension FileCoordinator {
    // MARK: The two halves of a coordination

    /// Runs `body` between ``begin(_:intents:claimPath:)`` and ``finish(_:accessorSucceeded:)``.
    /// `skippingPlain`: the caller found that the plain path (``performPlain(_:path:key:_:)``)
    /// does not apply; `claimPath`: the one request's claim path, which the caller
    /// resolved for that check.
    func perform<T>(
        _ requests: [ItemRequest], intents: [FileAccessIntent] = [], skippingPlain: Bool = false,
        claimPath resolved: FilePath? = nil,
        isolation: isolated (any Actor)? = #isolation, _ body: ([URL]) async throws -> T
    ) async throws -> T {
        try await center.prepareSpace()
        var resolved = resolved
        if !skippingPlain, requests.count == 1, intents.isEmpty, Self.isPlain(requests[0]) {
            let (path, key) = try await claimPath(requests[0].url, followingLast: true)
            if !center.hasPresenters || !center.hasPresenters(concerning: key) {
                return try await performPlain(requests[0], path: path, key: key) { url in try await body([url]) }
            }
            resolved = path
        }
        let session = try await begin(requests, intents: intents, claimPath: resolved)
        if Self.allForUploading(requests) {
            return try await withSnapshots(session, body)
        }
        let outcome: Result<T, any Error>
        do {
            // Only a writer can report moves; readers skip the task-local.
            if let transport = center.transport, transport.fencesClaims, let request = session.request {
                outcome = .success(try await fenced(transport, request, path: session.items.first?.path) {
                    try await CoordinationContext.$current.withValue(session.context) { try await body(session.urls) }
                })
            } else if session.items.contains(where: \.isWrite) {
                outcome = .success(try await CoordinationContext.$current.withValue(session.context) { try await body(session.urls) })
            } else {
                outcome = .success(try await body(session.urls))
            }
        } catch {
            outcome = .failure(error)
        }
        let succeeded = if case .success = outcome { true } else { false }
        await finish(session, accessorSucceeded: succeeded)
        return try outcome.get()
    }

    /// One item: the common case goes straight to ``performPlain(_:_:)``, with no arrays
    /// of requests or URLs made for it.
    func performOne<T>(
        _ request: ItemRequest, isolation: isolated (any Actor)? = #isolation, _ body: (URL) async throws -> T
    ) async throws -> T {
        if !center.spaceIsPrepared { try await center.prepareSpace() }
        var resolved: FilePath?
        if Self.isPlain(request) {
            let lexical = try itemPath(request.url).path
            let (path, key) = if let reused = CanonicalPaths.reused(lexical, followingLast: true) {
                reused
            } else {
                await CanonicalPaths.resolveKeyed(lexical, followingLast: true)
            }
            if !center.hasPresenters || !center.hasPresenters(concerning: key) {
                return try await performPlain(request, path: path, key: key, body)
            }
            resolved = path
        }
        return try await perform([request], skippingPlain: true, claimPath: resolved) { urls in try await body(urls[0]) }
    }

    /// The path (and its key) that claims and presenters of the item at `url` meet on:
    /// its canonical path (``CanonicalPaths``). `followingLast`: the access acts on what a
    /// symbolic link there points to (a read, a write of content), not on the link.
    func claimPath(_ url: URL, followingLast: Bool,
                   isolation: isolated (any Actor)? = #isolation) async throws(FileCoordinationError) -> (path: FilePath, key: PathKey) {
        try await CanonicalPaths.canonicalKeyed(itemPath(url).path, followingLast: followingLast)
    }

    /// One item, no option that needs the file system answered first.
    private static func isPlain(_ request: ItemRequest) -> Bool {
        switch request {
        case .reading(_, let options): options.isDisjoint(with: [.forUploading, .resolvesSymbolicLink])
        case .writing(_, let options): options.isDisjoint(with: [.forDeleting, .forMoving, .forReplacing])
        }
    }

    /// The common case, with nobody to message: claim, accessor, release. (With no
    /// presenter registered there are no messages to send before or after, and moves
    /// reported inside the accessor are applied to waiting claims at once.)
    private func performPlain<T>(
        _ request: ItemRequest, path: FilePath, key: PathKey, isolation: isolated (any Actor)? = #isolation,
        _ body: (URL) async throws -> T
    ) async throws -> T {
        let claim = CoordinationRules.Claim(key: key, access: { if case .writing = request { .writing } else { .reading } }())
        let generation = cancellations.load(ordering: .relaxed)
        let id: CoordinationRules.RequestID, waited: Bool
        if claimTimeout == nil {
            // Without a timeout, the center's own steps: a free claim is held with no async call.
            switch try center.submit([claim], purpose: purposeIdentifier, coordinator: self) {
            case .held(let held): (id, waited) = (held, false)
            case .pending(let pending): (id, waited) = try await center.complete(pending)
            }
        } else {
            (id, waited) = try await acquire([claim], path: path)
        }
        defer { center.release(id) }
        if waited && cancellations.load(ordering: .relaxed) != generation {
            throw FileCoordinationError.coordinatorCancelled(path: path)
        }
        var url = request.url
        if waited, let current = center.claims(of: id).first?.path, current != path { url = current.fileURL }
        if let transport = center.transport, transport.fencesClaims {
            return try await fenced(transport, id, path: path) { try await body(url) }
        }
        return try await body(url)
    }

    /// Runs an accessor whose claims can stop holding (an etcd space's, when the lease is
    /// lost): its task is cancelled then, and once it returns the coordination throws
    /// `claimLost`. ``fencingToken`` is the claims' token inside it.
    func fenced<T>(_ transport: any CoordinationTransport, _ id: CoordinationRules.RequestID, path: FilePath?,
                   isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> T) async throws -> T {
        withUnsafeCurrentTask { task in
            if let task { transport.accessorStarts(id.raw, task: AccessorTask(task: task)) }
        }
        let outcome: Result<T, any Error>
        do {
            outcome = .success(try await FencingContext.$token.withValue(transport.fencingToken(of: id.raw)) { try await body() })
        } catch {
            outcome = .failure(error)
        }
        guard await transport.accessorEnds(id.raw) else { throw FileCoordinationError.claimsLost(path: path) }
        return try outcome.get()
    }

    /// Takes claims, within ``claimTimeout`` (of waiting) when one is set.
    private func acquire(_ claims: [CoordinationRules.Claim], path: FilePath?, intents: [(FilePath, FileAccessIntent)] = [],
                         isolation: isolated (any Actor)? = #isolation
    ) async throws -> (id: CoordinationRules.RequestID, waited: Bool) {
        let (center, purpose) = (center, purposeIdentifier)
        guard let timeout = claimTimeout else {
            return try await center.acquire(claims, purpose: purpose, coordinator: self, intents: intents)
        }
        let wait = ClaimWait()
        return try await withThrowingTaskGroup(of: (id: CoordinationRules.RequestID, waited: Bool)?.self) { group in
            group.addTask {
                try await ClaimWait.$current.withValue(wait) {
                    try await center.acquire(claims, purpose: purpose, coordinator: self, intents: intents)
                }
            }
            group.addTask {
                // The deadline counts from when the claim starts to wait.
                await wait.untilWaiting()
                try await Task.sleep(for: timeout) // ok: the claim deadline
                return nil
            }
            let first = await Result { try await group.next()! }
            group.cancelAll()
            // Whatever the other task ends with; a grant that raced the deadline is given back.
            let second = await Result { try await group.next()! }
            switch (first, second) {
            case (.success(let granted?), _):
                return granted
            case (.success(nil), .success(let granted?)):
                center.release(granted.id)
                fallthrough
            case (.success(nil), _):
                let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
                throw FileCoordinationError(code: .timedOut, path: path, operation: "coordinate",
                                            message: "a conflicting claim did not end within \(seconds) s")
            case (.failure(let error), _):
                throw error
            }
        }
    }

    /// Takes the claims, then messages the presenters before the access. On failure
    /// everything taken is given back (reacquirers run, claims released). `claimPath`: the
    /// one request's claim path, already resolved by a caller that checked it for the
    /// plain path (following the last component, as a plain request does).
    func begin(_ requests: [ItemRequest], intents: [FileAccessIntent] = [],
               claimPath resolved: FilePath? = nil) async throws -> CoordinationSession {
        try await center.prepareSpace()
        var items: [CoordinationSession.Item] = []
        for request in requests {
            // A delete, move or replace acts on the name itself: a link there is the item.
            let followingLast = if case .writing(_, let options) = request {
                options.isDisjoint(with: [.forDeleting, .forMoving, .forReplacing])
            } else { true }
            var path = if let resolved, requests.count == 1, followingLast {
                resolved
            } else {
                try await claimPath(request.url, followingLast: followingLast).path
            }
            var subtree = false
            switch request {
            case .reading(_, let options):
                if options.contains(.resolvesSymbolicLink) { path = try await Self.resolveLink(path) }
            case .writing(_, let options):
                if !options.isDisjoint(with: [.forDeleting, .forMoving, .forReplacing]) {
                    subtree = try await Self.isDirectory(path)
                }
            }
            let resolved = path
            items.append(.init(path: resolved, request: request, url: request.url, subtree: subtree))
            if case .reading(_, let options) = request, options.contains(.resolvesSymbolicLink) {
                items[items.count - 1].url = resolved.fileURL
            }
        }
        let claims = items.map {
            CoordinationRules.Claim(path: $0.path, access: $0.isWrite ? .writing : .reading, scope: $0.subtree ? .subtree : .item)
        }
        let generation = cancellations.load(ordering: .relaxed)
        let (id, waited) = try await acquire(claims, path: items.first?.path, intents: zip(items, intents).map { ($0.path, $1) })
        do {
            // The items may have moved while the claims waited.
            if waited {
                for (index, claim) in center.claims(of: id).enumerated() where index < items.count && claim.path != items[index].path {
                    items[index].path = claim.path
                    items[index].url = claim.path.fileURL
                }
            }
            for (index, intent) in intents.enumerated() where index < items.count { intent.update(items[index].path.fileURL) }
            let reacquirers = try await messageBefore(items)
            let recorded: [CoordinationSession.Item]
            do {
                recorded = try await recordExistence(items)
            } catch {
                await runReacquirers(reacquirers)
                throw error
            }
            let session = CoordinationSession(request: id, items: recorded, reacquirers: reacquirers,
                                              context: CoordinationContext(coordinator: self),
                                              suppressions: beginSuppressing(items))
            if Task.isCancelled || cancellations.load(ordering: .relaxed) != generation {
                for (watch, token) in session.suppressions { await watch.endSuppressing(token) }
                await runReacquirers(session.reacquirers)
                if Task.isCancelled { throw CancellationError() }
                throw FileCoordinationError.coordinatorCancelled(path: items.first?.path)
            }
            return session
        } catch {
            await release(id)
            throw error
        }
    }

    /// Releases the claims of `id` once every message posted to other processes' presenters
    /// (a `reacquire` above all) is written: none may reach its presenter after another
    /// coordination's request for the same item.
    private func release(_ id: CoordinationRules.RequestID) async {
        await center.messagesWritten()
        center.release(id)
    }

    /// After the accessor: the `did…` messages, then the reacquirers, then the claims go.
    func finish(_ session: CoordinationSession, accessorSucceeded: Bool) async {
        var messages: [PendingMessage] = []
        if accessorSucceeded {
            let exclude = filePresenter.map(ObjectIdentifier.init)
            let moved = session.context.movedPresenters
            for item in session.items where item.isWrite && !item.writingOptions.contains(.forDeleting) {
                let concerned = center.presenters(for: item.path, subtree: false, excluding: exclude)
                messages += await PresenterPlan.after(write: item.path, options: item.writingOptions, existedBefore: item.existedBefore,
                                                      concerned: concerned, moved: moved) {
                    (try? await Self.exists(item.path)) ?? true
                }
            }
        }
        // The write's own inotify events are in the presenters' watches by now: stop
        // dropping that path's events after them.
        for (watch, token) in session.suppressions { await watch.endSuppressing(token) }
        messages += session.context.takeDeferred()
        await deliver(messages)
        await runReacquirers(session.reacquirers)
        if let request = session.request { await release(request) }
    }

    /// Presenters watching written items would see the write again through inotify (the
    /// writer's own presenter included): their watches drop those events from now until
    /// `finish`, which reports the write itself.
    private func beginSuppressing(_ items: [CoordinationSession.Item]) -> [(PresenterWatch, Int)] {
        guard center.hasPresenters else { return [] }
        var result: [(PresenterWatch, Int)] = []
        for item in items where item.isWrite {
            let concerned = center.presenters(for: item.path, subtree: item.subtree, excluding: nil)
            for entry in concerned.item + concerned.containers + concerned.inside {
                if let watch = center.watch(of: entry.id) { result.append((watch, watch.beginSuppressing(item.path))) }
            }
        }
        return result
    }

    // MARK: File-system questions (on the I/O threads)

    private func recordExistence(_ items: [CoordinationSession.Item]) async throws -> [CoordinationSession.Item] {
        var items = items
        let exclude = filePresenter.map(ObjectIdentifier.init)
        for index in items.indices where items[index].isWrite {
            let containers = center.presenters(for: items[index].path, subtree: false, excluding: exclude).containers
            if !containers.isEmpty { items[index].existedBefore = try await Self.exists(items[index].path) }
        }
        return items
    }

    static func exists(_ path: FilePath) async throws -> Bool {
        try await FileSystemQueries.exists(path)
    }

    static func isDirectory(_ path: FilePath) async throws -> Bool {
        try await FileSystemQueries.isDirectory(path)
    }

    static func resolveLink(_ path: FilePath) async throws -> FilePath {
        try await FileSystemQueries.resolveSymbolicLink(path)
    }

    // MARK: forUploading

    private func withSnapshots<T>(
        _ session: CoordinationSession, isolation: isolated (any Actor)? = #isolation, _ body: ([URL]) async throws -> T
    ) async throws -> T {
        let snapshots = try await takeSnapshots(session)
        defer { FileSystemQueries.removeSnapshots(snapshots) }
        return try await body(snapshots.map(\.fileURL))
    }

    /// Whether every request reads with `forUploading`: the accessor then gets snapshots.
    static func allForUploading(_ requests: [ItemRequest]) -> Bool {
        !requests.isEmpty && requests.allSatisfy { if case .reading(_, let o) = $0 { o.contains(.forUploading) } else { false } }
    }

    /// Snapshots of the session's items, after which the session ends: the read is the
    /// snapshot, so presenters get their item back and writers may go on while the
    /// accessor uses the copies (remove them with `FileSystemQueries.removeSnapshots`).
    func takeSnapshots(_ session: CoordinationSession) async throws -> [FilePath] {
        let snapshots: [FilePath]
        do {
            snapshots = try await FileSystemQueries.snapshots(of: session.items.map(\.path))
        } catch {
            await finish(session, accessorSucceeded: false)
            throw error
        }
        await finish(session, accessorSucceeded: true)
        return snapshots
    }
}

extension FileCoordinationError {
    /// An accessor's claims stopped holding while it ran.
    static func claimsLost(path: FilePath?) -> FileCoordinationError {
        FileCoordinationError(code: .claimLost, path: path, operation: "coordinate",
                              message: "the claims stopped holding while the accessor ran (the process's etcd lease was lost); another process may have been granted them")
    }

    /// A coordination ended by ``FileCoordinator/cancel()``.
    package static func coordinatorCancelled(path: FilePath? = nil) -> FileCoordinationError {
        FileCoordinationError(code: .cancelled, path: path, operation: "coordinate", message: "the coordinator was cancelled")
    }
}

/// The fencing token of the claims held by the accessor running in this task.
enum FencingContext {
    @TaskLocal static var token: Int64?
}
