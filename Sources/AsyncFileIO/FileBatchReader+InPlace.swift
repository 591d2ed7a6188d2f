import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// One file of a batch read in place: its bytes, valid only during the call that receives
/// them (the buffer is reused for the worker's next file), or its error.
public struct BatchFileContents {
    /// The file's position in the input list.
    public let index: Int
    /// The file, as given (made when asked for: a file given as a URL is read without one).
    public var path: FilePath { platformPath.filePath }
    /// The file's path as the kernel took it.
    package let platformPath: PlatformPath
    /// The whole content, or why it could not be read.
    public let bytes: Result<UnsafeRawBufferPointer, FileCoordinationError>

    package init(index: Int, path: FilePath, bytes: Result<UnsafeRawBufferPointer, FileCoordinationError>) {
        self.init(index: index, platformPath: PlatformPath(path), bytes: bytes)
    }

    package init(index: Int, platformPath: PlatformPath, bytes: Result<UnsafeRawBufferPointer, FileCoordinationError>) {
        self.index = index
        self.platformPath = platformPath
        self.bytes = bytes
    }
}

/// Lets a layer above decide, before a group of files is read, whether it is read now:
/// the coordinated batch takes the files' claims when they are free, on the worker, or
/// (``enterWithoutBlocking(_:)``) on the sequence's consumer.
///
/// A file the gate lets through is opened without following its last component
/// (`O_NOFOLLOW`): the gate may claim the name itself, and a file that turns out to be a
/// symbolic link is not read there but skipped (``skip(_:)``), for the owner to read
/// through its target's claim.
package protocol InPlaceGate: Sendable {
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
    /// Whether ``enterWithoutBlocking(_:)`` may let files through: the consumer of the
    /// batch's sequence then reads files itself while it would wait.
    var admitsWithoutBlocking: Bool { get }
    /// ``enter(_:)`` on a thread that must not block (the sequence's consumer: the
    /// cooperative pool, or the main thread); nothing is noted, even for a lone file. What
    /// the gate lets through is read only where that needs no wait either, without
    /// following the last component.
    func enterWithoutBlocking(_ files: [(index: Int, path: PlatformPath)]) -> GateAdmission
}

/// What ``InPlaceGate/enterWithoutBlocking(_:)`` answers.
package enum GateAdmission: Sendable {
    /// All of the files may be read now: the token for ``InPlaceGate/leave(_:)``.
    case admitted(UInt64)
    /// Something stands in the way: the files go back to the workers, which ask for each.
    case refused
    /// Answering needs a call that may wait (a directory not looked up yet): the files go
    /// back to the workers, whose questions make the answer known for the next group.
    case notKnownYet
}

extension InPlaceGate {
    /// A gate admits nothing without blocking unless it says so.
    package var admitsWithoutBlocking: Bool { false }
    /// Refuses: the workers ask ``enter(_:)``.
    package func enterWithoutBlocking(_ files: [(index: Int, path: PlatformPath)]) -> GateAdmission { .refused }
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
        package func forEachFile<Partial: Sendable>(
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

        /// Reads one file into the worker's buffer and hands it to the body; a file the
        /// gate let through that is a symbolic link goes back to the gate instead.
        func read(_ index: Int, _ input: FileBatchReader.PlatformResolved, _ partial: inout Partial,
                  gate: (any InPlaceGate)? = nil) {
            switch input {
            case .invalid(let path, let error):
                body(&partial, BatchFileContents(index: index, path: path, bytes: .failure(error)))
            case .path(let path):
                let result = descriptors.read {
                    FileOperations.readWholeFile(path, maximumSize: maximumFileSize, followingLast: gate == nil, into: buffer)
                }
                if let gate, case .failure(let error) = result, FileOperations.isLinkRefused(error) {
                    gate.skip(index)
                    return
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
            // Labelled as the gate takes them: an array of unlabelled tuples would be cast,
            // element by element through the runtime, on every group.
            let paths = group.compactMap { file -> (index: Int, path: PlatformPath)? in
                if case .path(let path) = file.input { return (file.index, path) } else { return nil }
            }
            // One question for a group of several files; a lone file is asked alone below
            // (the gate notes a lone file it refuses as skipped).
            if paths.count > 1, let token = gate.enter(paths) {
                for file in group { worker.read(file.index, file.input, &partial, gate: gate) }
                gate.leave(token)
                continue
            }
            for file in group {
                guard case .path(let path) = file.input else {
                    worker.read(file.index, file.input, &partial)
                    continue
                }
                guard let token = gate.enter([(file.index, path)]) else { continue }
                worker.read(file.index, file.input, &partial, gate: gate)
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
