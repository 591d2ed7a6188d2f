@_spi(FileCoordinationInternal) import AsyncFileIO
import Synchronization

/// Tells a claim's timeout when the claim starts to wait, so that the timeout runs only
/// while the claim really waits: an uncontended claim succeeds with any timeout, zero
/// included (as `flock -n`). A timer started with the claim would race the first claim of
/// a process (which opens its claim shards on an I/O thread), and often win.
///
/// Set as a task-local around an acquisition; the in-process center and the space's locks
/// call ``noteWaiting()`` where they park.
final class ClaimWait: Sendable {
    @TaskLocal static var current: ClaimWait?

    private let state = Locked<(started: Bool, waiter: UnsafeContinuation<Void, Never>?)>((false, nil))

    /// The current acquisition is about to park (in this process's rules, or on another
    /// process's claims).
    static func noteWaiting() { current?.started() }

    private func started() {
        let waiter = state.withLock { state in
            state.started = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    /// Returns once the acquisition has started to wait, or once this task is cancelled.
    func untilWaiting() async {
        await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                let now = state.withLock { state in
                    if state.started || Task.isCancelled { return true }
                    state.waiter = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            started()
        }
    }
}
