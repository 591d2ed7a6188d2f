import AsyncFileIO
import SystemCalls
import CFileCoordinationShims
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Taking and giving back the kernel locks of a set of claims.
extension SpaceLocks {
    // MARK: Acquire and release

    /// Opens every shard (on an I/O thread), so that ``tryAcquireNow(_:)`` can serve any
    /// path; false, opening nothing, when the budget is smaller.
    func openAllShards() async throws -> Bool {
        guard shardBudget >= Self.shardCount else { return false }
        try await openShards(UInt64.max) // every shard (there are 64)
        return true
    }

    /// How many of `paths` (normalized, absolute), from the first, one read claim can
    /// cover with the shards it may keep open: all of them with the full budget, else as
    /// many as fit (at least one).
    func readsFitting(_ paths: some Sequence<[UInt8]>) -> Int {
        var used: UInt64 = 0 // one bit per shard
        var fitting = 0
        for path in paths {
            let (item, ancestors) = Self.slots(path)
            var next = used | 1 << Self.shard(item)
            for ancestor in ancestors { next |= 1 << Self.shard(ancestor) }
            if !fitsBudget(next), fitting > 0 { break }
            used = next
            fitting += 1
        }
        return fitting
    }

    /// Takes the plan's bytes if that needs no waiting and no shard still to open; nil
    /// otherwise (nothing is held then). Never blocks: the non-blocking lock calls only.
    func tryAcquireNow(_ plan: Plan) -> Held? {
        var queued: [Byte] = []
        if case .held(let held)? = try? attempt(plan, queued: &queued) { return held }
        release(Held(bytes: queued))
        return nil
    }

    /// ``tryAcquireNow(_:)`` that first opens the plan's shards that are closed (closing
    /// others that hold nothing, to stay within the budget): for a process that may not
    /// keep every shard open. Nil, with nothing held, when the plan needs more shards than
    /// the budget, or something is in the way. Blocking (`openat`): for the batch's
    /// workers, on the I/O threads, only.
    func tryAcquireOpening(_ plan: Plan, mask needed: UInt64) -> Held? {
        var queued: [Byte] = []
        switch try? attempt(plan, queued: &queued) {
        case .held(let held)?: return held
        case .shardClosed?: release(Held(bytes: queued))
        case .conflict?, nil:
            release(Held(bytes: queued))
            return nil
        }
        guard fitsBudget(needed) else { return nil }
        // Pinned from their opening to the attempt, as in `acquire`.
        pin(needed, by: 1)
        defer { pin(needed, by: -1) }
        guard (try? openShardsNow(needed)) != nil else { return nil }
        queued = []
        if case .held(let held)? = try? attempt(plan, queued: &queued) { return held }
        release(Held(bytes: queued))
        return nil
    }

    /// Whether a plan's shards (`mask`, from ``shardMask(of:)``) fit in the budget.
    func fitsBudget(_ mask: UInt64) -> Bool { mask.nonzeroBitCount <= shardBudget }

    /// Takes the plan's bytes, waiting while another process holds a conflicting lock:
    /// in the kernel (``waitInKernel(for:token:)``), else, when no thread or signal can be
    /// had for that, on inotify. Throws `CancellationError` if the task is cancelled
    /// meanwhile.
    ///
    /// `token` names the wait for ``cancel(token:)``, which ends it with
    /// `FileCoordinationError.Code.cancelled`; `waits` is called once, when the claim
    /// starts to wait, and `parks` each time it is about to wait (the claim deadline
    /// counts from the first).
    func acquire(_ plan: Plan, token: UInt64? = nil, waits: (() -> Void)? = nil, parks: () -> Void = {}) async throws -> Held {
        // Pinned, the plan's shards stay open from their opening to the attempt (a shard
        // it needs is not closed to make room for another claim meanwhile); not while it
        // sleeps on inotify or for a byte it does not take, so that waiters do not keep
        // shards open past the budget.
        let needed = Self.shardMask(of: plan)
        var pinned = true
        pin(needed, by: 1)
        defer { if pinned { pin(needed, by: -1) } }
        try await openShards(needed)
        var queued: [Byte] = []
        var flagged = false
        var inKernel = waitsInKernel
        var watched = false
        var poll: Duration = .milliseconds(1)
        // (Closes before the claim began are not its to answer.)
        var answered = (closes: state.withLock { $0.closes }, looks: Self.closeRechecks)
        defer {
            if flagged { lowerWaitingFlag() }
            if let token { _ = state.withLock { $0.cancelled.remove(token) } }
        }
        do {
            while true {
                try Task.checkCancellation()
                if let token, state.withLock({ $0.cancelled.contains(token) }) {
                    throw FileCoordinationError.coordinatorCancelled()
                }
                let generation = state.withLock { $0.generation }
                let blocker: Blocker
                switch try attempt(plan, queued: &queued) {
                case .held(let held): return held
                case .shardClosed:
                    // Closed before this acquisition pinned it (again): open it again.
                    try await openShards(needed)
                    continue
                case .conflict(let found): blocker = found
                }
                if !flagged {
                    // The claim waits from its first conflict: the deadline counts from here
                    // even when starting the watches is slow (a record written while the
                    // disk is saturated).
                    parks()
                    if LibraryLogger.logs(.debug) { FileCoordinator.logger.debug("claim waits for another process's claim") }
                    // Watched before the flag is raised, so no doorbell rung after it is
                    // missed. A wait in the kernel needs no watch: the kernel wakes it.
                    if !inKernel { watched = await startWatching() }
                    // Raise the flag, then try again before sleeping: a release between the
                    // first attempt and the flag would not have rung. The doorbell asks
                    // every process to give back its idle bytes (one may be in the way),
                    // this one's own included.
                    flagged = true
                    waits?()
                    raiseWaitingFlag()
                    dropIdle(suspend: true)
                    ringDoorbell()
                    continue
                }
                parks()
                if inKernel {
                    if !blocker.isQueue {
                        pin(needed, by: -1)
                        pinned = false
                    }
                    let outcome = await waitInKernel(for: blocker, token: token)
                    if !pinned {
                        pin(needed, by: 1)
                        pinned = true
                        try await openShards(needed)
                    }
                    switch outcome {
                    case .taken: queued.append(blocker.byte)
                    case .tryAgain: break
                    case .unavailable:
                        // No thread, descriptor or signal for it: wait on inotify instead,
                        // watched before the next try.
                        inKernel = false
                        watched = await startWatching()
                    }
                    continue
                }
                pin(needed, by: -1)
                pinned = false
                if watched {
                    try await waitForChange(after: generation, atMost: recheckPause(&answered))
                } else {
                    // No inotify instance to be had: try again after a pause that grows to
                    // ``longestPoll``. Slower than a doorbell, never stuck.
                    try await Task.sleep(for: poll) // ok: the fallback when nothing can be watched
                    poll = Swift.min(poll * 2, Self.longestPoll)
                }
                pin(needed, by: 1)
                pinned = true
                try await openShards(needed)
            }
        } catch {
            release(Held(bytes: queued))
            throw error
        }
    }

    /// Counts (or uncounts) an acquisition's use of the shards in `mask`.
    func pin(_ mask: UInt64, by change: Int) {
        for index in 0 ..< Self.shardCount where mask & 1 << index != 0 {
            shards[index].state.withLock { $0.pins += change }
        }
    }

    /// One try at the plan on the claim shards (``attempt(_:queued:calls:)``).
    func attempt(_ plan: Plan, queued: inout [Byte]) throws -> Attempt {
        try Self.attempt(plan, queued: &queued, calls: self)
    }

    /// Whether the writers' queue byte `check` is free of other processes' writers
    /// (`.taken`: it is). `writerWaits` is whether another process's writer waits
    /// anywhere, once looked at.
    func check(_ check: Int64, writerWaits: inout Bool?) throws -> Take {
        try shards[Self.shard(check)].state.withLock { state in
            guard state.fd >= 0 else { return .shardClosed }
            // This process queues there itself.
            if state.bytes.kernelLock(at: check) == fc_F_WRLCK { return .taken }
            // The item (or, for a directory, its inside byte) is already held in the kernel
            // by this process (idle, or by another task), the process hears the doorbell,
            // and it has not rung since: no writer can be queued behind it without having
            // rung, so the check would find nothing. (A process that does not hear it would
            // let its readers overlap ahead of a queued writer for ever.)
            if listening.load(ordering: .relaxed), !suspended.load(ordering: .relaxed),
               Self.holds(state, check - 2) || Self.holds(state, check - 1) { return .taken }
            // A writer that has to wait raises the waiting flag before it sleeps: while no
            // other process holds it, no writer waits anywhere and no queue byte needs a
            // look (one call for a whole batch instead of one per file).
            if writerWaits == nil {
                switch Syscall.conflictingLock(fd, fc_F_WRLCK, Self.waitingFlagOffset, 1) {
                case .success(let flag): writerWaits = flag != fc_F_UNLCK
                case .failure(let errno): throw lockError(.lockQuery, errno)
                }
            }
            guard writerWaits == true else { return .taken }
            switch Syscall.conflictingLock(state.fd, fc_F_RDLCK, check, 1) {
            case .success(let conflicting): return conflicting == fc_F_UNLCK ? .taken : .conflict
            case .failure(let errno): throw lockError(.lockQuery, errno)
            }
        }
    }

    /// Whether this process holds `offset` in the kernel.
    static func holds(_ state: borrowing ShardState, _ offset: Int64) -> Bool {
        state.bytes.kernelLock(at: offset) != fc_F_UNLCK
    }

    /// Counts `byte` for this process, asking the kernel only when the process does not
    /// hold it strongly enough already.
    func take(_ byte: Byte) throws -> Take {
        try shards[Self.shard(byte.offset)].state.withLock { state in
            guard state.fd >= 0 else { return .shardClosed }
            let fd = state.fd
            let taken = try state.bytes.take(at: byte.offset, exclusive: byte.exclusive) { type in
                switch Syscall.lock(fd, type, byte.offset, 1) {
                case .success: return true
                case .failure(let error) where error == .resourceTemporarilyUnavailable || error == .permissionDenied: return false
                case .failure(let error): throw lockError(.lock, error)
                }
            }
            switch taken {
            case .refused: return .conflict
            case .taken(let wasIdle):
                if wasIdle { idleTotal.subtract(1, ordering: .relaxed) } // an idle byte taken again
                return .taken
            }
        }
    }

    /// Whether a byte no task holds any more may stay locked, idle: only while the process
    /// hears the doorbell, no waiter has asked for idle bytes back, and it has not left.
    /// Nor while a claim of this process waits: its wait for a byte it does not take
    /// (on a descriptor of its own) would wait for this process's own idle lock.
    private var keepsIdleBytes: Bool {
        listening.load(ordering: .relaxed) && !suspended.load(ordering: .relaxed) && !closed.load(ordering: .relaxed)
            && waitingHere.load(ordering: .relaxed) == 0
    }

    /// Uncounts `byte`; lowers or drops the kernel lock when no task needs it. Returns
    /// whether the kernel lock changed.
    @discardableResult
    func give(_ byte: Byte) -> Bool { give([byte]) }

    /// Uncounts `bytes` (a claim's), shard by shard under each shard's lock once. Bytes of
    /// one slot whose kernel locks go, with nothing of this process's between them, are
    /// unlocked in one call: a write's item and queue bytes (slot+0 and slot+2, its
    /// inside byte unheld between) are one `F_OFD_SETLK` instead of two. (Slots of one
    /// shard lie 256 bytes apart.) Returns whether any kernel lock changed.
    func give(_ bytes: [Byte]) -> Bool {
        let ordered = bytes.sorted { (Self.shard($0.offset), $0.offset) < (Self.shard($1.offset), $1.offset) }
        var changed = false
        var start = 0
        while start < ordered.count {
            let shard = Self.shard(ordered[start].offset)
            var end = start + 1
            while end < ordered.count, Self.shard(ordered[end].offset) == shard { end += 1 }
            let group = ordered[start ..< end]
            start = end
            let kept = shards[shard].state.withLock { state -> (changed: Bool, newlyIdle: Int) in
                // Kept idle, a shared kernel lock stays for the next task that needs it; past
                // the limit, every idle byte goes (``release(_:)``).
                let mayKeepIdle = keepsIdleBytes
                let idleBefore = state.bytes.idle
                var unlocks: [Int64] = []
                var changed = false
                for byte in group {
                    switch state.bytes.give(at: byte.offset, exclusive: byte.exclusive, mayKeepIdle: mayKeepIdle) {
                    case .none: break
                    case .unlock: unlocks.append(byte.offset)
                    case .downgrade:
                        _ = Syscall.lock(state.fd, fc_F_RDLCK, byte.offset, 1) // a downgrade always succeeds
                        changed = true
                    }
                }
                var index = 0
                while index < unlocks.count {
                    let first = unlocks[index]
                    var last = first
                    while index + 1 < unlocks.count, unlocks[index + 1] - last <= 3,
                          (last + 1 ..< unlocks[index + 1]).allSatisfy({ state.bytes.kernelLock(at: $0) == fc_F_UNLCK }) {
                        index += 1
                        last = unlocks[index]
                    }
                    _ = Syscall.lock(state.fd, fc_F_UNLCK, first, last - first + 1)
                    changed = true
                    index += 1
                }
                return (changed, max(0, state.bytes.idle - idleBefore))
            }
            if kept.newlyIdle > 0 { idleTotal.add(kept.newlyIdle, ordering: .relaxed) }
            if kept.changed { changed = true }
        }
        return changed
    }

    /// Gives back every idle byte: in each shard, sorted by offset, each run of idle
    /// bytes not interrupted by a byte a task holds is one unlock call. Returns whether
    /// there was any.
    @discardableResult
    func dropIdleBytes() -> Bool {
        var any = false
        for shard in shards {
            let dropped = shard.state.withLock { state -> Int in
                let idle = state.bytes.idle
                for run in state.bytes.dropIdle() {
                    _ = Syscall.lock(state.fd, fc_F_UNLCK, run.lowerBound, run.upperBound - run.lowerBound + 1)
                }
                return idle
            }
            if dropped > 0 {
                idleTotal.subtract(dropped, ordering: .relaxed)
                any = true
            }
        }
        return any
    }

    /// Gives the bytes back; wakes this process's waiters, and rings the doorbell when
    /// another process waits.
    func release(_ held: Held) {
        guard !held.bytes.isEmpty else { return }
        // Not under a reduced budget: the watches cost descriptors (the inotify instance,
        // the watcher's doorbell) that such a process counted on for its files.
        if shardBudget == Self.shardCount, !listening.load(ordering: .relaxed), releases.add(1, ordering: .relaxed).newValue == 2 {
            let start = startWatching
            Task { _ = await start() }
        }
        let changed = give(held.bytes)
        if idleTotal.load(ordering: .relaxed) > Self.idleLimit { dropIdleBytes() }
        // Claims that opened shards past a reduced budget (several at once, or one
        // spanning many) leave the process over it: close what now holds nothing.
        if shardBudget < Self.shardCount, openShardCount > shardBudget { closeShards(keeping: 0, toFit: 0) }
        guard changed else { return }
        let waiters = state.withLock { Self.takeWaiters(&$0) }
        for waiter in waiters { waiter.resume() }
        ringIfOthersWait()
    }

    /// Rings the doorbell when another process waits (holds the waiting flag); when none
    /// does, idle bytes may be kept again.
    func ringIfOthersWait() {
        if case .success(let conflicting) = Syscall.conflictingLock(fd, fc_F_WRLCK, Self.waitingFlagOffset, 1) {
            if conflicting != fc_F_UNLCK {
                ringDoorbell()
            } else {
                suspended.store(false, ordering: .relaxed)
            }
        }
    }

    /// Gives back every idle byte (another process may be waiting for one); returns
    /// whether there was any. With `suspend`, no new ones are kept until a release finds
    /// nobody waiting.
    @discardableResult
    func dropIdle(suspend: Bool) -> Bool {
        if suspend { suspended.store(true, ordering: .relaxed) }
        return dropIdleBytes()
    }

    /// The process leaves the space: idle bytes go, none are kept from now on, and the
    /// shard files are closed (a process that joins and leaves spaces keeps no descriptor).
    func close() {
        closed.store(true, ordering: .relaxed)
        if dropIdle(suspend: false) { ringDoorbell() }
        for (index, shard) in shards.enumerated() {
            let fd = shard.state.withLock { state in
                defer {
                    state = ShardState(pins: state.pins)
                    openMask.bitwiseAnd(~(1 << index), ordering: .relaxed)
                }
                return state.fd
            }
            if fd >= 0 { _ = Syscall.close(fd) }
        }
    }

    /// Wakes every process waiting on the space's claims.
    func ringDoorbell() {
        var byte: UInt8 = 1
        _ = Syscall.pwrite(fd, &byte, 1, Self.doorbellOffset)
    }
}
