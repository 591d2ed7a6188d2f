import Synchronization

/// Guards one open descriptor against being closed (and its number reused) while an
/// operation is still using it. Operations take a lease; closing waits for the last
/// lease to end before the close action runs.
///
/// Taking and ending a lease is one atomic operation each (it sits on the path of every
/// range read); only closing takes a lock.
final class DescriptorLease: Sendable {
    /// Twice the number of leases, plus 1 once closed.
    private let word = Atomic<Int>(0)
    /// The close action, until whoever sees the last lease end after closing runs it.
    /// In a struct, not as the lock's value itself: a function value kept directly in a
    /// `Mutex` is re-abstracted by each access (Swift 6.3.1), one thunk deeper every time.
    private struct PendingClose { var action: (@Sendable () -> Void)? }
    private let pendingClose = Locked(PendingClose())

    /// True once ``close(_:)`` has been called.
    var isClosed: Bool { word.load(ordering: .acquiring) & 1 != 0 }

    /// Starts a lease; false when the descriptor is closed or closing.
    func acquire() -> Bool {
        var current = word.load(ordering: .relaxed)
        while current & 1 == 0 {
            let (exchanged, original) = word.weakCompareExchange(
                expected: current, desired: current + 2, successOrdering: .acquiring, failureOrdering: .relaxed)
            if exchanged { return true }
            current = original
        }
        return false
    }

    /// Ends a lease; runs a pending close when it was the last.
    func release() {
        let remaining = word.subtract(2, ordering: .acquiringAndReleasing).newValue
        if remaining == 1 { runPendingClose() }
    }

    /// Marks the descriptor closed and runs `action` once no lease is held.
    /// Returns false (and does not run `action`) if it was already closed.
    @discardableResult
    func close(_ action: @escaping @Sendable () -> Void) -> Bool {
        // Store the action before publishing the closed bit, so that the last release
        // always finds it.
        let stored = pendingClose.withLock { pending in
            guard word.load(ordering: .relaxed) & 1 == 0, pending.action == nil else { return false }
            pending.action = action
            return true
        }
        guard stored else { return false }
        let before = word.bitwiseOr(1, ordering: .acquiringAndReleasing).oldValue
        guard before & 1 == 0 else { return false }
        if before == 0 { runPendingClose() }
        return true
    }

    private func runPendingClose() {
        let action = pendingClose.withLock { pending in
            defer { pending.action = nil }
            return pending.action
        }
        action?()
    }
}
