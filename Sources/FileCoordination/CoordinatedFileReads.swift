import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage

/// The results of ``FileCoordinator/readFiles(at:options:batchOptions:window:)-([URL],_,_,_)``.
public struct CoordinatedFileReads: AsyncSequence, Sendable {
    public typealias Element = BatchReadResult

    /// The files, as given.
    enum Files: Sendable {
        case urls([URL])
        case paths([FilePath])
    }

    let coordinator: FileCoordinator
    let files: Files
    let options: FileCoordinator.ReadingOptions
    let batchOptions: BatchReadOptions
    let window: Int

    /// Reads the files in place, under read claims taken by the workers: each file's bytes
    /// go to `body` on the I/O thread that read them, as `FileBatchReader.forEachFile(perWorker:_:)`
    /// does (indices are positions in the whole list). Returns the workers' values, to
    /// combine.
    ///
    /// A worker takes one claim for a group of consecutive files (32) when nothing stands
    /// in the way of any: no presenter of them (or of a directory containing them) in any
    /// process, no conflicting claim here or in another process; otherwise it claims them
    /// one by one. A claim lasts while its files are read and `body` runs. The other files (and every file when `options` ask for more than a plain
    /// read) are read afterwards through the full coordination, in windows as the
    /// sequence reads them: presenters are asked, conflicting claims waited for.
    public func forEachFile<Partial: Sendable>(
        perWorker initial: Partial, _ body: @escaping @Sendable (inout Partial, BatchFileContents) -> Void
    ) async throws -> [Partial] {
        var partials: [Partial] = []
        var remaining = Array(0 ..< count)
        let unanswered = UnansweredPresenters()
        // A plain read (no snapshot, no link to resolve) on the thread-pool engine.
        if readsOnWorkers {
            let gate = try await workersGate()
            // Workers that take claims share the process's claim tables: past two per core
            // they mostly wait for each other (measured: 16 workers read 4x slower than 4;
            // with claims for 32 files at a time, 3 per core were 20% slower than 2).
            var workers = batchOptions
            workers.concurrency = Swift.min(workers.concurrency, 2 * ProcessInfo.processInfo.activeProcessorCount)
            partials = try await batch(workers).forEachFile(perWorker: initial, gate: gate, body)
            remaining = gate.skipped.sorted()
        }
        var start = 0
        // A window made of the files of a failed window that were free: it is not split again.
        var retryWindow: [Int]?
        while start < remaining.count || retryWindow != nil {
            let positions: [Int]
            if let retry = retryWindow {
                positions = retry
            } else {
                let count = try await windowCount(remaining[start...].lazy.map(url))
                positions = Array(remaining[start ..< start + count])
                start += positions.count
            }
            let retrying = retryWindow != nil
            retryWindow = nil
            let session: CoordinationSession, current: [URL]
            do {
                (session, current) = try await claimWindow(positions.map(url), unanswered: unanswered)
            } catch {
                guard let failure = Self.failureOfItsFiles(error) else { throw error }
                let free = retrying ? [] : await claimableNow(positions, after: failure)
                if !free.isEmpty { retryWindow = free }
                let failed = positions.filter { !free.contains($0) }
                partials.append(await reportFailures(failed, failure, initial, body))
                continue
            }
            do {
                partials += try await FileBatchReader(urls: current, options: batchOptions).forEachFile(perWorker: initial) { partial, file in
                    body(&partial, BatchFileContents(index: positions[file.index], platformPath: file.platformPath, bytes: file.bytes))
                }
            } catch {
                await coordinator.finish(session, accessorRan: true)
                throw error
            }
            await coordinator.finish(session, accessorRan: true)
        }
        return partials
    }

    /// Whether the workers may take the claims: a plain read (no snapshot, no link to
    /// resolve) on the thread-pool engine.
    private var readsOnWorkers: Bool {
        options.isDisjoint(with: [.forUploading, .resolvesSymbolicLink]) && batchOptions.engine == .threadPool
    }

    /// The uncoordinated batch over the files.
    private func batch(_ options: BatchReadOptions) -> FileBatchReader {
        switch files {
        case .urls(let urls): FileBatchReader(urls: urls, options: options)
        case .paths(let paths): FileBatchReader(paths: paths, options: options)
        }
    }

    /// How many files there are.
    var count: Int {
        switch files {
        case .urls(let urls): urls.count
        case .paths(let paths): paths.count
        }
    }

    /// The `index`th file's URL (a path's is made when asked: the windows ask, the workers
    /// reading in place do not).
    fileprivate func url(_ index: Int) -> URL {
        switch files {
        case .urls(let urls): urls[index]
        case .paths(let paths): paths[index].fileURL
        }
    }

    /// The `index`th file's path, for a result that reports its failure.
    fileprivate func platformPath(_ index: Int) -> PlatformPath {
        switch files {
        case .urls(let urls): (try? PlatformPath(fileURL: urls[index])) ?? PlatformPath(FilePath(urls[index].absoluteString))
        case .paths(let paths): PlatformPath(paths[index])
        }
    }

    /// The error to report for the files of a window whose coordination failed: a
    /// conflicting claim or a presenter that timed out, or a presenter that refused. The
    /// batch reports it for those files and reads the others. Nil for anything else
    /// (cancellation, a space that cannot be used), which ends the batch.
    fileprivate static func failureOfItsFiles(_ error: any Error) -> FileCoordinationError? {
        guard let error = error as? FileCoordinationError, [.timedOut, .presenterFailed].contains(error.code) else { return nil }
        return error
    }

    /// The files of a window whose claim waited past the claim timeout that could be
    /// claimed right now (checked without waiting): claimed again together, once, they are
    /// read, and only the others fail. None when a presenter failed or refused: the whole
    /// window fails, so that a presenter is not asked again for each of its files.
    fileprivate func claimableNow(_ positions: [Int], after failure: FileCoordinationError) async -> [Int] {
        guard failure.code == .timedOut, failure.operation == "coordinate" else { return [] }
        let center = coordinator.center, purpose = coordinator.purposeIdentifier
        let paths = positions.map { position in (try? PlatformPath(fileURL: url(position))).map(FileCoordinator.normalizedBytes) }
        // The kernel claims may open shard files, and canonical paths may need the file
        // system: on an I/O thread.
        return (try? await runOnIOThread {
            zip(positions, paths).compactMap { position, path -> Int? in
                guard let path else { return nil }
                let key = PathKey(CanonicalPaths.canonicalNow(path, followingLast: true))
                guard let id = center.tryAcquireNow([CoordinationRules.Claim(key: key, access: .reading)], purpose: purpose,
                                                    openingShards: true) else { return nil }
                center.release(id)
                return position
            }
        }) ?? []
    }

    /// Hands `body` a failed result for each of `positions`, on an I/O thread as for
    /// the files read (one partial for them all).
    fileprivate func reportFailures<Partial: Sendable>(
        _ positions: [Int], _ failure: FileCoordinationError, _ initial: Partial,
        _ body: @escaping @Sendable (inout Partial, BatchFileContents) -> Void
    ) async -> Partial {
        let paths = positions.map(platformPath)
        return (try? await runOnIOThread {
            var partial = initial
            for (position, path) in zip(positions, paths) {
                body(&partial, BatchFileContents(index: position, platformPath: path, bytes: .failure(failure.naming(path))))
            }
            return partial
        }) ?? initial
    }

    /// The gate through which the workers claim their files. Joins the space (if the
    /// process coordinates across processes) and opens every claim shard; when the process
    /// may not keep them all open (a low descriptor limit), the workers open the shards
    /// their claims need, and a group of files needing more than it may keep is claimed
    /// file by file.
    private func workersGate() async throws -> ClaimGate {
        try await coordinator.center.prepareSpace()
        let transport = coordinator.center.transport
        let everyShard = try await transport?.prepareForBatch() ?? true
        return ClaimGate(center: coordinator.center, purpose: coordinator.purposeIdentifier, openingShards: !everyShard,
                         admitsWithoutBlocking: everyShard && transport?.takesClaimsForBatch != false)
    }

    /// How many of `urls`, from the first, the next window takes: `window`, or as many as
    /// one claim can cover when the process may keep only a few claim shards open.
    fileprivate func windowCount(_ urls: some Collection<URL>) async throws -> Int {
        let count = Swift.min(window, urls.count)
        try await coordinator.center.prepareSpace()
        guard let transport = coordinator.center.transport else { return count }
        return transport.readsFitting(urls.prefix(count).lazy.map { url in
            (try? PlatformPath(fileURL: url)).map(FileCoordinator.normalizedBytes) ?? []
        }) ?? count
    }

    /// Takes one read claim for a window of files and messages their presenters; returns
    /// the session and the URLs to read (they change for files that moved meanwhile).
    /// URLs that are not file URLs take no claim: the batch reports them.
    /// `unanswered`: the presenters that did not answer in time earlier in the same batch,
    /// not asked again.
    fileprivate func claimWindow(_ slice: [URL], unanswered: UnansweredPresenters) async throws -> (CoordinationSession, [URL]) {
        let coordinated = slice.enumerated().filter { $0.element.isFileURL }
        let session = try await UnansweredPresenters.$current.withValue(unanswered) {
            try await coordinator.begin(coordinated.map { ItemRequest.reading($0.element, options) })
        }
        var current = slice
        for (position, url) in zip(coordinated.map { $0.offset }, session.urls) { current[position] = url }
        return (session, current)
    }

    /// ``forEachFile(perWorker:_:)`` without values of its own.
    public func forEachFile(_ body: @escaping @Sendable (BatchFileContents) -> Void) async throws {
        _ = try await forEachFile(perWorker: ()) { _, file in body(file) }
    }

    /// An iterator; reading starts with its first `next()`.
    public func makeAsyncIterator() -> Iterator {
        Iterator(owner: self)
    }

    /// Delivers each file's result in the order given.
    ///
    /// For a plain read, one batch reads every file and its workers take the claims as
    /// they read; the files they skip are claimed and read together, up to a window at a
    /// time, when the consumer reaches the first of them. Otherwise the files go in
    /// windows: one claim covers a window's files, its presenters are messaged once, and
    /// the claim is given back as soon as the consumer moves past the window.
    public final class Iterator: AsyncIteratorProtocol {
        private let owner: CoordinatedFileReads
        private var started = false
        /// Presenters that did not answer in time in an earlier window of this batch.
        private let unanswered = UnansweredPresenters()
        /// Set when the workers take the claims.
        private var gate: ClaimGate?
        /// Files the workers skipped, being read through the full coordination: their
        /// indices, the claim covering them, the read, and results read ahead of their
        /// turn (only when the batch delivers in completion order).
        private var skipped: SkippedWindow?
        /// The iteration threw: it is over.
        private var failed = false
        /// Files whose window's coordination failed, with the error each reports when
        /// the consumer gets there.
        private var failures: [Int: FileCoordinationError] = [:]
        /// Failed results of the current window (the windows path), delivered in order.
        private var failedResults: [BatchReadResult] = []

        private struct SkippedWindow {
            var indices: [Int]
            var left: Int
            let session: CoordinationSession
            let reads: FileBatchReader.Iterator
            var early: [Int: BatchReadResult] = [:]
        }
        private var next = 0
        private var base = 0
        private var session: CoordinationSession?
        private var inner: FileBatchReader.Iterator?

        init(owner: CoordinatedFileReads) {
            self.owner = owner
        }

        /// How many files the consumer read itself, under claims it took (for tests).
        var filesReadByConsumer: Int { inner?.filesReadByConsumer ?? 0 }

        deinit {
            // Abandoned mid-window: the claim must still go.
            for session in [session, skipped?.session].compactMap({ $0 }) {
                Task { [owner] in await owner.coordinator.finish(session, accessorRan: true) }
            }
        }

        /// The next file's result, in the order given; nil at the end.
        public func next() async throws -> BatchReadResult? {
            if !started {
                started = true
                if owner.readsOnWorkers {
                    let gate = try await owner.workersGate()
                    self.gate = gate
                    inner = owner.batch(owner.batchOptions).makeAsyncIterator(gate: gate)
                }
            }
            if let gate { return try await nextClaimedOnWorkers(gate) }
            while true {
                if let inner {
                    do {
                        if let result = try await inner.next() {
                            return BatchReadResult(index: base + result.index, platformPath: result.platformPath, result: result.result)
                        }
                    } catch {
                        await endWindow()
                        throw error
                    }
                }
                await endWindow()
                if !failedResults.isEmpty { return failedResults.removeFirst() }
                guard next < owner.count else { return nil }
                try await beginWindow()
            }
        }

        private func nextClaimedOnWorkers(_ gate: ClaimGate) async throws -> BatchReadResult? {
            guard !failed else { return nil }
            do {
                guard let result = try await inner?.next() else { return nil }
                guard case .failure = result.result else { return result }
                if let failure = failures.removeValue(forKey: result.index) {
                    return BatchReadResult(index: result.index, platformPath: result.platformPath, result: .failure(failure.naming(result.platformPath)))
                }
                if skipped?.indices.contains(result.index) == true { return try await readSkipped(result.index) }
                guard gate.takeSkipped(result.index) else { return result }
                // The workers could not claim it at once: the full coordination, for it and
                // the files after it they skipped so far (one claim, presenters asked once).
                // One window at a time: another skipped file met meanwhile (possible only in
                // completion order) gets a window of its own.
                var indices = skipped == nil
                    ? [result.index] + gate.takeSkipped(after: result.index, limit: owner.window - 1)
                    : [result.index]
                // As many as one claim can cover with the shards the process may keep open
                // (all of them unless its descriptor limit is low); the rest stay skipped.
                let fitting = try await owner.windowCount(indices.lazy.map(owner.url))
                for index in indices.dropFirst(Swift.max(1, fitting)) { gate.skip(index) }
                indices = Array(indices.prefix(Swift.max(1, fitting)))
                var session: CoordinationSession, current: [URL]
                do {
                    (session, current) = try await owner.claimWindow(indices.map(owner.url), unanswered: unanswered)
                } catch {
                    guard let failure = CoordinatedFileReads.failureOfItsFiles(error) else { throw error }
                    // The files free right now are claimed again together, once; the
                    // others (all of them if that fails too) report the failure.
                    let free = await owner.claimableNow(indices, after: failure)
                    for index in indices where !free.contains(index) { failures[index] = failure }
                    do {
                        guard !free.isEmpty else { throw failure }
                        (session, current) = try await owner.claimWindow(free.map(owner.url), unanswered: unanswered)
                        indices = free
                    } catch {
                        guard let again = CoordinatedFileReads.failureOfItsFiles(error) else { throw error }
                        for index in free { failures[index] = again }
                        let failure = failures.removeValue(forKey: result.index) ?? again
                        return BatchReadResult(index: result.index, platformPath: result.platformPath, result: .failure(failure.naming(result.platformPath)))
                    }
                    if let failure = failures.removeValue(forKey: result.index) {
                        // The window of the free files is read as the consumer reaches them.
                        // (Free files besides this one mean a window of several: only
                        // formed when no other window was open.)
                        skipped = SkippedWindow(indices: indices, left: indices.count, session: session,
                                                reads: FileBatchReader(urls: current, options: owner.batchOptions).makeAsyncIterator())
                        return BatchReadResult(index: result.index, platformPath: result.platformPath, result: .failure(failure.naming(result.platformPath)))
                    }
                }
                let window = SkippedWindow(indices: indices, left: indices.count, session: session,
                                           reads: FileBatchReader(urls: current, options: owner.batchOptions).makeAsyncIterator())
                guard skipped == nil else { return try await readAlone(window, result.index) }
                skipped = window
                return try await readSkipped(result.index)
            } catch {
                failed = true
                if let window = skipped {
                    skipped = nil
                    await owner.coordinator.finish(window.session, accessorRan: true)
                }
                throw error
            }
        }

        /// The result of the skipped file at `index` from the current window (read as the
        /// consumer gets there); the window's claim goes with its last file.
        private func readSkipped(_ index: Int) async throws -> BatchReadResult {
            guard var window = skipped else { preconditionFailure("no window of skipped files") }
            var found = window.early.removeValue(forKey: index)
            while found == nil, let read = try await window.reads.next() {
                let result = BatchReadResult(index: window.indices[read.index], platformPath: read.platformPath, result: read.result)
                if result.index == index { found = result } else { window.early[result.index] = result }
            }
            window.left -= 1
            skipped = window
            if window.left == 0 {
                skipped = nil
                await owner.coordinator.finish(window.session, accessorRan: true)
            }
            guard let found else { preconditionFailure("a skipped file's window ended without it") }
            return found
        }

        /// A window of one skipped file, read and released at once.
        private func readAlone(_ window: SkippedWindow, _ index: Int) async throws -> BatchReadResult {
            let read: BatchReadResult?
            do {
                read = try await window.reads.next()
            } catch {
                await owner.coordinator.finish(window.session, accessorRan: true)
                throw error
            }
            await owner.coordinator.finish(window.session, accessorRan: true)
            guard let read else { preconditionFailure("a skipped file's window ended without it") }
            return BatchReadResult(index: index, platformPath: read.platformPath, result: read.result)
        }

        /// Claims the next window and starts reading it. When its coordination fails
        /// (see ``CoordinatedFileReads/failureOfItsFiles(_:)``), each of its files gets
        /// that failure as its result: this path serves reads with options, in windows
        /// whose files cannot be read apart from their claim.
        private func beginWindow() async throws {
            let count = try await owner.windowCount((next ..< owner.count).lazy.map(owner.url))
            let slice = (next ..< next + count).map(owner.url)
            base = next
            next += slice.count
            let session: CoordinationSession, current: [URL]
            do {
                (session, current) = try await owner.claimWindow(slice, unanswered: unanswered)
            } catch {
                guard let failure = CoordinatedFileReads.failureOfItsFiles(error) else { throw error }
                failedResults = (base ..< base + count).map {
                    BatchReadResult(index: $0, platformPath: owner.platformPath($0), result: .failure(failure.naming(owner.platformPath($0))))
                }
                return
            }
            self.session = session
            inner = FileBatchReader(urls: current, options: owner.batchOptions).makeAsyncIterator()
        }

        private func endWindow() async {
            inner = nil
            if let session {
                self.session = nil
                await owner.coordinator.finish(session, accessorRan: true)
            }
        }
    }
}
