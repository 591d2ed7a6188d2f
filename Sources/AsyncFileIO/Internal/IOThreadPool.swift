import CFileCoordinationShims
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Threads the library owns, for the system calls that may block (open, fstat, read of
/// an uncached page, fsync, rename). Work submitted here never runs on the Swift
/// cooperative pool, so a slow disk or an NFS stall holds one of these threads and no
/// task executor.
///
/// Threads start on demand, up to ``maximumThreads``, and then stay parked on a
/// condition variable; an idle pool costs nothing but their stacks.
final class IOThreadPool: @unchecked Sendable {
    /// The pool every API of the library uses unless told otherwise.
    static let shared = IOThreadPool(name: "filecoord-io", maximumThreads: 64)

    let name: String
    let maximumThreads: Int

    // Guarded by `mutex`.
    private var jobs: [@Sendable () -> Void] = []
    private var head = 0
    private var idle = 0
    private var threads = 0
    /// Until when (`CLOCK_MONOTONIC`, ns) one thread looks for work instead of parking,
    /// and whether one does (``expectWork(withinMicroseconds:)``).
    private var spinUntil: UInt64 = 0
    private var spinning = 0
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    init(name: String, maximumThreads: Int) {
        precondition(maximumThreads > 0)
        self.name = name
        self.maximumThreads = maximumThreads
        mutex = .allocate(capacity: 1)
        condition = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
    }

    deinit {
        // Only the shared pool exists in practice, and it lives as long as the process.
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    /// Runs `work` on one of the pool's threads. Never blocks the caller.
    func submit(_ work: @escaping @Sendable () -> Void) {
        pthread_mutex_lock(mutex)
        jobs.append(work)
        let pending = jobs.count - head
        let spawn = pending > idle + spinning && threads < maximumThreads
        if spawn { threads += 1 }
        // A thread looking for work (``expectWork(withinMicroseconds:)``) takes one job: a
        // parked one is signalled, or a new one started, only for more than that.
        let (wake, number) = (idle > 0 && pending > spinning, threads)
        pthread_mutex_unlock(mutex)
        // Signalled after unlocking: a thread woken while the mutex is still held, on the
        // same CPU, runs at once, blocks on the mutex and is woken a second time (two
        // context switches more per job, seen with `perf sched` on a message hand-off).
        // A thread counted idle waits on the condition until signalled, so the signal
        // finds it; should another thread take the job first, it wakes, finds none and
        // waits again.
        if wake { pthread_cond_signal(condition) }
        if spawn { startThread(number: number) }
    }

    private func startThread(number: Int) {
        let result = startDetachedThread(named: "\(name)-\(number)", stackSize: 512 * 1024) { [self] in workLoop() }
        if result != 0 {
            pthread_mutex_lock(mutex)
            threads -= 1
            let stranded = threads == 0 && jobs.count > head
            pthread_mutex_unlock(mutex)
            // With no thread at all the work could never run: that is not recoverable.
            precondition(!stranded, "FileCoordination: cannot start an I/O thread (error \(result))")
        }
    }

    /// Work is expected within `microseconds`: a parked thread, if there is one, wakes
    /// now, and one thread looks for work until then or until ``endExpectedWork()``
    /// (yielding its CPU between looks; a thread that finishes a job meanwhile looks
    /// again), so that the job does not wait for a thread's wake-up, which is slow when the
    /// thread's CPU has halted meanwhile: woken ahead, it wakes while the work is still
    /// being prepared. The price is the CPU of the wait (figures in docs/performance.md,
    /// "The remote write, step by step").
    func expectWork(withinMicroseconds microseconds: Int) {
        let until = monotonicNanoseconds() + UInt64(max(0, microseconds)) * 1000
        pthread_mutex_lock(mutex)
        spinUntil = max(spinUntil, until)
        let wake = spinning == 0 && idle > 0
        pthread_mutex_unlock(mutex)
        if wake { pthread_cond_signal(condition) }
    }

    /// Whether a thread is looking for expected work now (for tests).
    var isLookingForWork: Bool {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return spinning > 0
    }

    /// The work expected has come: a thread looking for more parks once it finds none.
    func endExpectedWork() {
        pthread_mutex_lock(mutex)
        spinUntil = 0
        pthread_mutex_unlock(mutex)
    }

    private func workLoop() {
        pthread_mutex_lock(mutex)
        while true {
            while head == jobs.count {
                if spinning == 0, monotonicNanoseconds() < spinUntil {
                    spinning += 1
                    while head == jobs.count, monotonicNanoseconds() < spinUntil {
                        pthread_mutex_unlock(mutex)
                        sched_yield()
                        pthread_mutex_lock(mutex)
                    }
                    spinning -= 1
                    continue
                }
                idle += 1
                pthread_cond_wait(condition, mutex)
                idle -= 1
            }
            let job = jobs[head]
            head += 1
            if head == jobs.count {
                jobs.removeAll(keepingCapacity: true)
                head = 0
            } else if head >= 4096 {
                jobs.removeFirst(head)
                head = 0
            }
            pthread_mutex_unlock(mutex)
            job()
            pthread_mutex_lock(mutex)
        }
    }

}

/// Starts a detached thread named `name` that runs `body`; the thread's stack is
/// `stackSize` bytes, else the system's default. A bare pthread, not Foundation's
/// `Thread`, which is slow to start the first time (a short command starts its threads
/// once). Returns `pthread_create`'s result: 0, or the error (nothing then runs).
package func startDetachedThread(named name: String, stackSize: Int? = nil, _ body: @escaping @Sendable () -> Void) -> Int32 {
    let context = Unmanaged.passRetained(DetachedThreadContext(name: name, body: body))
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
    if let stackSize { pthread_attr_setstacksize(&attributes, stackSize) }
    var thread = pthread_t()
    let result = pthread_create(&thread, &attributes, { raw in
        let context = Unmanaged<DetachedThreadContext>.fromOpaque(raw!).takeRetainedValue()
        fc_set_thread_name(context.name)
        context.body()
        return nil
    }, context.toOpaque())
    if result != 0 { context.release() }
    return result
}

private final class DetachedThreadContext {
    let name: String
    let body: @Sendable () -> Void
    init(name: String, body: @escaping @Sendable () -> Void) {
        self.name = name
        self.body = body
    }
}

extension IOThreadPool {
    /// Runs blocking `body` on the pool and suspends the calling task until it finishes.
    ///
    /// Cancellation: while `body` is still queued, cancelling the task removes it and
    /// throws `CancellationError`; once `body` has started it runs to completion (a system
    /// call cannot be interrupted safely) and its result is returned.
    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        let job = CancellableJob<T>()
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<T, any Error>) in
                guard job.install(continuation) else {
                    continuation.resume(throwing: CancellationError())
                    return
                }
                submit {
                    guard let continuation = job.start() else { return }
                    continuation.resume(with: Result { try body() })
                }
            }
        } onCancel: {
            job.cancel()
        }
    }

    /// Like ``run(_:)`` for a body that reports failure as a `Result`.
    func run<T: Sendable>(_ body: @escaping @Sendable () -> Result<T, FileCoordinationError>) async throws -> T {
        try await run { () throws -> T in try body().get() }
    }
}

/// The hand-off between a task waiting for pool work and the pool thread that runs it.
private final class CancellableJob<T: Sendable>: Sendable {
    private enum State {
        case created
        case waiting(UnsafeContinuation<T, any Error>)
        case running
        case cancelled
    }
    private let state = Locked<State>(.created)

    /// Stores the continuation; false when the task was cancelled before it got here.
    func install(_ continuation: UnsafeContinuation<T, any Error>) -> Bool {
        state.withLock { state in
            guard case .created = state else { return false }
            state = .waiting(continuation)
            return true
        }
    }

    /// Claims the job for running; nil when it was cancelled while queued.
    func start() -> UnsafeContinuation<T, any Error>? {
        state.withLock { state in
            guard case .waiting(let continuation) = state else { return nil }
            state = .running
            return continuation
        }
    }

    func cancel() {
        let continuation: UnsafeContinuation<T, any Error>? = state.withLock { state in
            switch state {
            case .created:
                state = .cancelled
                return nil
            case .waiting(let continuation):
                state = .cancelled
                return continuation
            case .running, .cancelled:
                return nil
            }
        }
        continuation?.resume(throwing: CancellationError())
    }
}

/// Runs blocking `body` on the library's I/O threads (for the FileCoordination module,
/// which needs the same guarantee for its own file-system questions).
package func runOnIOThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await IOThreadPool.shared.run(body)
}

/// Runs `body` on an I/O thread and returns its result whatever becomes of the calling
/// task: for work owed however the caller ends (what a coordination tells its presenters
/// after an access), or shared with tasks that did not ask for it.
package func runOnIOThreadToCompletion<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withUnsafeContinuation { continuation in
        IOThreadPool.shared.submit { continuation.resume(returning: body()) }
    }
}

/// Work for the I/O threads is expected within `microseconds`: one of them stays awake
/// for it (see `IOThreadPool.expectWork(withinMicroseconds:)`).
package func expectIOWork(withinMicroseconds microseconds: Int) {
    IOThreadPool.shared.expectWork(withinMicroseconds: microseconds)
}

/// The work announced by ``expectIOWork(withinMicroseconds:)`` has come.
package func endExpectedIOWork() {
    IOThreadPool.shared.endExpectedWork()
}

/// Runs blocking `work` on the library's I/O threads without waiting for it (the caller
/// learns of its outcome some other way).
package func submitToIOThread(_ work: @escaping @Sendable () -> Void) {
    IOThreadPool.shared.submit(work)
}

/// The pool runs tasks too: a task that prefers it (SE-0417) runs its nonisolated code
/// on the pool's threads, where a blocking system call is allowed, so it can make one
/// without handing it to another thread and waiting for that thread to wake.
extension IOThreadPool: TaskExecutor {
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        submit { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

/// The library's I/O threads as a task executor, for tasks of the FileCoordination
/// module whose work alternates between awaiting and small blocking system calls.
package var ioThreadTaskExecutor: any TaskExecutor { IOThreadPool.shared }
