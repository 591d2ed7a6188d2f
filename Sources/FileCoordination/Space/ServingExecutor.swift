import AsyncFileIO
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The executor of the task that serves other processes' requests to this process's
/// presenters (see ``PresenterServer/start(replying:)``).
///
/// Its jobs run on the library's I/O threads, where the task may write each reply itself.
/// One case runs where it is: when the watcher thread hands a request over
/// (``runHandedOver(_:)``) and that wakes the serving task, the task's job runs on the
/// watcher thread right after the hand-over instead of waking an I/O thread for it. The
/// presenter's callbacks then start without a thread switch: one wake-up fewer on the way
/// from a writer in another process to its accessor. (Not for a presenter whose callbacks
/// may block: see ``FilePresenter/presentedItemCallbacksMayBlock``.)
///
/// The job runs until the task next suspends. Callbacks are `async` and must not block
/// (as everywhere in Swift concurrency); one that awaits, or that is isolated to an actor,
/// suspends the task, the watcher thread goes back to its events, and the task resumes
/// on an I/O thread. Nothing on the watcher thread waits for another thread synchronously,
/// so a callback that awaits something the watcher does (adding a watch, another
/// process's reply) cannot deadlock it; one that blocks waiting for it would.
final class ServingExecutor: TaskExecutor, @unchecked Sendable {
    /// The hand-over in progress: the thread making it and the jobs it enqueued.
    private struct HandOver {
        var thread: pthread_t
        var jobs: [UnownedJob] = []
    }
    private let handOver = Locked<HandOver?>(nil)

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let kept = handOver.withLock { handOver -> Bool in
            guard var current = handOver, pthread_equal(current.thread, pthread_self()) != 0 else { return false }
            handOver = nil // no copy of the list while appending
            current.jobs.append(job)
            handOver = current
            return true
        }
        if !kept { submitToIOThread { job.runSynchronously(on: self.asUnownedTaskExecutor()) } }
    }

    /// Calls `body` (which may resume the serving task), then runs here what it enqueued;
    /// returns whether it ran anything. The hand-over ends before the jobs run: whatever
    /// they enqueue goes to the I/O threads. Called on the watcher thread, one hand-over
    /// at a time.
    @discardableResult
    func runHandedOver(_ body: () -> Void) -> Bool {
        handOver.withLock { $0 = HandOver(thread: pthread_self()) }
        body()
        let jobs = handOver.withLock { handOver -> [UnownedJob] in
            defer { handOver = nil }
            return handOver?.jobs ?? []
        }
        for job in jobs { job.runSynchronously(on: asUnownedTaskExecutor()) }
        return !jobs.isEmpty
    }
}
