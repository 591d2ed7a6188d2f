/// The calls one try at a claim makes on the kernel's locks, as this process sees them:
/// ``SpaceLocks`` makes them on the claim shards; tests make them on a table in memory.
protocol ClaimLockCalls {
    /// Counts `byte` for this process, asking the kernel when it must.
    func take(_ byte: SpaceLocks.Byte) throws -> SpaceLocks.Take
    /// Whether the writers' queue byte at `offset` is free of other processes' writers
    /// (`.taken`: it is). `writerWaits` is whether another process's writer waits
    /// anywhere, once looked at (nil before).
    func check(_ offset: Int64, writerWaits: inout Bool?) throws -> SpaceLocks.Take
    /// Uncounts `byte` (a try that fails gives back what it took).
    @discardableResult func give(_ byte: SpaceLocks.Byte) -> Bool
    /// Gives back queue bytes a try keeps no longer, waking whoever waits for them.
    func release(_ held: SpaceLocks.Held)
}

extension SpaceLocks: ClaimLockCalls {}

extension SpaceLocks {
    /// What one try gave.
    enum Attempt {
        case held(Held)
        /// Another process holds something in the way: the byte to wait for.
        case conflict(Blocker)
        /// A shard of the plan is not open.
        case shardClosed
    }

    /// The byte a try found held by another process, as the claim wants it.
    struct Blocker: Equatable, Sendable {
        var byte: Byte
        /// The next of the claim's writers' queue bytes, in order: a wait for it takes
        /// it, and the claim keeps it as it keeps the queue bytes before it. Any other
        /// byte (a queue byte tested, an item's or a directory's) is only waited for
        /// until it is free, holding nothing more than the queue bytes below it.
        var isQueue: Bool
    }

    /// What taking one byte gave.
    enum Take {
        case taken, conflict, shardClosed
    }

    /// One try at `plan`: the queue bytes and the checks in one order of offsets, then
    /// the rest all or nothing. Bytes taken before a refusal are given back.
    ///
    /// Queue bytes are kept across tries (in `queued`), but only those below the point
    /// where a try stopped: a check that finds another process's writer queued gives back
    /// this claim's queue bytes above it. So a waiting claim holds queue bytes only below
    /// what it waits for, every chain of waits climbs in offset, and no cycle can form.
    /// (Were they kept whatever the order, a claim reading X and writing Y and another
    /// reading Y and writing X would each hold the queue byte the other's check waits for.)
    static func attempt(_ plan: Plan, queued: inout [Byte], calls: some ClaimLockCalls) throws -> Attempt {
        var writerWaits: Bool?
        var (nextQueue, nextCheck) = (0, 0)
        while nextQueue < plan.queue.count || nextCheck < plan.checks.count {
            // A queue byte before a check of the same offset: a claim's own queue byte
            // never stands in its own way.
            if nextQueue < plan.queue.count, nextCheck == plan.checks.count || plan.queue[nextQueue].offset <= plan.checks[nextCheck] {
                let byte = plan.queue[nextQueue]
                nextQueue += 1
                // The ones kept from an earlier try: always the first of the plan's.
                if nextQueue <= queued.count { continue }
                switch try calls.take(byte) {
                case .taken: queued.append(byte)
                case .conflict: return .conflict(Blocker(byte: byte, isQueue: true))
                case .shardClosed: return .shardClosed
                }
            } else {
                let check = plan.checks[nextCheck]
                nextCheck += 1
                if writerWaits == false { continue } // no queue byte needs a look
                switch try calls.check(check, writerWaits: &writerWaits) {
                case .taken: break
                case .conflict:
                    giveBackQueued(above: check, &queued, calls: calls)
                    return .conflict(Blocker(byte: Byte(offset: check, exclusive: false), isQueue: false))
                case .shardClosed: return .shardClosed
                }
            }
        }
        var taken: [Byte] = []
        taken.reserveCapacity(plan.bytes.count)
        // All or nothing: on a refusal, or a lock call that throws, what was taken goes back.
        var complete = false
        defer { if !complete { for byte in taken.reversed() { calls.give(byte) } } }
        for byte in plan.bytes {
            switch try calls.take(byte) {
            case .taken: break
            case .conflict: return .conflict(Blocker(byte: byte, isQueue: false))
            case .shardClosed: return .shardClosed
            }
            taken.append(byte)
        }
        complete = true
        return .held(Held(bytes: queued + taken))
    }

    /// Gives back the queue bytes of `queued` above `offset` (the last ones: they were
    /// taken in order).
    static func giveBackQueued(above offset: Int64, _ queued: inout [Byte], calls: some ClaimLockCalls) {
        var above: [Byte] = []
        while let last = queued.last, last.offset > offset { above.append(queued.removeLast()) }
        calls.release(Held(bytes: above.reversed()))
    }
}
