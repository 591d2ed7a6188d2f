@_spi(FileCoordinationInternal) import AsyncFileIO
import ArgumentParser
import CFilecoordCommand
import FileCoordination
import Foundation
import Synchronization

struct Present: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "present",
        abstract: "Present a file or directory and print every callback until a signal, --count events or --timeout.",
        discussion: """
            Registers a presenter for PATH (a file, or a directory covering its whole subtree). \
            It hears changes made by any program, coordinated or not. The first line is \
            "ready", printed once the presenter is registered and its watches are in place. \
            It ends on SIGINT, SIGTERM, SIGHUP or SIGQUIT (it removes its presenter, then \
            dies by the signal: the shell sees 128+N), after --count events (exit 0, \
            once the access a relinquish let through has ended), or when no event came for \
            --timeout (exit 2). Events: \(EventFilter.names.joined(separator: ", ")). \
            With --json each line is one object, keys sorted: \
            {"date":ISO8601,"event":E,"path":P,"pid":N?,"time":EPOCH,"to":Q?}; pid is \
            this process's for ready, and the asking process's for relinquishToReader, \
            relinquishToWriter and the reacquire after them (other events do not know who \
            made the change). A name that is not UTF-8 also gets pathBase64 (and toBase64) \
            with its exact bytes. In text lines, a backslash, a control character and any \
            byte that is not UTF-8 are escaped as `ls -b` escapes them (\\\\, \\n, \\ooo). \
            A directory left unwatched because the user's inotify watch limit is reached is \
            printed as "unwatched DIR" (changes made inside it by programs that do not \
            coordinate are not heard), after ready or when it is created. \
            Coordinated readers and writers in every process of the space message it first.
            """
    )

    @Argument(help: "The file or directory to present.", completion: .file())
    var path: String

    @Flag(help: "Print one JSON object per line.")
    var json = false

    @Option(name: .customLong("ack-delay"), parsing: .unconditional,
            help: ArgumentHelp("Wait this long before acknowledging a relinquish.", valueName: "DURATION"))
    var ackDelay = CommandDuration(seconds: 0)

    @Flag(name: .customLong("refuse-writers"), help: "Answer relinquish-to-writer with an error.")
    var refuseWriters = false

    @OptionGroup var space: SpaceOption

    /// On by default: a shell's `echo x > f` truncates, then writes, and would print two
    /// changes; 50 ms is far below what a person or a script notices.
    @Option(parsing: .unconditional,
            help: ArgumentHelp("Print a change made outside coordination once when it repeats within this interval (a truncation and the write after it are one change); 0 prints every inotify event.",
                               valueName: "DURATION"))
    var settle = CommandDuration(seconds: 0.05)

    @Option(parsing: .unconditional,
            help: ArgumentHelp("Exit 0 after N events (ready and unwatched lines do not count); a relinquish's writer or reader has finished by then.",
                               valueName: "N"))
    var count: Int?

    @Flag(help: "Exit 0 after the first event: --count 1.")
    var once = false

    @Option(parsing: .unconditional,
            help: ArgumentHelp("Exit 2 when no event comes for this long (after ready, and after each event); 0 waits for ever, as inotifywait -t 0.", valueName: "DURATION"))
    var timeout: CommandDuration?

    @Option(name: [.customShort("e"), .customLong("event")], help: ArgumentHelp("Print (and count) only these events, comma-separated; the option may be repeated.", valueName: "NAME[,NAME...]"), completion: .list(EventFilter.names))
    var events: [String] = []

    @Option(help: ArgumentHelp("Print only events whose path (or a move's destination) matches this POSIX extended regular expression.", valueName: "REGEX"))
    var include: String?

    @Option(help: ArgumentHelp("Leave out events whose path (and a move's destination) match this POSIX extended regular expression.", valueName: "REGEX"))
    var exclude: String?

    func validate() throws {
        try ackDelay.requireNonNegative("--ack-delay")
        try settle.requireNonNegative("--settle")
        try timeout?.requireNonNegative("--timeout")
        if let count, count < 1 { throw ValidationError("--count must be 1 or more") }
        if once, let count, count != 1 { throw ValidationError("--once and --count \(count) contradict each other") }
        _ = try EventFilter(events: events, include: include, exclude: exclude)
    }

    func run() async throws {
        let target = RawArguments.path(path)
        // On the name's own bytes (a name that is not UTF-8 is a name), and with the
        // kernel's reason (a loop of links is ELOOP, not "no such file").
        var info = stat()
        guard target.withPlatformString({ stat($0, &info) }) == 0 else {
            Output.report(FileCoordinationError("stat", errno: Errno(rawValue: errno), path: target))
            throw Status.failed
        }
        // Signals, the count reached, a relinquish's access finished and the idle timer all
        // wake the loop below.
        let wakes = AsyncStream.makeStream(of: PresentWake.self)
        let printer = EventPrinter(json: json, filter: try EventFilter(events: events, include: include, exclude: exclude),
                                   limit: once ? 1 : count, wakes: wakes.continuation)
        // A relative PATH is taken from the current directory: every line names the item
        // absolute, `ready` included.
        let presenter = PrintingPresenter(url: target.fileURL, printer: printer, ackDelay: ackDelay.duration ?? .seconds(1e9),
                                          refuseWriters: refuseWriters,
                                          settle: settle.seconds > 0 ? settle.duration ?? .seconds(1e9) : nil)
        try await space.join()
        // After joining, which catches them to remove the process's files and die: a
        // presenter removes itself first (a closed terminal's SIGHUP included).
        try CaughtSignals.shared.catchSignals(TerminatingSignals.handled) { number in
            wakes.continuation.yield(.stop(number))
        }
        await FileCoordinator.addFilePresenter(presenter)
        printer.print("ready", presenter.path, pid: getpid())
        // 0 is no timeout, as `inotifywait -t 0`.
        let idle = timeout.flatMap { $0.seconds == 0 ? nil : $0.duration ?? .seconds(1e9) }
        let end = await Self.waitForEnd(wakes.stream, printer: printer, idle: idle)
        await FileCoordinator.removeFilePresenter(presenter)
        await FileCoordinator.leaveCoordinationSpace()
        switch end {
        case .signal(let number): TerminatingSignals.die(by: number)
        case .status(let status): if status != 0 { throw ExitCode(status) }
        }
    }

    /// How `present` ends.
    private enum End {
        /// By this signal, once the presenter is removed.
        case signal(Int32)
        case status(Int32)
    }

    /// Runs until a signal, the count reached with no relinquished access still going on
    /// (0: `present --once f && make` runs make after the writer is done), or `idle`
    /// without an event (2, as `inotifywait -t` does).
    private static func waitForEnd(_ wakes: AsyncStream<PresentWake>, printer: EventPrinter, idle: Duration?) async -> End {
        var timer: Task<Void, Never>?
        var generation = 0
        func arm() {
            timer?.cancel()
            guard let idle else { return }
            generation += 1
            let armed = generation, continuation = printer.wakes
            timer = Task {
                try? await Task.sleep(for: idle)
                if !Task.isCancelled { continuation.yield(.idle(armed)) }
            }
        }
        defer { timer?.cancel() }
        arm()
        for await wake in wakes {
            switch wake {
            case .stop(let number):
                return .signal(number)
            case .event:
                if printer.isDone {
                    timer?.cancel()
                    if printer.relinquished == 0 { return .status(0) }
                } else {
                    arm()
                }
            case .reacquired:
                if printer.isDone && printer.relinquished == 0 { return .status(0) }
            case .outputFailed:
                // Reported by the command's end: nothing more can be printed.
                return .status(0)
            case .idle(let armed):
                if armed == generation && !printer.isDone { return .status(2) }
            }
        }
        return .status(0)
    }
}

/// What wakes `present`'s loop.
enum PresentWake: Sendable {
    /// A terminating signal came.
    case stop(Int32)
    /// An event was printed.
    case event
    /// A relinquished access ended (its reacquirer ran).
    case reacquired
    /// The idle timer armed `n`-th fired.
    case idle(Int)
    /// A line could not be written to stdout.
    case outputFailed
}

/// `--event`, `--include` and `--exclude`: which events `present` prints.
struct EventFilter: Sendable {
    /// Passes every event.
    static let all = try! EventFilter()

    static let names = ["relinquishToReader", "relinquishToWriter", "reacquire", "save", "accommodateDeletion", "didChange",
                        "didMove", "subitemDidAppear", "subitemDidChange", "subitemDidMove", "accommodateSubitemDeletion", "resync"]
    /// Nil: every event.
    let events: Set<String>?
    let include: PosixRegex?
    let exclude: PosixRegex?

    init(events given: [String] = [], include: String? = nil, exclude: String? = nil) throws {
        var events: Set<String> = []
        // `split` would drop empty names (`-e ''`, `-e a,,b`): each must name an event.
        for name in given.flatMap({ $0.split(separator: ",", omittingEmptySubsequences: false) }).map({ $0.trimmingCharacters(in: .whitespaces) }) {
            guard !name.isEmpty else {
                throw ValidationError("--event: an empty event name; the events are \(Self.names.joined(separator: ", "))")
            }
            guard let known = Self.names.first(where: { $0.lowercased() == name.lowercased() }) else {
                throw ValidationError("--event: no event named '\(name)'; the events are \(Self.names.joined(separator: ", "))")
            }
            events.insert(known)
        }
        self.events = given.isEmpty ? nil : events
        self.include = try include.map { try PosixRegex($0, option: "--include") }
        self.exclude = try exclude.map { try PosixRegex($0, option: "--exclude") }
    }

    /// Whether an event is printed: its name is wanted, one of its paths included (when
    /// `--include` is given), and not all of them excluded.
    func passes(_ event: String, paths: [FilePath]) -> Bool {
        if let events, !events.contains(event) { return false }
        if let include, !paths.contains(where: include.matches) { return false }
        if let exclude, paths.allSatisfy(exclude.matches) { return false }
        return true
    }
}

/// A POSIX extended regular expression (`regcomp(3)`, as `grep -E` and `inotifywait`
/// take them), matched against a path's bytes.
final class PosixRegex: Sendable {
    private nonisolated(unsafe) let compiled: UnsafeMutablePointer<regex_t>

    init(_ pattern: String, option: String) throws {
        // Compiled before it is stored: a failed init of a class still runs its deinit.
        let compiled = UnsafeMutablePointer<regex_t>.allocate(capacity: 1)
        let result = regcomp(compiled, pattern, REG_EXTENDED | REG_NOSUB)
        guard result == 0 else {
            var message = [UInt8](repeating: 0, count: 256)
            message.withUnsafeMutableBufferPointer { buffer in
                _ = buffer.withMemoryRebound(to: CChar.self) { regerror(result, compiled, $0.baseAddress, $0.count) }
            }
            compiled.deallocate()
            let text = String(decoding: message.prefix { $0 != 0 }, as: UTF8.self)
            throw ValidationError("\(option) '\(pattern)': \(text)")
        }
        self.compiled = compiled
    }

    deinit {
        regfree(compiled)
        compiled.deallocate()
    }

    /// `regexec` on a compiled pattern is safe from several threads (glibc locks it).
    func matches(_ path: FilePath) -> Bool {
        path.withPlatformString { regexec(compiled, $0, 0, nil, 0) == 0 }
    }
}

/// Prints presenter callbacks, one line each, in text or JSON, those the filter passes,
/// up to the limit.
final class EventPrinter: Sendable {
    let json: Bool
    let filter: EventFilter
    let limit: Int?
    let wakes: AsyncStream<PresentWake>.Continuation

    private struct State {
        /// Lines of callbacks that came before `ready` was printed (the presenter is asked
        /// as soon as it is registered): printed right after it, so `ready` is always
        /// first. Nil once `ready` is out.
        var early: [[UInt8]]? = []
        var printed = 0
        /// Relinquishes answered whose reacquirer has not run yet.
        var relinquished = 0
    }
    private let state = Locked(State())

    init(json: Bool, filter: EventFilter = EventFilter.all, limit: Int? = nil,
         wakes: AsyncStream<PresentWake>.Continuation = AsyncStream.makeStream(of: PresentWake.self).continuation) {
        self.json = json
        self.filter = filter
        self.limit = limit
        self.wakes = wakes
    }

    /// The limit of events is reached: nothing more is printed.
    var isDone: Bool { state.withLock { state in limit.map { state.printed >= $0 } ?? false } }

    /// Relinquishes answered whose access has not ended yet.
    var relinquished: Int { state.withLock { $0.relinquished } }

    /// A relinquish was answered (+1) or its reacquirer ran (-1).
    func relinquish(_ change: Int) {
        state.withLock { $0.relinquished += change }
        if change < 0 { wakes.yield(.reacquired) }
    }

    /// Prints one line; `pid` is the process the event is about, when known. `ready` and
    /// `unwatched` are always printed and never counted.
    func print(_ event: String, _ path: FilePath, to destination: FilePath? = nil, pid: Int32? = nil) {
        let counted = event != "ready" && event != "unwatched"
        if counted && !filter.passes(event, paths: [path] + (destination.map { [$0] } ?? [])) { return }
        let line: [UInt8]
        if json {
            line = JSONLines.line(JSONLines.Event(event, path: path, to: destination, pid: pid, at: Date()))
        } else {
            line = Array(("\(event) \(Output.displayed(path))" + (destination.map { " -> \(Output.displayed($0))" } ?? "") + "\n").utf8)
        }
        // Written under the lock: a line must not overtake `ready` and those held for it,
        // and no line passes the limit.
        // nil: past the limit, not printed; else whether the write succeeded.
        let written = state.withLock { state -> Bool? in
            if counted {
                if let limit, state.printed >= limit { return nil }
                state.printed += 1
            }
            guard let held = state.early else {
                return Output.writeStandardOutput(line)
            }
            guard event == "ready" else {
                state.early = held + [line]
                return true
            }
            state.early = nil
            return Output.writeStandardOutput(Array(([line] + held).joined()))
        }
        if written == false {
            wakes.yield(.outputFailed)
        } else if written == true && counted {
            wakes.yield(.event)
        }
    }
}

/// The CLI's presenter: reports every callback, can delay or refuse relinquishing.
///
/// Each report is a `write` of one line to stdout. It blocks only while the reader of the
/// output does not read, and then this process, whose whole job is reporting, stalls
/// either way; so the callbacks do not claim ``FilePresenter/presentedItemCallbacksMayBlock``.
final class PrintingPresenter: FilePresenter {
    let presentedItemURL: URL?
    let printer: EventPrinter
    let ackDelay: Duration
    let refuseWriters: Bool
    let presentedItemSettleInterval: Duration?

    init(url: URL, printer: EventPrinter, ackDelay: Duration, refuseWriters: Bool, settle: Duration?) {
        presentedItemURL = url
        self.printer = printer
        self.ackDelay = ackDelay
        self.refuseWriters = refuseWriters
        presentedItemSettleInterval = settle
    }

    struct Refused: Error, CustomStringConvertible {
        let path: String
        var description: String { "filecoord present refuses writers of \(path)" }
    }

    /// The presented item's path, as every line names it (absolute).
    var path: FilePath { (try? FilePath(fileURL: presentedItemURL!)) ?? FilePath("") }
    private func path(_ url: URL) -> FilePath { (try? FilePath(fileURL: url)) ?? FilePath(url.path) }

    // A relinquish is counted from before its line until its reacquirer runs: `--count`
    // waits for the access it let through to end.

    func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? {
        printer.relinquish(+1)
        printer.print("relinquishToReader", path(reader.url), pid: reader.processIdentifier)
        if ackDelay > .zero { try? await Task.sleep(for: ackDelay) }
        return reacquirer(for: reader)
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        printer.relinquish(+1)
        printer.print("relinquishToWriter", path(writer.url), pid: writer.processIdentifier)
        if ackDelay > .zero { try? await Task.sleep(for: ackDelay) }
        if refuseWriters {
            printer.relinquish(-1)
            throw Refused(path: Output.displayed(path))
        }
        return reacquirer(for: writer)
    }

    private func reacquirer(for request: FileAccessRequest) -> FileReacquirer {
        { [printer, path] in
            printer.print("reacquire", path, pid: request.processIdentifier)
            printer.relinquish(-1)
        }
    }

    func savePresentedItemChanges() async throws { printer.print("save", path) }
    func accommodatePresentedItemDeletion() async throws { printer.print("accommodateDeletion", path) }
    func presentedItemDidMove(to newURL: URL) async { printer.print("didMove", path, to: path(newURL)) }
    func presentedItemDidChange() async { printer.print("didChange", path) }
    func presentedItemDidLoseEvents() async { printer.print("resync", path) }
    func presentedSubitemDidAppear(at url: URL) async { printer.print("subitemDidAppear", path(url)) }
    func presentedSubitemDidChange(at url: URL) async { printer.print("subitemDidChange", path(url)) }
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) async {
        printer.print("subitemDidMove", path(oldURL), to: path(newURL))
    }
    func accommodatePresentedSubitemDeletion(at url: URL) async throws { printer.print("accommodateSubitemDeletion", path(url)) }
    func presentedItemIsPartlyUnwatched(_ directories: [URL]) async {
        for directory in directories { printer.print("unwatched", path(directory)) }
    }
}
