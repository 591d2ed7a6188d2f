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
    /// The file's path, with the exact bytes it was given with (made when asked for: a
    /// batch given URLs reads without one).
    public var path: FilePath { platformPath.filePath }
    /// The file's path as the kernel took it.
    @_spi(FileCoordinationInternal)
    public let platformPath: PlatformPath
    /// The file's whole content, or why it could not be read.
    public let result: Result<Data, FileCoordinationError>

    /// The file's `file:` URL.
    public var url: URL { path.fileURL }

    /// The content, or the error that prevented reading it.
    public func get() throws(FileCoordinationError) -> Data { try result.get() }

    /// A result (for sequences that renumber or wrap batch results).
    public init(index: Int, path: FilePath, result: Result<Data, FileCoordinationError>) {
        self.init(index: index, platformPath: PlatformPath(path), result: result)
    }

    @_spi(FileCoordinationInternal)
    public init(index: Int, platformPath: PlatformPath, result: Result<Data, FileCoordinationError>) {
        self.index = index
        self.platformPath = platformPath
        self.result = result
    }
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
        self.maximumBufferedBytes = max(1, maximumBufferedBytes)
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
    @_spi(FileCoordinationInternal)
    public func makeAsyncIterator(gate: any InPlaceGate) -> Iterator {
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

        init(storage: BatchStorage) {
            self.storage = storage
        }

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

/// The state shared by a batch's workers and its consumer.
///
/// Built to stay off locks on the hot path: workers claim indices with an atomic
/// counter and keep finished results in a private buffer, publishing them under the
/// lock in groups, or at once when the consumer is waiting. The consumer takes all
/// published results in one lock acquisition and starts workers when there is room.
final class BatchStorage: Sendable {
    enum Take {
        /// Never empty, and no element nil (optional so that each can be moved out).
        case results([BatchReadResult?])
        case finished
        case pending
    }

    private struct State {
        /// Given order: a ring of `slots.count` results indexed by `index % slots.count`.
        var slots: [BatchReadResult?]
        /// Completion order: results in arrival order.
        /// (Optional, so that results move in and out without a copy: see `Iterator.local`.)
        var ready: [BatchReadResult?] = []
        var handed = 0
        var activeWorkers = 0
        var waiter: UnsafeContinuation<Void, Never>?
        /// Waits for the last worker to stop (after cancellation): only that wakes it.
        var stopWaiter: UnsafeContinuation<Void, Never>?
        /// When the consumer parked (monotonic nanoseconds).
        var waitingSince: UInt64 = 0

        var deliverable: Bool {
            slots.isEmpty ? !ready.isEmpty : slots[handed % slots.count] != nil
        }

        /// Whether enough is deliverable to be worth waking the consumer for: each wake
        /// costs two context switches, so results are handed over in groups.
        func worthWaking(groupSize: Int, groupBytes: Int) -> Bool {
            if slots.isEmpty {
                return ready.count >= groupSize || ready.reduce(0, { $0 + ($1.map(BatchStorage.size(of:)) ?? 0) }) >= groupBytes
            }
            var count = 0, bytes = 0
            while count < groupSize, bytes < groupBytes, let result = slots[(handed + count) % slots.count] {
                count += 1
                bytes += BatchStorage.size(of: result)
            }
            return count >= groupSize || bytes >= groupBytes
        }
    }

    /// How many results (or bytes) make a group worth waking the consumer for.
    private static let wakeGroup = 64
    private static let wakeBytes = 4 << 20
    /// A waiting consumer is woken for whatever is ready after this long (nanoseconds).
    private static let wakeLatency: UInt64 = 1_000_000

    /// Results a worker keeps before publishing when nobody is waiting for them.
    private static let publishEvery = 16

    private let inputs: FileBatchReader.Inputs
    private let options: BatchReadOptions
    private let concurrency: Int
    /// How far claiming may run ahead of the consumer (a soft bound: concurrent claims
    /// may pass it by at most `concurrency * chunk`, which the ring has room for).
    private let window: Int
    private let nextIndex = Atomic<Int>(0)
    private let handed = Atomic<Int>(0)
    private let bufferedBytes = Atomic<Int>(0)
    private let cancelled = Atomic<Bool>(false)
    private let consumerWaiting = Atomic<Bool>(false)
    private let descriptors = DescriptorWaits()
    private let gate: (any InPlaceGate)?
    /// How many consecutive files a worker claims at once: with a gate, a group that the
    /// gate is asked about together (as the in-place batch does; a claim per file had
    /// the workers contend for the claim tables); without, `Inputs.ungatedClaim`. In both
    /// cases only while groups of the largest file read so far fit in
    /// `maximumBufferedBytes` (back-pressure is checked per claim).
    private let chunk: Int
    /// The largest file read so far (bytes).
    private let largestFile = Atomic<Int>(0)
    /// Indices a worker claimed in a group but left unread at the buffer limit (without a
    /// gate), sorted; `givenBackCount` mirrors their number, read without the lock.
    private let givenBack = Locked<[Int]>([])
    private let givenBackCount = Atomic<Int>(0)
    /// How many times a group was given back (for tests).
    private let givenBackTotal = Atomic<Int>(0)
    var groupsGivenBack: Int { givenBackTotal.load(ordering: .relaxed) }
    /// Set once a read had to wait for a device (its file was not all in the page cache):
    /// from then on the batch may use up to `concurrency` threads. Until then, reads come
    /// from the page cache and more threads than cores would only take turns. (Where the
    /// file system cannot tell, as tmpfs, a read that took over 200 us sets it.)
    private let blocking = Atomic<Bool>(false)
    /// False once a read found that the file system cannot tell (no `RWF_NOWAIT`).
    private let cacheProbes = Atomic<Bool>(true)
    private static let processors = max(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
    private let state: Locked<State>

    init(inputs: FileBatchReader.Inputs, options: BatchReadOptions, gate: (any InPlaceGate)?) {
        self.inputs = inputs
        self.options = options
        self.gate = options.engine == .threadPool ? gate : nil
        // (No more workers than files: a huge `concurrency` would size the window and the ring.)
        concurrency = max(1, min(options.concurrency, inputs.count))
        chunk = self.gate != nil ? 32 : inputs.ungatedClaim(workers: concurrency)
        // Room for every worker's private group plus as much again in the shared ring,
        // so that workers pause for a slow consumer, not for each other. (Smaller
        // windows, meant to keep buffers in the CPU caches, measured no better.) And
        // several wake groups: with a window of one group (64 files, as concurrency 2
        // had), the workers stopped each time the consumer was woken, and read 0.44x
        // of the C pool instead of 0.73x.
        window = max(2 * concurrency * Self.publishEvery, 4 * Self.wakeGroup)
        let slots = options.order == .given
            ? [BatchReadResult?](repeating: nil, count: window + concurrency * chunk)
            : []
        state = Locked(State(slots: slots))
    }

    /// How many files have been claimed for reading so far (for tests of back-pressure).
    var claimedCount: Int { min(nextIndex.load(ordering: .relaxed), inputs.count) }

    // MARK: Consumer side

    func take() -> Take {
        let (take, spawn): (Take, Int) = state.withLock { state in
            var moved: [BatchReadResult?] = []
            if state.slots.isEmpty {
                swap(&moved, &state.ready)
                state.handed += moved.count
            } else {
                let ring = state.slots.count
                while let result = state.slots[state.handed % ring].take() {
                    state.handed += 1
                    moved.append(result)
                }
            }
            handed.store(state.handed, ordering: .releasing)
            var bytes = 0
            for result in moved { bytes += result.map(Self.size(of:)) ?? 0 }
            let buffered = bufferedBytes.subtract(bytes, ordering: .relaxed).newValue
            var spawn = 0
            let givenBack = givenBackCount.load(ordering: .acquiring)
            if !cancelled.load(ordering: .relaxed) && (buffered < options.maximumBufferedBytes || givenBack > 0) {
                let claimed = min(nextIndex.load(ordering: .relaxed), inputs.count)
                let threads = blocking.load(ordering: .relaxed) ? concurrency : min(concurrency, Self.processors)
                // Given-back files are read whatever the window and the buffer (see `claim`).
                let room = max(window - (claimed - state.handed), givenBack)
                spawn = max(0, min(threads - state.activeWorkers, inputs.count - claimed + givenBack, room))
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
                if state.deliverable || state.activeWorkers == 0 || cancelled.load(ordering: .relaxed) { return true }
                state.waiter = continuation
                state.waitingSince = Self.now()
                consumerWaiting.store(true, ordering: .relaxed)
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
                state.stopWaiter = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Whether ``cancel()`` was called.
    var isCancelled: Bool { cancelled.load(ordering: .relaxed) }

    func cancel() {
        cancelled.store(true, ordering: .relaxed)
        let waiter = state.withLock { state in
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    // MARK: Worker side

    fileprivate static func size(of result: BatchReadResult) -> Int {
        if case .success(let data) = result.result { return data.count }
        return 0
    }

    /// Claims the next `chunk` indices (or one given back), or nil when the worker should
    /// stop: the batch is done or cancelled, or reading is too far ahead of the consumer.
    private func claim() -> Range<Int>? {
        guard !cancelled.load(ordering: .relaxed) else { return nil }
        // A given-back index is read even past the buffer limit: it lies behind results
        // already buffered, which in the given order cannot be taken before it.
        if givenBackCount.load(ordering: .acquiring) > 0,
           let index = givenBack.withLock({ $0.isEmpty ? nil : $0.removeFirst() })
        {
            givenBackCount.subtract(1, ordering: .relaxed)
            return index ..< index + 1
        }
        guard bufferedBytes.load(ordering: .relaxed) < options.maximumBufferedBytes,
              nextIndex.load(ordering: .relaxed) - handed.load(ordering: .acquiring) < window
        else { return nil }
        var size = 1
        if chunk > 1 {
            let largest = largestFile.load(ordering: .relaxed)
            if largest > 0, largest * chunk * concurrency <= options.maximumBufferedBytes { size = chunk }
        }
        let start = nextIndex.wrappingAdd(size, ordering: .relaxed).oldValue
        return start < inputs.count ? start ..< Swift.min(start + size, inputs.count) : nil
    }

    /// Returns claimed indices left unread, to be claimed again (lowest first) before new ones.
    private func giveBack(_ indices: some Sequence<Int>) {
        givenBack.withLock { list in
            list.append(contentsOf: indices)
            list.sort()
            givenBackCount.store(list.count, ordering: .releasing)
        }
        givenBackTotal.add(1, ordering: .relaxed)
    }

    /// Publishes a worker's finished results; with `exiting`, also retires the worker.
    private func publish(_ results: inout [BatchReadResult], exiting: Bool) {
        var bytes = 0
        for result in results { bytes += Self.size(of: result) }
        bufferedBytes.add(bytes, ordering: .relaxed)
        let waiter: UnsafeContinuation<Void, Never>? = state.withLock { state in
            // Moved, not copied (see `Iterator.local`); in completion order, in the
            // order the worker finished them.
            if state.slots.isEmpty {
                var end = state.ready.count + results.count
                state.ready.append(contentsOf: repeatElement(nil, count: results.count))
                while let result = results.popLast() {
                    end -= 1
                    state.ready[end] = result
                }
            } else {
                while let result = results.popLast() { state.slots[result.index % state.slots.count] = result }
            }
            if exiting { state.activeWorkers -= 1 }
            if state.activeWorkers == 0, let stopWaiter = state.stopWaiter {
                state.stopWaiter = nil
                stopWaiter.resume()
            }
            guard state.waiter != nil else { return nil }
            if state.activeWorkers > 0 {
                guard state.deliverable else { return nil }
                let tail = nextIndex.load(ordering: .relaxed) >= inputs.count && givenBackCount.load(ordering: .relaxed) == 0
                guard tail || state.worthWaking(groupSize: Self.wakeGroup, groupBytes: Self.wakeBytes)
                    || Self.now() - state.waitingSince >= Self.wakeLatency
                else { return nil }
            }
            consumerWaiting.store(false, ordering: .relaxed)
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    /// Monotonic nanoseconds (vDSO, no system call).
    private static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    private func startWorker() {
        switch options.engine {
        case .threadPool:
            IOThreadPool.shared.submit { [self] in
                descriptors.workerStarted()
                var finished: [BatchReadResult] = []
                finished.reserveCapacity(Self.publishEvery)
                var finishedBytes = 0
                var oldest: UInt64 = 0
                while let indices = claim() {
                    let group = indices.map { (index: $0, input: inputs[$0]) }
                    // With a gate: one question for a group of several files, else one per file.
                    var token: UInt64?
                    if let gate, group.count > 1 {
                        let paths = group.compactMap { file -> (Int, PlatformPath)? in
                            if case .path(let path) = file.input { (file.index, path) } else { nil }
                        }
                        if paths.count > 1 { token = gate.enter(paths) }
                    }
                    for (position, file) in group.enumerated() {
                        // Without a gate, a group is not read further once cancelled, nor past
                        // the buffer limit (a jump from small files to large ones): the rest
                        // is given back, so a group holds no more than a single claim would.
                        if gate == nil, position > 0 {
                            if cancelled.load(ordering: .relaxed) { break }
                            if bufferedBytes.load(ordering: .relaxed) + finishedBytes >= options.maximumBufferedBytes {
                                giveBack(group[position...].lazy.map(\.index))
                                break
                            }
                        }
                        // A group is read to its end under its claim, except past the
                        // buffer limit (a jump from small files to large ones): the rest of
                        // it is left to the gate's owner, which reads it as the consumer
                        // gets there.
                        if let gate, position > 0,
                           bufferedBytes.load(ordering: .relaxed) + finishedBytes >= options.maximumBufferedBytes
                        {
                            for rest in group[position...] {
                                gate.skip(rest.index)
                                let path = Self.path(of: rest.input)
                                finished.append(BatchReadResult(index: rest.index, path: path, result: .failure(Self.leftToGate(path))))
                            }
                            break
                        }
                        let started = Self.now()
                        var probe = FileOperations.CacheProbe.notProbed
                        let result = readBlocking(file.index, file.input, askingGate: gate != nil && token == nil, probe: &probe)
                        if finished.isEmpty { oldest = started }
                        if probe == .unsupported { cacheProbes.store(false, ordering: .relaxed) }
                        if !blocking.load(ordering: .relaxed) && (probe == .waitedForDevice
                            || (!cacheProbes.load(ordering: .relaxed) && Self.now() - started > 200_000)) {
                            blocking.store(true, ordering: .relaxed)
                        }
                        let size = Self.size(of: result)
                        if chunk > 1 { largestFile.max(size) }
                        finishedBytes += size
                        finished.append(consume result)
                        // Publishing takes the lock and may wake the consumer: do it for a group
                        // of results, for a large one, or when the consumer has waited a while.
                        if finished.count >= Self.publishEvery || finishedBytes >= 1 << 20
                            || (consumerWaiting.load(ordering: .relaxed) && Self.now() - oldest >= 100_000)
                        {
                            publish(&finished, exiting: false)
                            finishedBytes = 0
                        }
                    }
                    if let token { gate?.leave(token) }
                }
                descriptors.workerEnded()
                publish(&finished, exiting: true)
            }
        case .dispatchIO:
            Task { [self] in
                var finished: [BatchReadResult] = []
                while let indices = claim() {
                    for index in indices where !cancelled.load(ordering: .relaxed) {
                        finished.append(await readWithDispatch(index))
                    }
                    publish(&finished, exiting: false)
                }
                publish(&finished, exiting: true)
            }
        }
    }
    /// The placeholder result of a file left to the gate's owner (which replaces it).
    private static func leftToGate(_ path: FilePath) -> FileCoordinationError {
        FileCoordinationError(code: .cancelled, path: path, operation: "read", message: "left to the full coordination")
    }

    private static func path(of input: FileBatchReader.PlatformResolved) -> FilePath {
        switch input {
        case .path(let path): path.filePath
        case .invalid(let path, _): path
        }
    }

    /// Reads one file; with `askingGate`, only if the gate lets it through alone.
    private func readBlocking(_ index: Int, _ input: FileBatchReader.PlatformResolved, askingGate: Bool,
                              probe: inout FileOperations.CacheProbe) -> BatchReadResult {
        switch input {
        case .invalid(let path, let error):
            return BatchReadResult(index: index, path: path, result: .failure(error))
        case .path(let path):
            var token: UInt64?
            if askingGate, let gate {
                token = gate.enter([(index, path)])
                guard token != nil else {
                    return BatchReadResult(index: index, path: path.filePath, result: .failure(Self.leftToGate(path.filePath)))
                }
            }
            // Probing tells a device wait from a preempted thread, until the batch knows.
            let probing = !blocking.load(ordering: .relaxed) && cacheProbes.load(ordering: .relaxed)
            var learned = FileOperations.CacheProbe.notProbed
            let result = descriptors.read {
                FileOperations.readWholeFile(path, maximumSize: options.maximumFileSize, probingCache: probing, probe: &learned)
            }
            probe = learned
            if let token { gate?.leave(token) }
            return BatchReadResult(index: index, platformPath: path, result: result)
        }
    }

    private func readWithDispatch(_ index: Int) async -> BatchReadResult {
        switch inputs.resolved(index) {
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

// MARK: - Reading in place

/// One file of a batch read in place: its bytes, valid only during the call that receives
/// them (the buffer is reused for the worker's next file), or its error.
public struct BatchFileContents {
    /// The file's position in the input list.
    public let index: Int
    /// The file, as given (made when asked for: a file given as a URL is read without one).
    public var path: FilePath { platformPath.filePath }
    /// The file's path as the kernel took it.
    @_spi(FileCoordinationInternal)
    public let platformPath: PlatformPath
    /// The whole content, or why it could not be read.
    public let bytes: Result<UnsafeRawBufferPointer, FileCoordinationError>

    @_spi(FileCoordinationInternal)
    public init(index: Int, path: FilePath, bytes: Result<UnsafeRawBufferPointer, FileCoordinationError>) {
        self.init(index: index, platformPath: PlatformPath(path), bytes: bytes)
    }

    @_spi(FileCoordinationInternal)
    public init(index: Int, platformPath: PlatformPath, bytes: Result<UnsafeRawBufferPointer, FileCoordinationError>) {
        self.index = index
        self.platformPath = platformPath
        self.bytes = bytes
    }
}

/// Lets a layer above decide, on the worker, whether each file is read now: the
/// coordinated batch takes each file's claim there when it is free.
@_spi(FileCoordinationInternal)
public protocol InPlaceGate: Sendable {
    /// Before a group of files (index, path) is read: a token for ``leave(_:)`` when all
    /// of them may be read now. Nil for a group of several: each is then asked alone. Nil
    /// for one file: it is skipped (neither read nor handed to the body; the gate's owner
    /// deals with it) and noted by the gate.
    func enter(_ files: [(index: Int, path: PlatformPath)]) -> UInt64?
    /// After the body returned for every file of the group `enter` let through.
    func leave(_ token: UInt64)
    /// A file the batch leaves unread, for the gate's owner to deal with (as a file
    /// `enter` refused alone).
    func skip(_ index: Int)
}

extension FileBatchReader {
    /// Reads every file of the batch and hands each one's content to `body` where it was
    /// read, in a buffer that is reused for the next file: nothing is allocated, copied or
    /// handed to another thread per file. For work that digests each file on its own
    /// (checksums, indexing, searching) this is the fastest way through many files.
    ///
    /// ```swift
    /// let total = Atomic<Int>(0)
    /// try await FileBatchReader(paths: paths).forEachFile { file in
    ///     if case .success(let bytes) = file.bytes { total.wrappingAdd(bytes.count, ordering: .relaxed) }
    /// }
    /// ```
    ///
    /// `body` runs on the library's I/O threads, for up to
    /// ``BatchReadOptions/concurrency`` files at once, in no particular order; it must not
    /// keep the bytes, and should not block for long. A file that cannot be read reaches
    /// `body` as its error; the others go on. Returns when every file has been handed to
    /// `body`; if the calling task is cancelled, the files not started are skipped and it
    /// throws `CancellationError` once the ones in progress are done. With the
    /// ``FileIOEngine/dispatchIO`` engine, files are read by the asynchronous sequence and
    /// `body` runs in the calling task.
    public func forEachFile(_ body: @escaping @Sendable (BatchFileContents) -> Void) async throws {
        _ = try await forEachFile(perWorker: ()) { _, file in body(file) }
    }

    /// ``forEachFile(_:)`` with a value of its own for each worker, passed `inout` to
    /// `body` with every file that worker reads: totals, hashes or indexes built without
    /// sharing anything between threads. Returns every worker's final value, to combine.
    ///
    /// ```swift
    /// let counts = try await FileBatchReader(paths: paths).forEachFile(perWorker: 0) { lines, file in
    ///     if case .success(let bytes) = file.bytes { lines += bytes.count(where: { $0 == 0x0A }) }
    /// }
    /// let total = counts.reduce(0, +)
    /// ```
    public func forEachFile<Partial: Sendable>(
        perWorker initial: Partial, _ body: @escaping @Sendable (inout Partial, BatchFileContents) -> Void
    ) async throws -> [Partial] {
        try await forEachFile(perWorker: initial, gate: nil, body)
    }

    /// ``forEachFile(perWorker:_:)`` with a gate asked on the worker before each file
    /// (the thread-pool engine only).
    @_spi(FileCoordinationInternal)
    public func forEachFile<Partial: Sendable>(
        perWorker initial: Partial, gate: (any InPlaceGate)?,
        _ body: @escaping @Sendable (inout Partial, BatchFileContents) -> Void
    ) async throws -> [Partial] {
        if case .dispatchIO = options.engine {
            var partial = initial
            for try await file in self {
                let data = (try? file.result.get()) ?? Data()
                data.withUnsafeBytes { raw in
                    body(&partial, BatchFileContents(index: file.index, path: file.path, bytes: file.result.map { _ in raw }))
                }
            }
            return [partial]
        }
        let job = InPlaceBatch(inputs: inputs, maximumFileSize: options.maximumFileSize, initial: initial, gate: gate,
                               workers: Swift.max(1, Swift.min(options.concurrency, inputs.count)), body: body)
        let partials = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<[Partial], Never>) in
                job.start(whenDone: continuation)
            }
        } onCancel: {
            job.cancel()
        }
        if job.wasCancelled { throw CancellationError() }
        return partials
    }
}

/// The shared state of ``FileBatchReader/forEachFile(perWorker:_:)``: an input cursor the
/// workers claim files from, the workers still running and the values of those done.
private final class InPlaceBatch<Partial: Sendable>: Sendable {
    private let inputs: FileBatchReader.Inputs
    private let maximumFileSize: Int
    private let initial: Partial
    private let gate: (any InPlaceGate)?
    private let body: @Sendable (inout Partial, BatchFileContents) -> Void
    /// The input cursor and the cancel flag, which every worker writes or reads per file,
    /// on a cache line of their own (see ``SharedCursor``).
    private let cursor = SharedCursor()
    private let descriptors = DescriptorWaits()
    /// How many workers the batch runs.
    private let workers: Int
    private struct State {
        var running = 0
        var partials: [Partial] = []
        var done: CheckedContinuation<[Partial], Never>?
    }
    private let state = Locked(State())

    init(inputs: FileBatchReader.Inputs, maximumFileSize: Int, initial: Partial, gate: (any InPlaceGate)?,
         workers: Int, body: @escaping @Sendable (inout Partial, BatchFileContents) -> Void) {
        self.inputs = inputs
        self.workers = workers
        self.maximumFileSize = maximumFileSize
        self.initial = initial
        self.gate = gate
        self.body = body
    }

    var wasCancelled: Bool { cursor.cancelled.load(ordering: .acquiring) }

    func cancel() { cursor.cancelled.store(true, ordering: .releasing) }

    func start(whenDone continuation: CheckedContinuation<[Partial], Never>) {
        guard inputs.count > 0 else { return continuation.resume(returning: []) }
        state.withLock { $0 = State(running: workers, done: continuation) }
        for _ in 0 ..< workers { IOThreadPool.shared.submit { [self] in work() } }
    }

    /// How many consecutive files a worker takes at once when there is a gate: the gate
    /// is asked once for all of them (one claim for the group), then file by file only
    /// if the group could not pass together. Measured with the coordinated batch: 8
    /// files a group read 95-108k files/s, 32 read 107-130k, 128 no better.
    static var gatedChunk: Int { 32 }

    /// What a worker reads with, copied out of the batch once: read from the shared
    /// object per file, these loads missed the cache whenever another worker had just
    /// advanced the cursor beside them (measured: most of the batch's own time per file).
    private struct Worker {
        let maximumFileSize: Int
        let body: @Sendable (inout Partial, BatchFileContents) -> Void
        let descriptors: DescriptorWaits
        let buffer = ReusableBuffer()

        /// Reads one file into the worker's buffer and hands it to the body.
        func read(_ index: Int, _ input: FileBatchReader.PlatformResolved, _ partial: inout Partial) {
            switch input {
            case .invalid(let path, let error):
                body(&partial, BatchFileContents(index: index, path: path, bytes: .failure(error)))
            case .path(let path):
                let result = descriptors.read {
                    FileOperations.readWholeFile(path, maximumSize: maximumFileSize, into: buffer)
                }
                body(&partial, BatchFileContents(index: index, platformPath: path,
                                                 bytes: result.map { UnsafeRawBufferPointer(start: buffer.base, count: $0) }))
            }
        }
    }

    private func work() {
        let worker = Worker(maximumFileSize: maximumFileSize, body: body, descriptors: descriptors)
        let cursor = self.cursor, inputs = self.inputs, count = inputs.count, gate = self.gate
        worker.descriptors.workerStarted()
        var partial = initial
        let chunk = gate == nil ? inputs.ungatedClaim(workers: workers) : Self.gatedChunk
        while !cursor.cancelled.load(ordering: .relaxed) {
            let start = cursor.next.wrappingAdd(chunk, ordering: .relaxed).oldValue
            guard start < count else { break }
            let indices = start ..< Swift.min(start + chunk, count)
            guard let gate else {
                // A cancelled batch starts no other file, even of the group claimed.
                for index in indices where !cursor.cancelled.load(ordering: .relaxed) {
                    worker.read(index, inputs[index], &partial)
                }
                continue
            }
            let group = indices.map { (index: $0, input: inputs[$0]) }
            let paths = group.compactMap { file -> (Int, PlatformPath)? in
                if case .path(let path) = file.input { return (file.index, path) } else { return nil }
            }
            // One question for a group of several files; a lone file is asked alone below
            // (the gate notes a lone file it refuses as skipped).
            if paths.count > 1, let token = gate.enter(paths) {
                for file in group { worker.read(file.index, file.input, &partial) }
                gate.leave(token)
                continue
            }
            for file in group {
                guard case .path(let path) = file.input else {
                    worker.read(file.index, file.input, &partial)
                    continue
                }
                guard let token = gate.enter([(file.index, path)]) else { continue }
                worker.read(file.index, file.input, &partial)
                gate.leave(token)
            }
        }
        worker.descriptors.workerEnded()
        let done = state.withLock { state -> (CheckedContinuation<[Partial], Never>, [Partial])? in
            state.partials.append(partial)
            guard state.partials.count == state.running, let done = state.done else { return nil }
            state.done = nil
            return (done, state.partials)
        }
        if let (continuation, partials) = done { continuation.resume(returning: partials) }
    }
}

/// A batch's input cursor and cancel flag, each alone on its cache line: every worker
/// advances the cursor, and beside the batch's other fields (or the flag, which every
/// worker reads per file) each of those writes made the other workers' next loads of
/// them miss.
final class SharedCursor: Sendable {
    // 128 bytes apart: x86 fetches lines in adjacent pairs.
    private typealias Padding = (Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int, Int)
    private static let padding: Padding = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    private let before = SharedCursor.padding
    /// The next input index to claim.
    let next = Atomic<Int>(0)
    private let between = SharedCursor.padding
    /// Set when the batch is cancelled.
    let cancelled = Atomic<Bool>(false)
    private let after = SharedCursor.padding
}

/// How the workers of one batch share descriptors when the process runs out: a worker
/// whose open fails with `EMFILE` tries again while another worker of the batch may still
/// close a file, instead of failing (up to about 1 s).
final class DescriptorWaits: Sendable {
    /// Workers running (between ``workerStarted()`` and ``workerEnded()``).
    private let active = Atomic<Int>(0)
    /// Those of them waiting for a descriptor: they hold none.
    private let waiting = Atomic<Int>(0)

    /// A worker starts taking files (on its thread, not when it is queued).
    func workerStarted() { active.add(1, ordering: .relaxed) }

    /// A worker takes no more files.
    func workerEnded() { active.subtract(1, ordering: .relaxed) }

    /// Runs `read` on a running worker, again while it fails with `EMFILE` and another
    /// worker is not waiting (it holds a file, or is about to open one and close it).
    /// When every running worker waits, none can free a descriptor: they are held
    /// elsewhere in the process, for a moment (the runtime's own) or for good, so the
    /// file fails after ``aloneRetries`` more tries (50 ms).
    func read<T>(_ read: () -> Result<T, FileCoordinationError>) -> Result<T, FileCoordinationError> {
        var waited = 0, alone = 0
        defer { if waited > 0 { waiting.subtract(1, ordering: .relaxed) } }
        while true {
            let result = read()
            guard case .failure(let error) = result, error.code == .tooManyOpenFiles, waited < 2000 else { return result }
            if waited == 0 { waiting.add(1, ordering: .relaxed) }
            waited += 1
            if active.load(ordering: .relaxed) <= waiting.load(ordering: .relaxed) {
                alone += 1
                if alone > Self.aloneRetries { return result }
            }
            usleep(500)
        }
    }

    /// Tries, 0.5 ms apart, of a worker that no other worker can free a descriptor for.
    static let aloneRetries = 100
}

extension Atomic where Value == Int {
    /// Raises the value to `candidate` if it is larger.
    func max(_ candidate: Int) {
        var current = load(ordering: .relaxed)
        while candidate > current {
            let (exchanged, original) = compareExchange(expected: current, desired: candidate, ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }
}
