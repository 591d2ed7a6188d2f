import AsyncFileIO
import SystemCalls
import CFileCoordinationShims
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Waiting for the kernel locks to change (another process let go), and the descriptors
/// that hold this process's claims.
extension SpaceLocks {
    // MARK: Waiting

    /// A new generation: every parked waiter is taken, to be resumed (outside the lock)
    /// so that it tries again.
    static func takeWaiters(_ state: inout State) -> [UnsafeContinuation<Void, any Error>] {
        state.generation &+= 1
        defer { state.waiters.removeAll() }
        return Array(state.waiters.values)
    }

    /// Ends the wait of the acquisition with this token (its coordinator was cancelled).
    func cancel(token: UInt64) {
        let (waiters, inKernel) = state.withLock { state in
            state.cancelled.insert(token)
            return (Self.takeWaiters(&state), state.kernelWaits[token])
        }
        for waiter in waiters { waiter.resume() }
        inKernel?.cancel()
    }

    /// Called by the watcher thread for a shard's `IN_CLOSE_WRITE`: a holder may have let
    /// go by ending, with no other event to come. This process's waiters try again (and
    /// look again on their own for a while, see ``closeRechecks``).
    func shardClosed() {
        wakeWaiters(closed: true)
    }

    /// Called by the watcher thread for the lock file's `IN_MODIFY` / `IN_CLOSE_WRITE`
    /// (`closed`: a process may have let go by ending): this process's waiters try again,
    /// and its idle bytes go (someone may wait for one); if there were any, the doorbell
    /// rings for the waiters elsewhere.
    func somethingChanged(closed: Bool = false) {
        wakeWaiters(closed: closed)
        if dropIdle(suspend: true) { ringDoorbell() }
    }

    /// A new generation, so that a claim between its attempt and its parking tries again
    /// too, and every parked waiter resumed; `closed` counts a close to answer.
    private func wakeWaiters(closed: Bool) {
        let waiters = state.withLock { state in
            if closed { state.closes &+= 1 }
            return Self.takeWaiters(&state)
        }
        for waiter in waiters { waiter.resume() }
    }

    func waitForChange(after generation: UInt64, atMost timeout: Duration? = nil) async throws {
        let id = state.withLock { state in
            defer { state.nextWaiter += 1 }
            if timeout != nil { state.timed[state.nextWaiter] = false }
            return state.nextWaiter
        }
        let timer = timeout.map { timeout in
            Task { [self] in
                // ok: a bounded look again after a claim file's close (``closeRechecks``).
                guard (try? await Task.sleep(for: timeout)) != nil else { return }
                let waiter = state.withLock { state -> UnsafeContinuation<Void, any Error>? in
                    // (Ended meanwhile: nothing to do.)
                    guard state.timed[id] != nil else { return nil }
                    if let waiter = state.waiters.removeValue(forKey: id) { return waiter }
                    state.timed[id] = true
                    return nil
                }
                waiter?.resume()
            }
        }
        defer {
            timer?.cancel()
            if timer != nil { _ = state.withLock { $0.timed.removeValue(forKey: id) } }
        }
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, any Error>) in
                let parked = state.withLock { state in
                    guard state.generation == generation, !Task.isCancelled, state.timed[id] != true else { return false }
                    state.waiters[id] = continuation
                    return true
                }
                if !parked { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { $0.waiters.removeValue(forKey: id) }
            waiter?.resume(throwing: CancellationError())
        }
    }

    /// How long a waiting claim that still finds a conflict pauses before it looks again
    /// on its own: after a claim file's close it has not answered yet (`answered`: the
    /// closes it has seen, and the looks made since the last), 1 ms doubling for
    /// ``closeRechecks`` looks; nil (wait for an event alone) after.
    func recheckPause(_ answered: inout (closes: UInt64, looks: Int)) -> Duration? {
        let closes = state.withLock { $0.closes }
        if closes != answered.closes { answered = (closes, 0) }
        guard closes != 0, answered.looks < Self.closeRechecks else { return nil }
        defer { answered.looks += 1 }
        return .milliseconds(1 << answered.looks)
    }

    func raiseWaitingFlag() {
        state.withLock { state in
            state.waiting += 1
            waitingHere.add(1, ordering: .relaxed)
            if state.waiting == 1 { _ = Syscall.lock(fd, fc_F_RDLCK, Self.waitingFlagOffset, 1) }
        }
    }

    func lowerWaitingFlag() {
        state.withLock { state in
            state.waiting -= 1
            waitingHere.subtract(1, ordering: .relaxed)
            if state.waiting == 0 { _ = Syscall.lock(fd, fc_F_UNLCK, Self.waitingFlagOffset, 1) }
        }
    }

    /// `claims.lock` and every shard file in which this process holds a byte: a child
    /// process that inherits them keeps this process's claims until it ends, even if this
    /// process dies first (the locks belong to the open files, not to the process), and
    /// its exit is the `IN_CLOSE_WRITE` that wakes the waiters.
    func descriptorsHoldingClaims() -> [Int32] {
        [fd] + shards.compactMap { shard in shard.state.withLock { $0.fd >= 0 && !$0.bytes.isEmpty ? $0.fd : nil } }
    }

    /// Bytes this process holds in the kernel (for tests and `status`).
    var heldCount: Int { shards.reduce(0) { $0 + $1.state.withLock { $0.bytes.lockedCount } } }

    func lockError(_ operation: FileCoordinationError.Operation, _ code: Errno) -> FileCoordinationError {
        FileCoordinationError(operation, code: .io, path: path, errno: code,
                              message: "the coordination space's lock file refused a lock")
    }
}
