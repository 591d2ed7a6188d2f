import AsyncFileIO
import Synchronization

/// The deadlines of the requests this process waits on, kept by one sleeping task for all
/// of them instead of a timer task per request.
///
/// A task per request cost a task start and a timer for every remote callback, on the
/// path of every coordinated write with a presenter in another process (measured: about
/// a sixth of that write's latency here). Requests use the same presenter timeout, so
/// a new deadline nearly always falls after the one the sleeper waits for and changes
/// nothing; only an earlier one starts another sleeper, which takes over.
final class ReplyDeadlines: Sendable {
    private struct State {
        var pending: [UInt64: (at: ContinuousClock.Instant, expire: @Sendable () -> Void)] = [:]
        /// The sleeper in charge and the instant it wakes at; nil when none sleeps.
        var armed: (sleeper: UInt64, until: ContinuousClock.Instant)?
        var nextSleeper: UInt64 = 0
    }

    private let state = Locked(State())

    /// Calls `expire` once `timeout` has passed, unless ``remove(_:)`` comes first.
    func add(_ id: UInt64, after timeout: Duration, expire: @escaping @Sendable () -> Void) {
        let at = ContinuousClock.now + timeout
        let sleeper: UInt64? = state.withLock { state in
            state.pending[id] = (at, expire)
            if let armed = state.armed, armed.until <= at { return nil }
            defer { state.nextSleeper += 1 }
            state.armed = (state.nextSleeper, at)
            return state.nextSleeper
        }
        if let sleeper {
            Task.detached { [self] in await sleep(sleeper, until: at) }
        }
    }

    /// Forgets a deadline (its reply arrived, or its request was given up).
    func remove(_ id: UInt64) {
        _ = state.withLock { $0.pending.removeValue(forKey: id) }
    }

    private func sleep(_ sleeper: UInt64, until first: ContinuousClock.Instant) async {
        var until = first
        while true {
            // Not a stand-in for synchronisation: the presenter timeout is real time.
            try? await Task.sleep(until: until, clock: .continuous)
            let now = ContinuousClock.now
            let (expired, next): ([@Sendable () -> Void], ContinuousClock.Instant?) = state.withLock { state in
                // In deadline order, also when a late wake-up finds several due.
                let due = state.pending.filter { $0.value.at <= now }.sorted { $0.value.at < $1.value.at }
                for (id, _) in due { state.pending[id] = nil }
                let expired = due.map(\.value.expire)
                // Another sleeper took over (for an earlier deadline): it keeps the rest.
                guard state.armed?.sleeper == sleeper else { return (expired, nil) }
                let earliest = state.pending.values.map(\.at).min()
                state.armed = earliest.map { (sleeper, $0) }
                return (expired, earliest)
            }
            for expire in expired { expire() }
            guard let next else { return }
            until = next
        }
    }
}
