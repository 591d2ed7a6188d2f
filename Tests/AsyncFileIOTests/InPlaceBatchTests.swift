import Foundation
import Synchronization
import SystemPackage
import Testing
import TestSupport
@testable import AsyncFileIO

@Suite("FileBatchReader.forEachFile (in place)")
struct InPlaceBatchTests {
    @Test("every file reaches the body once, with exactly its bytes", arguments: [FileIOEngine.threadPool, .dispatchIO], [1, 16])
    func everyFileOnce(engine: FileIOEngine, concurrency: Int) async throws {
        let directory = TemporaryDirectory("inplace")
        let files = try await FileBatchReaderTests.makeFiles(directory, count: 600, maximumSize: 40_000)
        let seen = Locked<[Int: Data]>([:])
        try await FileBatchReader(paths: files.map(\.0), options: .init(concurrency: concurrency, engine: engine)).forEachFile { file in
            let bytes = try? file.bytes.get()
            let copy = bytes.map { Data($0) }
            seen.withLock { seen in
                #expect(seen[file.index] == nil, "file \(file.index) delivered twice")
                seen[file.index] = copy
            }
            #expect(file.path == files[file.index].0)
        }
        let delivered = seen.withLock { $0 }
        #expect(delivered.count == files.count)
        for (index, (_, content)) in files.enumerated() { #expect(delivered[index] == content, "file \(index)") }
    }

    @Test("a file whose size no buffer can hold (sparse, 4 TiB) reaches the body as fileTooLarge; the others are read",
          .enabled(if: (try? String(contentsOfFile: "/proc/sys/vm/overcommit_memory", encoding: .utf8))?.hasPrefix("0") == true,
                   "the kernel refuses an allocation past memory only under heuristic overcommit"))
    func fileBeyondMemory() async throws {
        let directory = TemporaryDirectory("inplace-huge")
        let small = try directory.make("small", Data("small".utf8))
        let huge = try directory.make("huge", Data())
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: huge.string))
        try handle.truncate(atOffset: 4 << 40)
        try handle.close()
        let outcomes = Locked<[Int: String]>([:])
        try await FileBatchReader(paths: [small, huge, small]).forEachFile { file in
            let outcome = switch file.bytes {
            case .success(let bytes): String(decoding: bytes, as: UTF8.self)
            case .failure(let error): "\(error.code)"
            }
            outcomes.withLock { $0[file.index] = outcome }
        }
        #expect(outcomes.withLock { $0 } == [0: "small", 1: "\(FileCoordinationError.Code.fileTooLarge)", 2: "small"])
    }

    @Test("bad files reach the body as their errors; the others are read")
    func errorsInPlace() async throws {
        let directory = TemporaryDirectory("inplace-errors")
        let paths = try await FileBatchReaderTests.pathsWithBadInputs(directory, count: 40, positions: (5, 15, 25))
        let expected = paths
        let outcome = Locked<(successes: Int, failures: [Int: FileCoordinationError.Code])>((0, [:]))
        try await FileBatchReader(paths: paths).forEachFile { file in
            switch file.bytes {
            case .success: outcome.withLock { $0.successes += 1 }
            case .failure(let error):
                #expect(error.path == expected[file.index])
                outcome.withLock { $0.failures[file.index] = error.code }
            }
        }
        let (successes, failures) = outcome.withLock { $0 }
        #expect(successes == 40)
        #expect(failures == [5: .notFound, 15: .isDirectory, 25: .unsupportedFileType])
    }

    @Test("each worker keeps its own value; together they count every byte, on the library's threads")
    func perWorkerValues() async throws {
        let directory = TemporaryDirectory("inplace-partials")
        let files = try await FileBatchReaderTests.makeFiles(directory, count: 300, maximumSize: 5000)
        let threads = Locked<Set<String>>([])
        let partials = try await FileBatchReader(paths: files.map(\.0), options: .init(concurrency: 4))
            .forEachFile(perWorker: 0) { total, file in
                threads.withLock { _ = $0.insert(currentThreadName()) }
                if case .success(let bytes) = file.bytes { total += bytes.count }
            }
        #expect(partials.count <= 4)
        #expect(partials.reduce(0, +) == files.reduce(0) { $0 + $1.1.count })
        #expect(threads.withLock { $0.allSatisfy { $0.hasPrefix("filecoord-io") } })
    }

    @Test("cancelled, it stops early, throws CancellationError and leaves no descriptor open")
    func cancellation() async throws {
        let directory = TemporaryDirectory("inplace-cancel")
        let files = try await FileBatchReaderTests.makeFiles(directory, count: 3000, maximumSize: 20_000)
        let count = Atomic<Int>(0)
        let (reached, signal) = AsyncStream.makeStream(of: Void.self)
        // From the 100th file on, every worker waits at this gate until the batch is
        // cancelled: the batch cannot finish before the cancellation arrives.
        let gate = DispatchSemaphore(value: 0)
        let workers = 8
        let batch = Task {
            try await FileBatchReader(paths: files.map(\.0), options: .init(concurrency: workers)).forEachFile { _ in
                let seen = count.wrappingAdd(1, ordering: .relaxed).newValue
                if seen == 100 { signal.yield() }
                if seen >= 100 { gate.wait() }
            }
        }
        for await _ in reached { break }
        batch.cancel()
        for _ in 0 ..< 3000 { gate.signal() }
        await #expect(throws: CancellationError.self) { try await batch.value }
        // The files in progress when it was cancelled finish; no other starts.
        #expect(count.load(ordering: .relaxed) < 100 + workers)
        #expect(openDescriptors(under: directory.path) == 0)
    }

    @Test("an empty batch returns at once")
    func emptyBatch() async throws {
        let outcome = try await FileBatchReader(paths: [FilePath]()).forEachFile(perWorker: 0) { count, _ in count += 1 }
        #expect(outcome.reduce(0, +) == 0)
    }
}
