import AsyncFileIO
import ArgumentParser
import CFilecoordCommand
import FileCoordination
import Foundation
import Synchronization

struct Present: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "present",
        abstract: "Present files or directories and print every callback, or run a command on each change.",
        usage: """
            filecoord present [<options>] PATH... [--fromfile FILE]
            filecoord present [<options>] PATH... -- COMMAND [ARGUMENT...]
            """,
        discussion: """
            Registers a presenter for each PATH (a file, or a directory covering its whole \
            subtree; with --shallow its own entries only). It hears changes made by any \
            program, coordinated or not. The first lines are "ready PATH", one per PATH, \
            printed once the presenters are registered and their watches are in place. \
            It ends on SIGINT, SIGTERM, SIGHUP or SIGQUIT (it removes its presenters, then \
            dies by the signal: the shell sees 128+N), after --count events (exit 0, \
            once the access a relinquish let through has ended), or when no event came for \
            --timeout (exit 2). Events: \(EventFilter.names.joined(separator: ", ")); -e \
            also takes inotify's names (\(EventFilter.inotifyNames.map(\.key).joined(separator: ", "))) \
            for the callbacks that report the same. \
            With --json each line is one object, keys sorted: \
            {"date":ISO8601,"event":E,"path":P,"pid":N?,"time":EPOCH,"to":Q?}; pid is \
            this process's for ready, and the asking process's for relinquishToReader, \
            relinquishToWriter and the reacquire after them (other events do not know who \
            made the change). A name that is not UTF-8 also gets pathBase64 (and toBase64) \
            with its exact bytes. In text lines, a backslash, a control character and any \
            byte that is not UTF-8 are escaped as `ls -b` escapes them (\\\\, \\n, \\ooo). \
            --format writes each line as inotifywait's does: %w the presented item (for a \
            subitem's event the directory it is in, with a trailing slash), %f the \
            subitem's name (empty for the item's own events), %e the event, %T the time \
            (--timefmt, strftime; default \(EventFormat.defaultTimeFormat)), %t a move's \
            destination, %p the asking process, %0 a NUL byte, %% a percent sign; %w, %f \
            and %t are the names' exact bytes, %xw, %xf and %xt the names escaped as in \
            text lines. \
            A directory left unwatched because the user's inotify watch limit is reached is \
            printed as "unwatched DIR" (changes made inside it by programs that do not \
            coordinate are not heard), after ready or when it is created. \
            Coordinated readers and writers in every process of the space message it first. \
            With a COMMAND after --, it prints the ready lines, then runs COMMAND after each \
            burst of changes has settled (--settle), never two at once, under a \
            coordinated read of the changed items (a coordinating writer waits for it, and \
            it never starts inside a coordinated save), with their paths, one a line, on \
            its stdin and in FILECOORD_CHANGED (up to 64 KiB of them). A change during a \
            run is run for after it (--on-busy queue) or ends it with SIGTERM and runs \
            again (--on-busy restart). --count N ends after N runs with the last run's \
            status; a terminating signal is passed on to the running command, and \
            filecoord dies by it once the command has ended.
            """
    )

    @Argument(help: "The files or directories to present.", completion: .file())
    var paths: [String] = []

    @Option(help: ArgumentHelp("Present the paths in FILE too, one a line (- for stdin); a line @PATH leaves PATH's events out, as inotifywait's.",
                               valueName: "FILE"), completion: .file())
    var fromfile: String?

    @Flag(help: "Watch a directory's own entries only, not its subtree (inotifywait without -r); deeper changes are not reported.")
    var shallow = false

    @Flag(help: "Print one JSON object per line.")
    var json = false

    @Option(parsing: .unconditional, help: ArgumentHelp("Print each event as FORMAT says (inotifywait's %w %f %e %T %%, and %t %p %xw %xf %xt %0; see above).",
                                                        valueName: "FORMAT"))
    var format: String?

    @Option(parsing: .unconditional, help: ArgumentHelp("The strftime(3) format of --format's %T.", valueName: "FORMAT"))
    var timefmt: String?

    @Flag(name: .customLong("no-newline"), help: "With --format, end lines with nothing (the format's own %0 or text ends them).")
    var noNewline = false

    @Option(name: .customLong("ack-delay"), parsing: .unconditional,
            help: ArgumentHelp("Wait this long before acknowledging a relinquish.", valueName: "DURATION"))
    var ackDelay = CommandDuration(seconds: 0)

    @Flag(name: .customLong("refuse-writers"), help: "Answer relinquish-to-writer with an error.")
    var refuseWriters = false

    @OptionGroup var space: SpaceOption

    /// On by default: a shell's `echo x > f` truncates, then writes, and would print two
    /// changes; 50 ms is far below what a person or a script notices.
    @Option(parsing: .unconditional,
            help: ArgumentHelp("Print a change made outside coordination once when it repeats within this interval (a truncation and the write after it are one change); 0 prints every inotify event. With a command: the quiet time after a burst of changes before it runs.",
                               valueName: "DURATION"))
    var settle = CommandDuration(seconds: 0.05)

    @Option(parsing: .unconditional,
            help: ArgumentHelp("Exit 0 after N events (ready and unwatched lines do not count); a relinquish's writer or reader has finished by then. With a command: after N runs, with the last one's status.",
                               valueName: "N"))
    var count: Int?

    @Flag(help: "Exit after the first event (or run): --count 1.")
    var once = false

    @Option(parsing: .unconditional,
            help: ArgumentHelp("Exit 2 when no event comes for this long (after ready, and after each event); 0 waits for ever, as inotifywait -t 0.", valueName: "DURATION"))
    var timeout: CommandDuration?

    @Option(name: [.customShort("e"), .customLong("event")], help: ArgumentHelp("Print (and count) only these events, comma-separated; the option may be repeated. With a command: the changes that run it.", valueName: "NAME[,NAME...]"), completion: .list(EventFilter.allNames))
    var events: [String] = []

    @Option(help: ArgumentHelp("Print only events whose path (or a move's destination) matches this POSIX extended regular expression.", valueName: "REGEX"))
    var include: String?

    @Option(help: ArgumentHelp("Leave out events whose path (and a move's destination) match this POSIX extended regular expression.", valueName: "REGEX"))
    var exclude: String?

    @Option(name: .customLong("on-busy"), help: ArgumentHelp("With a command, a change during a run: queue (run again after it) or restart (end it with SIGTERM, then run again).",
                                                             valueName: "queue|restart"))
    var onBusy: String?

    @Flag(help: "With a command, run it once at the start too, for the presented paths.")
    var initial = false

    @Flag(name: .customLong("no-coordination"), help: "With a command, run it without the coordinated read (it may then see a file in the middle of a save).")
    var noCoordination = false

    /// The command after `--` (split off before parsing: ``PresentCommandLine``).
    var command: [String] { PresentCommandLine.command.withLock { $0 } }

    func validate() throws {
        try ackDelay.requireNonNegative("--ack-delay")
        try settle.requireNonNegative("--settle")
        try timeout?.requireNonNegative("--timeout")
        if paths.isEmpty && fromfile == nil { throw ValidationError("name a file or directory to present, or --fromfile") }
        if let count, count < 1 { throw ValidationError("--count must be 1 or more") }
        if once, let count, count != 1 { throw ValidationError("--once and --count \(count) contradict each other") }
        if json && format != nil { throw ValidationError("--json and --format contradict each other") }
        if format == nil && (timefmt != nil || noNewline) { throw ValidationError("\(timefmt != nil ? "--timefmt" : "--no-newline") goes with --format") }
        if let format { _ = try EventFormat(format, timeFormat: timefmt) }
        if command.isEmpty {
            let commandOnly = [(onBusy != nil, "--on-busy"), (initial, "--initial"), (noCoordination, "--no-coordination")]
            if let (_, name) = commandOnly.first(where: \.0) { throw ValidationError("\(name) goes with a command after --") }
        } else {
            if json || format != nil { throw ValidationError("\(json ? "--json" : "--format") and a command contradict each other: the command's output is what is printed") }
            if let onBusy, ChangeRunState.OnBusy(rawValue: onBusy) == nil {
                throw ValidationError("--on-busy '\(onBusy)': give queue or restart")
            }
        }
        _ = try EventFilter(events: events, include: include, exclude: exclude)
    }

    func run() async throws {
        var targets = paths.map { RawArguments.path($0) }
        var excluded: [FilePath] = []
        if let fromfile {
            for listed in try await Read.readList(fromfile, separator: UInt8(ascii: "\n")) {
                let bytes = listed.platformBytes
                if bytes.first == UInt8(ascii: "@") {
                    excluded.append(Self.absolute(RawArguments.path(bytes: Array(bytes.dropFirst()))))
                } else {
                    targets.append(listed)
                }
            }
        }
        guard !targets.isEmpty else {
            Output.report(FileCoordinationError(.present, code: .invalidArgument, path: fromfile.map { RawArguments.path($0) }, errno: .invalidArgument, message: "the list names no file to present"))
            throw Status.failed
        }
        // Each on the name's own bytes (a name that is not UTF-8 is a name), and with the
        // kernel's reason (a loop of links is ELOOP, not "no such file"); all before any
        // is presented.
        for target in targets {
            var info = stat()
            guard target.withPlatformString({ stat($0, &info) }) == 0 else {
                Output.report(FileCoordinationError(.stat, errno: Errno(rawValue: errno), path: target))
                throw Status.failed
            }
        }
        var seen = Set<FilePath>()
        targets = targets.filter { seen.insert(Self.absolute($0)).inserted }
        let filter = try EventFilter(events: events, include: include, exclude: exclude, excludedTrees: excluded)
        let settleInterval = settle.seconds > 0 ? settle.duration ?? .seconds(1e9) : nil
        // 0 is no timeout, as `inotifywait -t 0`.
        let idle = timeout.flatMap { $0.seconds == 0 ? nil : $0.duration ?? .seconds(1e9) }
        let limit = once ? 1 : count
        // Signals, the count reached, a relinquish's access finished and the idle timer all
        // wake the loop below.
        let wakes = AsyncStream.makeStream(of: PresentWake.self)
        let style: EventPrinter.Style = json ? .json : try format.map { .format(try EventFormat($0, timeFormat: timefmt, newline: !noNewline)) } ?? .text
        let printer = EventPrinter(style: style, filter: filter, limit: limit, wakes: wakes.continuation)
        let runner = command.isEmpty ? nil : ChangeRunner(command: command, filter: filter, coordinated: !noCoordination,
                                                          settle: settle.duration ?? .zero, idle: idle)
        // A relative PATH is taken from the current directory: every line names the item
        // absolute, `ready` included.
        let presenters = targets.map { target in
            PrintingPresenter(url: target.fileURL, events: runner ?? printer, ackDelay: ackDelay.duration ?? .seconds(1e9),
                              refuseWriters: refuseWriters, settle: runner == nil ? settleInterval : nil, shallow: shallow)
        }
        try await space.join()
        // After joining, which catches them to remove the process's files and die: a
        // presenter removes itself first (a closed terminal's SIGHUP included).
        try CaughtSignals.shared.catchSignals(TerminatingSignals.handled) { number, fromTerminal in
            if let runner { runner.stop(number, fromTerminal: fromTerminal) } else { wakes.continuation.yield(.stop(number)) }
        }
        for presenter in presenters { await FileCoordinator.addFilePresenter(presenter) }
        printer.ready(presenters.map(\.path))
        let end: End
        if let runner {
            let initialPaths = initial ? presenters.map(\.path) : nil
            switch await runner.serve(onBusy: onBusy.flatMap(ChangeRunState.OnBusy.init) ?? .queue, limit: limit, initial: initialPaths) {
            case .success(let status): end = .status(status)
            case .failure(let signal): end = .signal(signal.number)
            }
        } else {
            end = await Self.waitForEnd(wakes.stream, printer: printer, idle: idle)
        }
        for presenter in presenters { await FileCoordinator.removeFilePresenter(presenter) }
        await FileCoordinator.leaveCoordinationSpace()
        switch end {
        case .signal(let number): TerminatingSignals.die(by: number)
        case .status(let status): if status != 0 { throw ExitCode(status) }
        }
    }

    /// `path` from the current directory, when relative.
    private static func absolute(_ path: FilePath) -> FilePath {
        guard !path.isAbsolute else { return path.lexicallyNormalized() }
        return FilePath(FileManager.default.currentDirectoryPath).pushing(path).lexicallyNormalized()
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

