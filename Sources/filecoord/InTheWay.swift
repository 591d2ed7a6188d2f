import AsyncFileIO
import FileCoordination
import Foundation

/// Who keeps a claim waiting: the processes holding conflicting claims, else the
/// presenters of the items (asked, or not answering). For the line a wait prints after a
/// second, and for the error of a claim that timed out.
enum InTheWay {
    /// An item a command claims, as it was named. ``describe(_:in:timeout:)`` finds it
    /// in `status` under the path the library claims it by.
    struct Wanted: Sendable {
        var path: FilePath
        var isWrite: Bool
        /// Links in the last component are followed (a read or write of content), not
        /// for a delete, which acts on the name.
        var followingLast = true
    }

    /// How long a waiting claim stays silent before it says who is in the way.
    static let quietWait = Duration.seconds(1)

    /// `pid N (write claim on PATH)`, `pid N (presenter of PATH, not answering)`, one per
    /// process in the way; empty when the space names nobody (the wait ended meanwhile).
    ///
    /// The processes' records are read first, no process asked: a claim waiting in the
    /// kernel reads no mailbox, and asking would make it start to listen (and a hundred
    /// waiters would each ask every process). Only when no record names a claim in the way
    /// (a presenter keeps the wait, or a claim is younger than the records) are the
    /// processes asked, within `timeout`.
    static func describe(_ wanted: [Wanted], in space: CoordinationSpace, timeout: Duration) async -> [String] {
        // Resolving links blocks: on an I/O thread.
        guard let wanted = try? await runOnIOThread({
            wanted.map { Wanted(path: FileCoordinator.claimPath(of: $0.path, followingLast: $0.followingLast), isWrite: $0.isWrite) }
        }) else { return [] }
        if let recorded = try? await space.recordedStatus() {
            let found = claimsInTheWay(of: wanted, in: recorded)
            if !found.isEmpty { return found }
        }
        guard let status = try? await space.status(timeout: timeout) else { return [] }
        var found = claimsInTheWay(of: wanted, in: status)
        if !found.isEmpty { return found }
        let me = getpid()
        for presenter in status.presenters where presenter.processIdentifier != me {
            guard wanted.contains(where: { related($0.path, presenter.path) }) else { continue }
            let silent = status.unanswered.contains(presenter.processIdentifier) ? ", not answering" : ""
            let who = StatusCommand.who(presenter.processIdentifier, nil, otherNamespace: presenter.isInAnotherPIDNamespace)
            found.append("\(who) (presenter of \(Output.displayed(presenter.path))\(silent))")
        }
        return found
    }

    /// The lines for the claims of other processes that conflict with `wanted`.
    private static func claimsInTheWay(of wanted: [Wanted], in status: CoordinationSpace.Status) -> [String] {
        let me = getpid()
        let conflicting = status.claims.filter { claim in
            claim.processIdentifier != me && wanted.contains { ($0.isWrite || claim.isWrite) && related($0.path, claim.path) }
        }
        // A process that did not answer is listed from its record, up to 100 ms stale
        // (``CoordinationSpace/claimRecordDelay``): its claims count only when no process
        // that answered holds one in the way.
        let answered = conflicting.filter { !status.unanswered.contains($0.processIdentifier) }
        var found: [String] = []
        for claim in answered.isEmpty ? conflicting : answered {
            let line = "\(StatusCommand.who(claim.processIdentifier, nil, otherNamespace: claim.isInAnotherPIDNamespace)) (\(claim.isWrite ? "write" : "read") claim on \(Output.displayed(claim.path)))"
            if !found.contains(line) { found.append(line) }
        }
        return found
    }

    /// The same item, or one inside the other.
    private static func related(_ a: FilePath, _ b: FilePath) -> Bool {
        a == b || a.starts(with: b) || b.starts(with: a)
    }
}

/// Says who is in the way once a claim has waited ``InTheWay/quietWait``, unless the
/// claims are granted first (``granted()``). The clock starts when the coordination starts
/// to wait on another process, a claim parking or a presenter asked (``waiting()``): a
/// command that waits on nobody makes no timer and no task.
final class WaitReporter: Sendable {
    private enum State {
        case idle
        case waiting(Task<Void, Never>)
        case granted
    }

    private let wanted: [InTheWay.Wanted]
    private let state: Locked<State>

    init(_ wanted: [InTheWay.Wanted], enabled: Bool) {
        self.wanted = wanted
        state = Locked(enabled && !wanted.isEmpty ? .idle : .granted)
    }

    /// Whether it may speak at all (``waiting()`` is then worth calling).
    var enabled: Bool {
        state.withLock { if case .granted = $0 { false } else { true } }
    }

    /// The coordination started to wait: the line comes ``InTheWay/quietWait`` later, unless the
    /// claims are granted first. Quick; once is enough, more calls change nothing.
    func waiting() {
        state.withLock { state in
            guard case .idle = state else { return }
            let wanted = wanted
            state = .waiting(Task {
                try? await Task.sleep(for: InTheWay.quietWait)
                guard !Task.isCancelled, let space = FileCoordinator.coordinationSpace else { return }
                let blockers = await InTheWay.describe(wanted, in: space, timeout: .seconds(1))
                guard !Task.isCancelled, !blockers.isEmpty else { return }
                Output.error("waiting for " + blockers.joined(separator: ", "))
            })
        }
    }

    /// The claims are had (the accessor runs): nothing more to say.
    func granted() {
        let task = state.withLock { state -> Task<Void, Never>? in
            defer { state = .granted }
            if case .waiting(let task) = state { return task }
            return nil
        }
        task?.cancel()
    }
}
