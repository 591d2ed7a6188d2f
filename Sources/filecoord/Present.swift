@_spi(FileCoordinationInternal) import AsyncFileIO
import ArgumentParser
import CFileCoordinationShims
import FileCoordination
import Foundation
import Synchronization

struct Present: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Present a file or directory and print every callback until SIGINT or SIGTERM.",
        discussion: """
            Registers a presenter for PATH (a file, or a directory covering its whole subtree). \
            It hears changes made by any program, coordinated or not. The first line is \
            "ready", printed once the presenter is registered and its watches are in place. \
            With --json each line is {"event":E,"path":P,"to":Q?,"pid":N?,"time":T}; pid is \
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

    @Argument(help: "The file or directory to present.")
    var path: String

    @Flag(help: "Print one JSON object per line.")
    var json = false

    @Option(name: .customLong("ack-delay"), parsing: .unconditional,
            help: ArgumentHelp("Wait this long before acknowledging a relinquish.", valueName: "MS"))
    var ackDelay = 0

    @Flag(name: .customLong("refuse-writers"), help: "Answer relinquish-to-writer with an error.")
    var refuseWriters = false

    @OptionGroup var space: SpaceOption

    @Option(parsing: .unconditional,
            help: ArgumentHelp("Coalesce bursts of changes made outside coordination over this interval.", valueName: "MS"))
    var settle: Int?

    func validate() throws {
        guard ackDelay >= 0 else { throw ValidationError("--ack-delay must be zero or more milliseconds") }
        if let settle, settle < 0 { throw ValidationError("--settle must be zero or more milliseconds") }
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
        let printer = EventPrinter(json: json)
        // A relative PATH is taken from the current directory: every line names the item
        // absolute, `ready` included.
        let presenter = PrintingPresenter(url: target.fileURL, printer: printer, ackDelay: .milliseconds(ackDelay),
                                          refuseWriters: refuseWriters, settle: settle.map { .milliseconds($0) })
        // Signals end the session cleanly: unregister, exit 0. Until they are caught a
        // signal ends it the default way.
        let stop = AsyncStream.makeStream(of: Void.self)
        try await space.join()
        // After joining, which catches them to remove the process's files and die: a
        // presenter ends cleanly instead (a closed terminal's SIGHUP included).
        try CaughtSignals.shared.catchSignals([SIGINT, SIGTERM, SIGHUP].filter { fc_ignored_at_start($0) == 0 }) { _ in
            stop.continuation.yield()
        }
        await FileCoordinator.addFilePresenter(presenter)
        printer.print("ready", presenter.path, pid: getpid())
        for await _ in stop.stream { break }
        await FileCoordinator.removeFilePresenter(presenter)
        await FileCoordinator.leaveCoordinationSpace()
    }
}

/// Prints presenter callbacks, one line each, in text or JSON.
final class EventPrinter: Sendable {
    let json: Bool
    /// Lines of callbacks that came before `ready` was printed (the presenter is asked
    /// as soon as it is registered): printed right after it, so `ready` is always first.
    /// Nil once `ready` is out.
    private let early = Locked<[String]?>([])
    init(json: Bool) { self.json = json }

    /// Prints one line; `pid` is the process the event is about, when known.
    func print(_ event: String, _ path: FilePath, to destination: FilePath? = nil, pid: Int32? = nil) {
        let time = Date().timeIntervalSince1970
        var line: String
        if json {
            line = #"{"event":"\#(event)",\#(Output.jsonPath("path", path))"#
            if let destination { line += "," + Output.jsonPath("to", destination) }
            if let pid { line += #","pid":\#(pid)"# }
            line += #","time":\#(String(format: "%.6f", time))}"#
        } else {
            line = "\(event) \(Output.displayed(path))" + (destination.map { " -> \(Output.displayed($0))" } ?? "")
        }
        // Written under the lock: a line must not overtake `ready` and those held for it.
        early.withLock { early in
            guard let held = early else {
                Output.writeStandardOutput(Array((line + "\n").utf8))
                return
            }
            guard event == "ready" else {
                early = held + [line]
                return
            }
            early = nil
            Output.writeStandardOutput(Array(([line] + held).map { $0 + "\n" }.joined().utf8))
        }
    }

    static func jsonString(_ text: String) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: [text])) ?? Data("[\"\"]".utf8)
        let array = String(decoding: data, as: UTF8.self)
        return String(array.dropFirst().dropLast())
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

    func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? {
        printer.print("relinquishToReader", path(reader.url), pid: reader.processIdentifier)
        if ackDelay > .zero { try? await Task.sleep(for: ackDelay) }
        return { [printer, path] in printer.print("reacquire", path, pid: reader.processIdentifier) }
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        printer.print("relinquishToWriter", path(writer.url), pid: writer.processIdentifier)
        if ackDelay > .zero { try? await Task.sleep(for: ackDelay) }
        if refuseWriters { throw Refused(path: Output.displayed(path)) }
        return { [printer, path] in printer.print("reacquire", path, pid: writer.processIdentifier) }
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
