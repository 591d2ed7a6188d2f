import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The outcome of reading one file of a ``FileBatchReader``.
public struct BatchReadResult: Sendable {
    /// The file's position in the list the batch was made from.
    public let index: Int
    /// The file's path, with the exact bytes it was given with.
    public let path: FilePath
    /// The file's whole content, or why it could not be read.
    public let result: Result<Data, FileCoordinationError>

    /// The file's `file:` URL.
    public var url: URL { path.fileURL }

    /// The content, or the error that prevented reading it.
    public func get() throws(FileCoordinationError) -> Data { try result.get() }
}

/// How a ``FileBatchReader`` reads.
public struct BatchReadOptions: Sendable {
    /// The order results are delivered in.
    public enum Order: Sendable, Hashable {
        /// The order of the input list.
        case given
        /// As each file finishes, whatever its position.
        case completion
    }

    /// How many files are read at the same time (at most one descriptor each).
    public var concurrency: Int
    /// The order results are delivered in.
    public var order: Order
    /// Files larger than this fail with ``FileCoordinationError/Code/fileTooLarge``.
    public var maximumFileSize: Int
    /// Reading pauses while this many bytes of results wait for the consumer
    /// (back-pressure); at least one file is always let through.
    public var maximumBufferedBytes: Int
    /// The engine that reads the files.
    public var engine: FileIOEngine

    /// Options with the given values; the defaults suit many small files on a local disk.
    public init(concurrency: Int = 16, order: Order = .given, maximumFileSize: Int = .max,
                maximumBufferedBytes: Int = 256 << 20, engine: FileIOEngine = .default) {
        self.concurrency = concurrency
        self.order = order
        self.maximumFileSize = maximumFileSize
        self.maximumBufferedBytes = maximumBufferedBytes
        self.engine = engine
    }
}

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
/// consumer. Cancelling the consuming task (or dropping the iterator) stops the batch:
/// `next()` throws `CancellationError` once every file still being read is closed.
public struct FileBatchReader: AsyncSequence, Sendable {
    public typealias Element = BatchReadResult

    enum Input: Sendable {
        case path(FilePath)
        case invalid(FilePath, FileCoordinationError)
    }

    let inputs: [Input]
    /// How the batch reads.
    public let options: BatchReadOptions

    /// A batch over file-system paths.
    public init(paths: some Sequence<FilePath>, options: BatchReadOptions = BatchReadOptions()) {
        inputs = paths.map { .path($0) }
        self.options = options
    }

    /// A batch over `file:` URLs; a URL that is not one becomes that element's error.
    public init(urls: some Sequence<URL>, options: BatchReadOptions = BatchReadOptions()) {
        inputs = urls.map { url in
            do throws(FileCoordinationError) {
                return .path(try FilePath(fileURL: url))
            } catch {
                return .invalid(FilePath(url.absoluteString), error)
            }
        }
        self.options = options
    }

    /// The number of files in the batch.
    public var count: Int { inputs.count }

    public func makeAsyncIterator() -> Iterator {
        Iterator(storage: BatchStorage(inputs: inputs, options: options))
    }

    /// Delivers results; dropping it cancels the files not yet read.
    public final class Iterator: AsyncIteratorProtocol {
        private let storage: BatchStorage
        private var local: [BatchReadResult] = []
        private var localIndex = 0

        init(storage: BatchStorage) {
            self.storage = storage
        }

        deinit {
            storage.cancel()
        }

        public func next() async throws -> BatchReadResult? {
            if localIndex < local.count {
                defer { localIndex += 1 }
                return local[localIndex]
            }
            while true {
                if Task.isCancelled {
                    storage.cancel()
                    await storage.waitUntilStopped()
                    throw CancellationError()
                }
                switch storage.take() {
                case .results(let results):
                    local = results
                    localIndex = 1
                    return results[0]
                case .finished:
                    return nil
                case .pending:
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

/// The state shared by a batch's workers and its consumer. Workers claim indices and
/// store results; the consumer takes results in bulk, which starts more workers.
final class BatchStorage: Sendable {
    enum Take {
        case results([BatchReadResult])
        case finished
        case pending
    }

    private struct State {
        var nextIndex = 0
        var handed = 0
        var slots: [BatchReadResult?]
        var ready: [BatchReadResult] = []
        var bufferedBytes = 0
        var activeWorkers = 0
        var cancelled = false
        var waiter: UnsafeContinuation<Void, Never>?

        var deliverable: Bool {
            slots.isEmpty ? !ready.isEmpty : slots[handed % slots.count] != nil
        }
    }

    private let inputs: [FileBatchReader.Input]
    private let options: BatchReadOptions
    private let window: Int
    private let state: Mutex<State>

    init(inputs: [FileBatchReader.Input], options: BatchReadOptions) {
        self.inputs = inputs
        self.options = options
        let concurrency = max(1, options.concurrency)
        window = max(4 * concurrency, 64)
        let slots = options.order == .given ? [BatchReadResult?](repeating: nil, count: window) : []
        state = Mutex(State(slots: slots))
    }

    // MARK: Consumer side

    func take() -> Take {
        let (take, spawn): (Take, Int) = state.withLock { state in
            var moved: [BatchReadResult] = []
            if state.slots.isEmpty {
                swap(&moved, &state.ready)
            } else {
                while let result = state.slots[state.handed % window] {
                    state.slots[state.handed % window] = nil
                    state.handed += 1
                    moved.append(result)
                }
            }
            if state.slots.isEmpty { state.handed += moved.count }
            for result in moved { state.bufferedBytes -= Self.size(of: result) }
            var spawn = 0
            if !state.cancelled && state.bufferedBytes < options.maximumBufferedBytes {
                spawn = min(max(1, options.concurrency) - state.activeWorkers,
                            inputs.count - state.nextIndex,
                            window - (state.nextIndex - state.handed))
                spawn = max(0, spawn)
                state.activeWorkers += spawn
            }
            if !moved.isEmpty { return (.results(moved), spawn) }
            return (state.handed == inputs.count ? .finished : .pending, spawn)
        }
        for _ in 0 ..< spawn { startWorker() }
        return take
    }

    /// Suspends until a result can be taken, the workers have all stopped, or the batch is cancelled.
    func waitForResults() async {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            let now = state.withLock { state in
                if state.deliverable || state.activeWorkers == 0 || state.cancelled { return true }
                state.waiter = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Suspends until no worker is reading (after ``cancel()``): every descriptor is closed.
    func waitUntilStopped() async {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            let now = state.withLock { state in
                if state.activeWorkers == 0 { return true }
                state.waiter = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    func cancel() {
        let waiter = state.withLock { state in
            state.cancelled = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    // MARK: Worker side

    private static func size(of result: BatchReadResult) -> Int {
        (try? result.result.get().count) ?? 0
    }

    /// Stores a finished result and claims the next index, in one lock acquisition.
    private func store(_ result: BatchReadResult?) -> Int? {
        let (claim, waiter): (Int?, UnsafeContinuation<Void, Never>?) = state.withLock { state in
            if let result {
                if state.slots.isEmpty {
                    state.ready.append(result)
                } else {
                    state.slots[result.index % window] = result
                }
                state.bufferedBytes += Self.size(of: result)
            }
            var claim: Int?
            if state.cancelled || state.nextIndex >= inputs.count || state.nextIndex - state.handed >= window
                || state.bufferedBytes >= options.maximumBufferedBytes
            {
                state.activeWorkers -= 1
            } else {
                claim = state.nextIndex
                state.nextIndex += 1
            }
            guard state.waiter != nil, state.deliverable || state.activeWorkers == 0 else { return (claim, nil) }
            defer { state.waiter = nil }
            return (claim, state.waiter)
        }
        waiter?.resume()
        return claim
    }

    private func othersActive() -> Bool {
        state.withLock { $0.activeWorkers > 1 }
    }

    private func startWorker() {
        switch options.engine {
        case .threadPool:
            IOThreadPool.shared.submit { [self] in
                var result: BatchReadResult?
                while let index = store(result) {
                    result = readBlocking(index)
                }
            }
        case .dispatchIO:
            Task { [self] in
                var result: BatchReadResult?
                while let index = store(result) {
                    result = await readWithDispatch(index)
                }
            }
        }
    }

    private func readBlocking(_ index: Int) -> BatchReadResult {
        switch inputs[index] {
        case .invalid(let path, let error):
            return BatchReadResult(index: index, path: path, result: .failure(error))
        case .path(let path):
            var waited = 0
            while true {
                let result = FileOperations.readWholeFile(path, maximumSize: options.maximumFileSize)
                // Out of descriptors while other files of this batch are open: they will
                // close soon, so wait for one instead of failing this file (up to ~1 s).
                if case .failure(let error) = result, error.code == .tooManyOpenFiles, waited < 2000, othersActive() {
                    waited += 1
                    usleep(500)
                    continue
                }
                return BatchReadResult(index: index, path: path, result: result)
            }
        }
    }

    private func readWithDispatch(_ index: Int) async -> BatchReadResult {
        switch inputs[index] {
        case .invalid(let path, let error):
            return BatchReadResult(index: index, path: path, result: .failure(error))
        case .path(let path):
            do {
                let data = try await Data(asyncContentsOf: path, maximumSize: options.maximumFileSize, engine: .dispatchIO)
                return BatchReadResult(index: index, path: path, result: .success(data))
            } catch let error as FileCoordinationError {
                return BatchReadResult(index: index, path: path, result: .failure(error))
            } catch {
                return BatchReadResult(index: index, path: path, result: .failure(
                    FileCoordinationError(code: .unknown, path: path, operation: "read", message: "\(error)", cause: error)))
            }
        }
    }
}
