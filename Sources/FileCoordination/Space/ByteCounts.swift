import CFileCoordinationShims

/// The bytes this process holds in one claim shard: how many of its tasks hold each
/// (shared or exclusive), and what the kernel holds for the process. The kernel sees one
/// owner per process, so a byte's lock is taken for its first task and given back (or
/// kept idle for the next) after its last. A pure state machine: it decides what to ask
/// the kernel, and ``SpaceLocks`` makes the call (passed in, or told by the answer),
/// under the shard's lock.
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

    /// The outcome of ``take(at:exclusive:lock:)``: the kernel refused what the process
    /// lacked, or the task is counted (and whether it took an idle byte again).
    enum Taken: Equatable { case refused, taken(wasIdle: Bool) }

    /// Counts a task on `offset`. When the process does not hold it strongly enough
    /// already, `lock(type)` asks the kernel first (`F_RDLCK`, or `F_WRLCK` to upgrade)
    /// and says whether it granted it; nothing is counted when it did not.
    mutating func take(at offset: Int64, exclusive: Bool, lock: (Int16) throws -> Bool) rethrows -> Taken {
        var count = counts[offset] ?? Count()
        let wasIdle = count.total == 0 && count.kernel != fc_F_UNLCK
        let needed: Int16? = exclusive ? (count.kernel == fc_F_WRLCK ? nil : fc_F_WRLCK) : (count.kernel == fc_F_UNLCK ? fc_F_RDLCK : nil)
        if let needed {
            guard try lock(needed) else { return .refused }
            count.kernel = needed
        }
        if wasIdle { idle -= 1 }
        if exclusive { count.exclusive += 1 } else { count.shared += 1 }
        counts[offset] = count
        return .taken(wasIdle: wasIdle)
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
