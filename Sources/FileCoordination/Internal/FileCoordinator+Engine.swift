@_spi(FileCoordinationInternal) import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// One item of a coordination, as asked.
enum ItemRequest: Sendable {
    case reading(URL, FileCoordinator.ReadingOptions)
    case writing(URL, FileCoordinator.WritingOptions)

    var url: URL {
        switch self {
        case .reading(let url, _), .writing(let url, _): url
        }
    }

    /// The request an intent makes, at the intent's current URL.
    init(_ intent: FileAccessIntent) {
        switch intent.kind {
        case .reading(let options): self = .reading(intent.url, options)
        case .writing(let options): self = .writing(intent.url, options)
        }
    }
}

/// A message to a presenter after an access, delivered once the accessor has returned.
enum PendingMessage: Sendable {
    case didChange(PresenterRegistry.Entry)
    case didMove(PresenterRegistry.Entry, to: FilePath)
    case subitemDidAppear(PresenterRegistry.Entry, FilePath)
    case subitemDidChange(PresenterRegistry.Entry, FilePath)
    case subitemDidMove(PresenterRegistry.Entry, from: FilePath, to: FilePath)
}

/// The coordination an accessor runs in (a task-local): collects the move messages
/// reported with `item(at:didMoveTo:)` until the accessor returns.
final class CoordinationContext: Sendable {
    @TaskLocal static var current: CoordinationContext?

    let coordinator: FileCoordinator
    private let deferred = Locked<[PendingMessage]>([])
    /// Presenters told of a move in this coordination: they hear `didMove`, not `didChange`.
    private let moved = Locked<Set<ObjectIdentifier>>([])

    func recordMoved(_ ids: some Sequence<ObjectIdentifier>) {
        moved.withLock { $0.formUnion(ids) }
    }

    var movedPresenters: Set<ObjectIdentifier> { moved.withLock { $0 } }

    init(coordinator: FileCoordinator) {
        self.coordinator = coordinator
    }

    func `defer`(_ messages: [PendingMessage]) {
        deferred.withLock { $0 += messages }
    }

    func takeDeferred() -> [PendingMessage] {
        deferred.withLock { messages in
            defer { messages.removeAll() }
            return messages
        }
    }
}

/// Presenters already asked to relinquish and save by `prepare(...)`: coordinations
/// inside the batch do not ask them again.
final class PreparedBatch: Sendable {
    @TaskLocal static var current: PreparedBatch?
    let presenters: Set<ObjectIdentifier>
    init(presenters: Set<ObjectIdentifier>) { self.presenters = presenters }
}

/// A coordination between its two halves: claims held, presenters messaged.
final class CoordinationSession: Sendable {
    struct Item: Sendable {
        var path: FilePath
        var request: ItemRequest
        /// The URL to hand the accessor: the caller's own, unless the item moved or a
        /// symbolic link was resolved (then made from `path`).
        var url: URL
        var subtree: Bool
        /// For writes with container presenters: whether the item existed before.
        var existedBefore: Bool?

        var isWrite: Bool { if case .writing = request { true } else { false } }
        var writingOptions: FileCoordinator.WritingOptions {
            if case .writing(_, let options) = request { options } else { [] }
        }
        var readingOptions: FileCoordinator.ReadingOptions {
            if case .reading(_, let options) = request { options } else { [] }
        }
    }

    let request: CoordinationRules.RequestID?
    let items: [Item]
    let reacquirers: [(PresenterRegistry.Entry, FileReacquirer)]
    let context: CoordinationContext
    /// Presenter watches told to drop this write's own inotify events, until `finish`.
    let suppressions: [(PresenterWatch, Int)]

    init(request: CoordinationRules.RequestID?, items: [Item], reacquirers: [(PresenterRegistry.Entry, FileReacquirer)],
         context: CoordinationContext, suppressions: [(PresenterWatch, Int)] = []) {
        self.request = request
        self.items = items
        self.reacquirers = reacquirers
        self.context = context
        self.suppressions = suppressions
    }

    var urls: [URL] { items.map(\.url) }
}

extension FileCoordinator {
    // MARK: The two halves of a coordination

    /// Runs `body` between ``begin(_:intents:)`` and ``finish(_:accessorSucceeded:)``.
    /// `skippingPlain`: the caller found that the plain path (``performPlain(_:path:key:_:)``)
    /// does not apply.
    func perform<T>(
        _ requests: [ItemRequest], intents: [FileAccessIntent] = [], skippingPlain: Bool = false,
        isolation: isolated (any Actor)? = #isolation, _ body: ([URL]) async throws -> T
    ) async throws -> T {
        try await center.prepareSpace()
        if !skippingPlain, requests.count == 1, intents.isEmpty, Self.isPlain(requests[0]) {
            let (path, key) = try await claimPath(requests[0].url, followingLast: true)
            if !center.hasPresenters || !center.hasPresenters(concerning: key) {
                return try await performPlain(requests[0], path: path, key: key) { url in try await body([url]) }
            }
        }
        let session = try await begin(requests, intents: intents)
        if !requests.isEmpty, requests.allSatisfy({ if case .reading(_, let o) = $0 { o.contains(.forUploading) } else { false } }) {
            return try await withSnapshots(session, body)
        }
        let outcome: Result<T, any Error>
        do {
            // Only a writer can report moves; readers skip the task-local.
            if session.items.contains(where: \.isWrite) {
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
        try await center.prepareSpace()
        if Self.isPlain(request) {
            let (path, key) = try await claimPath(request.url, followingLast: true)
            if !center.hasPresenters || !center.hasPresenters(concerning: key) {
                return try await performPlain(request, path: path, key: key, body)
            }
        }
        return try await perform([request], skippingPlain: true) { urls in try await body(urls[0]) }
    }

    /// The path (and its key) that claims and presenters of the item at `url` meet on:
    /// its canonical path (``CanonicalPaths``). `followingLast`: the access acts on what a
    /// symbolic link there points to (a read, a write of content), not on the link.
    func claimPath(_ url: URL, followingLast: Bool,
                   isolation: isolated (any Actor)? = #isolation) async throws(FileCoordinationError) -> (path: FilePath, key: PathKey) {
        let lexical = try itemPath(url).path
        let path = await CanonicalPaths.canonical(lexical, followingLast: followingLast)
        return (path, PathKey(path.platformBytes))
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
        let (id, waited) = try await acquire([claim], path: path)
        defer { center.release(id) }
        if waited && cancellations.load(ordering: .relaxed) != generation {
            throw FileCoordinationError.coordinatorCancelled(path: path)
        }
        var url = request.url
        if waited, let current = center.claims(of: id).first?.path, current != path { url = current.fileURL }
        return try await body(url)
    }

    /// Takes claims, within ``claimTimeout`` (of waiting) when one is set.
    private func acquire(_ claims: [CoordinationRules.Claim], path: FilePath?, intents: [(FilePath, FileAccessIntent)] = [],
                         isolation: isolated (any Actor)? = #isolation
    ) async throws -> (id: CoordinationRules.RequestID, waited: Bool) {
        let (center, purpose, owner) = (center, purposeIdentifier, ObjectIdentifier(self))
        guard let timeout = claimTimeout else {
            return try await center.acquire(claims, purpose: purpose, owner: owner, intents: intents)
        }
        let wait = ClaimWait()
        return try await withThrowingTaskGroup(of: (id: CoordinationRules.RequestID, waited: Bool)?.self) { group in
            group.addTask {
                try await ClaimWait.$current.withValue(wait) {
                    try await center.acquire(claims, purpose: purpose, owner: owner, intents: intents)
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
    /// everything taken is given back (reacquirers run, claims released).
    func begin(_ requests: [ItemRequest], intents: [FileAccessIntent] = []) async throws -> CoordinationSession {
        try await center.prepareSpace()
        var items: [CoordinationSession.Item] = []
        for request in requests {
            // A delete, move or replace acts on the name itself: a link there is the item.
            let followingLast = if case .writing(_, let options) = request {
                options.isDisjoint(with: [.forDeleting, .forMoving, .forReplacing])
            } else { true }
            var path = try await claimPath(request.url, followingLast: followingLast).path
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
            for item in session.items where item.isWrite {
                let options = item.writingOptions
                guard !options.contains(.forDeleting) else { continue }
                var concerned = center.presenters(for: item.path, subtree: false, excluding: exclude)
                concerned.item.removeAll { moved.contains($0.id) }
                if !options.contains(.forMoving) {
                    messages += concerned.item.map { .didChange($0) }
                }
                guard !concerned.containers.isEmpty else { continue }
                let existsAfter = (try? await Self.exists(item.path)) ?? true
                if item.existedBefore == false && existsAfter {
                    messages += concerned.containers.map { .subitemDidAppear($0, item.path) }
                } else if !options.contains(.forMoving) && existsAfter {
                    messages += concerned.containers.map { .subitemDidChange($0, item.path) }
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

    // MARK: Presenters before the access

    /// One presenter's steps, and the purpose they are asked for.
    private struct Plan {
        var steps: PresenterPlan.Steps
        var purpose: String
        var entry: PresenterRegistry.Entry { steps.entry }
        var path: FilePath { steps.path }
        var kind: FileAccessRequest.Kind { steps.kind }
        var save: Bool { steps.save }
        var accommodateDeletion: Bool { steps.accommodateDeletion }
        var subitemDeletions: [FilePath] { steps.subitemDeletions }
    }

    /// Asks every concerned presenter to relinquish (and save, or accommodate a
    /// deletion), all presenters at once, each one's steps in order. Returns their
    /// reacquirers; on any failure runs the ones collected and throws.
    func messageBefore(_ items: [CoordinationSession.Item]) async throws -> [(PresenterRegistry.Entry, FileReacquirer)] {
        let exclude = filePresenter.map(ObjectIdentifier.init)
        let prepared = PreparedBatch.current?.presenters ?? []
        let unanswered = UnansweredPresenters.current
        var known: FileCoordinationError?
        var planned = PresenterPlan()
        for item in items {
            let concerned = center.presenters(for: item.path, subtree: item.subtree, excluding: exclude)
            guard !concerned.isEmpty else { continue }
            planned.add(item.path, item.request, concerned: concerned) { entry in
                guard !prepared.contains(entry.id) else { return false }
                // Silent earlier in the same batch: not asked again.
                if let outcome = unanswered?.outcome(of: entry.id) {
                    if let error = outcome { known = known ?? error }
                    return false
                }
                return true
            }
        }
        if let known { throw known }
        guard !planned.isEmpty else { return [] }
        let plans = planned.steps.map { Plan(steps: $0, purpose: purposeIdentifier) }
        let policy = presenterTimeoutPolicy
        // One presenter (the common case) is asked from this task; several, all at once.
        let outcomes = plans.count == 1 ? [await Result { try await Self.run(plans[0], policy: policy) }]
            : await withTaskGroup(of: (Int, Result<FileReacquirer?, any Error>).self) { group in
            for (index, plan) in plans.enumerated() {
                group.addTask { (index, await Result { try await Self.run(plan, policy: policy) }) }
            }
            var outcomes = [Result<FileReacquirer?, any Error>?](repeating: nil, count: plans.count)
            for await (index, outcome) in group { outcomes[index] = outcome }
            return outcomes.map { $0! }
        }
        var reacquirers: [(PresenterRegistry.Entry, FileReacquirer)] = []
        var failure: (any Error)?
        for (index, outcome) in outcomes.enumerated() {
            switch outcome {
            case .success(let reacquirer?): reacquirers.append((plans[index].entry, reacquirer))
            case .success(nil): break
            case .failure(let error): failure = failure ?? error
            }
        }
        if let failure {
            await runReacquirers(reacquirers)
            throw failure
        }
        return reacquirers
    }

    private static func run(_ plan: Plan, policy: PresenterTimeoutPolicy) async throws -> FileReacquirer? {
        let presenter = plan.entry.presenter
        var reacquirer: FileReacquirer?
        func step<T: Sendable>(_ name: String, late: (@Sendable (T) -> Void)? = nil,
                               _ body: @escaping @Sendable () async throws -> T) async throws -> T? {
            do {
                return try await PresenterMessenger.bounded(policy, name, of: plan.entry, late: late, body)
            } catch {
                throw PresenterMessenger.failure(error, callback: name, entry: plan.entry)
            }
        }
        // A relinquish answered too late still gets its item back.
        let late: @Sendable (FileReacquirer?) -> Void = { reacquirer in
            if let reacquirer { Task { await reacquirer() } }
        }
        // A presenter in another process gets every step in one request: one round trip.
        if let remote = presenter as? RemotePresenter {
            let name = plan.kind == .writing ? "relinquishPresentedItem(toWriter:)" : "relinquishPresentedItem(toReader:)"
            let then: RemotePresenter.FollowUp? = plan.accommodateDeletion ? .accommodateDeletion : plan.save ? .save : nil
            let answer = try await step(name, late: late) {
                try await remote.relinquish(plan.path, kind: plan.kind, purpose: plan.purpose, then: then,
                                            subitemDeletions: plan.subitemDeletions)
            }
            guard case .some(let relinquished) = answer else { return nil }
            return relinquished
        }
        let request = FileAccessRequest(url: plan.path.fileURL, kind: plan.kind, purposeIdentifier: plan.purpose,
                                        processIdentifier: getpid())
        let answer: FileReacquirer??
        switch request.kind {
        case .reading:
            answer = try await step("relinquishPresentedItem(toReader:)", late: late) {
                try await presenter.relinquishPresentedItem(toReader: request)
            }
        case .writing:
            answer = try await step("relinquishPresentedItem(toWriter:)", late: late) {
                try await presenter.relinquishPresentedItem(toWriter: request)
            }
        }
        // A presenter that did not answer in time is not asked anything more: one
        // timeout bounds how long it can delay the access.
        guard case .some(let relinquished) = answer else { return nil }
        reacquirer = relinquished
        do {
            if plan.accommodateDeletion {
                _ = try await step("accommodatePresentedItemDeletion()") { try await presenter.accommodatePresentedItemDeletion() }
            } else if plan.save {
                _ = try await step("savePresentedItemChanges()") { try await presenter.savePresentedItemChanges() }
            }
            for path in plan.subitemDeletions {
                let url = path.fileURL
                _ = try await step("accommodatePresentedSubitemDeletion(at:)") {
                    try await presenter.accommodatePresentedSubitemDeletion(at: url)
                }
            }
        } catch {
            // This presenter relinquished: let it take the item back before failing.
            if let reacquirer { _ = try? await step("reacquirer") { await reacquirer() } }
            throw error
        }
        return reacquirer
    }

    // MARK: Presenters after the access

    func deliver(_ messages: [PendingMessage]) async {
        guard !messages.isEmpty else { return }
        // The change has happened; a slow presenter only delays, never fails it.
        let lenient = PresenterTimeoutPolicy(timeout: presenterTimeoutPolicy.timeout, action: .proceed)
        // One message (the common case) is sent from this task; several, all at once.
        if messages.count == 1 {
            await Self.deliver(messages[0], policy: lenient)
            return
        }
        await withTaskGroup(of: Void.self) { group in
            for message in messages {
                group.addTask { await Self.deliver(message, policy: lenient) }
            }
        }
    }

    private static func deliver(_ message: PendingMessage, policy: PresenterTimeoutPolicy) async {
        let (entry, name, body): (PresenterRegistry.Entry, String, @Sendable () async -> Void)
        switch message {
        case .didChange(let e):
            (entry, name, body) = (e, "presentedItemDidChange()", { await e.presenter.presentedItemDidChange() })
        case .didMove(let e, let path):
            let url = path.fileURL
            (entry, name, body) = (e, "presentedItemDidMove(to:)", { await e.presenter.presentedItemDidMove(to: url) })
        case .subitemDidAppear(let e, let path):
            let url = path.fileURL
            (entry, name, body) = (e, "presentedSubitemDidAppear(at:)", { await e.presenter.presentedSubitemDidAppear(at: url) })
        case .subitemDidChange(let e, let path):
            let url = path.fileURL
            (entry, name, body) = (e, "presentedSubitemDidChange(at:)", { await e.presenter.presentedSubitemDidChange(at: url) })
        case .subitemDidMove(let e, let from, let to):
            let (old, new) = (from.fileURL, to.fileURL)
            (entry, name, body) = (e, "presentedSubitem(at:didMoveTo:)", { await e.presenter.presentedSubitem(at: old, didMoveTo: new) })
        }
        _ = try? await PresenterMessenger.bounded(policy, name, of: entry, body)
    }

    func runReacquirers(_ reacquirers: [(PresenterRegistry.Entry, FileReacquirer)]) async {
        guard !reacquirers.isEmpty else { return }
        let lenient = PresenterTimeoutPolicy(timeout: presenterTimeoutPolicy.timeout, action: .proceed)
        @Sendable func run(_ entry: PresenterRegistry.Entry, _ reacquirer: @escaping FileReacquirer) async {
            _ = try? await PresenterMessenger.bounded(lenient, "reacquirer", of: entry) { await reacquirer() }
        }
        // One (the common case) runs from this task; several, all at once.
        if reacquirers.count == 1 { return await run(reacquirers[0].0, reacquirers[0].1) }
        await withTaskGroup(of: Void.self) { group in
            for (entry, reacquirer) in reacquirers {
                group.addTask { await run(entry, reacquirer) }
            }
        }
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
        let snapshots: [FilePath]
        do {
            snapshots = try await FileSystemQueries.snapshots(of: session.items.map(\.path))
        } catch {
            await finish(session, accessorSucceeded: false)
            throw error
        }
        // The read is the snapshot: presenters get their item back and writers may go on
        // while the accessor uses the copy.
        await finish(session, accessorSucceeded: true)
        defer { FileSystemQueries.removeSnapshots(snapshots) }
        return try await body(snapshots.map(\.fileURL))
    }
}

extension FileCoordinationError {
    /// A coordination ended by ``FileCoordinator/cancel()``.
    static func coordinatorCancelled(path: FilePath? = nil) -> FileCoordinationError {
        FileCoordinationError(code: .cancelled, path: path, operation: "coordinate", message: "the coordinator was cancelled")
    }
}
