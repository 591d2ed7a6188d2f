import Foundation
import SystemPackage
import Testing
@testable import AsyncFileIO
import TestSupport

/// A pseudo-terminal: a character device whose read, at its far end, waits until the
/// near end is closed (then fails with `EIO`).
private final class PseudoTerminal: Sendable {
    let farEnd: FilePath
    private let nearEnd: Int32

    init() throws {
        // (posix_openpt, unlockpt and ptsname are not in Swift's Glibc: their ioctls.)
        let unlock: UInt = 0x4004_5431, number: UInt = 0x8004_5430 // TIOCSPTLCK, TIOCGPTN
        nearEnd = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC)
        var locked: Int32 = 0, index: UInt32 = 0
        guard nearEnd >= 0, ioctl(nearEnd, unlock, &locked) == 0, ioctl(nearEnd, number, &index) == 0 else {
            throw FixtureError(path: "/dev/ptmx", operation: "open", errno: errno)
        }
        farEnd = FilePath("/dev/pts/\(index)")
    }

    /// Closes the near end: a read at the far end fails.
    func hangUp() { close(nearEnd) }
}

/// A gate that lets every file in at once and records the files left to its owner.
private final class OpenGate: InPlaceGate {
    let skipped = Locked<Set<Int>>([])
    var admitsWithoutBlocking: Bool { true }
    func enter(_ files: [(index: Int, path: PlatformPath)]) -> UInt64? { 1 }
    func enterWithoutBlocking(_ files: [(index: Int, path: PlatformPath)]) -> GateAdmission { .admitted(1) }
    func leave(_ token: UInt64) {}
    func skip(_ index: Int) { _ = skipped.withLock { $0.insert(index) } }
}

@Suite("FileBatchReader")
struct FileBatchReaderTests {
    /// `count` files of varied sizes, with their contents, made off the cooperative pool.
    static func makeFiles(_ directory: TemporaryDirectory, count: Int, maximumSize: Int = 3000) async throws -> [(FilePath, Data)] {
        try await offThePool {
            try (0 ..< count).map { index in
                let content = pattern(index * 37 % maximumSize, seed: UInt64(index))
                return (try directory.make("f\(index)", content), content)
            }
        }
    }

    /// `count` good files with three bad inputs inserted at `positions`: a missing file,
    /// a directory and a FIFO, in that order (their codes: notFound, isDirectory,
    /// unsupportedFileType).
    static func pathsWithBadInputs(_ directory: TemporaryDirectory, count: Int, positions: (Int, Int, Int)) async throws -> [FilePath] {
        let fifo = directory.file("fifo")
        try makeFIFO(fifo)
        var paths = try await makeFiles(directory, count: count).map(\.0)
        paths.insert(directory.file("missing"), at: positions.0)
        paths.insert(directory.path, at: positions.1)
        paths.insert(fifo, at: positions.2)
        return paths
    }

    @Test("results arrive in the given order, complete and correct",
          arguments: [FileIOEngine.threadPool, .dispatchIO], [1, 3, 16])
    func givenOrder(engine: FileIOEngine, concurrency: Int) async throws {
        let directory = TemporaryDirectory("order")
        let files = try await Self.makeFiles(directory, count: 700)
        var index = 0
        let batch = FileBatchReader(paths: files.map(\.0), options: .init(concurrency: concurrency, engine: engine))
        for try await result in batch {
            #expect(result.index == index)
            #expect(result.path == files[index].0)
            #expect(try result.get() == files[index].1)
            index += 1
        }
        #expect(index == files.count)
    }

    @Test("the consumer reads cached files itself while it would wait, and every kind of input reads as a worker reads it",
          .enabled(if: localDiskBase != nil, "no directory on a local disk's file system"),
          arguments: [BatchReadOptions.Order.given, .completion])
    func consumerReads(order: BatchReadOptions.Order) async throws {
        let directory = TemporaryDirectory("consumer", under: localDiskBase!)
        let files = try await Self.makeFiles(directory, count: 1200, maximumSize: 9000)
        let elsewhere = TemporaryDirectory("consumer-tmp")
        let odd = try oddInputs(in: directory, elsewhere: elsewhere, linkTo: files[3].0, overLimit: 9500, nextTo: files[5].0)
        // Regular files first (not f0, which is empty): the consumer's first claim, made
        // before any result can be ready, reads one of them whatever the machine's load.
        var paths = files.dropFirst().map(\.0)
        // Each about ten times, so that the consumer meets each whatever share it reads.
        for (count, position) in stride(from: paths.count, to: 20, by: -13).enumerated() { paths.insert(odd[count % odd.count], at: position) }
        let reader = FileBatchReader(paths: paths, options: .init(concurrency: 16, order: order, maximumFileSize: 9000))
        let iterator = reader.makeAsyncIterator()
        // Taken as fast as they come, so that the consumer waits (and reads) as a quick one
        // does; checked after.
        var results: [BatchReadResult] = []
        while let result = try await iterator.next() { results.append(result) }
        #expect(results.count == paths.count)
        #expect(Set(results.map(\.index)).count == paths.count)
        if order == .given { #expect(results.map(\.index) == Array(paths.indices)) }
        for result in results {
            #expect(result.path == paths[result.index])
            expectReadsAsAlone(result.result.mapError { $0 }, paths[result.index], maximumSize: 9000)
        }
        #expect(iterator.storage.filesReadByConsumer > 0, "the consumer read no file itself")
    }

    @Test("while a worker holds up the next result, the consumer's claims run up to the window and every result still arrives, in order",
          .enabled(if: localDiskBase != nil, "no directory on a local disk's file system"), .timeLimit(.minutes(1)))
    func consumerClaimsWithinTheRing() async throws {
        let directory = TemporaryDirectory("ring", under: localDiskBase!)
        // (Not f0, which is empty: a consumer whose first file is not read stops reading.)
        let files = Array(try await Self.makeFiles(directory, count: 600, maximumSize: 2000).dropFirst())
        // File `held` is the far end of a pseudo-terminal: the consumer leaves it to a
        // worker (not a regular file), whose read waits for the terminal, while the results
        // before it are taken and the consumer reads on in claims of 16 files, as far as the
        // window lets it. Once claiming has stopped, the terminal is hung up and the read
        // fails. Where the consumer's claims start depends on the worker's claims before (4
        // files each); over the positions, some claim starts just short of the window.
        for held in 1 ..< 16 {
            let terminal = try PseudoTerminal()
            var paths = files.map(\.0)
            paths[held] = terminal.farEnd
            let batch = FileBatchReader(paths: paths, options: .init(concurrency: 3))
            var index = 0
            let iterator = batch.makeAsyncIterator()
            let storage = iterator.storage
            let hangUp = Task {
                // Claiming has stopped once the count, past the held file, holds still for
                // 100 ms (10 s at most).
                var previous = -1, still = 0
                for _ in 0 ..< 500 where still < 5 {
                    let claimed = storage.claimedCount
                    still = claimed == previous && claimed > held ? still + 1 : 0
                    previous = claimed
                    try await Task.sleep(for: .milliseconds(20)) // ok: lets the consumer run to the window
                }
                terminal.hangUp()
            }
            while let result = try await iterator.next() {
                try #require(result.index == index, "result \(result.index) in the place of \(index)")
                if index == held {
                    #expect(throws: FileCoordinationError.self) { try result.get() }
                } else {
                    #expect(try result.get() == files[index].1)
                }
                index += 1
            }
            try await hangUp.value
            #expect(index == paths.count)
        }
    }

    @Test("through a gate, the sequence ends only after every group the gate let in has left it (a slow leave included)")
    func gateLeftBeforeTheEnd() async throws {
        /// A gate that lets every group in and takes its time to let one out, as a release
        /// that has to give back kernel locks may.
        final class SlowGate: InPlaceGate {
            let open = Locked(0)
            func enter(_ files: [(index: Int, path: PlatformPath)]) -> UInt64? {
                open.withLock { $0 += 1 }
                return 1
            }
            func leave(_ token: UInt64) {
                usleep(2_000)
                open.withLock { $0 -= 1 }
            }
            func skip(_ index: Int) {}
        }
        // Files of 1 MiB: a worker publishes each result as soon as it is read (see
        // `BatchStorage`), the last of its group too, before the group leaves the gate.
        let directory = TemporaryDirectory("gate")
        let files = try await offThePool {
            try (0 ..< 40).map { index in
                let content = pattern(1 << 20, seed: UInt64(index))
                return (try directory.make("f\(index)", content), content)
            }
        }
        for _ in 0 ..< 5 {
            let gate = SlowGate()
            let iterator = FileBatchReader(paths: files.map(\.0), options: .init(concurrency: 2)).makeAsyncIterator(gate: gate)
            var count = 0
            while let result = try await iterator.next() {
                #expect(try result.get() == files[result.index].1)
                count += 1
            }
            #expect(count == files.count)
            #expect(gate.open.withLock { $0 } == 0, "groups still inside the gate when the sequence ended")
        }
    }

    @Test("through a gate that admits without blocking, the consumer reads only files it let in, while they are in; refused groups and links go to the workers",
          .enabled(if: localDiskBase != nil, "no directory on a local disk's file system"))
    func consumerReadsThroughTheGate() async throws {
        /// Writes a group's files as it lets them in and overwrites them as they leave, as
        /// a writer that waits for their claims would: a file read outside its group's
        /// stay reads other bytes. Admits the consumer's groups by a script.
        final class WritingGate: InPlaceGate {
            struct State {
                var calls = 0
                var nextToken: UInt64 = 1
                var inside: [UInt64: [Int]] = [:]
                var admittedToConsumer = 0
                var refusedToConsumer = 0
                var unknownLeaves = 0
                var skipped: Set<Int> = []
            }
            let state = Locked(State())
            let files: [(FilePath, Data)]
            init(files: [(FilePath, Data)]) { self.files = files }
            var admitsWithoutBlocking: Bool { true }
            func write(_ index: Int, _ content: Data) {
                let fd = open(files[index].0.string, O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC)
                guard fd >= 0 else { return } // a link (not followed)
                _ = content.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
                close(fd)
            }
            private func admit(_ group: [(index: Int, path: PlatformPath)], _ state: inout State) -> UInt64 {
                for file in group { write(file.index, files[file.index].1) }
                defer { state.nextToken += 1 }
                state.inside[state.nextToken] = group.map(\.index)
                return state.nextToken
            }
            func enter(_ group: [(index: Int, path: PlatformPath)]) -> UInt64? { state.withLock { admit(group, &$0) } }
            func enterWithoutBlocking(_ group: [(index: Int, path: PlatformPath)]) -> GateAdmission {
                state.withLock { state in
                    state.calls += 1
                    // The first claim (made before any result is ready) let in, the second
                    // not known yet (the consumer waits and stays a reader), the fifth
                    // refused (it stops reading).
                    switch state.calls {
                    case 2: return .notKnownYet
                    case 5:
                        state.refusedToConsumer += group.count
                        return .refused
                    default:
                        state.admittedToConsumer += group.count
                        return .admitted(admit(group, &state))
                    }
                }
            }
            func leave(_ token: UInt64) {
                state.withLock { state in
                    guard let group = state.inside.removeValue(forKey: token) else { return state.unknownLeaves += 1 }
                    for index in group { write(index, Data("left".utf8)) }
                }
            }
            func skip(_ index: Int) { _ = state.withLock { $0.skipped.insert(index) } }
        }
        let directory = TemporaryDirectory("consumer-gate", under: localDiskBase!)
        // (Not f0, which is empty: a consumer whose first file is not read stops reading.)
        var files = Array(try await Self.makeFiles(directory, count: 1500, maximumSize: 4000).dropFirst())
        // Links to a file beside them, which a read that followed them would find at once;
        // one in every group of 32, wherever a group starts.
        let target = try directory.make("target", pattern(500))
        for position in stride(from: 20, to: files.count, by: 29) {
            let link = directory.file("link\(position)")
            try FileManager.default.createSymbolicLink(atPath: link.string, withDestinationPath: target.lastComponent!.string)
            // Followed once: a link's access time then needs no update when followed again,
            // which a lookup from the kernel's cache alone could not make.
            _ = try Data(contentsOf: URL(fileURLWithPath: link.string))
            files.insert((link, Data()), at: position)
        }
        let links = Set(files.indices.filter { files[$0].0.lastComponent!.string.hasPrefix("link") })
        // Until a group lets them in, the files hold other bytes.
        for (index, file) in files.enumerated() where !links.contains(index) { try writeFixture(Data("none".utf8), toPath: file.0.string) }
        let gate = WritingGate(files: files)
        // One worker beside the consumer, on any machine.
        let iterator = FileBatchReader(paths: files.map(\.0), options: .init(concurrency: 3)).makeAsyncIterator(gate: gate)
        var index = 0
        while let result = try await iterator.next() {
            try #require(result.index == index)
            if links.contains(index) {
                // Left to the gate's owner, which claims the link's target: never read through.
                #expect(throws: FileCoordinationError.self) { try result.get() }
            } else {
                #expect(try result.get() == files[index].1, "file \(index) read outside its group's stay in the gate")
            }
            index += 1
        }
        #expect(index == files.count)
        let seen = gate.state.withLock { $0 }
        #expect(seen.skipped == links)
        #expect(seen.inside.isEmpty, "groups still inside the gate")
        #expect(seen.unknownLeaves == 0, "a group left the gate twice")
        #expect(iterator.filesReadByConsumer > 0, "the consumer read no file itself")
        #expect(iterator.filesReadByConsumer <= seen.admittedToConsumer)
        #expect(seen.refusedToConsumer > 0, "no group refused to the consumer")
    }

    @Test("completion order delivers every file exactly once", arguments: [2, 16])
    func completionOrder(concurrency: Int) async throws {
        let directory = TemporaryDirectory("completion")
        let files = try await Self.makeFiles(directory, count: 500)
        var seen = Set<Int>()
        // (With 2 workers, 500 files are enough for claims of 4 files.)
        for try await result in FileBatchReader(paths: files.map(\.0), options: .init(concurrency: concurrency, order: .completion)) {
            #expect(seen.insert(result.index).inserted)
            #expect(try result.get() == files[result.index].1)
        }
        #expect(seen.count == files.count)
    }

    @Test("bad files become per-file errors and never stop the batch")
    func errorsAreIsolated() async throws {
        let directory = TemporaryDirectory("isolated")
        let paths = try await Self.pathsWithBadInputs(directory, count: 50, positions: (10, 20, 30))
        var failures: [Int: FileCoordinationError.Code] = [:]
        var successes = 0
        for try await result in FileBatchReader(paths: paths) {
            switch result.result {
            case .success: successes += 1
            case .failure(let error):
                failures[result.index] = error.code
                #expect(error.path == paths[result.index])
            }
        }
        #expect(successes == 50)
        #expect(failures == [10: .notFound, 20: .isDirectory, 30: .unsupportedFileType])
    }

    @Test("URLs that are not file URLs fail alone")
    func badURL() async throws {
        let directory = TemporaryDirectory("urls")
        let files = try await Self.makeFiles(directory, count: 3)
        let urls = [files[0].0.fileURL, URL(string: "https://example.com/x")!, files[2].0.fileURL]
        var codes: [FileCoordinationError.Code?] = []
        for try await result in FileBatchReader(urls: urls) {
            if case .failure(let error) = result.result { codes.append(error.code) } else { codes.append(nil) }
        }
        #expect(codes == [nil, .notFileURL, nil])
    }

    @Test("cancelling mid-batch stops promptly and leaves no descriptor open")
    func cancellation() async throws {
        let directory = TemporaryDirectory("cancel")
        let files = try await Self.makeFiles(directory, count: 3000, maximumSize: 20_000)
        let started = AsyncStream.makeStream(of: Void.self)
        let consumer = Task {
            var received = 0
            do {
                for try await _ in FileBatchReader(paths: files.map(\.0), options: .init(concurrency: 16)) {
                    received += 1
                    if received == 100 { started.continuation.yield() }
                    if received > 100 { await Task.yield() }
                }
            } catch is CancellationError {
                return (received, true)
            }
            return (received, false)
        }
        for await _ in started.stream { break }
        consumer.cancel()
        let (received, cancelled) = try await consumer.value
        #expect(cancelled, "the iteration ends with CancellationError")
        #expect(received < files.count)
        // next() throws only once every worker has closed its file.
        #expect(openDescriptors(under: directory.path) == 0)
    }

    @Test("an iterator whose task was cancelled throws CancellationError in any task after", .timeLimit(.minutes(3)))
    func cancelledThenReused() async throws {
        let directory = TemporaryDirectory("reused")
        let files = try await Self.makeFiles(directory, count: 3000)
        nonisolated(unsafe) let iterator = FileBatchReader(paths: files.map(\.0)).makeAsyncIterator()
        _ = try await iterator.next()
        // Results already taken still come; then the cancelled task's next() throws.
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            while try await iterator.next() != nil {}
        }
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        // This task is not cancelled, but the batch is: it throws too (it used to go on
        // handing out what had been read, then wait, spinning, for files no worker reads).
        await #expect(throws: CancellationError.self) { _ = try await iterator.next() }
    }

    @Test("a slow consumer holds reading back (back-pressure)")
    func backPressure() async throws {
        let directory = TemporaryDirectory("pressure")
        let files = try await Self.makeFiles(directory, count: 5000, maximumSize: 100)
        let batch = FileBatchReader(paths: files.map(\.0), options: .init(concurrency: 4))
        let iterator = batch.makeAsyncIterator()
        _ = try await iterator.next()
        // Wait until the workers pause: they stop claiming once far enough ahead.
        var previous = -1
        while iterator.storage.claimedCount != previous {
            previous = iterator.storage.claimedCount
            await Task.yield()
            try await Task.sleep(for: .milliseconds(20)) // ok: lets workers run to their pause
        }
        #expect(iterator.storage.claimedCount < 1000, "reading ran \(iterator.storage.claimedCount) files ahead")
        var count = 1
        while try await iterator.next() != nil { count += 1 }
        #expect(count == 5000)
    }

    @Test("past the buffer limit in the middle of a claimed group, the rest is given back and read in order",
          arguments: [1, 2])
    func groupGivenBack(concurrency: Int) async throws {
        let directory = TemporaryDirectory("giveback")
        // Small files first (claims of 4 files: the largest so far fits 4 times), then
        // files larger than the whole buffer limit: the first group of them stops after
        // one file and gives the rest back.
        let files = try (0 ..< 160).map { index in
            let content = pattern(index < 130 ? 10 : 70_000, seed: UInt64(index))
            return (try directory.make("f\(index)", content), content)
        }
        var gaveBack = false
        // Whether the group is given back depends on the consumer not having taken the
        // large file in between; the first result is taken, then nothing until the
        // workers pause. A few attempts make the path certain to run.
        for _ in 0 ..< 5 where !gaveBack {
            let batch = FileBatchReader(paths: files.map(\.0),
                                        options: .init(concurrency: concurrency, maximumBufferedBytes: 64 * 1024))
            let iterator = batch.makeAsyncIterator()
            var result = try await iterator.next()
            var previous = -1
            while iterator.storage.claimedCount != previous {
                previous = iterator.storage.claimedCount
                try await Task.sleep(for: .milliseconds(20)) // ok: lets workers run to their pause
            }
            var index = 0
            while let current = result {
                #expect(current.index == index)
                #expect(try current.get() == files[index].1)
                index += 1
                result = try await iterator.next()
            }
            #expect(index == files.count)
            gaveBack = iterator.storage.groupsGivenBack > 0
        }
        #expect(gaveBack)
    }

    /// Takes every result in order and checks it (a file left to the gate's owner fails).
    /// Once `pause` holds, takes nothing until the workers pause: what they buffer
    /// meanwhile is what the buffer limit lets through.
    private static func readAll(_ iterator: FileBatchReader.Iterator, _ files: [(FilePath, Data)], gate: OpenGate,
                                pausingOnce pause: () -> Bool) async throws {
        var index = 0
        var paused = false
        while let result = try await iterator.next() {
            #expect(result.index == index)
            if gate.skipped.withLock({ $0.contains(index) }) {
                #expect(throws: FileCoordinationError.self) { try result.get() } // left to the gate's owner
            } else {
                #expect(try result.get() == files[index].1, "file \(index)")
            }
            index += 1
            if !paused, pause() {
                paused = true
                var previous = -1
                while iterator.storage.mostBufferedBytes != previous {
                    previous = iterator.storage.mostBufferedBytes
                    try await Task.sleep(for: .milliseconds(20)) // ok: lets workers run to their pause
                }
            }
        }
        #expect(index == files.count)
    }

    @Test("under a gate, the files the consumer leaves at the buffer limit go back as one group, within which a worker stops at the limit",
          .enabled(if: localDiskBase != nil, "no directory on a local disk's file system"), .timeLimit(.minutes(2)))
    func consumerLeavesAtTheLimit() async throws {
        let directory = TemporaryDirectory("consumer-limit", under: localDiskBase!)
        // Small files (claimed 32 at a time: the largest so far fits), then files of 1 MiB
        // under a limit of 2 MiB: the group that takes the jump, when the consumer has it,
        // stops after two of them.
        let files = try await offThePool {
            try (0 ..< 260).map { index in
                let content = pattern(index < 200 ? 10 : 1 << 20, seed: UInt64(index))
                return (try directory.make("f\(index)", content), content)
            }
        }
        var stopped = false
        // Whether the consumer or the worker beside it takes the jump is the machine's
        // choice: a few batches make the consumer's case certain to run.
        for _ in 0 ..< 12 where !stopped {
            let gate = OpenGate()
            let iterator = FileBatchReader(paths: files.map(\.0), options: .init(concurrency: 3, maximumBufferedBytes: 2 << 20))
                .makeAsyncIterator(gate: gate)
            // Once the consumer has left files at the limit, nothing is taken until the workers
            // pause.
            try await Self.readAll(iterator, files, gate: gate) { iterator.storage.consumerStoppedAtLimit > 0 }
            // The limit, and a file more for the consumer and for each worker at most (the
            // first of a group is read whatever is buffered).
            #expect(iterator.storage.mostBufferedBytes <= 8 << 20, "\(iterator.storage.mostBufferedBytes) bytes buffered")
            stopped = iterator.storage.consumerStoppedAtLimit > 0
        }
        #expect(stopped, "the consumer never stopped at the buffer limit")
    }

    @Test("files the consumer leaves to the workers, with gaps between them, are read past the buffer limit only when they are next",
          .enabled(if: localDiskBase != nil, "no directory on a local disk's file system"), .timeLimit(.minutes(3)),
          arguments: [false, true])
    func leftFilesWaitTheirTurn(gated: Bool) async throws {
        let directory = TemporaryDirectory("consumer-left", under: localDiskBase!)
        // Small files, then small and 2 MiB files in turn: a claim of the consumer's that
        // reaches past the small ones while only they are known leaves each large one to
        // the workers (it is over what the consumer reads inline), one apart from the next.
        let files = try await offThePool {
            try (0 ..< 264).map { index in
                let content = pattern(index < 200 || index % 2 == 0 ? 10 : 2 << 20, seed: UInt64(index))
                return (try directory.make("f\(index)", content), content)
            }
        }
        var left = false
        // Whether the consumer or a worker beside it takes the jump is the machine's
        // choice: a few batches make the consumer's case certain to run.
        for _ in 0 ..< 16 where !left {
            let gate = OpenGate()
            let batch = FileBatchReader(paths: files.map(\.0), options: .init(concurrency: 3, maximumBufferedBytes: 2 << 20))
            let iterator = gated ? batch.makeAsyncIterator(gate: gate) : batch.makeAsyncIterator()
            // Once the consumer has left files, nothing is taken until the workers pause.
            try await Self.readAll(iterator, files, gate: gate) { iterator.storage.filesLeftByConsumer > 1 }
            // The limit, and a file more for each worker at most.
            #expect(iterator.storage.mostBufferedBytes <= 8 << 20, "\(iterator.storage.mostBufferedBytes) bytes buffered")
            left = iterator.storage.filesLeftByConsumer > 1
        }
        #expect(left, "the consumer never left files to the workers")
    }

    @Test("an empty batch ends at once")
    func emptyBatch() async throws {
        var count = 0
        for try await _ in FileBatchReader(paths: [FilePath]()) { count += 1 }
        #expect(count == 0)
    }

    @Test("an abandoned iterator stops its workers")
    func abandoned() async throws {
        let directory = TemporaryDirectory("abandon")
        let files = try await Self.makeFiles(directory, count: 2000)
        do {
            let iterator = FileBatchReader(paths: files.map(\.0)).makeAsyncIterator()
            _ = try await iterator.next()
        }
        await waitUntil { openDescriptors(under: directory.path) == 0 }
        #expect(openDescriptors(under: directory.path) == 0)
    }

    @Test("workers that all lack a descriptor fail after a short grace (for a descriptor the runtime holds a moment) instead of waiting for one another",
          .timeLimit(.minutes(3)))
    func descriptorsHeldElsewhere() async throws {
        // Every open fails with EMFILE (the descriptors are held elsewhere in the process,
        // not by the batch): waiting workers hold none, so nobody in the batch can free
        // one. Each worker tries for the grace (``DescriptorWaits/aloneRetries``, 50 ms),
        // not for the ~1 s a worker waits while another may still close a file.
        let descriptors = DescriptorWaits()
        let tries = Locked<[Int]>([])
        // Two workers (whether or not they run at the same time).
        DispatchQueue.concurrentPerform(iterations: 2) { _ in
            descriptors.workerStarted()
            defer { descriptors.workerEnded() }
            var count = 0
            let result: Result<Int, FileCoordinationError> = descriptors.read {
                count += 1
                return .failure(FileCoordinationError("open", errno: .tooManyOpenFiles, path: "/f"))
            }
            #expect(throws: FileCoordinationError.self) { try result.get() }
            tries.withLock { $0.append(count) }
        }
        let counts = tries.withLock { $0 }
        // A worker may also wait while the other still runs: a few tries more at most.
        #expect(counts.count == 2 && counts.allSatisfy { $0 <= 2 * DescriptorWaits.aloneRetries + 2 }, "tries per worker: \(counts)")
    }

    @Test("a worker without a descriptor waits while another worker reads a file, then succeeds",
          .timeLimit(.minutes(3)))
    func descriptorWaitsForReader() async throws {
        let descriptors = DescriptorWaits()
        let entered = DispatchSemaphore(value: 0)
        let finish = DispatchSemaphore(value: 0)
        descriptors.workerStarted()
        descriptors.workerStarted()
        let holder = Thread {
            _ = descriptors.read { () -> Result<Int, FileCoordinationError> in
                entered.signal()
                finish.wait() // holds "its file" until the other worker has failed twice
                return .success(1)
            }
        }
        holder.start()
        entered.wait()
        var tries = 0
        let result: Result<Int, FileCoordinationError> = descriptors.read {
            tries += 1
            if tries == 2 { finish.signal() }
            return tries < 3 ? .failure(FileCoordinationError("open", errno: .tooManyOpenFiles, path: "/f")) : .success(2)
        }
        #expect(try result.get() == 2)
        #expect(tries == 3)
    }
}
