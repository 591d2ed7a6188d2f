import AsyncFileIO
import Foundation
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// How a coordination reaches one presenter: by calling it in this process
/// (``LocalPresenterEndpoint``), or by messages to the process that registered it
/// (``RemotePresenter``: a request before the access, messages with no answer after
/// it). The engine, the messenger and the center go through this protocol; none of them
/// asks which kind of presenter it has.
package protocol PresenterEndpoint: Sendable {
    /// Asks for a plan's steps before the access (relinquish, then save or accommodate
    /// the deletion, then the subitem deletions): the reacquirer, or nil.
    func askBefore(_ steps: PresenterPlan.Steps, purpose: String, call: PresenterCall) async throws -> FileReacquirer?

    /// Tells the presenter what the access did (`message` is for this presenter); a slow
    /// or failing presenter only delays it, never fails it.
    func tell(_ message: PendingMessage, call: PresenterCall) async

    /// Runs the reacquirer ``askBefore(_:purpose:call:)`` returned: the presenter takes its
    /// item back.
    func giveBack(_ reacquirer: @escaping FileReacquirer, call: PresenterCall) async

    /// Whether this process registered the presenter: it publishes it in the coordination
    /// space, and publishes it again where it moves.
    var isRegisteredHere: Bool { get }

    /// Whether ``tell(_:call:)`` and ``giveBack(_:call:)`` only post a message, with no
    /// callback to wait for: such messages are posted one after another, in order.
    var tellsAtOnce: Bool { get }
}

/// One callback of a presenter under the coordinator's policy, bounded in one of two ways
/// (raced against the policy's timer in this process, or by the deadline a request to
/// another process carries), counted in `metrics` (the answer's time, or the timeout),
/// a failure wrapped as the coordination's error.
package struct PresenterCall: Sendable {
    let policy: PresenterTimeoutPolicy
    let entry: PresenterRegistry.Entry
    let metrics: CoordinationMetrics
    /// Fired by ``FileCoordinator/cancel()``: a callback or request under way then ends
    /// with the coordinator's cancellation (before an access only).
    var ending: CancelSignal? = nil

    /// A callback of a presenter of this process, run in a task of its own and raced
    /// against the policy's timer (``PresenterMessenger/race(_:_:of:late:_:)``): its value;
    /// nil when it was not answered in time and the policy proceeds. Throws the callback's
    /// error, `FileCoordinationError` `.timedOut` when the policy fails, or
    /// `CancellationError` if the coordinating task is cancelled meanwhile (unless
    /// `ignoringCancellation`: what comes after an access is owed whatever the caller).
    func callAsFunction<T: Sendable>(_ name: String, late: (@Sendable (T) -> Void)? = nil, ignoringCancellation: Bool = false,
                                     _ body: @escaping @Sendable () async throws -> T) async throws -> T? {
        try await measured(name) { [policy, entry] in
            try await PresenterMessenger.race(policy, name, of: entry, late: late, cancellable: !ignoringCancellation,
                                              ending: ignoringCancellation ? nil : ending, body)
        }
    }

    /// A request to a presenter of another process, which carries the policy's deadline
    /// itself (no task, no timer): its answer; nil when it was not answered in time
    /// (``RemoteNoAnswer``) and the policy proceeds. Throws as the other form does.
    func request<T: Sendable>(_ name: String, _ body: () async throws -> T) async throws -> T? {
        // The answer may take a while: a caller that says what it waits for says so now.
        WaitObserver.current?.notify()
        return try await measured(name) { [policy, entry] in
            do {
                return try await body()
            } catch is RemoteNoAnswer {
                let error = PresenterMessenger.timeoutError(policy, name, of: entry)
                UnansweredPresenters.current?.note(entry.id, policy.action == .fail ? error : nil)
                if policy.action == .fail { throw error }
                PresenterMessenger.warnTimeout(policy, name, of: entry)
                return nil
            }
        }
    }

    private func measured<T: Sendable>(_ name: String, _ bounded: () async throws -> T?) async throws -> T? {
        let start = ContinuousClock.now
        do {
            let answer = try await bounded()
            if answer == nil {
                metrics.presenterTimeouts.increment()
            } else {
                metrics.presenterAcknowledgement.recordNanoseconds((.now - start).nanoseconds)
            }
            return answer
        } catch let error as FileCoordinationError where error.code == .timedOut && error.operation == name {
            // ``PresenterMessenger/timeoutError(_:_:of:)``: the policy fails the coordination.
            metrics.presenterTimeouts.increment()
            throw error
        } catch is CancellationError {
            throw CancellationError()
        } catch let error as FileCoordinationError where error.code == .cancelled {
            throw error // the coordinator was cancelled: no answer, no timeout
        } catch {
            // A refusal is an answer too.
            metrics.presenterAcknowledgement.recordNanoseconds((.now - start).nanoseconds)
            throw PresenterMessenger.failure(error, callback: name, entry: entry)
        }
    }

    /// A relinquish answered too late still gets its item back.
    static let late: @Sendable (FileReacquirer?) -> Void = { reacquirer in
        if let reacquirer { Task(executorPreference: BlockingCaller.executor) { await reacquirer() } }
    }

    static func relinquishName(_ kind: FileAccessRequest.Kind) -> String {
        kind == .writing ? "relinquishPresentedItem(toWriter:)" : "relinquishPresentedItem(toReader:)"
    }
}

/// A presenter of this process: each callback is a call, raced against the policy's
/// timer in a task of its own.
struct LocalPresenterEndpoint: PresenterEndpoint {
    let presenter: any FilePresenter

    var isRegisteredHere: Bool { true }
    var tellsAtOnce: Bool { false }

    func askBefore(_ steps: PresenterPlan.Steps, purpose: String, call: PresenterCall) async throws -> FileReacquirer? {
        let presenter = self.presenter
        let request = FileAccessRequest(url: steps.path.fileURL, kind: steps.kind, purposeIdentifier: purpose,
                                        processIdentifier: getpid())
        let answer: FileReacquirer??
        switch request.kind {
        case .reading:
            answer = try await call(PresenterCall.relinquishName(.reading), late: PresenterCall.late) {
                try await presenter.relinquishPresentedItem(toReader: request)
            }
        case .writing:
            answer = try await call(PresenterCall.relinquishName(.writing), late: PresenterCall.late) {
                try await presenter.relinquishPresentedItem(toWriter: request)
            }
        }
        // A presenter that did not answer in time is not asked anything more: one
        // timeout bounds how long it can delay the access.
        guard case .some(let reacquirer) = answer else { return nil }
        do {
            if steps.accommodateDeletion {
                _ = try await call("accommodatePresentedItemDeletion()") { try await presenter.accommodatePresentedItemDeletion() }
            } else if steps.save {
                _ = try await call("savePresentedItemChanges()") { try await presenter.savePresentedItemChanges() }
            }
            for path in steps.subitemDeletions {
                let url = path.fileURL
                _ = try await call("accommodatePresentedSubitemDeletion(at:)") {
                    try await presenter.accommodatePresentedSubitemDeletion(at: url)
                }
            }
        } catch {
            // This presenter relinquished: let it take the item back before failing.
            if let reacquirer { await giveBack(reacquirer, call: call) }
            throw error
        }
        return reacquirer
    }

    func tell(_ message: PendingMessage, call: PresenterCall) async {
        let presenter = self.presenter
        let (name, body): (String, @Sendable () async -> Void)
        switch message {
        case .didChange:
            (name, body) = ("presentedItemDidChange()", { await presenter.presentedItemDidChange() })
        case .didMove(_, let path):
            let url = path.fileURL
            (name, body) = ("presentedItemDidMove(to:)", { await presenter.presentedItemDidMove(to: url) })
        case .subitemDidAppear(_, let path):
            let url = path.fileURL
            (name, body) = ("presentedSubitemDidAppear(at:)", { await presenter.presentedSubitemDidAppear(at: url) })
        case .subitemDidChange(_, let path):
            let url = path.fileURL
            (name, body) = ("presentedSubitemDidChange(at:)", { await presenter.presentedSubitemDidChange(at: url) })
        case .subitemDidMove(_, let from, let to):
            let (old, new) = (from.fileURL, to.fileURL)
            (name, body) = ("presentedSubitem(at:didMoveTo:)", { await presenter.presentedSubitem(at: old, didMoveTo: new) })
        }
        _ = try? await call(name, ignoringCancellation: true, body)
    }

    func giveBack(_ reacquirer: @escaping FileReacquirer, call: PresenterCall) async {
        _ = try? await call("reacquirer", ignoringCancellation: true) { await reacquirer() }
    }
}

/// A presenter of another process: the steps before an access go in one request, with the
/// policy's deadline, made from the coordinating task (no task for it, no timer racing
/// it): one round trip. Every other callback is a message with no answer.
extension RemotePresenter: PresenterEndpoint {
    package var isRegisteredHere: Bool { false }
    package var tellsAtOnce: Bool { true }

    package func askBefore(_ steps: PresenterPlan.Steps, purpose: String, call: PresenterCall) async throws -> FileReacquirer? {
        let then: FollowUp? = steps.accommodateDeletion ? .accommodateDeletion : steps.save ? .save : nil
        let timeout = call.policy.timeout
        let answer = try await call.request(PresenterCall.relinquishName(steps.kind)) {
            try await self.relinquish(steps.path, kind: steps.kind, purpose: purpose, then: then, subitemDeletions: steps.subitemDeletions,
                                      timeout: timeout, ending: call.ending)
        }
        guard case .some(let reacquirer) = answer else { return nil }
        return reacquirer
    }

    /// A message with no answer, posted behind this process's earlier messages to that
    /// process: nothing to wait for, so no task and no timer.
    package func tell(_ message: PendingMessage, call: PresenterCall) async {
        switch message {
        case .didChange: tell(.didChange)
        case .didMove(_, let to): tell(.didMove(to: to))
        case .subitemDidAppear(_, let at): tell(.subitemDidAppear, path: at)
        case .subitemDidChange(_, let at): tell(.subitemDidChange, path: at)
        case .subitemDidMove(_, let from, let to): tell(.subitemDidMove(to: to), path: from)
        }
    }

    /// The reacquirer of ``relinquish(_:kind:purpose:then:subitemDeletions:timeout:)``
    /// only posts a `reacquire`: run as it is.
    package func giveBack(_ reacquirer: @escaping FileReacquirer, call: PresenterCall) async {
        await reacquirer()
    }
}
