import AsyncFileIO
import ArgumentParser
import CFilecoordCommand
import FileCoordination
import Foundation
import Synchronization

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Show what FileCoordination does, in a temporary directory, in a few seconds."
    )

    @Option(parsing: .unconditional, help: "How many small files the batch read uses.")
    var files = 5000

    @Option(help: ArgumentHelp("The coordination space of the demo's processes (default: one of its own, in its directory).",
                               valueName: "DIR"), completion: .directory)
    var space: String?

    func validate() throws {
        guard files >= 0 else { throw ValidationError("--files must be zero or more") }
        try SpaceSettings.validate(space)
    }

    func run() async throws {
        let root = FilePath(NSTemporaryDirectory()).appending("filecoord-demo-\(getpid())")
        try FileManager.default.createDirectory(atPath: root.string, withIntermediateDirectories: true)
        let interruption = try DemoInterruption(root: root)
        do {
            try await show(root, interruption)
        } catch {
            await interruption.finish()
            throw error
        }
        await interruption.finish()
    }

    private func show(_ root: FilePath, _ interruption: DemoInterruption) async throws {
        say("FileCoordination demo in \(root)\n")

        try await batchRead(root)
        try await atomicReplace(root)
        try await coordination(root)
        try await acrossProcesses(root, interruption)
        say("""

            What happened:
            - Every blocking call (open, read, fsync, rename) ran on threads the library owns,
              never on the Swift cooperative pool; pages already cached were read inline with
              preadv2(RWF_NOWAIT), which cannot block.
            - The batch read kept 16 files in flight, delivered results in order, and turned the
              missing file and the directory into per-file errors without stopping the rest.
            - Atomic writes go to an unnamed O_TMPFILE beside the target, are fsynced and renamed
              into place: the concurrent reader only ever saw a whole old or a whole new file.
            - The coordinated writer waited for the reader, and the presenter was asked to
              relinquish and save before the write, and heard didChange and got its item back
              after it, in Apple's order.
            - Across processes the same happened through a coordination space (a directory, no
              daemon): claims are kernel OFD locks that die with their process, and the writer
              process found the presenter process's registration, asked it through its mailbox
              (inotify on its watcher thread), and waited for its acknowledgement.
            """)
    }

    private func say(_ text: String) {
        filecoord.say(text)
    }

    private func batchRead(_ root: FilePath) async throws {
        say("1. Parallel batch read of \(files) files of 1-16 KiB")
        var paths: [FilePath] = []
        var generator = SystemRandomNumberGenerator()
        for index in 0 ..< files {
            let path = root.appending("small-\(index).bin")
            let size = Int.random(in: 1024 ... 16384, using: &generator)
            try await Data(repeating: UInt8(truncatingIfNeeded: index), count: size).asyncWrite(to: path, options: [.skipSync])
            paths.append(path)
        }
        let broken = [root.appending("no-such-file"), root]
        let clock = ContinuousClock()
        var bytes = 0, failures: [FileCoordinationError] = []
        let start = clock.now
        for try await file in FileBatchReader(paths: paths + broken) {
            switch file.result {
            case .success(let data): bytes += data.count
            case .failure(let error): failures.append(error)
            }
        }
        let ours = clock.now - start
        let foundationStart = clock.now
        let allPaths = paths
        let foundationBytes = await withCheckedContinuation { continuation in
            // Foundation's synchronous read, on a thread of its own so it blocks no task.
            Thread.detachNewThread {
                var total = 0
                for path in allPaths { total += (try? Data(contentsOf: path.fileURL))?.count ?? 0 }
                continuation.resume(returning: total)
            }
        }
        let foundation = clock.now - foundationStart
        say("   FileBatchReader:            \(rate(paths.count, ours)) files/s (\(bytes) bytes)")
        say("   Data(contentsOf:) in a loop: \(rate(paths.count, foundation)) files/s (\(foundationBytes) bytes)")
        for failure in failures { say("   per-file error, batch went on: \(failure)") }
    }

    private func atomicReplace(_ root: FilePath) async throws {
        say("\n2. Atomic replacement under a concurrent reader")
        let path = root.appending("document.txt")
        let old = Data(repeating: UInt8(ascii: "a"), count: 256 * 1024)
        let new = Data(repeating: UInt8(ascii: "b"), count: 256 * 1024)
        try await old.asyncWrite(to: path)
        let rounds = 100
        let reader = Task {
            var seen = (old: 0, new: 0, torn: 0)
            while !Task.isCancelled {
                // Cancelled mid-read means the demo is over, not that the read failed.
                guard let data = try? await Data(asyncContentsOf: path) else { continue }
                if data == old { seen.old += 1 } else if data == new { seen.new += 1 } else { seen.torn += 1 }
            }
            return seen
        }
        for round in 0 ..< rounds {
            try await (round.isMultiple(of: 2) ? new : old).asyncWrite(to: path)
        }
        reader.cancel()
        let seen = await reader.value
        say("   \(rounds) atomic replacements; the reader saw \(seen.old) old, \(seen.new) new, \(seen.torn) torn files")
    }

    private func coordination(_ root: FilePath) async throws {
        say("\n3. Coordinated access: a presenter, a reader and a writer in one process")
        let url = root.appending("shared.txt").fileURL
        try await Data("draft".utf8).asyncWrite(to: url)
        let presenter = DemoPresenter(url: url) { say("   presenter: \($0)") }
        await FileCoordinator.addFilePresenter(presenter)
        defer { FileCoordinator.removeFilePresenter(presenter) }

        let readerHolding = AsyncStream.makeStream(of: Void.self)
        let reader = Task {
            try await FileCoordinator().coordinate(readingItemAt: url, options: .withoutChanges) { url in
                say("   reader:    reading (holds a shared claim)")
                readerHolding.continuation.yield()
                let text = try await Data(asyncContentsOf: url)
                say("   reader:    read \(text.count) bytes, done")
            }
        }
        for await _ in readerHolding.stream { break }
        say("   writer:    asking to write (waits for the reader)")
        try await FileCoordinator().coordinate(writingItemAt: url) { url in
            say("   writer:    writing")
            try await Data("final text".utf8).asyncWrite(to: url)
        }
        try await reader.value
        say("   writer:    done; the file now says \"\(String(decoding: try await Data(asyncContentsOf: url), as: UTF8.self))\"")
    }

    private func acrossProcesses(_ root: FilePath, _ interruption: DemoInterruption) async throws {
        say("\n4. Across processes: `filecoord present` in one process, `filecoord write` and `exec` in others")
        let space = self.space ?? root.appending("space").string, file = root.appending("shared.txt").string
        _ = FileManager.default.createFile(atPath: file, contents: Data("first version\n".utf8))
        let me = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let presenter = Process()
        presenter.executableURL = me
        presenter.arguments = ["present", file, "--space", space, "--ack-delay", "200ms"]
        let output = Pipe()
        presenter.standardOutput = output
        try interruption.start(presenter)
        // Its lines, read on a thread of their own (a pipe read blocks).
        let (lines, sink) = AsyncStream.makeStream(of: String.self)
        let handle = output.fileHandleForReading
        Thread.detachNewThread {
            var pending = Data()
            while case let chunk = handle.availableData, !chunk.isEmpty {
                pending.append(chunk)
                while let newline = pending.firstIndex(of: 0x0A) {
                    sink.yield(String(decoding: pending[..<newline], as: UTF8.self))
                    pending.removeSubrange(...newline)
                }
            }
            sink.finish()
        }
        let pid = presenter.processIdentifier
        var iterator = lines.makeAsyncIterator()
        guard let ready = await iterator.next() else {
            // It never got as far as `ready`: what it printed on stderr is above.
            let ended = await interruption.end(of: presenter)
            let how = ended.terminationReason == .exit ? "with status \(ended.terminationStatus)"
                : "killed by signal \(ended.terminationStatus)"
            Output.error("the presenter process (pid \(pid)) ended \(how) before it was ready")
            throw Status.failed
        }
        say("   presenter (pid \(pid)): \(ready)")
        let printer = Task {
            for await line in lines { say("   presenter (pid \(pid)): \(line)") }
        }
        func child(_ arguments: [String], input: String? = nil) async throws -> Int32 {
            let process = Process()
            process.executableURL = me
            process.arguments = arguments
            let stdin = Pipe()
            process.standardInput = stdin
            try interruption.start(process)
            if let input { stdin.fileHandleForWriting.write(Data(input.utf8)) }
            try stdin.fileHandleForWriting.close()
            return await interruption.end(of: process).terminationStatus
        }
        say("   writer process: filecoord write shared.txt (the presenter takes 200 ms to acknowledge)")
        let start = ContinuousClock.now
        _ = try await child(["write", file, "--space", space], input: "second version\n")
        say("   writer process: done after \(Int((ContinuousClock.now - start) / .milliseconds(1))) ms")
        say("   four processes, 25 increments each, of one counter under `filecoord exec --write`:")
        let counter = root.appending("counter").string
        _ = FileManager.default.createFile(atPath: counter, contents: Data("0".utf8))
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0 ..< 4 {
                group.addTask {
                    for _ in 0 ..< 25 {
                        _ = try await child(["exec", "--space", space, "--write", counter, "--", "sh", "-c",
                                             #"n=$(cat "$0"); echo $((n+1)) > "$0""#, counter])
                    }
                }
            }
            try await group.waitForAll()
        }
        let total = (try? String(contentsOfFile: counter, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
        say("   counter: \(total) (of 100; without coordination such a loop loses updates)")
        presenter.terminate()
        _ = await interruption.end(of: presenter)
        printer.cancel()
        _ = await printer.result
    }

    private func rate(_ count: Int, _ duration: Duration) -> String {
        let seconds = Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
        return String(format: "%8.0f", Double(count) / max(seconds, 1e-9))
    }
}

/// The demo's directory and processes, and what an interrupted demo undoes: a terminating
/// signal sent to it stops the processes it started (its presenter would otherwise run
/// on, waiting for a signal of its own) and removes its directory, then it dies by that
/// signal. A signal ignored when `filecoord` started
/// (`nohup`) stays ignored; one that comes while the demo is finishing on its own is.
final class DemoInterruption: Sendable {
    /// The pids of the processes the demo started and has not seen end.
    private let children = Locked<Set<Int32>>([])
    /// Set by whichever removes the directory first: the end of the demo or a signal.
    private let cleaning = Atomic<Bool>(false)
    private let root: FilePath
    private let handled = TerminatingSignals.handled

    init(root: FilePath) throws {
        self.root = root
        try CaughtSignals.shared.catchSignals(handled) { [self] number in interrupted(by: number) }
    }

    private func interrupted(by number: Int32) {
        guard !cleaning.exchange(true, ordering: .acquiringAndReleasing) else { return }
        // `exec` passes SIGTERM on to its command and ends with it. Each is waited for
        // without being reaped: Foundation's `Process` reaps its own children.
        // (Under the lock that `start` takes: no process starts after this.)
        for pid in children.withLock({ $0 }) where kill(pid, SIGTERM) == 0 {
            var info = siginfo_t()
            _ = waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT)
        }
        // The demo's tasks may still be creating files in it: moved aside first, the
        // directory takes no new ones by its path.
        let aside = root.string + ".removing"
        let gone = rename(root.string, aside) == 0 ? aside : root.string
        for _ in 0 ..< 3 where (try? FileManager.default.removeItem(atPath: gone)) == nil {}
        TerminatingSignals.die(by: number)
    }

    /// Starts `process`, noted as one to stop if the demo is interrupted; once it is
    /// interrupted, starts nothing (and throws `CancellationError`).
    func start(_ process: Process) throws {
        try children.withLock { pids in
            guard !cleaning.load(ordering: .acquiring) else { throw CancellationError() }
            try process.run()
            pids.insert(process.processIdentifier)
        }
    }

    /// `process`, once it has ended (waited for on a thread of its own: the wait blocks),
    /// no longer one to stop.
    func end(of process: Process) async -> Process {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread { [self] in
                process.waitUntilExit()
                _ = children.withLock { $0.remove(process.processIdentifier) }
                continuation.resume(returning: process)
            }
        }
    }

    /// The demo is over: removes its directory, and the signals act as before. If a signal
    /// came first, this waits for its handler to end the process instead.
    func finish() async {
        guard !cleaning.exchange(true, ordering: .acquiringAndReleasing) else {
            await withUnsafeContinuation { (_: UnsafeContinuation<Void, Never>) in }
            return
        }
        try? FileManager.default.removeItem(atPath: root.string)
        CaughtSignals.shared.release(handled)
    }
}

/// The demo's presenter: narrates every callback.
final class DemoPresenter: FilePresenter {
    let presentedItemURL: URL?
    private let say: @Sendable (String) -> Void

    init(url: URL, say: @escaping @Sendable (String) -> Void) {
        presentedItemURL = url
        self.say = say
    }

    func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? {
        say("relinquish to a reader")
        return { [say] in say("reacquire after the read") }
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        say("relinquish to a writer")
        return { [say] in say("reacquire after the write") }
    }

    func savePresentedItemChanges() async throws { say("save unsaved changes") }
    func presentedItemDidChange() async { say("the item changed: reload") }
}

/// Narration on stdout.
func say(_ text: String) {
    Output.writeStandardOutput(Array((text + "\n").utf8))
}
