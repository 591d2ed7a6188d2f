import FileCoordination
import Foundation
import AsyncFileIO

/// When `present PATH... -- COMMAND` runs its command: the decisions, with no I/O, no
/// lock and no clock. ``ChangeRunner`` feeds it what happened and carries out the actions.
///
/// Changes gather until none has come for the settle interval; then one run takes them
/// all. Runs never overlap: a change during a run waits for its end (`queue`) or ends it
/// (`restart`), and the next run takes every change since.
struct ChangeRunState {
    enum OnBusy: String, Sendable, CaseIterable {
        /// A change during a run is run for once the run has ended.
        case queue
        /// A change during a run ends it (SIGTERM), then it runs again.
        case restart
    }

    enum Input: Sendable, Equatable {
        /// Items changed.
        case changed([FilePath])
        /// The settle timer armed `n`-th fired.
        case settled(Int)
        /// The run ended with this status (128+N for signal N).
        case runEnded(Int32)
        /// A terminating signal came; `fromTerminal`: the run's command got it too.
        case stop(Int32, fromTerminal: Bool)
        /// The idle timer armed `n`-th fired.
        case idle(Int)
    }

    enum Action: Sendable, Equatable {
        /// Fire ``Input/settled(_:)`` with this number after the settle interval.
        case armSettle(Int)
        /// Fire ``Input/idle(_:)`` with this number after the idle timeout (if any).
        case armIdle(Int)
        /// Run the command for these items.
        case start([FilePath])
        /// Send this signal to the running command.
        case signalRun(Int32)
        /// The run is given up: a command not started yet is not started (nor waits for
        /// its claims any longer); one that starts meanwhile is sent this signal.
        case abandonRun(Int32)
        /// Exit with this status.
        case finish(Int32)
        /// Die by this signal.
        case die(Int32)
    }

    let onBusy: OnBusy
    /// The runs after which to finish (`--count`), if any.
    let limit: Int?

    private var pending: [FilePath] = []
    private var pendingSet: Set<FilePath> = []
    private var running = false
    /// The running command was already told to end (`restart`).
    private var ending = false
    private var settleTimer = 0
    private var idleTimer = 0
    private var runs = 0
    /// The signal that ends this process once the run has ended.
    private var stopping: Int32?

    init(onBusy: OnBusy = .queue, limit: Int? = nil) {
        self.onBusy = onBusy
        self.limit = limit
    }

    /// At the start: the idle timer, and a first run for `initial` when given (`--initial`).
    mutating func begin(initial: [FilePath]?) -> [Action] {
        idleTimer += 1
        guard let initial, !initial.isEmpty else { return [.armIdle(idleTimer)] }
        running = true
        return [.armIdle(idleTimer), .start(initial)]
    }

    mutating func handle(_ input: Input) -> [Action] {
        switch input {
        case .changed(let paths):
            guard stopping == nil else { return [] }
            for path in paths where pendingSet.insert(path).inserted { pending.append(path) }
            idleTimer += 1
            if running {
                guard onBusy == .restart, !ending else { return [.armIdle(idleTimer)] }
                ending = true
                return [.armIdle(idleTimer), .signalRun(SIGTERM)]
            }
            settleTimer += 1
            return [.armIdle(idleTimer), .armSettle(settleTimer)]
        case .settled(let timer):
            guard timer == settleTimer, !running, stopping == nil, !pending.isEmpty else { return [] }
            running = true
            defer { (pending, pendingSet) = ([], []) }
            return [.start(pending)]
        case .runEnded(let status):
            running = false
            ending = false
            runs += 1
            if let stopping { return [.die(stopping)] }
            if let limit, runs >= limit { return [.finish(status)] }
            idleTimer += 1
            guard !pending.isEmpty else { return [.armIdle(idleTimer)] }
            settleTimer += 1
            return [.armIdle(idleTimer), .armSettle(settleTimer)]
        case .stop(let number, let fromTerminal):
            guard running else { return [.die(number)] }
            guard stopping == nil else { return [] }
            stopping = number
            return fromTerminal ? [.abandonRun(number)] : [.abandonRun(number), .signalRun(number)]
        case .idle(let timer):
            guard timer == idleTimer, !running, stopping == nil else { return [] }
            return [.finish(2)]
        }
    }
}
