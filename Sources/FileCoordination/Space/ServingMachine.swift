/// How the serving task serves one item it was handed: a request for one of this
/// process's presenters, or the notice that a process which asked them to relinquish is
/// dead.
///
/// A pure state machine over the process's ``ServingLedger``, which each step is handed
/// under the server's lock. It returns one named action at a time, and takes the outcome
/// of the last as its next event. ``PresenterServer`` carries the actions out with the
/// presenters' callbacks and the space's replies; the simulator
/// (`Tests/FileCoordinationTests/Simulation`) drives the same type with presenters of its
/// own, so that what it proves is this code.
///
/// The order it keeps: a relinquish's reacquirer is kept in the ledger before the steps
/// that follow it (save, accommodate) run, and before the reply is sent; a failure after
/// the presenter relinquished gives the item back before the failure is told; a
/// relinquish whose asker died while it ran is undone at once; a dead asker's kept
/// relinquishes are undone one after another.
struct ServingMachine<Kept> {
    typealias Key = ServingLedger<Kept>.Key

    /// What the serving task was handed, as the machine needs to know it.
    enum Item {
        /// A relinquish request; `followUps`: it carries steps for after the relinquish (a
        /// save, an accommodation, subitem deletions).
        case relinquish(Key, followUps: Bool)
        /// The `reacquire` that ends a relinquish.
        case reacquire(Key)
        /// Any other call (a save or accommodation asked alone, a `did…` notice): no ledger
        /// keeps it.
        case other
        /// The process named is dead: what it left relinquished is given back.
        case senderGone(String)
    }

    enum Action {
        /// Call the presenter's relinquish; then ``Event/relinquished(_:)`` with what it
        /// keeps, or ``Event/failed(_:)``.
        case relinquish
        /// Run the steps the request carries after the relinquish; then
        /// ``Event/followedUp`` or ``Event/failed(_:)``.
        case followUps
        /// Undo what a relinquish kept (its echo suppression, then its reacquirer); then
        /// ``Event/undone``.
        case undo(Kept)
        /// Serve a `reacquire`: end the kept echo suppression (without waiting for it) and
        /// run the reacquirer; then ``Event/undone``.
        case reacquire(Kept)
        /// Deliver a call that no ledger keeps. The last action.
        case deliver
        /// Send the asker its reply: nil, or the presenter's failure. The last action.
        case reply(failure: String?)
        /// Nothing more for this item.
        case end
    }

    enum Event {
        case relinquished(Kept)
        case failed(String)
        case followedUp
        case undone
    }

    fileprivate enum Phase {
        case relinquishing(Key, followUps: Bool)
        case followingUp(Key)
        /// Undoing, then these: the kept relinquishes left to undo, and the reply to send
        /// after them (nil: none).
        case undoing(left: [Kept], reply: String??)
        case ended
    }

    private var phase: Phase = .ended

    /// Takes up `item`; `hasPresenter`: the presenter it names is still registered. The
    /// first action.
    static func start(_ item: Item, hasPresenter: Bool, ledger: inout ServingLedger<Kept>) -> (ServingMachine, Action) {
        var machine = ServingMachine()
        switch item {
        case .relinquish(let key, let followUps):
            // Its asker gave up on it, or died, before it started: nobody waits for it.
            guard ledger.startRelinquish(key) else { return (machine, .end) }
            guard hasPresenter else {
                ledger.relinquishFailed(key)
                return (machine, .reply(failure: nil))
            }
            machine.phase = .relinquishing(key, followUps: followUps)
            return (machine, .relinquish)
        case .reacquire(let key):
            guard let kept = ledger.reacquire(key) else { return (machine, .end) }
            machine.phase = .undoing(left: [], reply: nil)
            return (machine, .reacquire(kept))
        case .other:
            return (machine, .deliver)
        case .senderGone(let process):
            let action = machine.undo(ledger.senderGoneServed(process), thenReply: nil)
            return (machine, action)
        }
    }

    /// The outcome of the last action: the next one.
    mutating func handle(_ event: Event, ledger: inout ServingLedger<Kept>) -> Action {
        switch (phase, event) {
        case (.relinquishing(let key, let followUps), .relinquished(let kept)):
            // Its asker died while the presenter relinquished: nobody will reacquire.
            if let orphan = ledger.relinquished(key, keeping: kept) { return undo([orphan], thenReply: .some(nil)) }
            guard followUps else { return finish(.reply(failure: nil)) }
            phase = .followingUp(key)
            return .followUps
        case (.relinquishing(let key, _), .failed(let failure)):
            ledger.relinquishFailed(key)
            return finish(.reply(failure: failure))
        case (.followingUp, .followedUp):
            return finish(.reply(failure: nil))
        case (.followingUp(let key), .failed(let failure)):
            // It relinquished: it takes the item back before the failure is told.
            return undo(ledger.reacquire(key).map { [$0] } ?? [], thenReply: .some(failure))
        case (.undoing(let left, let reply), .undone):
            return undo(left, thenReply: reply)
        default:
            // An event the last action does not produce: the driver's mistake, which ends
            // the item rather than act on it.
            assertionFailure("serving: \(event) in \(phase)")
            return finish(.end)
        }
    }

    /// Undoes `kept` one after another, then sends `reply` (when not nil).
    private mutating func undo(_ kept: [Kept], thenReply reply: String??) -> Action {
        guard let first = kept.first else {
            guard case .some(let failure) = reply else { return finish(.end) }
            return finish(.reply(failure: failure))
        }
        phase = .undoing(left: Array(kept.dropFirst()), reply: reply)
        return .undo(first)
    }

    private mutating func finish(_ action: Action) -> Action {
        phase = .ended
        return action
    }
}

extension ServingMachine {
    /// What `message` is to the machine: nil when it is not a request for a presenter.
    static func item(_ message: SpaceProtocol.Message) -> Item? {
        guard case .presenter(let request) = message.body else { return nil }
        let from = message.header.from
        switch request.call {
        case .relinquish(let relinquish):
            return .relinquish(Key(process: from, request: relinquish.re),
                               followUps: relinquish.then != nil || !relinquish.subitemDeletions.isEmpty)
        case .reacquire(let re):
            return .reacquire(Key(process: from, request: re))
        default:
            return .other
        }
    }

    /// `item` arrived, on the thread that read it: noted in the ledger before the serving
    /// task is handed it (a `reacquire` drops its relinquish if that has not started).
    static func arrived(_ item: Item, ledger: inout ServingLedger<Kept>) {
        switch item {
        case .relinquish(let key, _): ledger.relinquishArrived(key)
        case .reacquire(let key): ledger.reacquireArrived(key)
        case .other, .senderGone: break
        }
    }
}

extension ServingMachine: Sendable where Kept: Sendable {}
extension ServingMachine.Event: Sendable where Kept: Sendable {}
extension ServingMachine.Action: Sendable where Kept: Sendable {}
extension ServingMachine.Phase: Sendable where Kept: Sendable {}
