import AsyncFileIO
import Dispatch
import Foundation
import Synchronization

extension FileCoordinator {
    // MARK: Blocking variants (Apple's shape, for code outside async contexts)
    //
    // Named `coordinateBlocking` rather than `coordinate`: with a trailing closure the
    // `byAccessor:` label disappears, and Swift would pick the blocking overload for any
    // synchronous accessor, even in async code.

    /// Reads an item under a coordinated read claim, **blocking the calling thread**
    /// until the claim is granted and the presenters have answered.
    ///
    /// For code that cannot `await` (a C callback, a synchronous API). Never call it from
    /// a Swift concurrency task or the main actor: it blocks the thread it runs on, and the
    /// claims it waits for are granted by tasks that need those threads. Errors are thrown
    /// where Apple's API would fill an `NSError` pointer.
    @available(*, noasync, message: "blocks the calling thread; use coordinate(readingItemAt:options:_:)")
    public func coordinateBlocking(readingItemAt url: URL, options: ReadingOptions = [], byAccessor reader: (URL) throws -> Void) throws {
        try blocking([.reading(url, options)]) { try reader($0[0]) }
    }

    /// Writes an item under a coordinated write claim, **blocking the calling thread**.
    /// See ``coordinateBlocking(readingItemAt:options:byAccessor:)`` for when this may be used.
    @available(*, noasync, message: "blocks the calling thread; use coordinate(writingItemAt:options:_:)")
    public func coordinateBlocking(writingItemAt url: URL, options: WritingOptions = [], byAccessor writer: (URL) throws -> Void) throws {
        try blocking([.writing(url, options)]) { try writer($0[0]) }
    }

    /// Reads one item and writes another, **blocking the calling thread**.
    @available(*, noasync, message: "blocks the calling thread")
    public func coordinateBlocking(
        readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [],
        writingItemAt writingURL: URL, options writingOptions: WritingOptions = [],
        byAccessor accessor: (URL, URL) throws -> Void
    ) throws {
        try blocking([.reading(readingURL, readingOptions), .writing(writingURL, writingOptions)]) { try accessor($0[0], $0[1]) }
    }

    /// Writes two items, **blocking the calling thread**.
    @available(*, noasync, message: "blocks the calling thread")
    public func coordinateBlocking(
        writingItemAt url1: URL, options options1: WritingOptions = [],
        writingItemAt url2: URL, options options2: WritingOptions = [],
        byAccessor accessor: (URL, URL) throws -> Void
    ) throws {
        try blocking([.writing(url1, options1), .writing(url2, options2)]) { try accessor($0[0], $0[1]) }
    }

    private func blocking(_ requests: [ItemRequest], _ body: ([URL]) throws -> Void) throws {
        let session = try Self.wait { try await self.begin(requests) }
        if Self.allForUploading(requests) {
            let snapshots = try Self.wait { try await self.takeSnapshots(session) }
            defer { FileSystemQueries.removeSnapshots(snapshots) }
            return try body(snapshots.map(\.fileURL))
        }
        var failure: (any Error)?
        do {
            // A writer's accessor may report a move (``itemBlocking(at:didMoveTo:)``): its
            // context is bound on this thread, where the accessor runs.
            if session.items.contains(where: \.isWrite) {
                try CoordinationContext.$current.withValue(session.context) { try body(session.urls) }
            } else {
                try body(session.urls)
            }
        } catch { failure = error }
        // Claims that can stop holding (an etcd space's): checked after the accessor, as
        // the async forms do (with no task to cancel while it runs).
        if failure == nil, let transport = center.transport, transport.fencesClaims, let request = session.request,
           try Self.wait({ await transport.accessorEnds(request.raw) }) == false {
            failure = FileCoordinationError.claimsLost(path: session.items.first?.path)
        }
        // It ran, to its end or not: its presenters are told as after any write.
        _ = try? Self.wait { await self.finish(session, accessorRan: true) }
        if let failure { throw failure }
    }

    /// Runs `operation` in a task and blocks the calling thread until it ends. The task
    /// runs on the library's I/O threads, not the cooperative pool: callers that block
    /// pool threads (ported code calls `NSFileCoordinator` from tasks) would otherwise
    /// leave it no thread to run on once they are as many as the pool's threads.
    private static func wait<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let result = Locked<Result<T, any Error>?>(nil)
        Task(executorPreference: ioThreadTaskExecutor) {
            let outcome = await BlockingCaller.$isWaiting.withValue(true) { await Result(catching: operation) }
            result.withLock { $0 = outcome }
            done.signal()
        }
        done.wait()
        return try result.withLock { $0! }.get()
    }

    /// Reports, inside an accessor that cannot await (a blocking or queue-based one), that
    /// the item at `oldURL` moved to `newURL`, **blocking the calling thread** until the
    /// move is recorded: ``item(at:didMoveTo:)`` for synchronous code. Inside this
    /// coordinator's accessor the presenters hear of it after the accessor returns;
    /// outside one, before this returns.
    @available(*, noasync, message: "blocks the calling thread; use item(at:didMoveTo:)")
    public func itemBlocking(at oldURL: URL, didMoveTo newURL: URL) {
        let context = CoordinationContext.current
        _ = try? Self.wait { await self.reportMove(from: oldURL, to: newURL, context: context) }
    }

    // MARK: Intents on a queue

    /// Coordinates every intent at once, then runs `accessor` on `queue` (Apple's
    /// `coordinate(with:queue:byAccessor:)`).
    ///
    /// Returns at once: the wait for claims and presenters never blocks the caller.
    /// `accessor` gets nil, or the error that prevented the coordination (it then must
    /// not touch the items). Inside it, each intent's ``FileAccessIntent/url`` is where
    /// the item is now. The claims are held until `accessor` returns.
    public func coordinate(with intents: [FileAccessIntent], queue: DispatchQueue,
                           byAccessor accessor: @escaping @Sendable ((any Error)?) -> Void) {
        schedule(intents, run: { work, _ in queue.async(execute: work) }, accessor)
    }

    /// Coordinates every intent at once, then runs `accessor` on `queue`; see
    /// ``coordinate(with:queue:byAccessor:)-(_,DispatchQueue,_)``. If the queue drops the operation
    /// (`cancelAllOperations`) the accessor is not called and the claims are released.
    public func coordinate(with intents: [FileAccessIntent], queue: OperationQueue,
                           byAccessor accessor: @escaping @Sendable ((any Error)?) -> Void) {
        schedule(intents, run: { work, dropped in
            let operation = BlockOperation(block: work)
            operation.completionBlock = { [weak operation] in
                if operation?.isCancelled == true { dropped() }
            }
            queue.addOperation(operation)
        }, accessor)
    }

    /// Waits for the claims, then hands the accessor to `run` (with what to do if the
    /// queue drops it), then finishes the coordination once the accessor has run.
    private func schedule(_ intents: [FileAccessIntent],
                          run: @escaping @Sendable (_ work: @escaping @Sendable () -> Void, _ dropped: @escaping @Sendable () -> Void) -> Void,
                          _ accessor: @escaping @Sendable ((any Error)?) -> Void) {
        let requests = intents.map(ItemRequest.init)
        Task {
            let session: CoordinationSession
            do {
                session = try await self.begin(requests, intents: intents)
            } catch {
                run({ accessor(error) }, {})
                return
            }
            if Self.allForUploading(requests) {
                // The intents name the snapshots, which the accessor may keep using while
                // writers go on; they are removed once it has run.
                let snapshots: [FilePath]
                do {
                    snapshots = try await self.takeSnapshots(session)
                } catch {
                    run({ accessor(error) }, {})
                    return
                }
                for (intent, snapshot) in zip(intents, snapshots) { intent.update(snapshot.fileURL) }
                run({
                    accessor(nil)
                    FileSystemQueries.removeSnapshots(snapshots)
                }, { FileSystemQueries.removeSnapshots(snapshots) })
                return
            }
            let ran = await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let once = Locked(false)
                let resume: @Sendable (Bool) -> Void = { value in
                    if once.withLock({ done in defer { done = true }; return !done }) { continuation.resume(returning: value) }
                }
                run({
                    CoordinationContext.$current.withValue(session.context) { accessor(nil) }
                    resume(true)
                }, { resume(false) })
            }
            await self.finish(session, accessorRan: ran)
        }
    }

    // MARK: Batches

    /// Prepares a batch of coordinated accesses (Apple's `prepare(forReadingItemsAt:…)`):
    /// the presenters of all the items are asked to relinquish and save once, up front;
    /// the coordinations made inside `batchAccessor` then do not ask them again (they
    /// still take their claims, and writers still send `did…` messages). The presenters'
    /// reacquirers run when `batchAccessor` returns or calls its completion handler,
    /// whichever comes first.
    public func prepare(
        forReadingItemsAt readingURLs: [URL], options readingOptions: ReadingOptions = [],
        writingItemsAt writingURLs: [URL], options writingOptions: WritingOptions = [],
        isolation: isolated (any Actor)? = #isolation,
        byAccessor batchAccessor: (_ completionHandler: @escaping @Sendable () -> Void) async throws -> Void
    ) async throws {
        let (prepared, finish) = try await prepareBatch(readingURLs, readingOptions, writingURLs, writingOptions)
        do {
            try await PreparedBatch.$current.withValue(prepared) {
                try await batchAccessor { Task { await finish() } }
            }
        } catch {
            await finish()
            throw error
        }
        await finish()
    }

    /// ``prepare(forReadingItemsAt:options:writingItemsAt:options:isolation:byAccessor:)``
    /// for code that cannot await, **blocking the calling thread** while the presenters
    /// are asked and again while their reacquirers run; `batchAccessor` runs on the
    /// calling thread, and the blocking coordinations made inside it belong to the batch.
    @available(*, noasync, message: "blocks the calling thread; use prepare(forReadingItemsAt:options:writingItemsAt:options:byAccessor:)")
    public func prepareBlocking(
        forReadingItemsAt readingURLs: [URL], options readingOptions: ReadingOptions = [],
        writingItemsAt writingURLs: [URL], options writingOptions: WritingOptions = [],
        byAccessor batchAccessor: (_ completionHandler: @escaping @Sendable () -> Void) throws -> Void
    ) throws {
        let (prepared, finish) = try Self.wait { try await self.prepareBatch(readingURLs, readingOptions, writingURLs, writingOptions) }
        // Bound on this thread: the tasks of the coordinations made inside inherit it.
        let outcome = Result { try PreparedBatch.$current.withValue(prepared) { try batchAccessor { Task { await finish() } } } }
        _ = try? Self.wait { await finish() }
        try outcome.get()
    }

    /// Asks the presenters of every item once; gives the batch (whose coordinations skip
    /// them) and what ends it (their reacquirers, once).
    private func prepareBatch(
        _ readingURLs: [URL], _ readingOptions: ReadingOptions, _ writingURLs: [URL], _ writingOptions: WritingOptions
    ) async throws -> (PreparedBatch, @Sendable () async -> Void) {
        var items: [CoordinationMachine.Item] = []
        for url in readingURLs {
            items.append(.init(path: await CanonicalPaths.canonical(try Self.normalizedPath(url), followingLast: true),
                               request: .reading(url, readingOptions), url: url, subtree: false))
        }
        for url in writingURLs {
            let followingLast = writingOptions.isDisjoint(with: [.forDeleting, .forMoving, .forReplacing])
            items.append(.init(path: await CanonicalPaths.canonical(try Self.normalizedPath(url), followingLast: followingLast),
                               request: .writing(url, writingOptions), url: url, subtree: false))
        }
        let reacquirers = try await messageBefore(items)
        // Run once, by the first of the completion handler and the accessor's return; every
        // caller waits for that run: `prepare` returns only once the presenters have their
        // items back.
        let ending = Locked<Task<Void, Never>?>(nil)
        let finish: @Sendable () async -> Void = { [self] in
            let run = ending.withLock { ending in
                if let ending { return ending }
                let run = Task {
                    await runReacquirers(reacquirers)
                    // A reacquirer of another process's presenter is posted: written by now.
                    await center.messagesWritten()
                }
                ending = run
                return run
            }
            await run.value
        }
        let prepared = PreparedBatch(presenters: Set(reacquirers.map(\.0.id)).union(
            items.flatMap { item in
                let concerned = center.presenters(for: item.path, subtree: false, excluding: filePresenter.map(ObjectIdentifier.init))
                return (concerned.item + concerned.containers).map(\.id)
            }))
        return (prepared, finish)
    }
}

/// Whether the current coordination runs for a blocking form: its caller may hold a thread
/// of the cooperative pool, and all of them may be held so. The tasks such a coordination
/// starts (a presenter's callback, its timer) then run on the library's I/O threads too.
enum BlockingCaller {
    @TaskLocal static var isWaiting = false

    /// Where a task the current coordination starts runs: nil, the default executor,
    /// unless it runs for a blocking form.
    static var executor: (any TaskExecutor)? { isWaiting ? ioThreadTaskExecutor : nil }
}
