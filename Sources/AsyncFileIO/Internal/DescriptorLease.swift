import Synchronization

/// Guards one open descriptor against being closed (and its number reused) while an
/// operation is still using it. Operations take a lease; closing waits for the last
/// lease to end before the close action runs.
final class DescriptorLease: Sendable {
    private struct State {
        var closed = false
        var leases = 0
        var pendingClose: (@Sendable () -> Void)?
    }
    private let state = Mutex(State())

    /// True once ``close(_:)`` has been called.
    var isClosed: Bool { state.withLock { $0.closed } }

    /// Starts a lease; false when the descriptor is closed or closing.
    func acquire() -> Bool {
        state.withLock { state in
            guard !state.closed else { return false }
            state.leases += 1
            return true
        }
    }

    /// Ends a lease; runs a pending close when it was the last.
    func release() {
        let action: (@Sendable () -> Void)? = state.withLock { state in
            state.leases -= 1
            guard state.leases == 0, let action = state.pendingClose else { return nil }
            state.pendingClose = nil
            return action
        }
        action?()
    }

    /// Marks the descriptor closed and runs `action` once no lease is held.
    /// Returns false (and does not run `action`) if it was already closed.
    @discardableResult
    func close(_ action: @escaping @Sendable () -> Void) -> Bool {
        let runNow: Bool? = state.withLock { state in
            guard !state.closed else { return nil }
            state.closed = true
            if state.leases == 0 { return true }
            state.pendingClose = action
            return false
        }
        guard let runNow else { return false }
        if runNow { action() }
        return true
    }
}
