import AsyncFileIO
import CFileCoordinationShims
import Foundation
import Synchronization
import SystemCalls
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
/// `IN_CLOSE_WRITE` when any process that had it open exits; and the shards' own
/// `IN_CLOSE_WRITE` (a holder's command may keep its shards after `claims.lock`). The
/// kernel reports a last close before it drops that file's locks, so a waiter that still
/// finds a conflict after a close looks again on its own a few times over a quarter
/// second (``closeRechecks``); apart from that, nothing polls.
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

    /// Held bytes, to give back. Opaque outside `SpaceLocks` and its extensions.
    struct Held: Sendable {
        var bytes: [Byte]
    }

    /// One shard file and the bytes this process holds in it. Each shard has its own lock,
    /// held across the lock calls on its file: workers claiming files in different shards
    /// make their calls in parallel (with one lock for all, a batch's workers queued for it).
    struct ShardState {
        /// The open shard file (-1: not open). A shard is closed only under its lock, and
        /// only when no task holds a byte in it.
        var fd: Int32 = -1
        /// Bytes held in the kernel: counted for the tasks using them, or idle (kept after
        /// their last task let go, for the next one; see ``idleLimit``).
        var bytes = ByteCounts()
        /// Acquisitions that opened (or found) this shard and have not finished: it is
        /// not closed under them, so two claims cannot keep closing each other's shards.
        var pins = 0
    }

    final class Shard: Sendable {
        let state = Locked(ShardState())
    }

    /// What waiting claims share.
    struct State {
        /// Waiting acquisitions whose coordinator was cancelled (their tokens).
        var cancelled: Set<UInt64> = []
        var generation: UInt64 = 0
        var waiters: [UInt64: UnsafeContinuation<Void, any Error>] = [:]
        var nextWaiter: UInt64 = 0
        /// Local requests currently waiting (they share the waiting flag).
        var waiting = 0
        /// How many times a file of the space's claims was closed for good (or inotify
        /// events were lost): a holder may be ending (see ``closeRechecks``).
        var closes: UInt64 = 0
        /// Timed waits (``waitForChange(after:atMost:)``), and whether the time ran out
        /// before they parked.
        var timed: [UInt64: Bool] = [:]
        /// Waits in the kernel, by the token of their acquisition (for ``cancel(token:)``).
        var kernelWaits: [UInt64: KernelLockWait] = [:]
    }

    /// How many times a waiter that still finds a conflict after a claim file's close
    /// looks again on its own, at pauses of 1, 2, 4 ... ms (a quarter second in all). The
    /// kernel reports a file's last close before it drops that file's locks: a waiter
    /// woken by the close of `claims.lock` or of a shard may try while those locks, or
    /// those of the dying process's next files, are still there, and the closes of the
    /// files it tried too early have been reported already.
    static let closeRechecks = 8

    /// At most this many idle bytes are kept: a process that coordinates again on the
    /// same items (or in the same directories) asks the kernel nothing, and the shards'
    /// lock lists stay short. Past the limit they all go at once, in one unlock call per
    /// run of idle bytes in a shard (a batch of 10,000 files gave back each byte with a
    /// call of its own: a third of its lock calls).
    static let idleLimit = 512

    static let doorbellOffset: Int64 = 0
    static let waitingFlagOffset: Int64 = 1
    static let firstSlot: Int64 = 4096
    static let shardCount = 64

    /// `claims.lock`: the doorbell and the waiting flag.
    let fd: Int32
    let path: FilePath
    /// The space's directory, where `claims/<shard>` are opened.
    let directoryFD: Int32
    let directory: FilePath
    /// Whom the shard files must belong to: the effective uid the process joined with.
    let owner: uid_t
    /// What keeps ``fd`` and ``directoryFD`` open while these locks may use them: the
    /// space's files (nil when the caller owns the descriptors).
    private let files: SpaceFiles?
    let state = Locked(State())
    let shards = (0 ..< SpaceLocks.shardCount).map { _ in Shard() }
    /// One bit per open shard, changed under the shard's lock with its `fd` (a hint for
    /// the fast path; each shard's lock decides).
    let openMask = Atomic<UInt64>(0)
    /// Idle bytes in all shards.
    let idleTotal = Atomic<Int>(0)
    /// Set when another process may be waiting (the doorbell rang): idle bytes are given
    /// back and no new ones are kept until a release finds nobody waiting.
    let suspended = Atomic<Bool>(false)
    /// The process left the space: nothing is kept any more.
    let closed = Atomic<Bool>(false)
    /// Claims of this process that wait (``State/waiting``, readable outside the lock).
    let waitingHere = Atomic<Int>(0)
    /// Threads of this space's kernel waits still in their lock call or about to make it
    /// (``waitInKernel(for:token:)``): what a cancelled wait leaves behind, for tests.
    let kernelWaitsInCall = Atomic<Int>(0)
    /// Whether a claim that has to wait waits in the kernel (``waitInKernel(for:token:)``);
    /// else on inotify, as it does anyway when no thread or signal can be had for it.
    let waitsInKernel: Bool
    /// At most this many shard files are kept open, unless one claim needs more.
    let shardBudget: Int
    /// Starts the space's watches (``CoordinationSpace/startWatching()``) when a claim
    /// first has to wait; false when they cannot be had, and waits then poll.
    let startWatching = WatchingHook()
    /// Whether the process hears the doorbell (its watches are in place). Only then are
    /// idle bytes kept: a process deaf to the doorbell could not be asked to give them back.
    let listening = Atomic<Bool>(false)
    /// Claims released so far, while not listening: the second starts the watches in the
    /// background (unless descriptors are short), so that a process that coordinates
    /// again and again (not a one-shot command) keeps idle bytes.
    let releases = Atomic<Int>(0)

    /// The watches are in place: idle bytes may be kept from now on, unless another
    /// process holds the waiting flag. It rang the doorbell before this process could hear
    /// it, and a byte kept idle now would hold it off until something else rang.
    func nowListening() {
        if case .success(let holder) = Syscall.conflictingLock(fd, fc_F_WRLCK, Self.waitingFlagOffset, 1), holder != fc_F_UNLCK {
            suspended.store(true, ordering: .relaxed)
        }
        listening.store(true, ordering: .relaxed)
    }
    /// The longest pause between two tries of a claim that waits without a watch.
    static let longestPoll: Duration = .milliseconds(50)

    /// `shardBudget` nil: ``defaultShardBudget()``.
    init(fd: Int32, path: FilePath, directoryFD: Int32, directory: FilePath, shardBudget: Int? = nil,
         owner: uid_t = geteuid(), waitsInKernel: Bool = KernelLockWait.signal != nil, files: SpaceFiles? = nil) {
        self.files = files
        self.fd = fd
        self.waitsInKernel = waitsInKernel
        self.owner = owner
        self.path = path
        self.directoryFD = directoryFD
        self.directory = directory
        self.shardBudget = Swift.max(1, Swift.min(Self.shardCount, shardBudget ?? Self.defaultShardBudget()))
    }

    /// The claims of the space whose files these are; they stay open as long as the locks.
    convenience init(files: SpaceFiles) {
        self.init(fd: files.lockFD, path: files.directory.appending(SpaceLayout.claimsLock), directoryFD: files.directoryFD,
                  directory: files.directory, owner: files.owner, files: files)
    }

    /// Every shard (64) when the process may open 160 descriptors or more; below that,
    /// half of what the limit leaves over 32 (for the process's other files), at least 8.
    /// Under `ulimit -n 64` that is 16, and a coordinated batch still reads 10,000 files.
    /// Under a limit so low that 8 would not leave room for the files themselves (with
    /// `ulimit -n 20` a process has some 14 descriptors of its own open), half of what is
    /// free beyond 2, at least 1: the budget is soft (one claim always gets the shards it
    /// needs), so a batch then claims and reads a file or two at a time.
    static func defaultShardBudget() -> Int {
        guard case .success(let limit) = Syscall.descriptorLimit(), limit.rlim_cur != rlim_t.max else { return shardCount }
        let soft = Int(clamping: limit.rlim_cur)
        let budget = Swift.min(shardCount, Swift.max(8, (soft - 32) / 2))
        guard budget < shardCount else { return budget }
        let free = soft - openDescriptorCount()
        return free >= budget * 2 ? budget : Swift.max(1, (free - 2) / 2)
    }

    /// How many descriptors the process has open (its `/proc/self/fd` entries, less the
    /// listing's own).
    static func openDescriptorCount() -> Int {
        guard case .success(let names) = OwnedFiles.list(fc_AT_FDCWD, "/proc/self/fd") else { return 0 }
        return names.count - 1
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
    func openShards(_ needed: UInt64) async throws {
        guard openMask.load(ordering: .acquiring) & needed != needed else { return }
        try await runOnIOThread { [self] in try openShardsNow(needed) }
    }

    /// `claims/NN`, the shard's number in two hex digits (by hand: `String(format:)` is
    /// slow the first time, and a short command opens shards once).
    static func shardName(_ shard: Int) -> String {
        let digits = Array("0123456789abcdef")
        return SpaceLayout.claims + "/" + String([digits[shard >> 4 & 0xf], digits[shard & 0xf]])
    }

    func openShardsNow(_ needed: UInt64) throws {
        guard !closed.load(ordering: .relaxed) else {
            throw FileCoordinationError(.open, code: .closed, path: directory, message: "this process left the coordination space")
        }
        let missing = (0 ..< Self.shardCount).filter { needed & 1 << $0 != 0 && shards[$0].state.withLock { $0.fd < 0 } }
        guard !missing.isEmpty else { return }
        closeShards(keeping: needed, toFit: missing.count)
        var opened: [(Int, Int32)] = []
        var madeRoom = false
        var index = 0
        while index < missing.count {
            let shard = missing[index]
            let name = Self.shardName(shard)
            let fd: Int32
            switch OwnedFiles.open(directoryFD, name, O_RDWR | O_CREAT, kind: .regularFile, privateOnly: false, owner: owner) {
            case .success(let value): fd = value
            case .failure(.system(let code)):
                if code == .tooManyOpenFiles, !madeRoom {
                    // Other files of the process took the room: give up every shard that
                    // holds nothing, once, and try again.
                    madeRoom = true
                    closeShards(keeping: needed, toFit: Self.shardCount)
                    continue
                }
                for (_, fd) in opened { _ = Syscall.close(fd) }
                var error = FileCoordinationError(.open, errno: code, path: directory.appending(name))
                if code == .tooManyOpenFiles {
                    error.message += "; this claim needs \(needed.nonzeroBitCount) claim shards open at once, one descriptor each"
                }
                throw error
            case .failure(let problem):
                for (_, fd) in opened { _ = Syscall.close(fd) }
                throw FileCoordinationError.refused(.open, problem, path: directory.appending(name))
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
            if !stored { _ = Syscall.close(fd) }
        }
    }

    /// Closes open shards in which no task of this process holds a byte, that no
    /// acquisition has pinned and that are not in `needed`, until `adding` more fit
    /// within the budget. Their idle bytes go with
    /// them (closing the file releases its locks). Shards without idle bytes go first.
    func closeShards(keeping needed: UInt64, toFit adding: Int) {
        var excess = openShardCount + adding - shardBudget
        for pass in 0 ..< 2 where excess > 0 {
            for index in 0 ..< Self.shardCount where excess > 0 && needed & 1 << index == 0 {
                let closing: Int32? = shards[index].state.withLock { state in
                    guard state.fd >= 0, state.pins == 0, pass == 1 || state.bytes.idle == 0,
                          !state.bytes.isInUse else { return nil }
                    defer {
                        idleTotal.subtract(state.bytes.idle, ordering: .relaxed)
                        state = ShardState()
                        openMask.bitwiseAnd(~(1 << index), ordering: .relaxed)
                    }
                    return state.fd
                }
                guard let closing else { continue }
                _ = Syscall.close(closing)
                excess -= 1
            }
        }
    }

    /// The last one-claim plan made, for a process that coordinates on one item again and again.
    let lastPlan = Locked<(claim: CoordinationRules.Claim, plan: Plan)?>(nil)
}
