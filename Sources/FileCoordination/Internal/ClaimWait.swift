import AsyncFileIO
import Synchronization

/// Tells a claim's timeout when the claim starts to wait, so that the timeout runs only
/// while the claim really waits: an uncontended claim succeeds with any timeout, zero
/// included (as `flock -n`). A timer started with the claim would race the first claim of
/// a process (which opens its claim shards on an I/O thread), and often win.
///
/// Set as a task-local around an acquisition; the in-process center calls
/// ``noteWaiting()`` where it parks, and hands the space ``notifier()`` (the space takes
/// no task-local).
package final class ClaimWait: Sendable {
    @TaskLocal static var current: ClaimWait?

    private let state = Locked<(started: Bool, waiter: UnsafeContinuation<Void, Never>?)>((false, nil))

    /// The current acquisition is about to park (in this process's rules, or on another
    /// process's claims).
    package static func noteWaiting() {
        current?.started()
        WaitObserver.current?.notify()
    }

    /// What the current acquisition calls where it is about to park, for a space to call.
    static func notifier() -> @Sendable () -> Void {
        let (wait, observer) = (current, WaitObserver.current)
        if wait == nil && observer == nil { return {} }
        return {
            wait?.started()
            observer?.notify()
        }
    }

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

/// Tells the caller of a coordination when it starts to wait on others: `filecoord`
/// starts the clock of its "waiting for" line then, and a coordination that waits on
/// nobody costs it no timer and no task.
///
/// A class holding the closure, not a task-local closure: with Swift 6.3.1 on Linux,
/// `withValue` of a task-local whose value is a function type crashes in optimized
/// builds (in `swift_task_localValuePush`; two lines reproduce it:
/// `enum L { @TaskLocal static var f: () -> Void = {} }` and
/// `L.$f.withValue({}) { L.f() }`, built with `swiftc -O`).
package final class WaitObserver: Sendable {
    /// The observer of the coordinations run with it set.
    @TaskLocal public static var current: WaitObserver?

    /// Called where a claim is about to park and where a request goes to another
    /// process's presenter, perhaps more than once. It must be quick and must not block.
    let notify: @Sendable () -> Void

    /// An observer that calls `notify` (see ``notify``).
    public init(_ notify: @escaping @Sendable () -> Void) { self.notify = notify }
}
