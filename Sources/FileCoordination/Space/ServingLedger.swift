/// What a process owes the other processes' coordinators that asked its presenters to
/// relinquish: the requests queued and not started, and what each relinquish keeps
/// (the reacquirer, the echo suppression) until its `reacquire` or its asker's death.
///
/// A pure state machine: the receiving thread and the serving task call it under their
/// lock and carry out what it returns. It is the part of the mailbox that decides what
/// to serve and what to drop when a sender is gone; the simulator
/// (`Tests/FileCoordinationTests/Simulation`) drives the same type.
struct ServingLedger<Kept> {
    /// A request: the asking process and the reference its `reacquire` carries.
    struct Key: Hashable, Sendable {
        var process: String
        var request: UInt64
    }

    private var queued: Set<Key> = []
    /// Relinquishes whose presenter callback is running.
    private var running: Set<Key> = []
    private var kept: [Key: Kept] = [:]
    /// Relinquishes running or kept whose asker stopped waiting (its `reacquire` came, or
    /// it died) before they were undone.
    private var givenUp: Set<Key> = []

    init() {}

    /// A relinquish request arrived and was handed to the serving task.
    mutating func relinquishArrived(_ key: Key) {
        queued.insert(key)
    }

    /// A `reacquire` arrived. A relinquish of it not started yet is dropped: its asker
    /// gave up on it, and serving it now would cost the next writer the delay.
    mutating func reacquireArrived(_ key: Key) {
        queued.remove(key)
        if running.contains(key) || kept[key] != nil { givenUp.insert(key) }
    }

    /// Whether the asker of `key` stopped waiting for it.
    func hasGivenUp(_ key: Key) -> Bool { givenUp.contains(key) }

    /// Whether relinquishes of requests other than `key` that `matches` are kept: their
    /// askers may be in their accessors.
    func keepsOther(than key: Key, _ matches: (Kept) -> Bool) -> Bool {
        kept.contains { $0.key != key && matches($0.value) }
    }

    /// The serving task reached a relinquish request: whether to serve it (false when its
    /// asker gave up on it or died before it started).
    mutating func startRelinquish(_ key: Key) -> Bool {
        guard queued.remove(key) != nil else { return false }
        running.insert(key)
        return true
    }

    /// The presenter relinquished: `value` is what its `reacquire` must undo. Returns
    /// `value` back when the asker died while the presenter was relinquishing (its
    /// death was heard before anything was kept): the driver undoes it at once.
    mutating func relinquished(_ key: Key, keeping value: Kept) -> Kept? {
        guard running.remove(key) != nil else { return value }
        kept[key] = value
        return nil
    }

    /// The presenter refused, or is not registered any more: nothing is kept.
    mutating func relinquishFailed(_ key: Key) {
        running.remove(key)
    }

    /// Changes what is kept for `key` in place (nothing when nothing is kept).
    mutating func update(_ key: Key, _ body: (inout Kept) -> Void) {
        guard var value = kept[key] else { return }
        body(&value)
        kept[key] = value
    }

    /// The `reacquire` is served, or the steps after relinquishing failed: what to undo.
    mutating func reacquire(_ key: Key) -> Kept? {
        givenUp.remove(key)
        return kept.removeValue(forKey: key)
    }

    /// The processes something is owed to: after an inotify queue overflow (their deaths
    /// may have been among the events lost), each is checked.
    var owedProcesses: [String] {
        Array(Set(queued.map(\.process)).union(running.map(\.process)).union(kept.keys.map(\.process))).sorted()
    }

    /// Whether anything is owed to `process`.
    func owes(_ process: String) -> Bool {
        queued.contains { $0.process == process } || running.contains { $0.process == process }
            || kept.keys.contains { $0.process == process }
    }

    /// `process` is dead: its queued requests are dropped at once, and a relinquish of it
    /// still running will not be kept (``relinquished(_:keeping:)`` hands it back).
    /// Returns whether relinquishes it asked for are kept; if so, the driver queues
    /// ``senderGoneServed(_:)`` behind the requests already handed to the serving task,
    /// so that a `reacquire` of that process already queued is served first.
    mutating func senderDied(_ process: String) -> Bool {
        queued = queued.filter { $0.process != process }
        running = running.filter { $0.process != process }
        givenUp.formUnion(kept.keys.filter { $0.process == process })
        return kept.keys.contains { $0.process == process }
    }

    /// The serving task reached a dead sender's notice: every relinquish it asked for is
    /// undone (otherwise a writer killed after a presenter relinquished would leave the
    /// presenter without its item, and deaf to every later change of it).
    mutating func senderGoneServed(_ process: String) -> [Kept] {
        let keys = kept.keys.filter { $0.process == process }
        givenUp = givenUp.filter { $0.process != process }
        return keys.compactMap { kept.removeValue(forKey: $0) }
    }

    /// How many relinquishes are kept (for tests and the simulator's final check).
    var keptCount: Int { kept.count }
}
