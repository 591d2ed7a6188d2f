/// Ends waits from outside the task that waits: ``FileCoordinator/cancel()`` ends a
/// coordination's waits for its presenters through one, in this process (the callback's
/// race) and in others (the request's wait for its reply), each with the error it fires
/// with.
package final class CancelSignal: Sendable {
    private struct State {
        var error: (any Error)?
        var hooks: [@Sendable (any Error) -> Void] = []
    }
    private let state = Locked(State())

    package init() {}

    /// Calls `hook` with the error when the signal fires; at once if it has.
    package func onFire(_ hook: @escaping @Sendable (any Error) -> Void) {
        let fired = state.withLock { state -> (any Error)? in
            if let error = state.error { return error }
            state.hooks.append(hook)
            return nil
        }
        if let fired { hook(fired) }
    }

    /// Fires the signal (once): calls every hook with `error`.
    package func fire(_ error: any Error) {
        let hooks = state.withLock { state -> [@Sendable (any Error) -> Void] in
            guard state.error == nil else { return [] }
            state.error = error
            defer { state.hooks = [] }
            return state.hooks
        }
        for hook in hooks { hook(error) }
    }
}
