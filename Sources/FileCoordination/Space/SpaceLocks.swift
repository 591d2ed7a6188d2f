@_spi(FileCoordinationInternal) import AsyncFileIO
import CFileCoordinationShims
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Claims that other processes respect: byte-range OFD locks, which the kernel drops
/// when the holding process dies, on the files of the space's `claims/` folder.
///
/// Every path has a *slot* of four bytes, at an offset derived from a hash of its bytes,
/// in one of 64 *shard* files (`claims/00` ... `claims/3f`, also chosen by the hash). The
/// kernel keeps one linear list of locks per file and walks it on every lock call, so
/// one file for all claims would make each claim cost more with every claim held anywhere
/// (measured: 0.9 us per call with none, 11 us with 1,000, 400 us with 10,000); 64 shards
/// divide that list by 64. A process opens a shard when it first needs it (on an I/O thread),
/// and keeps at most ``shardBudget`` open: when the descriptor limit is low, shards in
/// which it holds nothing are closed to make room (see ``defaultShardBudget()``).
///
/// | byte | meaning | taken by |
/// |------|---------|----------|
/// | +0 | the item | readers (shared), writers (exclusive) |
/// | +1 | "inside" | every access inside the directory (shared); a subtree writer (exclusive) |
/// | +2 | the writers' queue | a writer, from the moment it starts waiting until it ends |
///
/// A claim first checks that no writer is queued on its item (+2, for a read) or on any
/// directory containing it (their +2), so a stream of readers cannot starve a writer, nor
/// a stream of accesses inside a directory its delete, move or replace. Byte 1 of
/// `claims.lock` is the *waiting flag*: a process with a blocked claim holds it shared. A
/// process that releases anything checks the flag, and if another process waits it
/// writes one byte at offset 0 of `claims.lock` (the doorbell). Waiters watch
/// `claims.lock` through inotify: the doorbell's `IN_MODIFY`, and
/// `IN_CLOSE_WRITE` when any process that had it open exits (a dead holder's locks are
/// gone). Nothing polls.
///
/// A process keeps up to ``idleLimit`` shared bytes locked after its last task let go of
/// them (*idle*), so that coordinating again on the same items, or in the same directories,
/// asks the kernel nothing. A process that has to wait rings the doorbell as it starts to:
/// every process then gives back its idle bytes (ringing again if it had any) and keeps
/// no new ones until a release of its own finds nobody waiting.
///
/// One process has one open file description, so the kernel sees one owner per process:
/// the tasks of the process share each byte's kernel lock through counts (the in-process
/// rules have already decided which of them may hold what together).
final class SpaceLocks: Sendable {
    /// One byte lock a claim needs.
    struct Byte: Hashable, Sendable, Comparable {
        var offset: Int64
        var exclusive: Bool
        static func < (a: Byte, b: Byte) -> Bool { (a.offset, a.exclusive ? 1 : 0) < (b.offset, b.exclusive ? 1 : 0) }
    }

    /// What one claim asks the kernel for.
    struct Plan: Sendable {
        /// Writer queue bytes, sorted: taken first, in order, and kept while waiting (below
        /// the first check that fails).
        var queue: [Byte] = []
        /// Taken all together or not at all.
        var bytes: [Byte] = []
        /// Queue bytes that must be free (not held by another process's writer), sorted.
        var checks: [Int64] = []
    }

    /// Held bytes, to give back.
    struct Held: Sendable {
        fileprivate var bytes: [Byte]
    }

    private struct Count {
        var shared = 0
        var exclusive = 0
        /// What the kernel holds for this process now.
        var kernel: Int16 = fc_F_UNLCK
        var total: Int { shared + exclusive }
    }

    /// One shard file and the bytes this process holds in it. Each shard has its own lock,
    /// held across the lock calls on its file: workers claiming files in different shards
    /// make their calls in parallel (with one lock for all, a batch's workers queued for it).
    private struct ShardState {
        /// The open shard file (-1: not open). A shard is closed only under its lock, and
        /// only when no task holds a byte in it.
        var fd: Int32 = -1
        /// Bytes held in the kernel: counted for the tasks using them, or idle (kept after
        /// their last task let go, for the next one; see ``idleLimit``).
        var counts: [Int64: Count] = [:]
        /// How many of `counts` are idle.
        var idle = 0
        /// Acquisitions that opened (or found) this shard and have not finished: it is
        /// not closed under them, so two claims cannot keep closing each other's shards.
        var pins = 0
    }

    private final class Shard: Sendable {
        let state = Locked(ShardState())
    }

    /// What waiting claims share.
    private struct State {
        /// Waiting acquisitions whose coordinator was cancelled (their tokens).
        var cancelled: Set<UInt64> = []
        var generation: UInt64 = 0
        var waiters: [UInt64: UnsafeContinuation<Void, any Error>] = [:]
        var nextWaiter: UInt64 = 0
        /// Local requests currently waiting (they share the waiting flag).
        var waiting = 0
    }

    /// At most this many idle bytes are kept: a process that coordinates again on the
    /// same items (or in the same directories) asks the kernel nothing, and the shards'
    /// lock lists stay short. Past the limit they all go at once, in one unlock call per
    /// run of idle bytes in a shard (a batch of 10,000 files gave back each byte with a
    /// call of its own: a third of its lock calls).
    static let idleLimit = 512

    static let doorbellOffset: Int64 = 0
    static let waitingFlagOffset: Int64 = 1
    private static let firstSlot: Int64 = 4096
    static let shardCount = 64

    /// `claims.lock`: the doorbell and the waiting flag.
    let fd: Int32
    let path: FilePath
    /// The space's directory, where `claims/<shard>` are opened.
    private let directoryFD: Int32
    private let directory: FilePath
    private let state = Locked(State())
    private let shards = (0 ..< SpaceLocks.shardCount).map { _ in Shard() }
    /// One bit per open shard, changed under the shard's lock with its `fd` (a hint for
    /// the fast path; each shard's lock decides).
    private let openMask = Atomic<UInt64>(0)
    /// Idle bytes in all shards.
    private let idleTotal = Atomic<Int>(0)
    /// Set when another process may be waiting (the doorbell rang): idle bytes are given
    /// back and no new ones are kept until a release finds nobody waiting.
    private let suspended = Atomic<Bool>(false)
    /// The process left the space: nothing is kept any more.
    private let closed = Atomic<Bool>(false)
    /// At most this many shard files are kept open, unless one claim needs more.
    let shardBudget: Int
    /// Starts the space's watches (``CoordinationSpace/startWatching()``) when a claim
    /// first has to wait; false when they cannot be had, and waits then poll.
    var startWatching: @Sendable () async -> Bool {
        get { watchingHook.withLock { $0 } }
        set { watchingHook.withLock { $0 = newValue } }
    }
    private let watchingHook = Locked<@Sendable () async -> Bool>({ false })
    /// Whether the process hears the doorbell (its watches are in place). Only then are
    /// idle bytes kept: a process deaf to the doorbell could not be asked to give them back.
    private let listening = Atomic<Bool>(false)
    /// Claims released so far, while not listening: the second starts the watches in the
    /// background (unless descriptors are short), so that a process that coordinates
    /// again and again (not a one-shot command) keeps idle bytes.
    private let releases = Atomic<Int>(0)

    /// The watches are in place: idle bytes may be kept from now on.
    func nowListening() { listening.store(true, ordering: .relaxed) }
    /// The longest pause between two tries of a claim that waits without a watch.
    static let longestPoll: Duration = .milliseconds(50)

    /// `shardBudget` nil: ``defaultShardBudget()``.
    init(fd: Int32, path: FilePath, directoryFD: Int32, directory: FilePath, shardBudget: Int? = nil) {
        self.fd = fd
        self.path = path
        self.directoryFD = directoryFD
        self.directory = directory
        self.shardBudget = Swift.max(1, Swift.min(Self.shardCount, shardBudget ?? Self.defaultShardBudget()))
    }

    /// Every shard (64) when the process may open 160 descriptors or more; below that,
    /// half of what the limit leaves over 32 (for the process's other files), at least 8.
    /// Under `ulimit -n 64` that is 16, and a coordinated batch still reads 10,000 files.
    /// Under a limit so low that 8 would not leave room for the files themselves (with
    /// `ulimit -n 20` a process has some 14 descriptors of its own open), half of what is
    /// free beyond 2, at least 1: the budget is soft (one claim always gets the shards it
    /// needs), so a batch then claims and reads a file or two at a time.
    static func defaultShardBudget() -> Int {
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max else { return shardCount }
        let soft = Int(clamping: limit.rlim_cur)
        let budget = Swift.min(shardCount, Swift.max(8, (soft - 32) / 2))
        guard budget < shardCount else { return budget }
        let free = soft - openDescriptorCount()
        return free >= budget * 2 ? budget : Swift.max(1, (free - 2) / 2)
    }

    /// How many descriptors the process has open (its `/proc/self/fd` entries, less the
    /// listing's own).
    static func openDescriptorCount() -> Int {
        guard let directory = opendir("/proc/self/fd") else { return 0 }
        defer { closedir(directory) }
        var count = 0
        while let entry = readdir(directory) {
            if directoryEntryName(entry).first != UInt8(ascii: ".") { count += 1 }
        }
        return count - 1
    }

    /// The shard a slot's bytes live in.
    static func shard(_ offset: Int64) -> Int { Int(((offset - firstSlot) >> 2) & Int64(shardCount - 1)) }

    /// The shards a plan touches, one bit each.
    static func shardMask(of plan: Plan) -> UInt64 {
        var mask: UInt64 = 0
        for byte in plan.queue { mask |= 1 << shard(byte.offset) }
        for byte in plan.bytes { mask |= 1 << shard(byte.offset) }
        for check in plan.checks { mask |= 1 << shard(check) }
        return mask
    }

    /// How many shard files are open (for tests).
    var openShardCount: Int { openMask.load(ordering: .relaxed).nonzeroBitCount }

    /// Opens the shards in `needed` (one bit each) that this process has not opened yet
    /// (on an I/O thread), first closing shards it holds nothing in when that many would
    /// exceed the budget, or when an open fails with `EMFILE`.
    private func openShards(_ needed: UInt64) async throws {
        guard openMask.load(ordering: .acquiring) & needed != needed else { return }
        try await runOnIOThread { [self] in try openShardsNow(needed) }
    }

    private func openShardsNow(_ needed: UInt64) throws {
        guard !closed.load(ordering: .relaxed) else {
            throw FileCoordinationError(code: .closed, path: directory, operation: "open",
                                        message: "this process left the coordination space")
        }
        let missing = (0 ..< Self.shardCount).filter { needed & 1 << $0 != 0 && shards[$0].state.withLock { $0.fd < 0 } }
        guard !missing.isEmpty else { return }
        closeShards(keeping: needed, toFit: missing.count)
        var opened: [(Int, Int32)] = []
        var madeRoom = false
        var index = 0
        while index < missing.count {
            let shard = missing[index]
            let name = "claims/" + String(format: "%02x", shard)
            let fd = fc_openat(directoryFD, name, O_RDWR | O_CREAT | fc_O_NOFOLLOW | O_CLOEXEC, 0o600)
            var info = stat()
            guard fd >= 0, fstat(fd, &info) == 0 else {
                let code = errno
                if fd >= 0 { Glibc.close(fd) }
                if code == EMFILE, !madeRoom {
                    // Other files of the process took the room: give up every shard that
                    // holds nothing, once, and try again.
                    madeRoom = true
                    closeShards(keeping: needed, toFit: Self.shardCount)
                    continue
                }
                for (_, fd) in opened { Glibc.close(fd) }
                var error = FileCoordinationError("open", errno: Errno(rawValue: code), path: directory.appending(name))
                if code == EMFILE {
                    error.message += "; this claim needs \(needed.nonzeroBitCount) claim shards open at once, one descriptor each"
                }
                throw error
            }
            guard (info.st_mode & S_IFMT) == S_IFREG, info.st_uid == geteuid() else {
                Glibc.close(fd)
                for (_, fd) in opened { Glibc.close(fd) }
                throw FileCoordinationError(code: .insecureSpace, path: directory.appending(name), operation: "open",
                                            message: "refused: it is not a regular file of this user")
            }
            opened.append((shard, fd))
            index += 1
        }
        for (shard, fd) in opened {
            let stored = shards[shard].state.withLock { state in
                // Opened meanwhile by another task, or the process left the space (`close`
                // sets `closed` before it goes through the shards).
                guard state.fd < 0, !closed.load(ordering: .relaxed) else { return false }
                state.fd = fd
                openMask.bitwiseOr(1 << shard, ordering: .releasing)
                return true
            }
            if !stored { Glibc.close(fd) }
        }
    }

    /// Closes open shards in which no task of this process holds a byte, that no
    /// acquisition has pinned and that are not in `needed`, until `adding` more fit
    /// within the budget. Their idle bytes go with
    /// them (closing the file releases its locks). Shards without idle bytes go first.
    private func closeShards(keeping needed: UInt64, toFit adding: Int) {
        var excess = openShardCount + adding - shardBudget
        for pass in 0 ..< 2 where excess > 0 {
            for index in 0 ..< Self.shardCount where excess > 0 && needed & 1 << index == 0 {
                let closing: Int32? = shards[index].state.withLock { state in
                    guard state.fd >= 0, state.pins == 0, pass == 1 || state.idle == 0,
                          !state.counts.values.contains(where: { $0.total > 0 }) else { return nil }
                    defer {
                        idleTotal.subtract(state.idle, ordering: .relaxed)
                        state = ShardState()
                        openMask.bitwiseAnd(~(1 << index), ordering: .relaxed)
                    }
                    return state.fd
                }
                guard let closing else { continue }
                Glibc.close(closing)
                excess -= 1
            }
        }
    }

    // MARK: Slots

    private static let fnvBasis: UInt64 = 0xcbf2_9ce4_8422_2325
    private static func fnvStep(_ hash: UInt64, _ byte: UInt8) -> UInt64 { (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 }
    private static func slot(finishing hash: UInt64) -> Int64 {
        var hash = hash
        hash ^= hash >> 33; hash &*= 0xff51_afd7_ed55_8ccd; hash ^= hash >> 33
        return firstSlot + Int64(hash >> 5) * 4
    }

    /// The slot of `bytes` (an absolute, normalized path), and the slots of every
    /// directory containing it, nearest last. A slot's first byte comes from a 64-bit
    /// FNV-1a hash finished with a mixer; two paths sharing a slot only over-exclude each
    /// other, never under-exclude. FNV-1a is computed front to back, so one pass gives
    /// every prefix's hash.
    static func slots(_ bytes: [UInt8]) -> (item: Int64, ancestors: [Int64]) {
        let slots = slotsAndDirectory(bytes)
        return (slots.item, slots.ancestors)
    }

    /// ``slots(_:)``, with the length of the containing directory's path (the last
    /// separator's index; 0 for a file in the root) and the hash state after it.
    private static func slotsAndDirectory(_ bytes: [UInt8]) -> (item: Int64, ancestors: [Int64], directory: Int, hash: UInt64) {
        var hash = fnvBasis
        var ancestors: [Int64] = []
        var directory = (length: 0, hash: fnvBasis)
        for (index, byte) in bytes.enumerated() {
            if byte == UInt8(ascii: "/"), index > 0 {
                ancestors.append(slot(finishing: hash))
                directory = (index, hash)
            }
            hash = fnvStep(hash, byte)
            if index == 0, byte == UInt8(ascii: "/"), bytes.count > 1 { ancestors.append(slot(finishing: hash)) } // the root, "/"
        }
        return (slot(finishing: hash), ancestors, directory.length, directory.hash)
    }

    /// Whether `bytes` names an item directly inside the directory whose path is the first
    /// `length` bytes of `other` (`length` > 0).
    private static func isDirectlyInside(_ bytes: [UInt8], _ other: [UInt8], length: Int) -> Bool {
        guard bytes.count > length + 1, bytes[length] == UInt8(ascii: "/") else { return false }
        return bytes.withUnsafeBufferPointer { path in
            other.withUnsafeBufferPointer { directory in
                memcmp(path.baseAddress!, directory.baseAddress!, length) == 0
                    && memchr(path.baseAddress! + length + 1, Int32(UInt8(ascii: "/")), path.count - length - 1) == nil
            }
        }
    }

    /// The last one-claim plan made, for a process that coordinates on one item again and again.
    private let lastPlan = Locked<(claim: CoordinationRules.Claim, plan: Plan)?>(nil)

    /// ``plan(for:)``, from a one-entry cache when `claims` is the last single claim planned.
    func cachedPlan(for claims: [CoordinationRules.Claim]) -> Plan {
        guard claims.count == 1 else { return Self.plan(for: claims) }
        if let last = lastPlan.withLock({ $0 }), last.claim == claims[0] { return last.plan }
        let plan = Self.plan(for: claims)
        lastPlan.withLock { $0 = (claims[0], plan) }
        return plan
    }

    /// The kernel bytes for claims on normalized, absolute paths.
    static func plan(for claims: [CoordinationRules.Claim]) -> Plan {
        var plan = Plan()
        var inside: [Int64] = []
        // The previous claim's directory: its bytes (the first `length` of that claim's),
        // the hash state after them and the slots of the directories they name. A batch's
        // files share theirs, which are then neither hashed nor compared again.
        var directory: (bytes: [UInt8], length: Int, hash: UInt64, ancestors: [Int64])?
        for claim in claims {
            let bytes = claim.key.bytes
            let slot: Int64
            if let known = directory, known.length > 0, Self.isDirectlyInside(bytes, known.bytes, length: known.length) {
                var hash = known.hash
                for index in known.length ..< bytes.count { hash = fnvStep(hash, bytes[index]) }
                slot = Self.slot(finishing: hash)
            } else {
                let slots = slotsAndDirectory(bytes)
                slot = slots.item
                // The "inside" byte of every containing directory, and its writers' queue
                // byte to test (a delete, move or replace of the directory may be queued).
                if slots.ancestors != directory?.ancestors {
                    inside += slots.ancestors.map { $0 + 1 }
                    plan.checks += slots.ancestors.map { $0 + 2 }
                }
                directory = (bytes, slots.directory, slots.hash, slots.ancestors)
            }
            switch (claim.access, claim.scope) {
            case (.reading, _):
                plan.checks.append(slot + 2)
                plan.bytes.append(Byte(offset: slot, exclusive: false))
            case (.writing, .item):
                plan.queue.append(Byte(offset: slot + 2, exclusive: true))
                plan.bytes.append(Byte(offset: slot, exclusive: true))
            case (.writing, .subtree):
                plan.queue.append(Byte(offset: slot + 2, exclusive: true))
                plan.bytes.append(Byte(offset: slot, exclusive: true))
                plan.bytes.append(Byte(offset: slot + 1, exclusive: true))
            }
        }
        plan.bytes += inside.map { Byte(offset: $0, exclusive: false) }
        // One claim's bytes are distinct (its item's bytes and its directories' "inside"
        // bytes differ in their offset modulo 4). Several claims may share some: a byte
        // both shared and exclusive is taken exclusive, once; queue bytes go in one order.
        guard claims.count > 1 else {
            plan.checks.sort() // in one order with the queue bytes (see `attempt`)
            return plan
        }
        if plan.queue.isEmpty && !plan.bytes.contains(where: \.exclusive) {
            // Reads only (a batch): sorting and dropping repeats is all the merge needed.
            plan.bytes = Self.sortedUnique(plan.bytes.map(\.offset)).map { Byte(offset: $0, exclusive: false) }
            plan.checks = Self.sortedUnique(plan.checks)
            return plan
        }
        var merged: [Int64: Bool] = [:]
        for byte in plan.bytes { merged[byte.offset, default: false] = merged[byte.offset, default: false] || byte.exclusive }
        plan.bytes = merged.map { Byte(offset: $0.key, exclusive: $0.value) }.sorted()
        plan.queue = Array(Set(plan.queue)).sorted()
        plan.checks = Self.sortedUnique(plan.checks)
        return plan
    }

    private static func sortedUnique(_ offsets: [Int64]) -> [Int64] {
        var result: [Int64] = []
        result.reserveCapacity(offsets.count)
        for offset in offsets.sorted() where offset != result.last { result.append(offset) }
        return result
    }

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

    /// Takes the plan's bytes, waiting (on inotify) while another process holds a
    /// conflicting lock. Throws `CancellationError` if the task is cancelled meanwhile.
    ///
    /// `token` names the wait for ``cancel(token:)``, which ends it with
    /// ``FileCoordinationError/Code/cancelled``.
    func acquire(_ plan: Plan, token: UInt64? = nil) async throws -> Held {
        // Pinned, the plan's shards stay open from their opening to the attempt (a shard
        // it needs is not closed to make room for another claim meanwhile); not while it
        // sleeps, so that waiters do not keep shards open past the budget.
        let needed = Self.shardMask(of: plan)
        var pinned = true
        pin(needed, by: 1)
        defer { if pinned { pin(needed, by: -1) } }
        try await openShards(needed)
        var queued: [Byte] = []
        var flagged = false
        var watched = false
        var poll: Duration = .milliseconds(1)
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
                switch try attempt(plan, queued: &queued) {
                case .held(let held): return held
                case .shardClosed:
                    // Closed before this acquisition pinned it (again): open it again.
                    try await openShards(needed)
                    continue
                case .conflict: break
                }
                if !flagged {
                    // Watched before the flag is raised, so no doorbell rung after it is missed.
                    watched = await startWatching()
                    // Raise the flag, then try again before sleeping: a release between the
                    // first attempt and the flag would not have rung. The doorbell asks
                    // every process to give back its idle bytes (one may be in the way).
                    flagged = true
                    raiseWaitingFlag()
                    ringDoorbell()
                    continue
                }
                pin(needed, by: -1)
                pinned = false
                ClaimWait.noteWaiting()
                if watched {
                    try await waitForChange(after: generation)
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
    private func pin(_ mask: UInt64, by change: Int) {
        for index in 0 ..< Self.shardCount where mask & 1 << index != 0 {
            shards[index].state.withLock { $0.pins += change }
        }
    }

    /// What one try gave.
    private enum Attempt {
        case held(Held)
        /// Another process holds something in the way.
        case conflict
        /// A shard of the plan is not open.
        case shardClosed
    }

    /// What taking one byte gave.
    private enum Take {
        case taken, conflict, shardClosed
    }

    /// One try: the queue bytes and the checks, in one order of offsets, then the rest
    /// all-or-nothing. Each byte is taken under its shard's lock; bytes taken before a
    /// refusal are given back.
    ///
    /// Queue bytes are kept across tries, but only those below the point where a try
    /// stopped: a check that finds another process's writer queued gives back this
    /// claim's queue bytes above it. So a waiting claim holds queue bytes only below what
    /// it waits for, every chain of waits climbs in offset, and no cycle can form. (Were
    /// they kept whatever the order, a claim reading X and writing Y and another reading
    /// Y and writing X would each hold the queue byte the other's check waits for.)
    private func attempt(_ plan: Plan, queued: inout [Byte]) throws -> Attempt {
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
                switch try take(byte) {
                case .taken: queued.append(byte)
                case .conflict: return .conflict
                case .shardClosed: return .shardClosed
                }
            } else {
                let check = plan.checks[nextCheck]
                nextCheck += 1
                if writerWaits == false { continue } // no queue byte needs a look
                switch try self.check(check, writerWaits: &writerWaits) {
                case .taken: break
                case .conflict:
                    giveBackQueued(above: check, &queued)
                    return .conflict
                case .shardClosed: return .shardClosed
                }
            }
        }
        var taken: [Byte] = []
        taken.reserveCapacity(plan.bytes.count)
        // All or nothing: on a refusal, or a lock call that throws, what was taken goes back.
        var complete = false
        defer { if !complete { for byte in taken.reversed() { _ = give(byte) } } }
        for byte in plan.bytes {
            let outcome = try take(byte)
            guard case .taken = outcome else { return outcome == .conflict ? .conflict : .shardClosed }
            taken.append(byte)
        }
        complete = true
        return .held(Held(bytes: queued + taken))
    }

    /// Gives back the queue bytes of `queued` above `offset` (the last ones: they were
    /// taken in order).
    private func giveBackQueued(above offset: Int64, _ queued: inout [Byte]) {
        var above: [Byte] = []
        while let last = queued.last, last.offset > offset { above.append(queued.removeLast()) }
        release(Held(bytes: above.reversed()))
    }

    /// Whether the writers' queue byte `check` is free of other processes' writers
    /// (`.taken`: it is). `writerWaits` is whether another process's writer waits
    /// anywhere, once looked at.
    private func check(_ check: Int64, writerWaits: inout Bool?) throws -> Take {
        try shards[Self.shard(check)].state.withLock { state in
            guard state.fd >= 0 else { return .shardClosed }
            // This process queues there itself.
            if state.counts[check]?.kernel == fc_F_WRLCK { return .taken }
            // The item (or, for a directory, its inside byte) is already held in the kernel
            // by this process (idle, or by another task) and no doorbell has rung since: no
            // writer can be queued behind it without having rung, so the check would find
            // nothing.
            if !suspended.load(ordering: .relaxed), Self.holds(state, check - 2) || Self.holds(state, check - 1) { return .taken }
            // A writer that has to wait raises the waiting flag before it sleeps: while no
            // other process holds it, no writer waits anywhere and no queue byte needs a
            // look (one call for a whole batch instead of one per file).
            if writerWaits == nil {
                var flag: Int16 = fc_F_UNLCK
                guard fc_ofd_getlock(fd, fc_F_WRLCK, Self.waitingFlagOffset, 1, &flag) == 0 else { throw lockError("F_OFD_GETLK") }
                writerWaits = flag != fc_F_UNLCK
            }
            guard writerWaits == true else { return .taken }
            var conflicting: Int16 = fc_F_UNLCK
            guard fc_ofd_getlock(state.fd, fc_F_RDLCK, check, 1, &conflicting) == 0 else { throw lockError("F_OFD_GETLK") }
            return conflicting == fc_F_UNLCK ? .taken : .conflict
        }
    }

    /// Whether this process holds `offset` in the kernel.
    private static func holds(_ state: borrowing ShardState, _ offset: Int64) -> Bool {
        (state.counts[offset]?.kernel ?? fc_F_UNLCK) != fc_F_UNLCK
    }

    /// Counts `byte` for this process, asking the kernel only when the process does not
    /// hold it strongly enough already.
    private func take(_ byte: Byte) throws -> Take {
        try shards[Self.shard(byte.offset)].state.withLock { state in
            guard state.fd >= 0 else { return .shardClosed }
            var count = state.counts[byte.offset] ?? Count()
            let needed = byte.exclusive ? fc_F_WRLCK : fc_F_RDLCK
            let wasIdle = count.total == 0 && count.kernel != fc_F_UNLCK
            if count.kernel == fc_F_UNLCK || (needed == fc_F_WRLCK && count.kernel != fc_F_WRLCK) {
                if fc_ofd_lock(state.fd, needed, byte.offset, 1, 0) != 0 {
                    let error = errno
                    if error == EAGAIN || error == EACCES { return .conflict }
                    throw lockError("F_OFD_SETLK", error)
                }
                count.kernel = needed
            }
            if wasIdle { // an idle byte taken again
                state.idle -= 1
                idleTotal.subtract(1, ordering: .relaxed)
            }
            if byte.exclusive { count.exclusive += 1 } else { count.shared += 1 }
            state.counts[byte.offset] = count
            return .taken
        }
    }

    /// Uncounts `byte`; lowers or drops the kernel lock when no task needs it. Returns
    /// whether the kernel lock changed.
    private func give(_ byte: Byte) -> Bool {
        shards[Self.shard(byte.offset)].state.withLock { state in
            guard var count = state.counts[byte.offset] else { return false }
            if byte.exclusive { count.exclusive -= 1 } else { count.shared -= 1 }
            if count.total <= 0 && count.kernel == fc_F_RDLCK && listening.load(ordering: .relaxed) && !suspended.load(ordering: .relaxed)
                && !closed.load(ordering: .relaxed) {
                // Kept, idle: the shared kernel lock stays for the next task that needs it
                // (an exclusive one is never kept: a process stopped with it would hold off
                // every reader). Past the limit, every idle byte goes (``release(_:)``).
                count.shared = 0
                count.exclusive = 0
                state.counts[byte.offset] = count
                state.idle += 1
                idleTotal.add(1, ordering: .relaxed)
                return false
            }
            if count.total <= 0 {
                state.counts[byte.offset] = nil
                _ = fc_ofd_lock(state.fd, fc_F_UNLCK, byte.offset, 1, 0)
                return true
            }
            if count.exclusive == 0 && count.kernel == fc_F_WRLCK {
                _ = fc_ofd_lock(state.fd, fc_F_RDLCK, byte.offset, 1, 0) // a downgrade always succeeds
                count.kernel = fc_F_RDLCK
                state.counts[byte.offset] = count
                return true
            }
            state.counts[byte.offset] = count
            return false
        }
    }

    /// Gives back every idle byte: in each shard, sorted by offset, each run of idle
    /// bytes not interrupted by a byte a task holds is one unlock call. Returns whether
    /// there was any.
    @discardableResult
    private func dropIdleBytes() -> Bool {
        var any = false
        for shard in shards {
            let dropped = shard.state.withLock { state -> Int in
                guard state.idle > 0 else { return 0 }
                // Every byte held: its offset shifted left once, the low bit set for an
                // idle one (offsets are below 2^62), so that a plain integer sort orders them.
                var bytes = state.counts.compactMap { offset, count in
                    count.kernel != fc_F_UNLCK ? offset << 1 | (count.total == 0 ? 1 : 0) : nil
                }
                bytes.sort()
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
                        state.counts[last] = nil
                        index += 1
                    }
                    _ = fc_ofd_lock(state.fd, fc_F_UNLCK, first, last - first + 1, 0)
                }
                defer { state.idle = 0 }
                return state.idle
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
        var changed = false
        for byte in held.bytes.reversed() where give(byte) { changed = true }
        if idleTotal.load(ordering: .relaxed) > Self.idleLimit { dropIdleBytes() }
        // Claims that opened shards past a reduced budget (several at once, or one
        // spanning many) leave the process over it: close what now holds nothing.
        if shardBudget < Self.shardCount, openShardCount > shardBudget { closeShards(keeping: 0, toFit: 0) }
        guard changed else { return }
        let waiters = state.withLock { Self.takeWaiters(&$0) }
        for waiter in waiters { waiter.resume() }
        var conflicting: Int16 = fc_F_UNLCK
        if fc_ofd_getlock(fd, fc_F_WRLCK, Self.waitingFlagOffset, 1, &conflicting) == 0 {
            if conflicting != fc_F_UNLCK {
                ringDoorbell()
            } else {
                // Nobody waits any more: idle bytes may be kept again.
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
            if fd >= 0 { Glibc.close(fd) }
        }
    }

    /// Wakes every process waiting on the space's claims.
    func ringDoorbell() {
        var byte: UInt8 = 1
        _ = pwrite(fd, &byte, 1, off_t(Self.doorbellOffset))
    }

    // MARK: Waiting

    /// A new generation: every parked waiter is taken, to be resumed (outside the lock)
    /// so that it tries again.
    private static func takeWaiters(_ state: inout State) -> [UnsafeContinuation<Void, any Error>] {
        state.generation &+= 1
        defer { state.waiters.removeAll() }
        return Array(state.waiters.values)
    }

    /// Ends the wait of the acquisition with this token (its coordinator was cancelled).
    func cancel(token: UInt64) {
        let waiters = state.withLock { state in
            state.cancelled.insert(token)
            return Self.takeWaiters(&state)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Called by the watcher thread for the lock file's `IN_MODIFY` / `IN_CLOSE_WRITE`:
    /// this process's waiters try again, and its idle bytes go (someone may wait for
    /// one); if there were any, the doorbell rings for the waiters elsewhere.
    func somethingChanged() {
        let waiters = state.withLock { Self.takeWaiters(&$0) }
        for waiter in waiters { waiter.resume() }
        if dropIdle(suspend: true) { ringDoorbell() }
    }

    private func waitForChange(after generation: UInt64) async throws {
        let id = state.withLock { state in
            defer { state.nextWaiter += 1 }
            return state.nextWaiter
        }
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, any Error>) in
                let parked = state.withLock { state in
                    guard state.generation == generation, !Task.isCancelled else { return false }
                    state.waiters[id] = continuation
                    return true
                }
                if !parked { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { $0.waiters.removeValue(forKey: id) }
            waiter?.resume(throwing: CancellationError())
        }
    }

    private func raiseWaitingFlag() {
        state.withLock { state in
            state.waiting += 1
            if state.waiting == 1 { _ = fc_ofd_lock(fd, fc_F_RDLCK, Self.waitingFlagOffset, 1, 0) }
        }
    }

    private func lowerWaitingFlag() {
        state.withLock { state in
            state.waiting -= 1
            if state.waiting == 0 { _ = fc_ofd_lock(fd, fc_F_UNLCK, Self.waitingFlagOffset, 1, 0) }
        }
    }

    /// `claims.lock` and every shard file in which this process holds a byte: a child
    /// process that inherits them keeps this process's claims until it ends, even if this
    /// process dies first (the locks belong to the open files, not to the process), and
    /// its exit is the `IN_CLOSE_WRITE` that wakes the waiters.
    func descriptorsHoldingClaims() -> [Int32] {
        [fd] + shards.compactMap { shard in shard.state.withLock { $0.fd >= 0 && !$0.counts.isEmpty ? $0.fd : nil } }
    }

    /// Bytes this process holds in the kernel (for tests and `status`).
    var heldCount: Int { shards.reduce(0) { $0 + $1.state.withLock { $0.counts.count } } }

    private func lockError(_ operation: String, _ code: Int32 = errno) -> FileCoordinationError {
        FileCoordinationError(code: .io, path: path, operation: operation, errno: Errno(rawValue: code),
                              message: "the coordination space's lock file refused a lock")
    }
}
