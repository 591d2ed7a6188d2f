import CFileCoordinationShims
import Foundation
import Testing
@testable import FileCoordination

/// A claim that has to wait for another owner waits in the kernel, on a thread of the
/// library's own: granted when the other owner lets go, and ended promptly by a
/// cancellation, leaving nothing behind.
extension SpaceLocksTests {
    /// A write claim's plan for `/data/<name>`.
    func writing(_ name: String) -> SpaceLocks.Plan {
        SpaceLocks.plan(for: [CoordinationRules.Claim(path: FilePath("/data/" + name), access: .writing)])
    }

    /// The plan's exclusive bytes (the item's and its writers' queue byte), taken by a
    /// second owner; returns its descriptors with the byte each holds, for ``letGo(_:)``.
    func holdElsewhere(_ plan: SpaceLocks.Plan) throws -> [(fd: Int32, offset: Int64)] {
        try (plan.queue + plan.bytes).filter(\.exclusive).map { byte in
            let fd = otherOwner(of: byte.offset)
            try #require(fd >= 0)
            try #require(fc_ofd_lock(fd, fc_F_WRLCK, byte.offset, 1, 0) == 0)
            return (fd, byte.offset)
        }
    }

    /// Gives back what ``holdElsewhere(_:)`` took: unlocked, not only closed, as a child
    /// process another test forks meanwhile holds a copy of each descriptor until it
    /// execs, and the lock with it.
    func letGo(_ other: [(fd: Int32, offset: Int64)]) {
        for (fd, offset) in other {
            #expect(fc_ofd_lock(fd, fc_F_UNLCK, offset, 1, 0) == 0)
            close(fd)
        }
    }

    /// Polls `condition` every 5 ms for at most `seconds`; whether it came true.
    func eventually(within seconds: Double, _ condition: () -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(5)) // ok: polling a kernel state that has no event
        }
        return condition()
    }

    /// Whether another owner's claim waits: the waiting flag is held.
    func flagRaised() -> Bool {
        let fd = otherOwner(of: 0, lockFile: true)
        defer { close(fd) }
        return locked(SpaceLocks.waitingFlagOffset, seenFrom: fd)
    }

    @Test("a write claim waiting for another owner's write waits in the kernel and is granted when that owner lets go",
          .timeLimit(.minutes(1)))
    func kernelWaitGranted() async throws {
        try await withLocks { locks in
            #expect(locks.waitsInKernel, "a real-time signal was free for the wait")
            let plan = writing("granted")
            let other = try holdElsewhere(plan)
            let waiter = Task { try await locks.acquire(plan) }
            #expect(await eventually(within: 10) { flagRaised() && locks.kernelWaitsInCall.load(ordering: .relaxed) == 1 }, "the claim waits in the kernel")
            letGo(other)
            let held = try await waiter.value
            let probe = otherOwner(of: plan.bytes[0].offset)
            defer { close(probe) }
            for byte in held.bytes where byte.exclusive { #expect(locked(byte.offset, seenFrom: probe)) }
            locks.release(held)
            #expect(await eventually(within: 10) { locks.kernelWaitsInCall.load(ordering: .relaxed) == 0 && !flagRaised() })
        }
    }

    /// Waits until `plan`'s claim waits in the kernel, ends it with `end`, and checks that
    /// it ended within `seconds` and left nothing: no thread, no flag, no byte held, even
    /// after the other owner lets go.
    func endKernelWait(_ locks: SpaceLocks, _ plan: SpaceLocks.Plan, token: UInt64?, within seconds: Double,
                       _ end: (Task<SpaceLocks.Held, any Error>) -> Void) async throws {
        let other = try holdElsewhere(plan)
        let waiter = Task { try await locks.acquire(plan, token: token) }
        #expect(await eventually(within: 10) { flagRaised() && locks.kernelWaitsInCall.load(ordering: .relaxed) == 1 }, "the claim waits in the kernel")
        let start = ContinuousClock.now
        end(waiter)
        let result = await waiter.result
        let took = ContinuousClock.now - start
        #expect(throws: (any Error).self) { try result.get() }
        #expect(took < .seconds(seconds), "ended after \(took)")
        #expect(await eventually(within: 2) { locks.kernelWaitsInCall.load(ordering: .relaxed) == 0 }, "the wait's thread ended")
        #expect(!flagRaised(), "the waiting flag is lowered")
        #expect(locks.heldCount == 0, "nothing is counted")
        letGo(other)
        // Nothing was granted behind the other owner to a wait that had gone.
        let probe = otherOwner(of: plan.bytes[0].offset)
        defer { close(probe) }
        for byte in plan.queue + plan.bytes { #expect(!locked(byte.offset, seenFrom: probe), "byte \(byte.offset) is free") }
        // And the item is free to claim at once.
        let held = try #require(locks.tryAcquireNow(plan))
        locks.release(held)
    }

    @Test("a claim waiting in the kernel ends promptly when its task is cancelled, and leaves no thread, flag or lock",
          .timeLimit(.minutes(1)))
    func kernelWaitTaskCancelled() async throws {
        try await withLocks { locks in
            try await endKernelWait(locks, writing("cancelled"), token: nil, within: 30) { $0.cancel() }
        }
    }

    @Test("a claim waiting in the kernel ends promptly at its deadline (a task group racing a timer, as a claim timeout does), leaving nothing",
          .timeLimit(.minutes(1)))
    func kernelWaitTimedOut() async throws {
        try await withLocks { locks in
            let plan = writing("timed")
            let other = try holdElsewhere(plan)
            defer { letGo(other) }
            struct TimedOut: Error {}
            // Seen waiting in the kernel before the deadline.
            let waitedInKernel = Task {
                await eventually(within: 1.5) { flagRaised() && locks.kernelWaitsInCall.load(ordering: .relaxed) == 1 }
            }
            let start = ContinuousClock.now
            await #expect(throws: TimedOut.self) {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { locks.release(try await locks.acquire(plan)) }
                    group.addTask {
                        try await Task.sleep(for: .seconds(2)) // ok: the claim's deadline
                        throw TimedOut()
                    }
                    defer { group.cancelAll() }
                    try await group.next()
                }
            }
            #expect(await waitedInKernel.value, "the claim waited in the kernel")
            // The other claim is held until the test ends: any end well inside the time limit is
            // the deadline's (a loaded machine has taken 5 s to run the 2 s group).
            #expect(ContinuousClock.now - start < .seconds(30))
            #expect(await eventually(within: 2) { locks.kernelWaitsInCall.load(ordering: .relaxed) == 0 }, "the wait's thread ended")
            #expect(!flagRaised())
            #expect(locks.heldCount == 0)
        }
    }

    @Test("a claim waiting in the kernel for a byte it does not take (a reader behind a queued writer) ends promptly on cancel(token:)",
          .timeLimit(.minutes(1)))
    func kernelWaitCancelledByToken() async throws {
        try await withLocks { locks in
            // The writer's queue byte held elsewhere, its flag raised: the reader waits for it.
            let plan = reading(slot(7))
            let queue = otherOwner(of: slot(7))
            defer { close(queue) }
            try #require(fc_ofd_lock(queue, fc_F_WRLCK, slot(7) + 2, 1, 0) == 0)
            let flag = otherOwner(of: 0, lockFile: true)
            try #require(fc_ofd_lock(flag, fc_F_RDLCK, SpaceLocks.waitingFlagOffset, 1, 0) == 0)
            let waiter = Task { try await locks.acquire(plan, token: 41) }
            #expect(await eventually(within: 10) { locks.kernelWaitsInCall.load(ordering: .relaxed) == 1 }, "the claim waits in the kernel")
            let start = ContinuousClock.now
            locks.cancel(token: 41)
            let error = await #expect(throws: FileCoordinationError.self) { try await waiter.value }
            #expect(error?.code == .cancelled)
            #expect(ContinuousClock.now - start < .seconds(30)) // the flag is held until the test ends
            #expect(await eventually(within: 2) { locks.kernelWaitsInCall.load(ordering: .relaxed) == 0 }, "the wait's thread ended")
            // Unlocked, not only closed: a child process another test forks meanwhile holds a
            // copy of the descriptor until it execs, and the lock with it.
            #expect(fc_ofd_lock(flag, fc_F_UNLCK, SpaceLocks.waitingFlagOffset, 1, 0) == 0)
            close(flag)
            #expect(!flagRaised())
            #expect(locks.heldCount == 0)
        }
    }
}
