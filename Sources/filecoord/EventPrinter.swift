import AsyncFileIO
import FileCoordination
import Foundation

/// Where a ``PrintingPresenter`` reports its callbacks: printed (``EventPrinter``), or
/// gathered for a command (``ChangeRunner``).
protocol PresenterEvents: Sendable {
    /// One callback; `pid` is the process it is about, when known.
    func report(_ event: String, _ path: FilePath, to destination: FilePath?, pid: Int32?)
    /// A relinquish was answered (+1) or its reacquirer ran (-1).
    func relinquish(_ change: Int)
}

/// Prints presenter callbacks, one line each, in text, JSON or `--format`, those the
/// filter passes, up to the limit.
final class EventPrinter: PresenterEvents {
    enum Style: Sendable {
        case text, json
        case format(EventFormat)
    }

    let style: Style
    let filter: EventFilter
    let limit: Int?
    let wakes: AsyncStream<PresentWake>.Continuation

    private struct State {
        /// Lines of callbacks that came before the `ready` lines were printed (a presenter
        /// is asked as soon as it is registered): printed right after them, so that they
        /// always come first. Nil once they are out.
        var early: [[UInt8]]? = []
        var printed = 0
        /// Relinquishes answered whose reacquirer has not run yet.
        var relinquished = 0
    }
    private let state = Locked(State())

    init(style: Style, filter: EventFilter = EventFilter.all, limit: Int? = nil,
         wakes: AsyncStream<PresentWake>.Continuation = AsyncStream.makeStream(of: PresentWake.self).continuation) {
        self.style = style
        self.filter = filter
        self.limit = limit
        self.wakes = wakes
    }

    /// The limit of events is reached: nothing more is printed.
    var isDone: Bool { state.withLock { state in limit.map { state.printed >= $0 } ?? false } }

    /// Relinquishes answered whose access has not ended yet.
    var relinquished: Int { state.withLock { $0.relinquished } }

    func relinquish(_ change: Int) {
        state.withLock { $0.relinquished += change }
        if change < 0 { wakes.yield(.reacquired) }
    }

    /// One line per presented item, then the lines held until now.
    func ready(_ paths: [FilePath]) {
        let lines = paths.map { line("ready", $0, to: nil, pid: getpid()) }
        let written = state.withLock { state -> Bool in
            let held = state.early ?? []
            state.early = nil
            return Output.writeStandardOutput(Array((lines + held).joined()))
        }
        if !written { wakes.yield(.outputFailed) }
    }

    /// Prints one line. `unwatched` is always printed and never counted.
    func report(_ event: String, _ path: FilePath, to destination: FilePath? = nil, pid: Int32? = nil) {
        let counted = event != "unwatched"
        if counted && !filter.passes(event, paths: [path] + (destination.map { [$0] } ?? [])) { return }
        let line = line(event, path, to: destination, pid: pid)
        // Written under the lock: a line must not overtake `ready` and those held for it,
        // and no line passes the limit.
        // nil: past the limit, not printed; else whether the write succeeded.
        let written = state.withLock { state -> Bool? in
            if counted {
                if let limit, state.printed >= limit { return nil }
                state.printed += 1
            }
            guard let held = state.early else { return Output.writeStandardOutput(line) }
            state.early = held + [line]
            return true
        }
        if written == false {
            wakes.yield(.outputFailed)
        } else if written == true && counted {
            wakes.yield(.event)
        }
    }

    private func line(_ event: String, _ path: FilePath, to destination: FilePath?, pid: Int32?) -> [UInt8] {
        switch style {
        case .json:
            return JSONLines.line(JSONLines.Event(event, path: path, to: destination, pid: pid, at: Date()))
        case .format(let format):
            let isSubitem = event.hasPrefix("subitem") || event == "accommodateSubitemDeletion"
            return format.line(event, path: path, destination: destination, pid: pid, isSubitem: isSubitem, at: Date())
        case .text:
            return Array(("\(event) \(Output.displayed(path))" + (destination.map { " -> \(Output.displayed($0))" } ?? "") + "\n").utf8)
        }
    }
}
