import CFileCoordinationShims

/// The bytes this process holds in one claim shard: how many of its tasks hold each
/// (shared or exclusive), and what the kernel holds for the process. The kernel sees one
/// owner per process, so a byte's lock is taken for its first task and given back (or
/// kept idle for the next) after its last. A pure state machine: ``SpaceLocks`` asks it
/// what to tell the kernel, makes the call, and records the outcome, under the shard's
/// lock.
struct ByteCounts {
    struct Count {
        var shared = 0
        var exclusive = 0
        /// What the kernel holds for this process now (`F_UNLCK`, `F_RDLCK`, `F_WRLCK`).
        var kernel: Int16 = fc_F_UNLCK
        var total: Int { shared + exclusive }
    }

    /// What giving a byte back asks of the kernel.
    enum Release: Equatable {
        /// Nothing: other tasks hold it, or it stays locked, idle, for the next task.
        case none
        /// Unlock it.
        case unlock
        /// Lower it to shared: the last exclusive task let go, shared ones remain.
        case downgrade
    }

    private var counts: [Int64: Count] = [:]
    /// How many bytes are idle: locked in the kernel with no task holding them.
    private(set) var idle = 0

    /// Bytes locked in the kernel (held or idle).
    var lockedCount: Int { counts.count }
    /// Whether any task holds a byte here.
    var isInUse: Bool { counts.values.contains { $0.total > 0 } }
    var isEmpty: Bool { counts.isEmpty }

    /// What the kernel holds at `offset` for this process.
    func kernelLock(at offset: Int64) -> Int16 { counts[offset]?.kernel ?? fc_F_UNLCK }

    /// The lock to ask the kernel for before a task takes `offset`; nil when the process
    /// holds it strongly enough already.
    func lockNeeded(at offset: Int64, exclusive: Bool) -> Int16? {
        let held = kernelLock(at: offset)
        if exclusive { return held == fc_F_WRLCK ? nil : fc_F_WRLCK }
        return held == fc_F_UNLCK ? fc_F_RDLCK : nil
    }

    /// Counts a task on `offset`, the kernel having granted `granted` (what
    /// ``lockNeeded(at:exclusive:)`` asked for, or nil when nothing was asked). Returns
    /// whether an idle byte was taken again.
    mutating func take(at offset: Int64, exclusive: Bool, granted: Int16?) -> Bool {
        var count = counts[offset] ?? Count()
        let wasIdle = count.total == 0 && count.kernel != fc_F_UNLCK
        if let granted { count.kernel = granted }
        if wasIdle { idle -= 1 }
        if exclusive { count.exclusive += 1 } else { count.shared += 1 }
        counts[offset] = count
        return wasIdle
    }

    /// Uncounts a task on `offset`. With `mayKeepIdle`, a byte no task holds any more
    /// stays locked shared, idle; an exclusive one is never kept (a process stopped with
    /// it would hold off every reader).
    mutating func give(at offset: Int64, exclusive: Bool, mayKeepIdle: Bool) -> Release {
        guard var count = counts[offset] else { return .none }
        if exclusive { count.exclusive -= 1 } else { count.shared -= 1 }
        if count.total <= 0 && count.kernel == fc_F_RDLCK && mayKeepIdle {
            count.shared = 0
            count.exclusive = 0
            counts[offset] = count
            idle += 1
            return .none
        }
        if count.total <= 0 {
            counts[offset] = nil
            return .unlock
        }
        if count.exclusive == 0 && count.kernel == fc_F_WRLCK {
            count.kernel = fc_F_RDLCK
            counts[offset] = count
            return .downgrade
        }
        counts[offset] = count
        return .none
    }

    /// Forgets every idle byte; returns the runs to unlock, in order of offset, each
    /// uninterrupted by a byte a task holds (one unlock call each).
    mutating func dropIdle() -> [ClosedRange<Int64>] {
        guard idle > 0 else { return [] }
        // Every byte locked: its offset shifted left once, the low bit set for an idle one
        // (offsets are below 2^62), so that a plain integer sort orders them.
        var bytes = counts.compactMap { offset, count in
            count.kernel != fc_F_UNLCK ? offset << 1 | (count.total == 0 ? 1 : 0) : nil
        }
        bytes.sort()
        var runs: [ClosedRange<Int64>] = []
        var index = 0
        while index < bytes.count {
            guard bytes[index] & 1 == 1 else {
                index += 1
                continue
            }
            let first = bytes[index] >> 1
            var last = first
            while index < bytes.count, bytes[index] & 1 == 1 {
                last = bytes[index] >> 1
                counts[last] = nil
                index += 1
            }
            runs.append(first ... last)
        }
        idle = 0
        return runs
    }
}
