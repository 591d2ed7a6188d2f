import AsyncFileIO
import Foundation
import SystemPackage

/// One coordination that concerns presenters, from its claims to their release, as a
/// pure state machine: no lock, no I/O, no suspension.
///
/// It holds what the coordination decides on: its items and claims, the presenters
/// concerned (looked up once, in this process and others), what each is asked before
/// the access (``PresenterPlan``) and told after it, the reacquirers it owes, and the
/// order in which things end. The driver (`FileCoordinator+Engine`) carries out each
/// ``Action`` and hands the outcome back as an ``Event``; the next action follows. The
/// claims' own waiting (the rules across tasks, other processes, the claim deadline)
/// is the center's, taken as one action.
///
/// The order it keeps, Apple's (`docs/design.md`, "Message order"): claims first; then
/// every concerned presenter asked at once, each one's steps in order; the accessor only
/// when all agreed and nothing was cancelled; after it the `did…` messages, then the
/// reacquirers, then the claims go, once every message to another process is written.
/// Whatever fails after the claims are held, what was taken is given back in the same
/// order (reacquirers, then claims) and the coordination ends with the first failure.
struct CoordinationMachine: Sendable {
    /// One item of the coordination, its path resolved.
    struct Item: Sendable {
        var path: FilePath
        var request: ItemRequest
        /// The URL to hand the accessor: the caller's own, unless the item moved or a
        /// symbolic link was resolved (then made from `path`).
        var url: URL
        var subtree: Bool
        /// For writes with container presenters: whether the item existed before.
        var existedBefore: Bool?

        var isWrite: Bool { if case .writing = request { true } else { false } }
        var writingOptions: FileCoordinator.WritingOptions {
            if case .writing(_, let options) = request { options } else { [] }
        }
        var claim: CoordinationRules.Claim {
            .init(path: path, access: isWrite ? .writing : .reading, scope: subtree ? .subtree : .item)
        }
    }

    /// What the driver does next.
    enum Action {
        /// Take these claims together (waiting, within the claim deadline): then
        /// ``Event/granted(_:current:)``, or ``Event/failed(_:)`` with nothing held.
        case takeClaims([CoordinationRules.Claim])
        /// Point the caller's intents at these paths (the items', after any moves): then
        /// ``Event/done``.
        case updateIntents([FilePath])
        /// Find the presenters each access concerns (the coordinator's own included, in
        /// every process): then ``Event/presenters(_:silent:prepared:)``.
        case lookUpPresenters([(path: FilePath, subtree: Bool)])
        /// Ask each presenter its steps, all at once: then ``Event/answered(_:)``, in order.
        case ask([PresenterPlan.Steps])
        /// Whether each path exists: then ``Event/existence(_:)``, or ``Event/failed(_:)``.
        case checkExistence([FilePath])
        /// Drop the inotify events of each path in each presenter's watch from now until
        /// ``endSuppressing``: then ``Event/done``.
        case suppress([(presenter: ObjectIdentifier, path: FilePath)])
        /// Whether the task or the coordinator was cancelled: then ``Event/cancellation(_:)``.
        case checkCancellation
        /// Run the accessor with these URLs: then, once it returned,
        /// ``Event/accessorEnded(ran:moved:deferred:)``.
        case runAccessor([URL])
        /// Whether each path exists now (after the access; an error counts as existing):
        /// then ``Event/existence(_:)``.
        case checkExistenceAfter([FilePath])
        /// Stop what ``suppress(_:)`` started: then ``Event/done``.
        case endSuppressing
        /// Deliver these messages, leniently (the change has happened): then ``Event/done``.
        case tell([PendingMessage])
        /// Run these presenters' reacquirers: then ``Event/done``.
        case giveBack([(PresenterRegistry.Entry, FileReacquirer)])
        /// Release the claims once every message to another process is written: then
        /// ``Event/done``.
        case release(CoordinationRules.RequestID)
        /// The coordination is over: nil when it succeeded, else its error.
        case end((any Error)?)
    }

    /// What happened, after an ``Action``.
    enum Event {
        /// The claims are held; `current`: their paths now, when they waited (items may
        /// have moved meanwhile).
        case granted(CoordinationRules.RequestID, current: [FilePath]?)
        /// Per item, the presenters concerned; `silent`: presenters that did not answer
        /// earlier in the same batch (skipped, or failing it with their error);
        /// `prepared`: presenters the batch asked already.
        case presenters([PresenterRegistry.Concerned], silent: [ObjectIdentifier: FileCoordinationError?],
                        prepared: Set<ObjectIdentifier>)
        /// Each presenter's answer, in the order asked: its reacquirer, or nil.
        case answered([Result<FileReacquirer?, any Error>])
        case existence([Bool])
        /// nil: not cancelled.
        case cancellation(Cancellation?)
        /// `ran`: the accessor ran, whether it returned or threw (one that never ran, as a
        /// queue's whose block was never called, changed nothing: no `did…` messages);
        /// `moved`: presenters told of a move inside the accessor (they hear `didMove`,
        /// not `didChange`); `deferred`: the move messages it reported.
        case accessorEnded(ran: Bool, moved: Set<ObjectIdentifier>, deferred: [PendingMessage])
        /// The action failed; the coordination ends with `error`.
        case failed(any Error)
        /// The action was carried out.
        case done
    }

    enum Cancellation { case task, coordinator }

    private enum Phase {
        case idle, claiming, updatingIntents, lookingUp, asking, checkingExistence, suppressing, checkingCancellation
        case accessing, checkingAfter, ending, ended
    }

    /// The steps of the end, in order; each is skipped when there is nothing to do.
    private enum Ending: Int, Comparable {
        case endSuppressing, tell, giveBack, release, end
        static func < (a: Ending, b: Ending) -> Bool { a.rawValue < b.rawValue }
    }

    private(set) var items: [Item]
    /// The coordinator's own presenter: never asked or told of its accesses.
    private let owner: ObjectIdentifier?
    private let intentCount: Int
    private var phase = Phase.idle
    private(set) var request: CoordinationRules.RequestID?
    /// Per item, every presenter concerned (the owner's included: its watch drops the
    /// write's events too).
    private var concerned: [PresenterRegistry.Concerned] = []
    private var asked: [PresenterPlan.Steps] = []
    private var reacquirers: [(PresenterRegistry.Entry, FileReacquirer)] = []
    private var suppressing = false
    private var messages: [PendingMessage] = []
    /// Items whose existence was asked (before or after the access), in the order asked.
    private var checked: [Int] = []
    private var moved: Set<ObjectIdentifier> = []
    private var failure: (any Error)?
    private var nextEnding = Ending.endSuppressing

    /// `owner`: the coordinator's presenter; `intents`: how many of the items (the first
    /// ones) are the caller's intents.
    init(items: [Item], owner: ObjectIdentifier?, intents: Int = 0) {
        self.items = items
        self.owner = owner
        self.intentCount = min(intents, items.count)
    }

    /// The URLs the accessor gets.
    var urls: [URL] { items.map(\.url) }

    /// The first action.
    mutating func start() -> Action {
        precondition(phase == .idle, "a coordination starts once")
        phase = .claiming
        return .takeClaims(items.map(\.claim))
    }

    /// The next action, after `event`.
    mutating func handle(_ event: Event) -> Action {
        switch (phase, event) {
        case (.claiming, .granted(let id, let current)):
            request = id
            if let current {
                for (index, path) in current.enumerated() where index < items.count && path != items[index].path {
                    items[index].path = path
                    items[index].url = path.fileURL
                }
            }
            if intentCount > 0 {
                phase = .updatingIntents
                return .updateIntents(items.prefix(intentCount).map(\.path))
            }
            return lookUp()
        case (.claiming, .failed(let error)):
            // Nothing was taken.
            phase = .ended
            return .end(error)
        case (.updatingIntents, .done):
            return lookUp()
        case (.lookingUp, .presenters(let found, let silent, let prepared)):
            concerned = found
            return plan(silent: silent, prepared: prepared)
        case (.asking, .answered(let outcomes)):
            for (steps, outcome) in zip(asked, outcomes) {
                switch outcome {
                case .success(let reacquirer?): reacquirers.append((steps.entry, reacquirer))
                case .success(nil): break
                case .failure(let error): failure = failure ?? error
                }
            }
            if failure != nil { return ending() }
            return checkExistenceBefore()
        case (.checkingExistence, .existence(let answers)):
            for (index, exists) in zip(checked, answers) { items[index].existedBefore = exists }
            return suppress()
        case (.suppressing, .done):
            phase = .checkingCancellation
            return .checkCancellation
        case (.checkingCancellation, .cancellation(let cancelled)):
            switch cancelled {
            case nil:
                phase = .accessing
                return .runAccessor(urls)
            case .task?:
                failure = CancellationError()
            case .coordinator?:
                failure = FileCoordinationError.coordinatorCancelled(path: items.first?.path)
            }
            return ending()
        case (.accessing, .accessorEnded(let ran, let moved, let deferred)):
            self.moved = moved
            messages = deferred
            guard ran else { return ending() }
            checked = items.indices.filter { told($0).containers.isEmpty == false }
            guard !checked.isEmpty else { return after(existing: []) }
            phase = .checkingAfter
            return .checkExistenceAfter(checked.map { items[$0].path })
        case (.checkingAfter, .existence(let answers)):
            return after(existing: answers)
        case (.ending, .done):
            return ending()
        case (.lookingUp, .failed(let error)), (.checkingExistence, .failed(let error)), (.suppressing, .failed(let error)):
            failure = failure ?? error
            return ending()
        default:
            preconditionFailure("coordination machine: \(event) in \(phase)")
        }
    }

    // MARK: Before the access

    private mutating func lookUp() -> Action {
        phase = .lookingUp
        return .lookUpPresenters(items.map { ($0.path, $0.subtree) })
    }

    /// The presenters of `index`'s item other than the owner.
    private func others(_ index: Int) -> PresenterRegistry.Concerned {
        guard index < concerned.count else { return .init() }
        var result = concerned[index]
        if let owner {
            result.item.removeAll { $0.id == owner }
            result.containers.removeAll { $0.id == owner }
            result.inside.removeAll { $0.id == owner }
        }
        return result
    }

    /// The presenters told after a write of `index`'s item: its own and its containers'
    /// (not those inside it), the owner's excepted, and only for a write other than a deletion.
    private func told(_ index: Int) -> PresenterRegistry.Concerned {
        guard items[index].isWrite, !items[index].writingOptions.contains(.forDeleting) else { return .init() }
        var result = others(index)
        result.inside = []
        return result
    }

    private mutating func plan(silent: [ObjectIdentifier: FileCoordinationError?], prepared: Set<ObjectIdentifier>) -> Action {
        switch Self.plan(items, concerned: items.indices.map(others), silent: silent, prepared: prepared) {
        case .failure(let known):
            failure = known
            return ending()
        case .success(let steps) where steps.isEmpty:
            return checkExistenceBefore()
        case .success(let steps):
            asked = steps
            phase = .asking
            return .ask(steps)
        }
    }

    /// What each presenter is asked before accessing `items`, given the presenters each
    /// concerns (the owner's left out): ``PresenterPlan``, without the presenters a batch
    /// asked already (`prepared`) or found silent (`silent`: the batch fails with the
    /// first such error, under a failing policy).
    static func plan(_ items: [Item], concerned: [PresenterRegistry.Concerned], silent: [ObjectIdentifier: FileCoordinationError?],
                     prepared: Set<ObjectIdentifier>) -> Result<[PresenterPlan.Steps], FileCoordinationError> {
        var known: FileCoordinationError?
        var planned = PresenterPlan()
        for (item, concerned) in zip(items, concerned) where !concerned.isEmpty {
            planned.add(item.path, item.request, concerned: concerned) { entry in
                guard !prepared.contains(entry.id) else { return false }
                // Silent earlier in the same batch: not asked again.
                if let outcome = silent[entry.id] {
                    if let error = outcome { known = known ?? error }
                    return false
                }
                return true
            }
        }
        if let known { return .failure(known) }
        return .success(planned.steps)
    }

    /// A write (not a deletion) whose containers have presenters: whether its item exists
    /// before, so that they hear `subitemDidAppear` for a new one.
    private mutating func checkExistenceBefore() -> Action {
        checked = items.indices.filter { !told($0).containers.isEmpty }
        guard !checked.isEmpty else { return suppress() }
        phase = .checkingExistence
        return .checkExistence(checked.map { items[$0].path })
    }

    /// Presenters watching written items would see the write again through inotify (the
    /// owner's included): their watches drop those events until the end, which reports
    /// the write itself.
    private mutating func suppress() -> Action {
        var pairs: [(presenter: ObjectIdentifier, path: FilePath)] = []
        for index in items.indices where items[index].isWrite && index < concerned.count {
            let all = concerned[index]
            for entry in all.item + all.containers + all.inside { pairs.append((entry.id, items[index].path)) }
        }
        phase = .suppressing
        guard !pairs.isEmpty else { return handle(.done) }
        suppressing = true
        return .suppress(pairs)
    }

    // MARK: After the access

    /// The order table's "after it" column for every write, given whether each checked
    /// item exists now.
    private mutating func after(existing answers: [Bool]) -> Action {
        var existsNow: [Int: Bool] = [:]
        for (index, exists) in zip(checked, answers) { existsNow[index] = exists }
        var after: [PendingMessage] = []
        for index in items.indices {
            let concerned = told(index)
            guard !concerned.isEmpty else { continue }
            after += PresenterPlan.after(write: items[index].path, options: items[index].writingOptions,
                                         existedBefore: items[index].existedBefore, concerned: concerned, moved: moved,
                                         existsAfter: existsNow[index] ?? true)
        }
        messages = after + messages
        return ending()
    }

    /// The next step of the end: suppression stopped (the write's own events are in the
    /// watches by now), messages told, reacquirers run, claims released, and the end.
    private mutating func ending() -> Action {
        phase = .ending
        while true {
            let step = nextEnding
            guard step != .end else { break }
            nextEnding = Ending(rawValue: step.rawValue + 1)!
            switch step {
            case .endSuppressing where suppressing: return .endSuppressing
            case .tell where !messages.isEmpty: return .tell(messages)
            case .giveBack where !reacquirers.isEmpty: return .giveBack(reacquirers)
            case .release:
                if let request { return .release(request) }
            default: continue
            }
        }
        phase = .ended
        return .end(failure)
    }
}
