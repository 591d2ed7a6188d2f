import AsyncFileIO
import Foundation
import Logging
import Synchronization
import SystemPackage

/// How a presenter of this process is called under a coordinator's
/// ``PresenterTimeoutPolicy``, and how a presenter's silence or failure is told.
package enum PresenterMessenger {

    /// How ``PresenterCall`` bounds a callback of a presenter of this process: it runs in a
    /// task of its own, raced against a timer, so a presenter that never returns is left
    /// behind (and cancelled), never waited for. With `cancellable`, cancelling the calling task ends the race too (the callback is
    /// then left behind, or never made); so does `ending` when it fires.
    static func race<T: Sendable>(
        _ policy: PresenterTimeoutPolicy, _ callback: String, of entry: PresenterRegistry.Entry,
        late: (@Sendable (T) -> Void)?, cancellable: Bool = true, ending: CancelSignal? = nil,
        _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T? {
        let race = Race<T>()
        ending?.onFire { error in race.finish(.failure(error)) }
        guard cancellable else { return try await run(race, policy, callback, of: entry, late: late, body) }
        return try await withTaskCancellationHandler {
            try await run(race, policy, callback, of: entry, late: late, body)
        } onCancel: {
            race.finish(.failure(CancellationError()))
        }
    }

    /// The callback in a task of its own and the policy's timer in another: the first to
    /// finish `race` decides.
    private static func run<T: Sendable>(
        _ race: Race<T>, _ policy: PresenterTimeoutPolicy, _ callback: String, of entry: PresenterRegistry.Entry,
        late: (@Sendable (T) -> Void)?, _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T? {
        try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<T?, any Error>) in
            // Cancelled before it began: the callback is never made.
            guard race.install(continuation) else { return }
            // (A blocking form's callers may hold every thread of the pool.)
            let executor = BlockingCaller.executor
            let work = Task(executorPreference: executor) {
                do {
                    let value = try await body()
                    // An answer after the coordination gave up (timeout, cancellation)
                    // is handed to `late`: a reacquirer must still run.
                    if !race.finish(.success(value)) { late?(value) }
                } catch {
                    race.finish(.failure(error))
                }
            }
            let timer = Task(executorPreference: executor) {
                try? await Task.sleep(for: policy.timeout) // ok: the timeout is real time
                guard !Task.isCancelled else { return }
                switch policy.action {
                case .proceed:
                    if race.finish(.success(nil)) {
                        UnansweredPresenters.current?.note(entry.id, nil)
                        warnTimeout(policy, callback, of: entry)
                        work.cancel()
                    }
                case .fail:
                    let error = timeoutError(policy, callback, of: entry)
                    if race.finish(.failure(error)) {
                        UnansweredPresenters.current?.note(entry.id, error)
                        work.cancel()
                    }
                }
            }
            race.onFinish {
                timer.cancel()
                work.cancel()
            }
        }
    }

    private static func seconds(_ policy: PresenterTimeoutPolicy) -> Double {
        Double(policy.timeout.components.seconds) + Double(policy.timeout.components.attoseconds) / 1e18
    }

    /// The policy proceeds without a presenter that did not answer: say so.
    static func warnTimeout(_ policy: PresenterTimeoutPolicy, _ callback: String, of entry: PresenterRegistry.Entry) {
        let seconds = seconds(policy)
        FileCoordinator.logger.warning("\(name(of: entry.presenter)) did not answer \(callback) within \(seconds) s; proceeding without it",
                       metadata: ["presenter": "\(name(of: entry.presenter))", "path": "\(entry.path)",
                                  "callback": "\(callback)", "timeout": "\(seconds) s"])
    }

    /// The policy fails the coordination when a presenter did not answer.
    static func timeoutError(_ policy: PresenterTimeoutPolicy, _ callback: String, of entry: PresenterRegistry.Entry) -> FileCoordinationError {
        FileCoordinationError(code: .timedOut, path: entry.path, operation: callback,
                              message: "\(name(of: entry.presenter)) did not answer within \(seconds(policy)) s")
    }

    /// How warnings and errors name a presenter: its description when it has one (a
    /// presenter in another process names its process), else its type.
    static func name(of presenter: any FilePresenter) -> String {
        (presenter as? any CustomStringConvertible)?.description ?? "the presenter \(type(of: presenter))"
    }

    /// Wraps a presenter's own error as the coordination's failure. A presenter in another
    /// process is a proxy whose errors say themselves what failed: its own refusal, or a
    /// request that could not be delivered.
    static func failure(_ error: any Error, callback: String, entry: PresenterRegistry.Entry) -> any Error {
        if error is CancellationError { return error }
        if let error = error as? FileCoordinationError,
           error.code == .timedOut || error.code == .presenterFailed || error.code == .cancelled || entry.presenter is RemotePresenter { return error }
        return FileCoordinationError(code: .presenterFailed, path: entry.path, operation: callback,
                                     message: "the presenter refused: \(error)", cause: error)
    }
}

/// First finisher wins: the callback, the timer, or cancellation.
private final class Race<T: Sendable>: Sendable {
    private struct State {
        var continuation: UnsafeContinuation<T?, any Error>?
        var result: Result<T?, any Error>?
        var finished = false
        var onFinish: (@Sendable () -> Void)?
    }
    private let state = Locked(State())

    /// Stores the continuation; false (after resuming it) when the race was already decided.
    func install(_ continuation: UnsafeContinuation<T?, any Error>) -> Bool {
        let early: Result<T?, any Error>? = state.withLock { state in
            if let result = state.result { return result }
            state.continuation = continuation
            return nil
        }
        if let early {
            continuation.resume(with: early)
            return false
        }
        return true
    }

    func onFinish(_ action: @escaping @Sendable () -> Void) {
        let now = state.withLock { state in
            if state.finished { return true }
            state.onFinish = action
            return false
        }
        if now { action() }
    }

    /// True if this call decided the outcome.
    @discardableResult
    func finish(_ result: Result<T?, any Error>) -> Bool {
        let (won, continuation, action): (Bool, UnsafeContinuation<T?, any Error>?, (@Sendable () -> Void)?) = state.withLock { state in
            guard !state.finished else { return (false, nil, nil) }
            state.finished = true
            state.result = result
            defer { state.continuation = nil; state.onFinish = nil }
            return (true, state.continuation, state.onFinish)
        }
        continuation?.resume(with: result)
        action?()
        return won
    }
}

/// The presenters that did not answer in time during one batch of coordinations (a
/// coordinated batch read's windows): later windows do not ask them again. Under a
/// failing policy each later window fails with the same error at once; otherwise it
/// goes on without them. Set as a task-local around each window's coordination.
final class UnansweredPresenters: Sendable {
    @TaskLocal static var current: UnansweredPresenters?

    private let state = Locked<[ObjectIdentifier: FileCoordinationError?]>([:])

    /// `error`: what the coordination failed with (a failing policy), or nil (it went on).
    func note(_ presenter: ObjectIdentifier, _ error: FileCoordinationError?) {
        state.withLock { $0[presenter] = error }
    }

    /// Every presenter found silent so far, with its outcome.
    var outcomes: [ObjectIdentifier: FileCoordinationError?] { state.withLock { $0 } }
}
