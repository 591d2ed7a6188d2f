/// Which of a process's claim requests wait for which other processes' claim keys, as a
/// pure state machine (no lock, no I/O): the space drives it from its transactions and
/// from the deletions its one watch stream brings, under its own lock.
///
/// A request's transaction reads the claims at some revision; deletions the stream brings
/// while the transaction is under way may be earlier or later than that revision. Claim
/// keys are never made again once deleted (a request's key names its lease and its
/// number), so a key deleted at any revision is gone for good: the deletions seen since
/// the transaction started are taken off what it found, whatever their revisions.
struct EtcdWaits: Sendable {
    /// Each waiting request's remaining blockers.
    private(set) var blockers: [UInt64: Set<[UInt8]>] = [:]
    /// Which waiting requests each key blocks.
    private var waiters: [[UInt8]: Set<UInt64>] = [:]
    /// Requests whose transaction is under way, with where the deletions since it started
    /// begin in `deleted` (counting from `deletedBase`).
    private var inFlight: [UInt64: Int] = [:]
    private var deleted: [[UInt8]] = []
    private var deletedBase = 0

    /// The requests that wait.
    var waitingRequests: [UInt64] { blockers.keys.sorted() }

    /// The keys some request waits for.
    var blockingKeys: [[UInt8]] { Array(waiters.keys) }

    /// Request `id`'s transaction starts: deletions from now on are kept for it.
    mutating func transactionStarts(_ id: UInt64) {
        inFlight[id] = deletedBase + deleted.count
    }

    /// Its transaction found `found` standing before it: what remains of them (those not
    /// deleted since it started), for which it now waits. Empty: it waits for nothing.
    mutating func transactionDone(_ id: UInt64, found: Set<[UInt8]>) -> Set<[UInt8]> {
        let since = endFlight(id)
        let remaining = found.subtracting(since)
        guard !remaining.isEmpty else { return [] }
        blockers[id] = remaining
        for key in remaining { waiters[key, default: []].insert(id) }
        return remaining
    }

    /// Its transaction failed: nothing is kept for it.
    mutating func transactionFailed(_ id: UInt64) {
        _ = endFlight(id)
    }

    /// Keys were deleted: the requests whose last blocker went (they wait no more).
    mutating func deleted(_ keys: [[UInt8]]) -> [UInt64] {
        if !inFlight.isEmpty { deleted += keys }
        var done: [UInt64] = []
        for key in keys {
            guard let ids = waiters.removeValue(forKey: key) else { continue }
            for id in ids.sorted() {
                blockers[id]?.remove(key)
                if blockers[id]?.isEmpty == true {
                    blockers[id] = nil
                    done.append(id)
                }
            }
        }
        return done
    }

    /// Request `id` waits no more (granted, cancelled, failed).
    mutating func forget(_ id: UInt64) {
        guard let keys = blockers.removeValue(forKey: id) else { return }
        for key in keys {
            waiters[key]?.remove(id)
            if waiters[key]?.isEmpty == true { waiters[key] = nil }
        }
    }

    /// The deletions since `id`'s transaction started; the log is emptied once no
    /// transaction is under way.
    private mutating func endFlight(_ id: UInt64) -> Set<[UInt8]> {
        guard let mark = inFlight.removeValue(forKey: id) else { return [] }
        let since = Set(deleted[(mark - deletedBase)...])
        if inFlight.isEmpty {
            deletedBase += deleted.count
            deleted.removeAll()
        }
        return since
    }
}
