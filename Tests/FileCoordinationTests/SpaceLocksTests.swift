import CFileCoordinationShims
import Foundation
import Testing
@testable import FileCoordination

/// The kernel claims of a space, seen from a second open file description of the same
/// files: to the kernel that is another owner, exactly as another process would be.
@Suite("kernel claims (SpaceLocks)")
struct SpaceLocksTests {
    let sandbox = Sandbox()
    var directory: String { sandbox.url.path }

    /// Runs `body` with a `SpaceLocks` over a fresh space directory, every shard open
    /// (with the full budget; with a smaller one, none yet).
    func withLocks(shardBudget: Int? = nil, listening: Bool = true, _ body: (SpaceLocks) async throws -> Void) async throws {
        try FileManager.default.createDirectory(atPath: directory + "/claims", withIntermediateDirectories: true)
        let lockFD = open(directory + "/claims.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        defer {
            close(lockFD)
            close(directoryFD)
        }
        try #require(lockFD >= 0 && directoryFD >= 0)
        let locks = SpaceLocks(fd: lockFD, path: FilePath(directory + "/claims.lock"), directoryFD: directoryFD,
                               directory: FilePath(directory), shardBudget: shardBudget ?? SpaceLocks.shardCount)
        defer { locks.close() }
        // As a process whose watches are in place (it hears the doorbell): idle bytes are kept.
        if listening { locks.nowListening() }
        #expect(try await locks.openAllShards() == (shardBudget == nil))
        try await body(locks)
    }

    /// The `index`th slot of shard 0 (every slot of one shard shares its lock list).
    func slot(_ index: Int64) -> Int64 { slot(index, shard: 0) }

    /// The `index`th slot of `shard`.
    func slot(_ index: Int64, shard: Int64) -> Int64 { 4096 + shard * 4 + index * Int64(4 * SpaceLocks.shardCount) }

    /// A read claim's plan for the item at `slot`.
    func reading(_ slot: Int64) -> SpaceLocks.Plan {
        SpaceLocks.Plan(queue: [], bytes: [SpaceLocks.Byte(offset: slot, exclusive: false)], checks: [slot + 2])
    }

    /// A second owner (another open file description) of the file holding `offset`
    /// (`claims.lock` when `lockFile`).
    func otherOwner(of offset: Int64, lockFile: Bool = false) -> Int32 {
        let name = lockFile ? "claims.lock" : "claims/" + String(format: "%02x", SpaceLocks.shard(offset))
        return open(directory + "/" + name, O_RDWR | O_CLOEXEC)
    }

    /// Whether the byte at `offset` is locked by an owner other than `fd`'s.
    func locked(_ offset: Int64, seenFrom fd: Int32) -> Bool {
        var conflicting: Int16 = fc_F_UNLCK
        #expect(fc_ofd_getlock(fd, fc_F_WRLCK, offset, 1, &conflicting) == 0)
        return conflicting != fc_F_UNLCK
    }

    @Test("past the idle limit every idle byte is given back at once; a byte a task holds stays locked")
    func idleBytesGoTogether() async throws {
        try await withLocks { locks in
            let other = otherOwner(of: slot(0))
            defer { close(other) }
            // A task holds the item in the middle of the shard; the items around it become idle.
            let middle = Int64(SpaceLocks.idleLimit / 2)
            let held = try #require(locks.tryAcquireNow(reading(slot(middle))))
            for index in 0 ... Int64(SpaceLocks.idleLimit) where index != middle {
                locks.release(try #require(locks.tryAcquireNow(reading(slot(index)))))
            }
            // At the limit: all kept.
            #expect(locks.heldCount == SpaceLocks.idleLimit + 1)
            #expect(locked(slot(0), seenFrom: other) && locked(slot(Int64(SpaceLocks.idleLimit)), seenFrom: other))
            // One more idle byte: every idle byte goes, on both sides of the held one.
            locks.release(try #require(locks.tryAcquireNow(reading(slot(Int64(SpaceLocks.idleLimit) + 1)))))
            #expect(locks.heldCount == 1)
            #expect(!locked(slot(0), seenFrom: other) && !locked(slot(middle - 1), seenFrom: other))
            #expect(!locked(slot(middle + 1), seenFrom: other) && !locked(slot(Int64(SpaceLocks.idleLimit) + 1), seenFrom: other))
            #expect(locked(slot(middle), seenFrom: other))
            locks.release(held)
            #expect(locked(slot(middle), seenFrom: other), "given back by its task, it is kept idle")
        }
    }

    @Test("a write's item and queue bytes are given back together; the inside byte between them stays locked while this process holds it")
    func neighbouringBytesGoTogether() async throws {
        try await withLocks { locks in
            let item = slot(0)
            let other = otherOwner(of: item)
            defer { close(other) }
            let write = SpaceLocks.Plan(queue: [.init(offset: item + 2, exclusive: true)], bytes: [.init(offset: item, exclusive: true)])
            func written() throws {
                locks.release(try #require(locks.tryAcquireNow(write)))
                #expect(!locked(item, seenFrom: other) && !locked(item + 2, seenFrom: other))
            }
            try written()
            #expect(!locked(item + 1, seenFrom: other))
            // A claim inside the item (as a directory) holds its inside byte meanwhile, then
            // leaves it idle: a write's release unlocks around it, never it.
            let inside = try #require(locks.tryAcquireNow(SpaceLocks.Plan(bytes: [.init(offset: item + 1, exclusive: false)])))
            try written()
            #expect(locked(item + 1, seenFrom: other))
            locks.release(inside)
            try written()
            #expect(locked(item + 1, seenFrom: other), "kept idle")
            // One claim holding all three (a write of the item and a read inside it): its
            // inside byte, kept idle by the same release, stays; with no idle byte allowed
            // (another process waits), all three go.
            let all = SpaceLocks.Plan(queue: [.init(offset: item + 2, exclusive: true)],
                                      bytes: [.init(offset: item, exclusive: true), .init(offset: item + 1, exclusive: false)])
            locks.release(try #require(locks.tryAcquireNow(all)))
            #expect(!locked(item, seenFrom: other) && locked(item + 1, seenFrom: other) && !locked(item + 2, seenFrom: other))
            locks.dropIdle(suspend: true)
            locks.release(try #require(locks.tryAcquireNow(all)))
            #expect(!locked(item, seenFrom: other) && !locked(item + 1, seenFrom: other) && !locked(item + 2, seenFrom: other))
        }
    }

    @Test("under a small shard budget, shards holding nothing close to make room; held bytes stay locked",
          .timeLimit(.minutes(3)))
    func shardBudget() async throws {
        try await withLocks(shardBudget: 8) { locks in
            let held = try await locks.acquire(reading(slot(0, shard: 0)))
            // Twenty more shards, each claimed and given back: their bytes stay idle, and
            // shards close as others open.
            for shard in 1 ... Int64(20) { locks.release(try await locks.acquire(reading(slot(0, shard: shard)))) }
            #expect(locks.openShardCount == 8)
            let seen = (0 ... Int64(20)).map { otherOwner(of: slot(0, shard: $0)) }
            defer { seen.forEach { close($0) } }
            #expect(locked(slot(0, shard: 0), seenFrom: seen[0]), "a byte a task holds keeps its shard open")
            // A process spawned by another test at that moment holds a copy of every open
            // descriptor between its fork and its exec (the kernel drops a lock with the
            // last reference to its open file): released, the byte is free once that ends.
            var freed = false
            for _ in 0 ..< 200 where !freed {
                freed = !locked(slot(0, shard: 1), seenFrom: seen[1])
                if !freed { try await Task.sleep(for: .milliseconds(10)) } // ok: bounded wait for another process's exec
            }
            #expect(freed, "an idle byte goes with its shard")
            #expect(locked(slot(0, shard: 20), seenFrom: seen[20]), "an idle byte in an open shard is kept")
            #expect(locks.heldCount == 8, "the held byte and one idle byte per other open shard")
            // One claim spanning twelve shards gets them all at once, beyond the budget.
            var wide = SpaceLocks.Plan()
            for shard in 30 ..< Int64(42) {
                wide.bytes.append(SpaceLocks.Byte(offset: slot(0, shard: shard), exclusive: true))
            }
            let all = try await locks.acquire(wide)
            #expect(locks.openShardCount == 13)
            let last = otherOwner(of: slot(0, shard: 41))
            defer { close(last) }
            #expect(locked(slot(0, shard: 41), seenFrom: last))
            locks.release(all)
            // The next shard opened brings the count back within the budget.
            locks.release(try await locks.acquire(reading(slot(0, shard: 50))))
            #expect(locks.openShardCount == 8)
            #expect(locked(slot(0, shard: 0), seenFrom: seen[0]))
            locks.release(held)
        }
    }

    @Test("a batch worker's try under a small budget opens the shards it needs, within the budget; one needing more, or in conflict, gets nothing",
          .timeLimit(.minutes(3)))
    func tryOpeningUnderBudget() async throws {
        try await withLocks(shardBudget: 8) { locks in
            #expect(locks.openShardCount == 0)
            // Twenty claims in twenty shards, each held while the next is taken, then given
            // back: shards holding only idle bytes close to make room.
            var previous: SpaceLocks.Held?
            for shard in 0 ..< Int64(20) {
                let plan = reading(slot(1, shard: shard))
                let held = try #require(locks.tryAcquireOpening(plan, mask: SpaceLocks.shardMask(of: plan)))
                let other = otherOwner(of: slot(1, shard: shard))
                #expect(locked(slot(1, shard: shard), seenFrom: other))
                close(other)
                if let previous { locks.release(previous) }
                previous = held
                #expect(locks.openShardCount <= 8)
            }
            // Nine shards at once: more than the budget, refused before anything is opened.
            var wide = SpaceLocks.Plan()
            for shard in 40 ..< Int64(49) { wide.bytes.append(SpaceLocks.Byte(offset: slot(1, shard: shard), exclusive: false)) }
            let wideMask = SpaceLocks.shardMask(of: wide)
            #expect(!locks.fitsBudget(wideMask))
            #expect(locks.tryAcquireOpening(wide, mask: wideMask) == nil)
            // Another owner writing the item (in a shard not opened yet): refused, with
            // nothing held.
            let other = open(directory + "/claims/" + String(format: "%02x", 50), O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            defer { close(other) }
            #expect(fc_ofd_lock(other, fc_F_WRLCK, slot(2, shard: 50), 1, 0) == 0)
            let blocked = reading(slot(2, shard: 50))
            #expect(locks.tryAcquireOpening(blocked, mask: SpaceLocks.shardMask(of: blocked)) == nil)
            #expect(fc_ofd_lock(other, fc_F_UNLCK, slot(2, shard: 50), 1, 0) == 0)
            #expect(!locked(slot(2, shard: 50), seenFrom: other), "the refused claim left nothing locked")
            #expect(locks.openShardCount <= 8)
            if let previous { locks.release(previous) }
        }
    }

    @Test("tasks claiming in many shards at once under a small budget: every held byte stays locked while shards close around it",
          .timeLimit(.minutes(3)))
    func shardBudgetUnderConcurrency() async throws {
        try await withLocks(shardBudget: 8) { locks in
            // One observer descriptor per shard (another owner, as another process would be).
            let observers = (0 ..< 40).map { open(directory + "/claims/" + String(format: "%02x", $0), O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
            try #require(observers.allSatisfy { $0 >= 0 })
            defer { observers.forEach { close($0) } }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for task in 0 ..< 8 {
                    group.addTask {
                        var generator = SystemRandomNumberGenerator()
                        for round in 0 ..< 150 {
                            let shard = Int64(UInt64.random(in: 0 ..< 40, using: &generator))
                            let offset = slot(Int64(task * 1000 + round), shard: shard)
                            let held = try await locks.acquire(reading(offset))
                            // Held: another owner cannot write-lock the byte.
                            #expect(locked(offset, seenFrom: observers[Int(shard)]))
                            await Task.yield()
                            #expect(locked(offset, seenFrom: observers[Int(shard)]))
                            locks.release(held)
                        }
                    }
                }
                try await group.waitForAll()
            }
            // Only idle bytes are left, in open shards, and no more shards than the budget
            // plus what claims in flight needed.
            #expect(locks.openShardCount <= 8 + 8)
            locks.close()
            #expect(locks.heldCount == 0)
            for (shard, observer) in observers.enumerated() {
                var conflicting: Int16 = fc_F_UNLCK
                #expect(fc_ofd_getlock(observer, fc_F_WRLCK, 4096, Int64(4 * SpaceLocks.shardCount) * 10_000, &conflicting) == 0)
                #expect(conflicting == fc_F_UNLCK, "shard \(shard) still locked after close")
            }
        }
    }

    @Test("a batch's plan is the union of its files' own plans (files in one directory reuse its hashes)")
    func batchPlan() {
        let paths = ["/data/a", "/data/b", "/data/sub/c", "/data/d", "/e", "/f", "/data/sub/g", "/data/subx/h",
                     "/data/su", "/data/sub/g/i", "/data/sub/j"]
        let claims = paths.map { CoordinationRules.Claim(path: FilePath($0), access: .reading) }
        let batch = SpaceLocks.plan(for: claims)
        let alone = claims.map { SpaceLocks.plan(for: [$0]) }
        #expect(batch.bytes.map(\.offset) == Set(alone.flatMap { $0.bytes.map(\.offset) }).sorted())
        #expect(batch.checks == Set(alone.flatMap(\.checks)).sorted())
        #expect(batch.bytes.allSatisfy { !$0.exclusive } && batch.queue.isEmpty)
    }

    @Test("a reader tests writers' queue bytes only while another process waits (its waiting flag is raised)")
    func queueTestFollowsTheWaitingFlag() async throws {
        try await withLocks { locks in
            // Another owner queues as a writer on two items, without having had to wait yet.
            let other = otherOwner(of: slot(1))
            defer { close(other) }
            #expect(fc_ofd_lock(other, fc_F_WRLCK, slot(1) + 2, 1, 0) == 0)
            #expect(fc_ofd_lock(other, fc_F_WRLCK, slot(2) + 2, 1, 0) == 0)
            // No flag raised: the queue bytes are not looked at (the reader came first).
            let first = try #require(locks.tryAcquireNow(reading(slot(1))))
            locks.release(first)
            // The writer has to wait: it raises the flag. A reader of its other item now queues behind it.
            let flag = otherOwner(of: 0, lockFile: true)
            defer { close(flag) }
            #expect(fc_ofd_lock(flag, fc_F_RDLCK, SpaceLocks.waitingFlagOffset, 1, 0) == 0)
            #expect(locks.tryAcquireNow(reading(slot(2))) == nil)
            #expect(!locked(slot(2), seenFrom: other), "a refused claim holds nothing")
            // An item no writer queues on is still free to read.
            let third = try #require(locks.tryAcquireNow(reading(slot(3))))
            locks.release(third)
        }
    }

    @Test("a process that does not hear the doorbell tests the queue byte of an item its other tasks read: a writer queued there keeps new readers out")
    func readersQueueBehindWriterWhenDeaf() async throws {
        try await withLocks(listening: false) { locks in
            let first = try #require(locks.tryAcquireNow(reading(slot(1))))
            // Another owner's writer queues on the item and has to wait: the flag is raised
            // (the doorbell it rings is not heard here).
            let other = otherOwner(of: slot(1))
            defer { close(other) }
            #expect(fc_ofd_lock(other, fc_F_WRLCK, slot(1) + 2, 1, 0) == 0)
            let flag = otherOwner(of: 0, lockFile: true)
            defer { close(flag) }
            #expect(fc_ofd_lock(flag, fc_F_RDLCK, SpaceLocks.waitingFlagOffset, 1, 0) == 0)
            let second = locks.tryAcquireNow(reading(slot(1)))
            #expect(second == nil, "a second reader went in ahead of the queued writer")
            if let second { locks.release(second) }
            locks.release(first)
        }
    }

    @Test("while a writer waits, a claim inside a directory whose delete, move or replace is queued waits behind it")
    func queuedDirectoryWriterHoldsOffClaimsInside() async throws {
        try await withLocks { locks in
            func read(_ path: String) -> SpaceLocks.Plan {
                SpaceLocks.plan(for: [CoordinationRules.Claim(path: FilePath(path), access: .reading)])
            }
            let directory = SpaceLocks.slots(Array("/data/tree".utf8)).item
            // Another owner queued a subtree writer on /data/tree and has to wait (flag raised).
            let other = otherOwner(of: directory + 2)
            defer { close(other) }
            #expect(fc_ofd_lock(other, fc_F_WRLCK, directory + 2, 1, 0) == 0)
            let flag = otherOwner(of: 0, lockFile: true)
            defer { close(flag) }
            #expect(fc_ofd_lock(flag, fc_F_RDLCK, SpaceLocks.waitingFlagOffset, 1, 0) == 0)
            #expect(locks.tryAcquireNow(read("/data/tree/deep/file")) == nil)
            #expect(locks.heldCount == 0, "a refused claim holds nothing")
            // Beside the directory, and the directory's own parent, nothing is queued.
            let beside = try #require(locks.tryAcquireNow(read("/data/other/file")))
            locks.release(beside)
            let parent = try #require(locks.tryAcquireNow(read("/data")))
            locks.release(parent)
        }
    }
}
