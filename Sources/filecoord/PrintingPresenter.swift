import AsyncFileIO
import FileCoordination
import Foundation

/// The CLI's presenter: reports every callback, can delay or refuse relinquishing.
///
/// Each report is a `write` of one line to stdout (or a note for the command). It blocks
/// only while the reader of the output does not read, and then this process, whose whole
/// job is reporting, stalls either way; so the callbacks do not claim
/// ``FilePresenter/presentedItemCallbacksMayBlock``.
final class PrintingPresenter: FilePresenter {
    let presentedItemURL: URL?
    let events: any PresenterEvents
    let ackDelay: Duration
    let refuseWriters: Bool
    let presentedItemSettleInterval: Duration?
    /// `--shallow`: the directory's own entries only.
    let shallow: Bool
    var presentedItemWatchesSubtree: Bool { !shallow }

    init(url: URL, events: any PresenterEvents, ackDelay: Duration, refuseWriters: Bool, settle: Duration?, shallow: Bool = false) {
        presentedItemURL = url
        self.events = events
        self.ackDelay = ackDelay
        self.refuseWriters = refuseWriters
        presentedItemSettleInterval = settle
        self.shallow = shallow
    }

    struct Refused: Error, CustomStringConvertible {
        let path: String
        var description: String { "filecoord present refuses writers of \(path)" }
    }

    /// The presented item's path, as every line names it (absolute).
    var path: FilePath { (try? FilePath(fileURL: presentedItemURL!)) ?? FilePath("") }
    private func path(_ url: URL) -> FilePath { (try? FilePath(fileURL: url)) ?? FilePath(url.path) }

    /// A subitem's event, unless `--shallow` leaves it out: coordinated writers deeper in
    /// the tree still message the directory's presenter.
    private func subitem(_ event: String, _ url: URL, to destination: URL? = nil) {
        let (from, to) = (path(url), destination.map(path))
        if shallow, from.removingLastComponent() != path, to.map({ $0.removingLastComponent() != path }) ?? true { return }
        events.report(event, from, to: to, pid: nil)
    }

    // A relinquish is counted from before its line until its reacquirer runs: `--count`
    // waits for the access it let through to end.

    func relinquishPresentedItem(toReader reader: FileAccessRequest) async throws -> FileReacquirer? {
        events.relinquish(+1)
        events.report("relinquishToReader", path(reader.url), to: nil, pid: reader.processIdentifier)
        if ackDelay > .zero { try? await Task.sleep(for: ackDelay) }
        return reacquirer(for: reader)
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        events.relinquish(+1)
        events.report("relinquishToWriter", path(writer.url), to: nil, pid: writer.processIdentifier)
        if ackDelay > .zero { try? await Task.sleep(for: ackDelay) }
        if refuseWriters {
            events.relinquish(-1)
            throw Refused(path: Output.displayed(path))
        }
        return reacquirer(for: writer)
    }

    private func reacquirer(for request: FileAccessRequest) -> FileReacquirer {
        { [events, path] in
            events.report("reacquire", path, to: nil, pid: request.processIdentifier)
            events.relinquish(-1)
        }
    }

    func savePresentedItemChanges() async throws { events.report("save", path, to: nil, pid: nil) }
    func accommodatePresentedItemDeletion() async throws { events.report("accommodateDeletion", path, to: nil, pid: nil) }
    func presentedItemDidMove(to newURL: URL) async { events.report("didMove", path, to: path(newURL), pid: nil) }
    func presentedItemDidChange() async { events.report("didChange", path, to: nil, pid: nil) }
    func presentedItemDidLoseEvents() async { events.report("resync", path, to: nil, pid: nil) }
    func presentedSubitemDidAppear(at url: URL) async { subitem("subitemDidAppear", url) }
    func presentedSubitemDidChange(at url: URL) async { subitem("subitemDidChange", url) }
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) async { subitem("subitemDidMove", oldURL, to: newURL) }
    func accommodatePresentedSubitemDeletion(at url: URL) async throws { subitem("accommodateSubitemDeletion", url) }
    func presentedItemIsPartlyUnwatched(_ directories: [URL]) async {
        for directory in directories { events.report("unwatched", path(directory), to: nil, pid: nil) }
    }
}
