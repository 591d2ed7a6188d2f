/// The messages waiting to be written to one process, in the order they were posted,
/// and the coordinations waiting for them to be written.
///
/// A pure state machine: ``SpaceMail`` keeps one per process it writes to, under its
/// lock, and carries out what it returns. One writer at a time takes the jobs in order;
/// a write that fails stays first and is run again after a pause, and the coordinations
/// waiting meanwhile are let go, so that a process with no room for a message holds up
/// neither the messages' order nor this process's writers (and their claims).
struct Outbox<Write, Waiter> {
    enum Job {
        case write(Write)
        /// A coordination waiting for the writes posted before it.
        case waiter(Waiter)
    }

    /// What the writer does next.
    enum Next {
        /// Runs the first write (it stays first until ``written()`` or ``failed()``),
        /// given how many times it failed already.
        case write(Write, failures: Int)
        /// Resumes the coordination: what was posted before it is written.
        case resume(Waiter)
        /// Nothing is left: the outbox is done with.
        case empty
    }

    private var jobs: [Job]
    private var failures = 0

    /// An outbox holding `write`, posted while nothing was waiting.
    init(_ write: Write) {
        jobs = [.write(write)]
    }

    /// Posts `write` behind everything posted before it.
    mutating func post(_ write: Write) {
        jobs.append(.write(write))
    }

    /// Adds a coordination that waits for the writes posted so far; false when it need
    /// not wait (the first write failed and waits to be run again).
    mutating func wait(_ waiter: Waiter) -> Bool {
        guard failures == 0 else { return false }
        jobs.append(.waiter(waiter))
        return true
    }

    /// The next step for the writer; a waiter it returns is removed.
    mutating func next() -> Next {
        switch jobs.first {
        case nil: return .empty
        case .write(let write)?: return .write(write, failures: failures)
        case .waiter(let waiter)?:
            jobs.removeFirst()
            return .resume(waiter)
        }
    }

    /// The first write is done (written, or given up).
    mutating func written() {
        if case .write? = jobs.first { jobs.removeFirst() }
        failures = 0
    }

    /// The first write failed: it stays first. Returns the pause before it is run again
    /// (``RetryPause``) and the waiters to resume now.
    mutating func failed() -> (pauseMilliseconds: Int, resume: [Waiter]) {
        failures += 1
        var waiting: [Waiter] = []
        jobs.removeAll { job in
            guard case .waiter(let waiter) = job else { return false }
            waiting.append(waiter)
            return true
        }
        return (RetryPause.milliseconds(afterFailures: failures), waiting)
    }

    /// Whether anything waits behind the first job.
    var hasQueued: Bool { jobs.count > 1 }

    /// Whether nothing is left.
    var isEmpty: Bool { jobs.isEmpty }
}

/// How a message that could not be written or read is tried again: after pauses doubling
/// from 10 ms to 1 s, up to ``attempts`` times (some 35 s in all). Enough for a process to
/// get a descriptor or some space back; bounded, so that a lasting failure ends in a
/// warning rather than a stall.
enum RetryPause {
    static let attempts = 40

    /// The pause after `failures` failures (at least 1), in milliseconds.
    static func milliseconds(afterFailures failures: Int) -> Int {
        min(10 << min(max(failures, 1) - 1, 7), 1000)
    }
}
