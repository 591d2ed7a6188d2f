import AsyncFileIO
import CFileCoordinationShims
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A claim's wait in the kernel: blocking lock calls (`F_OFD_SETLKW`) on a thread of its
/// own, while the waiting task is suspended.
///
/// The kernel queues a blocked lock call behind the lock in its way, as it queues
/// flock(1)'s, and wakes it when that lock is given back or its holder dies (the kernel
/// drops a dead process's locks). Exclusive requests queue behind each other, so a release
/// wakes one waiter, not all of them; a waiting process spends nothing until then.
///
/// The cooperative pool never blocks: the task awaits a continuation that the thread
/// resumes. A wait that ends early (the task cancelled, a claim timeout, or ``cancel()``
/// for `FileCoordinator.cancel()`) resumes its task at once and sends the thread the
/// library's wait signal (`fc_lock_wait_signal`, a real-time signal with a handler that
/// does nothing, without `SA_RESTART`): the blocked call fails with `EINTR`, and the
/// thread sees it was cancelled. A signal that lands just before the thread enters the
/// call is sent again (``resends``). What the thread was granted after its task left
/// (`abandoned`) is the caller's to give back, on that thread.
final class KernelLockWait: Sendable {
    private struct State {
        var thread: pthread_t?
        var cancelled = false
        /// The body returned: the thread must not be signalled any more.
        var finished = false
        var continuation: UnsafeContinuation<Bool, Never>?
    }
    private let state = Locked(State())

    /// The wait signal, installed on first use; nil when no real-time signal was free.
    static let signal: Int32? = {
        let number = fc_lock_wait_signal()
        return number > 0 ? number : nil
    }()

    /// How many times a cancelled wait's signal is sent again, at 1, 2, 4 ... ms, while
    /// the thread has not seen it (it landed between the thread's look at the flag and
    /// its entry into the call).
    static let resends = 10

    /// Whether ``cancel()`` was called.
    var isCancelled: Bool { state.withLock { $0.cancelled } }

    /// Runs `body` on a new thread and returns what it returned; nil when the wait was
    /// cancelled first (`abandoned` then gets what `body` returns, on the thread).
    /// Throws `Errno` when no thread could be started or no signal can end the wait
    /// (nothing ran: the caller waits another way).
    func run<T: Sendable>(_ body: @escaping @Sendable (KernelLockWait) -> T,
                          abandoned: @escaping @Sendable (T) -> Void) async throws(Errno) -> T? {
        guard let signal = Self.signal else { throw Errno.notSupported }
        let result = Locked<T?>(nil)
        var started: Int32 = 0
        let delivered = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Bool, Never>) in
                let go = state.withLock { state in
                    guard !state.cancelled else { return false }
                    state.continuation = continuation
                    return true
                }
                guard go else {
                    continuation.resume(returning: false)
                    return
                }
                started = startDetachedThread(named: "filecoord wait", stackSize: 256 << 10) { [self] in
                    fc_block_all_signals_but(signal)
                    state.withLock { $0.thread = pthread_self() }
                    let value = body(self)
                    let waiter = state.withLock { state in
                        state.finished = true
                        defer { state.continuation = nil }
                        return state.continuation
                    }
                    guard let waiter else { return abandoned(value) }
                    result.withLock { $0 = value }
                    waiter.resume(returning: true)
                }
                if started != 0 {
                    let waiter = state.withLock { state in
                        defer { state.continuation = nil }
                        return state.continuation
                    }
                    waiter?.resume(returning: false)
                }
            }
        } onCancel: {
            cancel()
        }
        if started != 0 { throw Errno(rawValue: started) }
        return delivered ? result.withLock { $0 } : nil
    }

    /// Ends the wait: its task resumes now, and the thread's blocked call is interrupted.
    func cancel() {
        let waiter = state.withLock { state in
            state.cancelled = true
            defer { state.continuation = nil }
            return state.continuation
        }
        waiter?.resume(returning: false)
        guard interrupt() else { return }
        // Sent again while the thread has not seen it: bounded (``resends``); a thread
        // that still waits after them is granted the lock in turn, and gives it back.
        Task.detached { [self] in
            for attempt in 0 ..< Self.resends {
                try? await Task.sleep(for: .milliseconds(1 << attempt)) // ok: a lost signal is sent again, bounded
                guard interrupt() else { return }
            }
        }
    }

    /// Signals the thread if it is still in its body; returns whether it was.
    private func interrupt() -> Bool {
        guard let signal = Self.signal else { return false }
        return state.withLock { state in
            // Under the lock: the thread cannot end (and its id be reused) meanwhile.
            guard !state.finished else { return false }
            if let thread = state.thread { _ = fc_signal_thread(thread, signal) }
            return true
        }
    }

    /// On the wait's thread: takes the lock, blocking, until it is granted (`.success`),
    /// the wait is cancelled (`.failure(.interrupted)`) or the call fails.
    func lock(_ fd: Int32, _ type: Int16, _ offset: Int64) -> Result<Void, Errno> {
        while true {
            if isCancelled { return .failure(.interrupted) }
            switch Syscall.lockWaitingOnce(fd, type, offset, 1) {
            case .success: return .success(())
            case .failure(.interrupted): continue
            case .failure(let errno): return .failure(errno)
            }
        }
    }
}
