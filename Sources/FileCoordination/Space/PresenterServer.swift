import AsyncFileIO
import Foundation
import SystemPackage

/// Serves other processes' requests to this process's presenters, for either space: the
/// directory space's mailbox (``SpaceMail``) and the etcd space's hand it what they
/// receive, and send the replies it gives back.
///
/// Requests are served one at a time, in the order they arrived (so a presenter hears
/// `didChange` and its reacquirer after the relinquish of the same write, and before the
/// next writer's). What each relinquish keeps until its `reacquire`, and what a dead
/// asker is owed, is decided by the ``ServingLedger``.
package final class PresenterServer: Sendable {
    /// What a relinquish keeps until its `reacquire` (or its asker's death) undoes it.
    package struct KeptRelinquish: Sendable {
        package var reacquirer: FileReacquirer?
        package var suppression: EchoSuppression?
        /// The presenter's number in the space.
        var presenter: UInt64 = 0

        package init(reacquirer: FileReacquirer?, suppression: EchoSuppression? = nil) {
            (self.reacquirer, self.suppression) = (reacquirer, suppression)
        }
    }

    typealias Key = ServingLedger<KeptRelinquish>.Key

    /// What the serving task is handed, in order.
    enum Incoming: Sendable {
        case message(SpaceProtocol.Message)
        /// A process that asked this process's presenters to relinquish is dead: what it
        /// left relinquished is given back (``ServingLedger/senderGoneServed(_:)``).
        case senderGone(String)
    }

    struct State {
        /// This process's presenters, by their number in the space.
        var local: [UInt64: (presenter: any FilePresenter, path: FilePath)] = [:]
        var localNumbers: [ObjectIdentifier: UInt64] = [:]
        var nextPresenter: UInt64 = 1
        /// Relinquish requests queued, and what the served ones keep for their askers.
        var ledger = ServingLedger<KeptRelinquish>()
        /// Items lent to a presenter's own coordinators while it saves for the request
        /// (``followUps(_:of:presenter:)``).
        var loans: [Key: ItemLoan] = [:]
        var started = false
    }

    let state = Locked(State())
    let incoming: AsyncStream<Incoming>.Continuation
    let incomingStream: AsyncStream<Incoming>
    let executor = ServingExecutor()
    let hooks: SpaceHooks

    package init(hooks: SpaceHooks) {
        self.hooks = hooks
        (incomingStream, incoming) = AsyncStream.makeStream(of: Incoming.self)
    }

    // MARK: This process's presenters

    /// Adds `presenter`, or moves it to `path`: its number in the space, and the number it
    /// had when it is given a new one. With `renumbering` a presenter added again gets a
    /// new number (the directory space's records are read once per name).
    package func add(_ presenter: any FilePresenter, at path: FilePath, renumbering: Bool) -> (number: UInt64, replaced: UInt64?) {
        state.withLock { state in
            let existing = state.localNumbers[ObjectIdentifier(presenter)]
            if let existing, !renumbering {
                state.local[existing] = (presenter, path)
                return (existing, nil)
            }
            if let existing { state.local[existing] = nil }
            defer { state.nextPresenter += 1 }
            state.local[state.nextPresenter] = (presenter, path)
            state.localNumbers[ObjectIdentifier(presenter)] = state.nextPresenter
            return (state.nextPresenter, existing)
        }
    }

    /// Removes `presenter`: the number it had (nil when it was not added).
    package func remove(_ presenter: any FilePresenter) -> UInt64? {
        state.withLock { state in
            guard let number = state.localNumbers.removeValue(forKey: ObjectIdentifier(presenter)) else { return nil }
            state.local[number] = nil
            return number
        }
    }

    /// The presented paths and the numbers of this process's presenters.
    package var presented: [(number: UInt64, path: FilePath)] {
        state.withLock { $0.local.map { ($0.key, $0.value.path) } }
    }

    // MARK: Receiving (on the thread that read the message)

    /// Starts the serving task: `reply` sends a reply to the process named. It runs on the
    /// library's threads (``ServingExecutor``): between the presenter's callbacks it sends
    /// each reply itself, with no hand-over to another thread.
    package func start(replying reply: @escaping @Sendable (SpaceProtocol.Body, String) -> Void) {
        guard state.withLock({ state in
            defer { state.started = true }
            return !state.started
        }) else { return }
        let stream = incomingStream
        Task.detached(executorPreference: executor) { [self] in
            for await item in stream { await serve(item, reply: reply) }
        }
    }

    /// Whether the serving task was started (for tests).
    var isServing: Bool { state.withLock { $0.started } }

    /// Ends the serving task once what it was handed is served: the process left the
    /// space, and no `reacquire` can reach it any more. What it keeps for other processes
    /// is given back as for askers that died (``senderDied(_:)``), or its presenters would
    /// stay relinquished, and deaf to their items' changes, for as long as it lives.
    package func finish() {
        for process in owedProcesses { senderDied(process) }
        incoming.finish()
    }

    /// A request for this process's presenters arrived: noted in the ledger, then handed
    /// to the serving task. With `onWatcherThread` (the directory space's watcher thread,
    /// which heard a writer's own events before its `reacquire`), an echo suppression
    /// ends here, and the request may be served here (see ``ServingExecutor``): returns
    /// whether it was.
    package func received(_ message: SpaceProtocol.Message, onWatcherThread: Bool) -> Bool {
        guard case .presenter(let request) = message.body, let item = ServingMachine<KeptRelinquish>.item(message) else { return false }
        if onWatcherThread, case .reacquire(let key) = item { endSuppressionOnWatcherThread(of: key) }
        let loan = state.withLock { state -> ItemLoan? in
            ServingMachine.arrived(item, ledger: &state.ledger)
            // Its asker stopped waiting for the save (a presenter timeout): the item is
            // not lent any more.
            guard case .reacquire(let key) = item else { return nil }
            return state.loans[key]
        }
        loan?.revoke()
        guard onWatcherThread else {
            incoming.yield(.message(message))
            return false
        }
        return handOver(message, presenter: request.presenter)
    }

    /// A writer in another process sent `reacquire` after its write: the write's own
    /// inotify events came through this process's one inotify queue before this message,
    /// so the presenter's watch stops dropping them here, on the watcher thread, without
    /// the sync (a cookie file and its events) that ending it later would take. A
    /// suppression not kept yet (a reacquire sent on a timeout, while the relinquish is
    /// still running) is ended when the reacquire is served.
    private func endSuppressionOnWatcherThread(of key: Key) {
        let suppression = state.withLock { state -> EchoSuppression? in
            var ended: EchoSuppression?
            state.ledger.update(key) { kept in
                ended = kept.suppression
                kept.suppression = nil
            }
            return ended
        }
        suppression?.endOnWatcherThread()
    }

    /// Hands a request to the serving task; returns whether it was served here, on the
    /// watcher thread: not for a presenter that says its callbacks may block, or that is
    /// not registered any more.
    private func handOver(_ message: SpaceProtocol.Message, presenter number: UInt64) -> Bool {
        // A presenter no longer registered may still have a reacquirer kept: not knowing
        // whether it blocks, it is not run here.
        let mayBlock = state.withLock { $0.local[number]?.presenter }?.presentedItemCallbacksMayBlock ?? true
        guard !mayBlock else {
            incoming.yield(.message(message))
            return false
        }
        return executor.runHandedOver { incoming.yield(.message(message)) }
    }

    // MARK: Askers that are gone

    /// Whether anything is owed to `process` (a relinquish queued, running or kept).
    package func owes(_ process: String) -> Bool {
        state.withLock { $0.ledger.owes(process) }
    }

    /// The processes something is owed to.
    package var owedProcesses: [String] {
        state.withLock { $0.ledger.owedProcesses }
    }

    /// `process` is dead: its requests not started are not served, a relinquish of it
    /// still running is undone as it ends, and a notice that the serving task takes after
    /// everything already handed to it ends the echo suppressions and runs the
    /// reacquirers kept for it. Otherwise a writer killed after a presenter relinquished
    /// would leave the presenter without its item and deaf to every later change of it.
    package func senderDied(_ process: String) {
        let (owed, loans) = state.withLock { state in
            (state.ledger.senderDied(process), state.loans.filter { $0.key.process == process }.map(\.value))
        }
        for loan in loans { loan.revoke() }
        if owed { incoming.yield(.senderGone(process)) }
    }

    // MARK: Serving (the serving task)

    /// Serves one item it was handed: the ``ServingMachine``'s actions, carried out one at
    /// a time (the machine decides under the lock; the presenter's callbacks and the reply
    /// run outside it).
    func serve(_ item: Incoming, reply send: @Sendable (SpaceProtocol.Body, String) -> Void) async {
        var message: SpaceProtocol.Message?
        var request: SpaceProtocol.PresenterMessage?
        let taken: ServingMachine<KeptRelinquish>.Item
        switch item {
        case .senderGone(let process):
            taken = .senderGone(process)
        case .message(let received):
            guard case .presenter(let call) = received.body, let item = ServingMachine<KeptRelinquish>.item(received) else { return }
            (message, request, taken) = (received, call, item)
        }
        let presenter = request.flatMap { request in state.withLock { $0.local[request.presenter]?.presenter } }
        var (machine, action) = state.withLock { ServingMachine.start(taken, hasPresenter: presenter != nil, ledger: &$0.ledger) }
        while true {
            let event: ServingMachine<KeptRelinquish>.Event
            switch action {
            case .relinquish:
                event = await relinquish(request, of: message, presenter: presenter)
            case .followUps:
                event = await followUps(request, of: message, presenter: presenter)
            case .undo(let kept):
                await undo(kept)
                event = .undone
            case .reacquire(let kept):
                // Usually ended on arrival (``received(_:onWatcherThread:)``). Otherwise
                // ending it waits for the watch to catch up (a sync through inotify); the
                // next request need not wait behind it.
                if let suppression = kept.suppression { Task { await suppression.end() } }
                await kept.reacquirer?()
                event = .undone
            case .deliver:
                guard let message, let request else { return }
                await request.deliver(to: presenter, hooks: hooks) { body in
                    do { try await body() } catch { return Self.answer(message, failure: Self.describe(error), send) }
                    Self.answer(message, failure: nil, send)
                }
                return
            case .reply(let failure):
                if let message { Self.answer(message, failure: failure, send) }
                return
            case .end:
                return
            }
            action = state.withLock { machine.handle(event, ledger: &$0.ledger) }
        }
    }

    /// Sends `message`'s asker its reply: nil, or the presenter's failure.
    private static func answer(_ message: SpaceProtocol.Message, failure: String?, _ send: (SpaceProtocol.Body, String) -> Void) {
        var reply = SpaceProtocol.Reply(re: message.header.id)
        reply.failure = failure
        send(.reply(reply), message.header.from)
    }

    /// Calls the presenter's relinquish: what it keeps until the `reacquire` (the
    /// reacquirer, and for a writer the echo suppression of the write's events).
    private func relinquish(_ request: SpaceProtocol.PresenterMessage?, of message: SpaceProtocol.Message?,
                            presenter: (any FilePresenter)?) async -> ServingMachine<KeptRelinquish>.Event {
        guard let presenter, let request, let message, case .relinquish(let relinquish) = request.call else { return .failed("no presenter") }
        let writing = relinquish.access == .write
        let fileRequest = FileAccessRequest(url: request.path.fileURL, kind: writing ? .writing : .reading,
                                            purposeIdentifier: relinquish.purpose, processIdentifier: message.header.pid)
        do {
            let reacquirer = writing ? try await presenter.relinquishPresentedItem(toWriter: fileRequest)
                : try await presenter.relinquishPresentedItem(toReader: fileRequest)
            var kept = KeptRelinquish(reacquirer: reacquirer)
            kept.presenter = request.presenter
            if writing { kept.suppression = hooks.suppress(presenter, request.path) }
            return .relinquished(kept)
        } catch {
            return .failed(Self.describe(error))
        }
    }

    /// The steps a relinquish request carries for after the relinquish. A save or a
    /// deletion runs with the item lent to the presenter's own coordinators (``ItemLoan``)
    /// when its asker holds it alone: a writer, or a reader while no other asker's
    /// relinquish of the presenter is kept (another process may be reading the item).
    /// The answer waits until what was granted under the loan is released.
    private func followUps(_ request: SpaceProtocol.PresenterMessage?, of message: SpaceProtocol.Message?,
                           presenter: (any FilePresenter)?) async -> ServingMachine<KeptRelinquish>.Event {
        guard let presenter, let request, let message, case .relinquish(let relinquish) = request.call else { return .failed("no presenter") }
        let key = Key(process: message.header.from, request: relinquish.re)
        let loan = relinquish.then == nil ? nil : state.withLock { state -> ItemLoan? in
            guard !state.ledger.hasGivenUp(key),
                  relinquish.access == .write || !state.ledger.keepsOther(than: key, { $0.presenter == request.presenter })
            else { return nil }
            let loan = hooks.lend(presenter, request.path)
            state.loans[key] = loan
            return loan
        }
        let outcome: ServingMachine<KeptRelinquish>.Event
        do {
            switch relinquish.then {
            case .save: try await presenter.savePresentedItemChanges()
            case .accommodateDeletion: try await presenter.accommodatePresentedItemDeletion()
            case nil: break
            }
            for subitem in relinquish.subitemDeletions {
                try await presenter.accommodatePresentedSubitemDeletion(at: subitem.fileURL)
            }
            outcome = .followedUp
        } catch {
            outcome = .failed(Self.describe(error))
        }
        if let loan {
            state.withLock { _ = $0.loans.removeValue(forKey: key) }
            await loan.end()
        }
        return outcome
    }

    /// Ends a kept relinquish: the echo suppression, then the presenter's reacquirer.
    func undo(_ kept: KeptRelinquish) async {
        await kept.suppression?.end()
        await kept.reacquirer?()
    }

    /// The text of a presenter's failure, as a reply carries it.
    static func describe(_ error: any Error) -> String {
        if let error = error as? FileCoordinationError { return error.message }
        if let error = error as? any LocalizedError, let text = error.errorDescription { return text }
        return String(describing: error)
    }
}

extension SpaceProtocol.PresenterMessage {
    /// Delivers a call that no ledger keeps (every call but a relinquish and a reacquire)
    /// to `presenter` (nil: it was unregistered); a request's answer goes through
    /// `replying`; a move goes through `hooks` first. For the mailbox of either space.
    package func deliver(to presenter: (any FilePresenter)?, hooks: SpaceHooks,
                         replying: (() async throws -> Void) async -> Void) async {
        var url: URL { path.fileURL }
        switch call {
        case .save:
            await replying { try await presenter?.savePresentedItemChanges() }
        case .accommodateDeletion:
            await replying { try await presenter?.accommodatePresentedItemDeletion() }
        case .accommodateSubitemDeletion:
            await replying { try await presenter?.accommodatePresentedSubitemDeletion(at: url) }
        case .didChange:
            await presenter?.presentedItemDidChange()
        case .didMove(let to):
            guard let presenter else { return }
            await hooks.presenterMoved(presenter, path, to)
            await presenter.presentedItemDidMove(to: to.fileURL)
        case .subitemDidAppear:
            await presenter?.presentedSubitemDidAppear(at: url)
        case .subitemDidChange:
            await presenter?.presentedSubitemDidChange(at: url)
        case .subitemDidMove(let to):
            await presenter?.presentedSubitem(at: url, didMoveTo: to.fileURL)
        case .relinquish, .reacquire:
            break
        }
    }
}
