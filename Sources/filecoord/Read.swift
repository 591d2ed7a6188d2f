import ArgumentParser
import AsyncFileIO
import FileCoordination
import Foundation

extension FileIOEngine: ExpressibleByArgument {
    public init?(argument: String) {
        switch argument {
        case "threadPool", "threads": self = .threadPool
        case "dispatchIO", "dispatch": self = .dispatchIO
        default: return nil
        }
    }

    public static var allValueStrings: [String] { ["threadPool", "dispatchIO"] }
}

struct Read: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "read",
        abstract: "Read files in parallel, each under a coordinated read intent.",
        discussion: """
            Every file up to 16 MiB is read whole; a larger one, or a device whose size is \
            not known (/dev/zero), is read 1 MiB at a time once the batch reaches it, so \
            memory stays bounded. A file that fails is reported on stderr (and in its --json \
            line) and skipped; \
            the others are still read, and the exit status is 1. Without --cat or --json \
            a summary goes to stderr. --json prints one line per file on stdout, in the \
            order given, {"bytes":B,"path":P} or {"code":C,"errno":E?,"error":TEXT,"path":P} \
            (pathBase64 beside a name that is not UTF-8), then the summary \
            {"bytes":B,"failed":F,"files":N,"filesPerSecond":X,"mibPerSecond":Y,"seconds":S} (keys sorted), \
            where seconds times the read phase only. A progress bar is drawn on stderr when \
            it is a terminal, unless --cat writes to that terminal too. Without --cat (and \
            without a progress bar), each file is counted on the thread that read it; \
            failures are then reported once the batch is done, in the order given.
            """
    )

    @Argument(help: "Files to read.", completion: .file())
    var paths: [String] = []

    @Option(name: .customLong("from-list"), help: ArgumentHelp("Read paths from FILE, one a line (- for stdin); once.", valueName: "FILE"), completion: .file())
    var fromLists: [String] = []

    @Flag(name: [.customShort("z"), .customLong("null")], help: "The list separates paths with NUL bytes, for names that contain newlines.")
    var nullSeparated = false

    @Option(parsing: .unconditional, help: "How many files are read at once.")
    var concurrency = Self.defaultConcurrency

    /// `--concurrency`'s default.
    static let defaultConcurrency = 16

    @Flag(name: .customLong("no-coordination"), help: "Read without taking coordinated read intents.")
    var noCoordination = false

    @Flag(help: "Write the contents to stdout in the order given (byte-identical to cat).")
    var cat = false

    @Flag(help: "Print one JSON summary object on stdout.")
    var json = false

    @Option(help: ArgumentHelp("The I/O engine: threadPool (default) or dispatchIO.", valueName: "ENGINE"),
            completion: .list(["threadPool", "dispatchIO"]))
    var engine: FileIOEngine = .default

    /// Files larger than this are not read whole: the batch fails them as too large and
    /// they are then read in chunks of `chunkSize`, so that memory stays bounded whatever
    /// the files are (a multi-GB image, `/dev/zero`).
    static let wholeFileLimit = 16 << 20
    static let chunkSize = 1 << 20

    @OptionGroup var coordination: CoordinationOptions

    /// The values given, apart from the parser.
    var settings: ReadSettings {
        ReadSettings(paths: paths, fromList: fromLists.first, nullSeparated: nullSeparated, concurrency: concurrency,
                     noCoordination: noCoordination, cat: cat, json: json, engine: engine, coordination: coordination.settings)
    }

    func validate() throws {
        // A second list would silently replace the first.
        guard fromLists.count <= 1 else { throw ValidationError("--from-list may be given once (join the lists: cat A B | filecoord read --from-list -)") }
        try settings.validate()
    }

    /// How many files may be open at once, leaving one descriptor free: libdispatch's
    /// monitor of its worker threads opens `/proc/self/task/…/stat` about once a second
    /// and stops the process (SIGILL) when it cannot, as it did under `ulimit -n 7` while
    /// a batch held the last descriptor. `Int.max` when the limit is not low; nil when
    /// fewer than two descriptors are free (nothing can be read safely).
    static func descriptorHeadroom() -> Int? {
        guard let (limit, open) = Descriptors.underLowLimit() else { return .max }
        let free = limit - open
        return free >= 2 ? free - 1 : nil
    }

    /// Reads a list of paths from a file or stdin, split on `separator`.
    static func readList(_ source: String, separator: UInt8) async throws -> [FilePath] {
        let data: Data
        do {
            if source == "-" {
                data = try await DescriptorWriter(fd: 0, label: "filecoord.stdin").readToEnd()
            } else {
                // Read as a stream: a FIFO (`<(find …)`, `/dev/stdin`) is a list too. Its
                // open waits for a writer, on an I/O thread.
                let path = RawArguments.path(source)
                let fd = try await runOnIOThread {
                    let fd = path.withPlatformString { open($0, O_RDONLY | O_CLOEXEC) }
                    guard fd >= 0 else { throw FileCoordinationError(.open, errno: Errno(rawValue: errno), path: path) }
                    return fd
                }
                defer { close(fd) }
                data = try await DescriptorWriter(fd: fd, label: "filecoord.list").readToEnd(name: path.string)
            }
        } catch let error as FileCoordinationError {
            Output.report(error)
            throw Status.failed
        }
        // One pass over the bytes: each line (or NUL-separated name) becomes a path, empty
        // ones are skipped. (Splitting `Data` into slices cost more than reading the files.)
        // A NUL inside a line is no name's: cut there, the name would be another file's.
        let (paths, lineWithNUL) = data.withUnsafeBytes { raw -> ([FilePath], Int?) in
            var paths: [FilePath] = []
            var start = 0
            while start < raw.count {
                let end = memchr(raw.baseAddress! + start, Int32(separator), raw.count - start)
                    .map { UnsafeRawPointer($0) - raw.baseAddress! } ?? raw.count
                if end > start {
                    let name = UnsafeRawBufferPointer(rebasing: raw[start ..< end])
                    if separator != 0, memchr(name.baseAddress!, 0, name.count) != nil {
                        return (paths, raw[..<start].count { $0 == separator } + 1)
                    }
                    paths.append(RawArguments.path(bytes: Array(name)))
                }
                start = end + 1
            }
            return (paths, nil)
        }
        if let lineWithNUL {
            let list = source == "-" ? FilePath("stdin") : RawArguments.path(source)
            Output.report(FileCoordinationError(.readTheList, code: .invalidArgument, path: list, errno: .invalidArgument,
                                                message: "line \(lineWithNUL) holds a NUL byte, which no name can (a NUL-separated list takes -z)"))
            throw Status.failed
        }
        return paths
    }

    func run() async throws { try await settings.run() }
}

/// What ``Read`` holds, and what it does: a plain value, which ``QuickArguments`` makes
/// from the usual arguments without the parser.
struct ReadSettings: Sendable {
    var paths: [String]
    var fromList: String?
    var nullSeparated: Bool
    var concurrency: Int
    var noCoordination: Bool
    var cat: Bool
    var json: Bool
    var engine: FileIOEngine
    var coordination: CoordinationSettings

    /// Its own options' checks (those of ``CoordinationSettings`` are made first).
    func validate() throws {
        guard concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1") }
        guard !paths.isEmpty || fromList != nil else { throw ValidationError("name files to read, or --from-list") }
        guard !(cat && json) else { throw ValidationError("--cat and --json cannot be combined") }
    }

    func run() async throws {
        var list = paths.map(RawArguments.path)
        if let fromList {
            list += try await Read.readList(fromList, separator: nullSeparated ? 0 : UInt8(ascii: "\n"))
        }

        let output = cat ? DescriptorWriter(fd: 1, label: "filecoord.stdout") : nil
        // No bar where it would be drawn into the contents: --cat onto the same terminal.
        // `--json` gives its lines once the batch is done: no bar.
        let progress = Output.standardErrorIsTerminal && !json && !(cat && Output.standardOutputIsTerminal)
            ? Progress(total: list.count) : nil
        guard let headroom = Read.descriptorHeadroom() else {
            Output.report(FileCoordinationError(.read, code: .tooManyOpenFiles, path: nil, errno: .tooManyOpenFiles,
                                                message: "too few file descriptors free (ulimit -n): reading needs 2 beside those the process has open"))
            throw Status.failed
        }
        let options = BatchReadOptions(concurrency: min(concurrency, headroom), maximumFileSize: Read.wholeFileLimit, engine: engine)
        let coordinator = noCoordination ? nil : try await coordination.coordinator()
        // A file's claim that waits says who is in the way, as every claim does.
        let wanted = noCoordination ? [] : list.map { InTheWay.Wanted(path: $0, isWrite: false) }
        if !cat && progress == nil {
            // Nothing to write out and no progress to draw: count each file where it was read.
            try await coordination.run(wanted: wanted) { _ in
                try await summarizeInPlace(list, options: options, coordinator: coordinator)
            }
            return
        }
        let results: any AsyncSequence<BatchReadResult, any Error>
        if let coordinator {
            results = coordinator.readFiles(at: list, batchOptions: options)
        } else {
            results = FileBatchReader(paths: list, options: options)
        }
        try await coordination.run(wanted: wanted) { _ in
            try await consume(results, coordinator: coordinator, output: output, progress: progress)
        }
    }

    /// What each batch worker counts: files and bytes read, and the failures with their
    /// positions (reported in the order given once the batch is done).
    private struct Tally: Sendable {
        var files = 0
        var bytes = 0
        var failures: [(index: Int, error: FileCoordinationError)] = []
        /// The files too large to be read whole, streamed after the batch.
        var large: [Int] = []
        /// Each file's size, by position, for `--json`'s line per file (nil: not kept).
        var sizes: [(index: Int, bytes: Int)]?

        init(keepingSizes: Bool) { sizes = keepingSizes ? [] : nil }

        mutating func add(_ file: BatchFileContents) {
            switch file.bytes {
            case .success(let bytes):
                files += 1
                self.bytes += bytes.count
                sizes?.append((file.index, bytes.count))
            case .failure(let error) where error.code == .fileTooLarge:
                large.append(file.index)
            case .failure(let error):
                failures.append((file.index, error))
            }
        }
    }

    /// The summary modes: the batch is read in place (`forEachFile`), nothing crosses
    /// threads per file.
    private func summarizeInPlace(_ list: [FilePath], options: BatchReadOptions, coordinator: FileCoordinator?) async throws {
        let clock = ContinuousClock()
        let start = clock.now
        let partials: [Tally]
        let empty = Tally(keepingSizes: json)
        if let coordinator {
            partials = try await coordinator.readFiles(at: list, batchOptions: options)
                .forEachFile(perWorker: empty) { tally, file in tally.add(file) }
        } else {
            partials = try await FileBatchReader(paths: list, options: options).forEachFile(perWorker: empty) { tally, file in tally.add(file) }
        }
        var files = partials.reduce(0) { $0 + $1.files }, bytes = partials.reduce(0) { $0 + $1.bytes }
        var failures = partials.flatMap(\.failures)
        var sizes = partials.flatMap { $0.sizes ?? [] }
        for index in partials.flatMap(\.large).sorted() {
            switch try await stream(list[index], coordinator: coordinator, output: nil) {
            case .success(let count):
                files += 1
                bytes += count
                sizes.append((index, count))
            case .failure(let error):
                failures.append((index, error))
            }
        }
        let elapsed = clock.now - start
        failures.sort { $0.index < $1.index }
        var explained: [(index: Int, error: FileCoordinationError)] = []
        for failure in failures { explained.append((failure.index, await Self.explained(failure.error, of: list[failure.index]))) }
        // Failures on stderr in every mode: a script that reads --json's lines is told too.
        for failure in explained { Output.report(failure.error) }
        if json { try await printFiles(list, sizes: sizes, failures: explained) }
        try await summarize(files: files, bytes: bytes, failed: failures.count,
                            timedOut: failures.contains { $0.error.code == .timedOut }, elapsed: elapsed)
    }

    /// Reads the results; `seconds` covers this phase only (not start-up or joining the space).
    private func consume(_ results: any AsyncSequence<BatchReadResult, any Error>, coordinator: FileCoordinator?,
                         output: DescriptorWriter?, progress: Progress?) async throws {
        var files = 0, failed = 0, bytes = 0, timedOut = false
        let clock = ContinuousClock()
        let start = clock.now
        for try await file in results {
            var result = file.result.map { $0.count }
            switch file.result {
            case .success(let data):
                try await output?.write(data)
            case .failure(let error) where error.code == .fileTooLarge:
                result = try await stream(file.path, coordinator: coordinator, output: output)
            case .failure:
                break
            }
            switch result {
            case .success(let count):
                files += 1
                bytes += count
            case .failure(let error):
                failed += 1
                timedOut = timedOut || error.code == .timedOut
                progress?.clear()
                Output.report(await Self.explained(error, of: file.path))
            }
            progress?.update(done: files + failed)
        }
        let elapsed = clock.now - start
        progress?.clear()
        try await summarize(files: files, bytes: bytes, failed: failed, timedOut: timedOut, elapsed: elapsed)
    }

    /// Reads a file too large to be read whole, `chunkSize` bytes at a time, under a
    /// coordinated read claim of its own when coordinating; each chunk is written to
    /// `output`, or only counted. Returns its size, or why it could not be read; an error
    /// writing to `output` is thrown.
    private func stream(_ path: FilePath, coordinator: FileCoordinator?, output: DescriptorWriter?) async throws
        -> Result<Int, FileCoordinationError>
    {
        /// An error of the output's, to be told apart from the file's.
        struct OutputFailed: Error { let error: any Error }
        let engine = self.engine
        @Sendable func copy(_ path: FilePath) async throws -> Int {
            let file = try await path.openForReading(engine: engine)
            var total = 0
            while case let chunk = try await file.read(upToCount: Read.chunkSize), !chunk.isEmpty {
                total += chunk.count
                do { try await output?.write(chunk) } catch { throw OutputFailed(error: error) }
            }
            try await file.close()
            return total
        }
        do {
            if let coordinator {
                return .success(try await coordinator.coordinate(readingItemAt: path.fileURL) { url in
                    try await copy(FilePath(fileURL: url))
                })
            }
            return .success(try await copy(path))
        } catch let failed as OutputFailed {
            throw failed.error
        } catch let error as FileCoordinationError {
            return .failure(error)
        }
    }

    /// `--json`: one object per file, in the order given: its size, or its error.
    private func printFiles(_ list: [FilePath], sizes: [(index: Int, bytes: Int)],
                            failures: [(index: Int, error: FileCoordinationError)]) async throws {
        var lines = [JSONLines.ReadFile?](repeating: nil, count: list.count)
        for (index, count) in sizes { lines[index] = JSONLines.ReadFile(list[index], bytes: count) }
        for (index, error) in failures { lines[index] = JSONLines.ReadFile(list[index], error: error) }
        var text: [UInt8] = []
        for line in lines.compactMap({ $0 }) { text += JSONLines.line(line) }
        try await DescriptorWriter(fd: 1, label: "filecoord.stdout").write(Data(text))
    }

    /// A file's failure as reported: a claim's, absolute and with who held it.
    private static func explained(_ error: FileCoordinationError, of path: FilePath) async -> FileCoordinationError {
        await CoordinationSettings.explained(error, wanted: [InTheWay.Wanted(path: path, isWrite: false)])
    }

    /// The summary line (stderr), or the JSON object (stdout); exit 3 if a file's claim or
    /// presenter timed out, else 1 if any file failed.
    private func summarize(files: Int, bytes: Int, failed: Int, timedOut: Bool, elapsed: Duration) async throws {
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let perSecond = seconds > 0 ? Double(files) / seconds : 0
        let mibPerSecond = seconds > 0 ? Double(bytes) / 1_048_576 / seconds : 0
        if json {
            let summary = JSONLines.ReadSummary(files: files, bytes: bytes, failed: failed, seconds: seconds,
                                                filesPerSecond: perSecond, mibPerSecond: mibPerSecond)
            try await DescriptorWriter(fd: 1, label: "filecoord.stdout").write(Data(JSONLines.line(summary)))
        } else if !cat {
            Output.writeStandardError(Array(Self.summary(files: files, bytes: bytes, failed: failed, seconds: seconds).utf8))
        }
        if failed > 0 { throw timedOut ? Status.timedOut : Status.failed }
    }

    /// The summary line on stderr. The counts are interpolated, not formatted with `%d`,
    /// which takes 32 bits.
    static func summary(files: Int, bytes: Int, failed: Int, seconds: Double) -> String {
        let perSecond = seconds > 0 ? Double(files) / seconds : 0
        let mibPerSecond = seconds > 0 ? Double(bytes) / 1_048_576 / seconds : 0
        return "read \(files) files, \(bytes) bytes in " + String(format: "%.3f s (%.0f files/s, %.1f MiB/s)", seconds, perSecond, mibPerSecond)
            + (failed > 0 ? ", \(failed) failed" : "") + "\n"
    }
}

/// A one-line progress bar on a terminal's stderr, redrawn at most ten times a second.
final class Progress {
    private let total: Int
    private var lastDraw = ContinuousClock.now - .seconds(1)
    private var drawn = false

    init(total: Int) {
        self.total = total
    }

    func update(done: Int) {
        let now = ContinuousClock.now
        guard now - lastDraw >= .milliseconds(100) || done == total else { return }
        lastDraw = now
        let width = 30
        let filled = total > 0 ? width * done / total : width
        let bar = String(repeating: "=", count: filled) + String(repeating: " ", count: width - filled)
        Output.writeStandardError(Array("\r[\(bar)] \(done)/\(total)".utf8))
        drawn = true
    }

    func clear() {
        guard drawn else { return }
        Output.writeStandardError(Array("\r\u{1B}[K".utf8))
        drawn = false
    }
}
