import AsyncFileIO
import Synchronization
import SystemPackage

/// The events a watcher has seen and its consumers have not taken yet, shared between
/// the watcher thread (which appends) and any number of consuming tasks.
///
/// Waiting consumers each keep a continuation; an append wakes them all and the first to
/// take the lock takes the event (the others wait again). Cancellation and a timeout
/// wake only their own consumer.
final class EventBuffer: Sendable {
    private struct State {
        var events: [FileEvent] = []
        /// The sequence number of each buffered event (events appended so far, counting up).
        var sequences: [UInt64] = []
        var appended: UInt64 = 0
        var head = 0
        /// Events were lost: a resync is owed to the consumer, after what is buffered.
        var lost: FileEvent.Resync?
        /// The buffer has dropped events since the last resync was taken (an overflow
        /// counts once).
        var overflowing = false
        var finished = false
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter = 0
        var cookies: [String: CheckedContinuation<Void, any Error>] = [:]

        var count: Int { events.count - head }

        mutating func takeFirst() -> (FileEvent, UInt64) {
            let result = (events[head], sequences[head])
            head += 1
            if head == events.count {
                events.removeAll(keepingCapacity: true)
                sequences.removeAll(keepingCapacity: true)
                head = 0
            }
            return result
        }

        mutating func wakeAll() -> [CheckedContinuation<Void, Never>] {
            defer { waiters.removeAll() }
            return Array(waiters.values)
        }
    }

    private let state = Locked(State())
    let limit: Int
    /// The event reported for a resync (the root, as a directory or not).
    private let resyncEvent: FileEvent
    private let metrics: WatchMetrics

    init(limit: Int, resyncEvent: FileEvent, metrics: WatchMetrics = .standard) {
        self.limit = limit
        self.resyncEvent = resyncEvent
        self.metrics = metrics
    }

    // MARK: Watcher thread

    /// Appends an event; consecutive modifications of one item are one event, numbered
    /// as the later one: it reports a change that may come after a sync point (a
    /// suppression that covers the earlier one must not swallow it).
    func append(_ event: FileEvent) {
        var overflowed = false
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            guard !state.finished else { return [] }
            if event.kind == .modified, state.count > 0, state.events.last == event {
                state.appended += 1
                state.sequences[state.sequences.count - 1] = state.appended
                return []
            }
            if state.count >= limit {
                Self.lose(&state, FileEvent.Resync(cause: .buffer, lostEvents: 1))
                overflowed = !state.overflowing
                state.overflowing = true
                return []
            }
            state.appended += 1
            state.events.append(event)
            state.sequences.append(state.appended)
            return state.wakeAll()
        }
        for waiter in waiters { waiter.resume() }
        if overflowed { metrics.bufferOverflows.increment() }
    }

    /// Owes the consumer a resync, delivered after what is buffered now.
    func lose(_ resync: FileEvent.Resync) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            guard !state.finished else { return [] }
            Self.lose(&state, resync)
            return state.wakeAll()
        }
        for waiter in waiters { waiter.resume() }
    }

    private static func lose(_ state: inout State, _ resync: FileEvent.Resync) {
        guard var owed = state.lost else {
            state.lost = resync
            return
        }
        if owed.cause == resync.cause, let count = owed.lostEvents, let more = resync.lostEvents {
            owed.lostEvents = count + more
        } else if owed.cause == .buffer {
            owed = FileEvent.Resync(cause: resync.cause)
        }
        state.lost = owed
    }

    /// Resumes the sync whose cookie `name` was seen.
    func cookieSeen(_ name: String) {
        state.withLock { $0.cookies.removeValue(forKey: name) }?.resume()
    }

    /// The names of the cookies still awaited.
    var pendingCookies: [String] { state.withLock { Array($0.cookies.keys) } }

    /// How many events have been put into the buffer so far: after a sync, every event
    /// caused before it has a sequence number up to this.
    var appendedCount: UInt64 { state.withLock { $0.appended } }

    /// Events buffered and not taken yet (for tests).
    var bufferedCount: Int { state.withLock { $0.count } }

    // MARK: Consumers

    /// Ends the sequence: consumers get what is buffered, then nil; waiting syncs fail.
    /// Returns false if it had already ended.
    @discardableResult
    func finish() -> Bool {
        let (ended, waiters, cookies) = state.withLock { state in
            guard !state.finished else { return (false, [CheckedContinuation<Void, Never>](), [CheckedContinuation<Void, any Error>]()) }
            state.finished = true
            defer { state.cookies.removeAll() }
            return (true, state.wakeAll(), Array(state.cookies.values))
        }
        for waiter in waiters { waiter.resume() }
        // A sync can no longer complete: its cookie will not be seen.
        for cookie in cookies {
            cookie.resume(throwing: FileCoordinationError(.sync, 
                code: .cancelled, path: resyncEvent.path, message: "the watcher has stopped (cancelled, or its root is gone)"))
        }
        return ended
    }

    var isFinished: Bool { state.withLock { $0.finished } }

    /// One event with its sequence number without waiting: `.some(nil)` once finished and
    /// empty, nil when nothing is there yet.
    func take() -> (FileEvent, UInt64)?? {
        let taken: (FileEvent, UInt64)?? = state.withLock { state in
            if state.count > 0 { return .some(state.takeFirst()) }
            if let lost = state.lost {
                state.lost = nil
                state.overflowing = false
                var event = resyncEvent
                event.resync = lost
                return .some((event, state.appended))
            }
            return state.finished ? .some(nil) : nil
        }
        if case .some(.some((let event, _))) = taken, let resync = event.resync { metrics.resyncDelivered(resync.cause) }
        return taken
    }

    /// The next event, waiting until one comes: `.some(nil)` once the buffer has
    /// finished, nil when the deadline passes; `CancellationError` when the task is
    /// cancelled.
    func next(deadline: ContinuousClock.Instant? = nil) async throws -> (FileEvent, UInt64)?? {
        while true {
            try Task.checkCancellation()
            if let taken = take() { return taken }
            if let deadline, ContinuousClock.now >= deadline { return nil }
            let id = state.withLock { state in
                defer { state.nextWaiter += 1 }
                return state.nextWaiter
            }
            let timer = deadline.map { deadline in
                Task { [weak self] in
                    try? await Task.sleep(until: deadline, clock: .continuous) // the caller's time limit
                    self?.wake(id)
                }
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let ready = state.withLock { state in
                        if state.count > 0 || state.lost != nil || state.finished || Task.isCancelled { return true }
                        if let deadline, ContinuousClock.now >= deadline { return true }
                        state.waiters[id] = continuation
                        return false
                    }
                    if ready { continuation.resume() }
                }
            } onCancel: {
                wake(id)
            }
            timer?.cancel()
        }
    }

    private func wake(_ id: Int) {
        state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
    }

    /// Takes everything buffered without waiting, and the resync owed, if any.
    func drain() -> [FileEvent] {
        var events: [FileEvent] = []
        while let taken = take(), let (event, _) = taken { events.append(event) }
        return events
    }

    // MARK: Syncs

    /// Registers a sync's cookie; false if the buffer has finished.
    func expectCookie(_ name: String, _ continuation: CheckedContinuation<Void, any Error>) -> Bool {
        state.withLock { state in
            if state.finished { return false }
            state.cookies[name] = continuation
            return true
        }
    }

    /// Fails the sync waiting for `name`, if it still waits.
    func failCookie(_ name: String, _ error: any Error) {
        state.withLock { $0.cookies.removeValue(forKey: name) }?.resume(throwing: error)
    }
}
