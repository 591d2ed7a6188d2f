import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Reads many files in parallel and delivers each one's content, or its error, as an
/// element of an asynchronous sequence.
///
/// ```swift
/// for try await file in FileBatchReader(urls: urls, options: .init(concurrency: 16)) {
///     switch file.result {
///     case .success(let data): index(data, from: file.url)
///     case .failure(let error): print(error)   // one bad file never stops the batch
///     }
/// }
/// ```
///
/// Reading starts with the first call to `next()`. At most
/// ``BatchReadOptions/concurrency`` files are open at once, so a batch of 10,000 files
/// runs under `ulimit -n 64`; a worker that still meets `EMFILE` waits for a descriptor
/// to free up while others are open. Reading stays a bounded distance ahead of the
/// consumer. When no result is ready, `next()` reads the next few files itself where no
/// step waits for a device, a server or a daemon (opened from the kernel's lookup cache
/// on a local disk's file system, copied from the page cache, up to 1 MiB each) instead
/// of waiting for a worker. Cancelling the consuming task (or dropping the iterator)
/// stops the batch: `next()` throws `CancellationError` once every file still being read
/// is closed.
public struct FileBatchReader: AsyncSequence, Sendable {
    public typealias Element = BatchReadResult

    /// The files of a batch as they were given: the caller's array itself (other sequences
    /// are copied into one), each file converted by the worker that reads it, so that
    /// taking an array costs nothing up front (making an array of per-file values took
    /// about 0.1 us a file, on the caller's task before any reading started).
    enum Inputs: Sendable {
        case paths([FilePath])
        /// Converted to a path by the worker that reads it (in parallel, not up front).
        case urls([URL])

        var count: Int {
            switch self {
            case .paths(let paths): paths.count
            case .urls(let urls): urls.count
            }
        }

        /// File `index` as a path in bytes (no `FilePath` made for a URL), or the reason
        /// there is none.
        subscript(index: Int) -> PlatformResolved {
            switch self {
            case .paths(let paths): return .path(PlatformPath(paths[index]))
            case .urls(let urls):
                do throws(FileCoordinationError) {
                    return .path(try PlatformPath(fileURL: urls[index]))
                } catch {
                    return .invalid(FilePath(urls[index].absoluteString), error)
                }
            }
        }

        /// How many consecutive files a worker claims at once without a gate: a few, when
        /// there are enough files for every worker to get many groups, since each claim
        /// moves the shared cursor's cache line between cores (measured in place: claiming
        /// one file at a time spent most of the batch's own time per file waiting for that
        /// line); else one.
        func ungatedClaim(workers: Int) -> Int {
            count >= 64 * workers ? 4 : 1
        }

        /// File `index` as a path, or the reason there is none.
        func resolved(_ index: Int) -> Resolved {
            switch self[index] {
            case .path(let path): .path(path.filePath)
            case .invalid(let path, let error): .invalid(path, error)
            }
        }
    }

    /// An input ready to read in place: its path (as bytes, when it came as a URL), or
    /// why it has none.
    enum PlatformResolved: Sendable {
        case path(PlatformPath)
        case invalid(FilePath, FileCoordinationError)
    }

    /// An input ready to read: its path, or why it has none.
    enum Resolved: Sendable {
        case path(FilePath)
        case invalid(FilePath, FileCoordinationError)
    }

    let inputs: Inputs
    /// How the batch reads.
    public let options: BatchReadOptions

    /// A batch over file-system paths.
    public init(paths: some Sequence<FilePath>, options: BatchReadOptions = BatchReadOptions()) {
        inputs = .paths(Array(paths))
        self.options = options
    }

    /// A batch over `file:` URLs; a URL that is not one becomes that element's error.
    public init(urls: some Sequence<URL>, options: BatchReadOptions = BatchReadOptions()) {
        inputs = .urls(Array(urls))
        self.options = options
    }

    /// The number of files in the batch.
    public var count: Int { inputs.count }

    /// Starts nothing yet: reading begins with the iterator's first `next()`.
    public func makeAsyncIterator() -> Iterator {
        Iterator(storage: BatchStorage(inputs: inputs, options: options, gate: nil))
    }

    /// An iterator whose workers ask `gate` before each file (the thread-pool engine
    /// only). A file the gate refuses is not read: its result is a failure with code
    /// ``FileCoordinationError/Code/cancelled``, which the gate's owner replaces.
        package func makeAsyncIterator(gate: any InPlaceGate) -> Iterator {
        Iterator(storage: BatchStorage(inputs: inputs, options: options, gate: gate))
    }

    /// Delivers results; dropping it cancels the files not yet read.
    public final class Iterator: AsyncIteratorProtocol {
        let storage: BatchStorage
        /// Results taken from the workers and not yet returned (from `localIndex` on).
        /// Each is moved out with `take()`: copying a result costs reference count
        /// operations on memory another thread wrote, which measured a tenth of the
        /// sequence's time.
        private var local: [BatchReadResult?] = []
        private var localIndex = 0
        /// Reads files while `next()` would wait (see `BatchStorage.readOnConsumer`).
        private let cachedReads = CachedWholeFileReader()

        init(storage: BatchStorage) {
            self.storage = storage
        }

        /// How many files the consumer read itself so far (for tests).
                package var filesReadByConsumer: Int { storage.filesReadByConsumer }

        deinit {
            storage.cancel()
        }

        /// The next result in the batch's order; nil at the end. Throws `CancellationError`
        /// once the task is cancelled and every file being read is closed.
        public func next() async throws -> BatchReadResult? {
            try await next(isolation: nil)
        }

        /// The next result, delivered on the caller's actor: taking an already-read
        /// result costs no executor hop, and a consumer on the main actor stays there.
        public func next(isolation actor: isolated (any Actor)?) async throws -> BatchReadResult? {
            if localIndex < local.count {
                defer { localIndex += 1 }
                return local[localIndex].take()
            }
            while true {
                // (A batch cancelled before, when the iterator is used from another task
                // since, stays cancelled: it would otherwise wait for results forever.)
                if Task.isCancelled || storage.isCancelled {
                    cachedReads.close()
                    storage.cancel()
                    await storage.waitUntilStopped()
                    throw CancellationError()
                }
                switch storage.take() {
                case .results(let results):
                    local = results
                    localIndex = 1
                    return local[0].take()
                case .finished:
                    cachedReads.close()
                    return nil
                case .pending:
                    if storage.readOnConsumer(cachedReads) {
                        // A consumer that never has to wait must still let others run.
                        if CachedWholeFileReader.shouldYield() { await Task.yield() }
                        continue
                    }
                    await withTaskCancellationHandler {
                        await storage.waitForResults()
                    } onCancel: { [storage] in
                        storage.cancel()
                    }
                }
            }
        }
    }
}
