import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

extension FileCoordinator {
    // MARK: The two halves of a coordination

    /// Runs `body` between ``begin(_:intents:claimPath:since:)`` and ``finish(_:accessorRan:)``.
    /// `skippingPlain`: the caller found that the plain path (``performPlain(_:path:key:since:_:)``)
    /// does not apply; `claimPath`: the one request's claim path, which the caller
    /// resolved for that check; `since`: the coordinator's cancellations when the caller
    /// began (a `cancel()` after that ends the coordination before its accessor).
    func perform<T>(
        _ requests: [ItemRequest], intents: [FileAccessIntent] = [], skippingPlain: Bool = false,
        claimPath resolved: FilePath? = nil, since generation: Int? = nil,
        isolation: isolated (any Actor)? = #isolation, _ body: ([URL]) async throws -> T
    ) async throws -> T {
        let generation = generation ?? cancellations.load(ordering: .relaxed)
        if !center.spaceIsPrepared { try await center.prepareSpace() }
        var resolved = resolved
        if !skippingPlain, requests.count == 1, intents.isEmpty, Self.isPlain(requests[0]) {
            let (path, key) = try await claimPath(requests[0].url, followingLast: true)
            if !center.hasPresenters || !center.hasPresenters(concerning: key) {
                return try await performPlain(requests[0], path: path, key: key, since: generation) { url in try await body([url]) }
            }
            resolved = path
        }
        let session = try await begin(requests, intents: intents, claimPath: resolved, since: generation)
        if Self.allForUploading(requests) {
            return try await withSnapshots(session, body)
        }
        let outcome: Result<T, any Error>
        // Whether the accessor ran, to its end or not: one that threw may have written
        // before it did, and its presenters are told as after any write (Apple's are told
        // after every writing coordination).
        var ran = false
        do {
            // Only a writer can report moves; readers skip the task-local.
            if let transport = center.transport, transport.fencesClaims, let request = session.request {
                outcome = .success(try await fenced(transport, request, path: session.items.first?.path) {
                    try await CoordinationContext.$current.withValue(session.context) {
                        ran = true
                        return try await body(session.urls)
                    }
                })
            } else if session.items.contains(where: \.isWrite) {
                outcome = .success(try await CoordinationContext.$current.withValue(session.context) {
                    ran = true
                    return try await body(session.urls)
                })
            } else {
                ran = true
                outcome = .success(try await body(session.urls))
            }
        } catch {
            outcome = .failure(error)
        }
        await finish(session, accessorRan: ran)
        return try outcome.get()
    }

    /// One item: the common case goes straight to ``performPlain(_:_:)``, with no arrays
    /// of requests or URLs made for it.
    func performOne<T>(
        _ request: ItemRequest, isolation: isolated (any Actor)? = #isolation, _ body: (URL) async throws -> T
    ) async throws -> T {
        // A `cancel()` from here on ends the coordination, also while the path resolves.
        let generation = cancellations.load(ordering: .relaxed)
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
                return try await performPlain(request, path: path, key: key, since: generation, body)
            }
            resolved = path
        }
        return try await perform([request], skippingPlain: true, claimPath: resolved, since: generation) { urls in try await body(urls[0]) }
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
        _ request: ItemRequest, path: FilePath, key: PathKey, since generation: Int, isolation: isolated (any Actor)? = #isolation,
        _ body: (URL) async throws -> T
    ) async throws -> T {
        let claim = CoordinationRules.Claim(key: key, access: { if case .writing = request { .writing } else { .reading } }())
        let id: CoordinationRules.RequestID, waited: Bool
        if claimTimeout == nil {
            // Without a timeout, the center's own steps: a free claim is held with no async call.
            switch try center.submit([claim], purpose: purposeIdentifier, coordinator: self, since: generation) {
            case .held(let held): (id, waited) = (held, false)
            case .pending(let pending): (id, waited) = try await center.complete(pending)
            }
        } else {
            (id, waited) = try await acquire([claim], path: path, since: generation)
        }
        defer { center.release(id) }
        if cancellations.load(ordering: .relaxed) != generation {
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
                         since generation: Int, isolation: isolated (any Actor)? = #isolation
    ) async throws -> (id: CoordinationRules.RequestID, waited: Bool) {
        let (center, purpose) = (center, purposeIdentifier)
        guard let timeout = claimTimeout else {
            return try await center.acquire(claims, purpose: purpose, coordinator: self, intents: intents, since: generation)
        }
        let wait = ClaimWait()
        return try await withThrowingTaskGroup(of: (id: CoordinationRules.RequestID, waited: Bool)?.self) { group in
            group.addTask {
                try await ClaimWait.$current.withValue(wait) {
                    try await center.acquire(claims, purpose: purpose, coordinator: self, intents: intents, since: generation)
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
                throw FileCoordinationError(.coordinate, code: .timedOut, path: path, message: "a conflicting claim did not end within \(seconds) s")
            case (.failure(let error), let second):
                // The deadline's task ended first by the caller's cancellation, as the claim
                // was granted: the grant is given back.
                if case .success(let granted?) = second { center.release(granted.id) }
                throw error
            }
        }
    }

    /// The first half of a coordination that may concern presenters: resolves the items,
    /// then carries out its ``CoordinationMachine`` until the accessor may run (claims
    /// held, presenters asked). On failure everything taken is given back (reacquirers
    /// run, claims released) before it throws. `claimPath`: the one request's claim path,
    /// already resolved by a caller that checked it for the plain path (following the
    /// last component, as a plain request does); `since`: the coordinator's cancellations
    /// when the caller began.
    func begin(_ requests: [ItemRequest], intents: [FileAccessIntent] = [],
               claimPath resolved: FilePath? = nil, since generation: Int? = nil) async throws -> CoordinationSession {
        let generation = generation ?? cancellations.load(ordering: .relaxed)
        if !center.spaceIsPrepared { try await center.prepareSpace() }
        let items = try await resolve(requests, claimPath: resolved)
        let session = CoordinationSession(coordinator: self, intents: intents, cancellations: generation)
        var machine = CoordinationMachine(items: items, owner: filePresenter.map(ObjectIdentifier.init), intents: intents.count)
        let next = machine.start()
        if let error = await drive(&machine, from: next, session) { throw error }
        session.machine = machine
        return session
    }

    /// The second half: after the accessor, the machine's `did…` messages, reacquirers
    /// and release.
    func finish(_ session: CoordinationSession, accessorRan: Bool) async {
        var machine = session.machine
        let next = machine.handle(.accessorEnded(ran: accessorRan, moved: session.context.movedPresenters,
                                                 deferred: session.context.takeDeferred()))
        _ = await drive(&machine, from: next, session)
    }

    /// Carries out `machine`'s actions from `action` until the accessor may run or the
    /// coordination ends; returns the error it ended with.
    private func drive(_ machine: inout CoordinationMachine, from action: CoordinationMachine.Action,
                       _ session: CoordinationSession) async -> (any Error)? {
        var action = action
        while true {
            switch action {
            case .takeClaims(let claims):
                let intents = zip(machine.items, session.intents).map { ($0.path, $1) }
                do {
                    let (id, waited) = try await acquire(claims, path: machine.items.first?.path, intents: intents,
                                                         since: session.cancellations)
                    action = machine.handle(.granted(id, current: waited ? center.claims(of: id).map(\.path) : nil))
                } catch {
                    action = machine.handle(.failed(error))
                }
            case .updateIntents(let paths):
                for (intent, path) in zip(session.intents, paths) { intent.update(path.fileURL) }
                action = machine.handle(.done)
            case .lookUpPresenters(let accesses):
                let found = accesses.map { center.presenters(for: $0.path, subtree: $0.subtree, excluding: nil) }
                action = machine.handle(.presenters(found, silent: UnansweredPresenters.current?.outcomes ?? [:],
                                                    prepared: PreparedBatch.current?.presenters ?? []))
            case .ask(let steps):
                // Until every presenter answered, ``cancel()`` ends the asking (at once if it
                // came since the coordination began).
                let ending = CancelSignal()
                let key = asking.withLock { asking in
                    defer { asking.next += 1 }
                    asking.signals[asking.next] = ending
                    return asking.next
                }
                if cancellations.load(ordering: .relaxed) != session.cancellations {
                    ending.fire(FileCoordinationError.coordinatorCancelled(path: machine.items.first?.path))
                }
                // Meanwhile its claims stand aside for the coordinators of the presenters
                // of this process it asks: one saving through its own writes while this waits.
                let yielding = Set(steps.filter { $0.entry.endpoint.isRegisteredHere }.map { Self.purpose(of: $0.entry.presenter) })
                if let request = machine.request, !yielding.isEmpty { center.yield(request, to: yielding) }
                let answers = await ask(steps, ending: ending)
                if let request = machine.request, !yielding.isEmpty { center.yield(request, to: []) }
                asking.withLock { _ = $0.signals.removeValue(forKey: key) }
                action = machine.handle(.answered(answers))
            case .checkExistence(let paths):
                do {
                    var answers: [Bool] = []
                    for path in paths { answers.append(try await Self.exists(path)) }
                    action = machine.handle(.existence(answers))
                } catch {
                    action = machine.handle(.failed(error))
                }
            case .suppress(let pairs):
                for (presenter, path) in pairs {
                    if let watch = center.watch(of: presenter) { session.suppress(watch, watch.beginSuppressing(path)) }
                }
                action = machine.handle(.done)
            case .checkCancellation:
                let cancelled: CoordinationMachine.Cancellation? = Task.isCancelled ? .task
                    : cancellations.load(ordering: .relaxed) != session.cancellations ? .coordinator : nil
                action = machine.handle(.cancellation(cancelled))
            case .runAccessor:
                return nil
            case .checkExistenceAfter(let paths):
                var answers: [Bool] = []
                for path in paths { answers.append(await FileSystemQueries.existsToCompletion(path)) }
                action = machine.handle(.existence(answers))
            case .endSuppressing:
                for (watch, token) in session.suppressions { await watch.endSuppressing(token) }
                session.suppressions = []
                action = machine.handle(.done)
            case .tell(let messages):
                await deliver(messages)
                action = machine.handle(.done)
            case .giveBack(let reacquirers):
                await runReacquirers(reacquirers)
                action = machine.handle(.done)
            case .release(let id):
                // Once every message posted to other processes' presenters (a `reacquire`
                // above all) is written: none may reach its presenter after another
                // coordination's request for the same item.
                await center.messagesWritten()
                center.release(id)
                action = machine.handle(.done)
            case .end(let error):
                return error
            }
        }
    }

    /// The items as claimed: canonical paths, a symbolic link resolved where asked, and
    /// whether a delete, move or replace covers a directory's subtree.
    private func resolve(_ requests: [ItemRequest], claimPath resolved: FilePath?) async throws -> [CoordinationMachine.Item] {
        var items: [CoordinationMachine.Item] = []
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
            var url = request.url
            switch request {
            case .reading(_, let options):
                if options.contains(.resolvesSymbolicLink) {
                    path = try await Self.resolveLink(path)
                    url = path.fileURL
                }
            case .writing(_, let options):
                if !options.isDisjoint(with: [.forDeleting, .forMoving, .forReplacing]) {
                    subtree = try await Self.isDirectory(path)
                }
            }
            items.append(.init(path: path, request: request, url: url, subtree: subtree))
        }
        return items
    }

    // MARK: File-system questions (on the I/O threads)

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
            await finish(session, accessorRan: false)
            throw error
        }
        await finish(session, accessorRan: true)
        return snapshots
    }
}

extension FileCoordinationError {
    /// An accessor's claims stopped holding while it ran.
    static func claimsLost(path: FilePath?) -> FileCoordinationError {
        FileCoordinationError(.coordinate, code: .claimLost, path: path, message: "the claims stopped holding while the accessor ran (the process's etcd lease was lost); another process may have been granted them")
    }

    /// A coordination ended by ``FileCoordinator/cancel()``.
    package static func coordinatorCancelled(path: FilePath? = nil) -> FileCoordinationError {
        FileCoordinationError(.coordinate, code: .cancelled, path: path, message: "the coordinator was cancelled")
    }
}

/// The fencing token of the claims held by the accessor running in this task.
enum FencingContext {
    @TaskLocal static var token: Int64?
}
