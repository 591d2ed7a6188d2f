import Dispatch
import Foundation
import Synchronization
import Testing
@testable import FileCoordination
import TestSupport

/// An executor that counts the jobs given to it: each hop of a task back onto its actor
/// is one.
final class CountingExecutor: SerialExecutor {
    private let queue = DispatchQueue(label: "counting-executor")
    let jobs = Atomic<Int>(0)

    func enqueue(_ job: consuming ExecutorJob) {
        jobs.add(1, ordering: .relaxed)
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }

    func asUnownedSerialExecutor() -> UnownedSerialExecutor { UnownedSerialExecutor(ordinary: self) }
}

/// A caller on an actor of its own, as code on the main actor is.
actor IsolatedCaller {
    let executor = CountingExecutor()
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    func coordinate(_ count: Int, _ url: URL, with coordinator: FileCoordinator) async throws {
        for _ in 0 ..< count { try await coordinator.coordinate(readingItemAt: url) { _ in } }
    }
}

@Suite("callers in an actor's isolation")
struct CallerIsolationTests {
    @Test("an uncontended coordination from an actor stays on it: no hop to the global executor and back")
    func noHop() async throws {
        let box = Sandbox()
        let file = box.file("f")
        try Data("x".utf8).write(to: file)
        let caller = IsolatedCaller()
        let coordinator = privateCoordinator(CoordinationCenter())
        try await caller.coordinate(10, file, with: coordinator) // the directory resolved, the space settled
        let before = caller.executor.jobs.load(ordering: .relaxed)
        try await caller.coordinate(200, file, with: coordinator)
        let hops = caller.executor.jobs.load(ordering: .relaxed) - before
        // One job is the call itself; a few more may come from the registry of other
        // tests' presenters changing meanwhile (re-read off the actor). A hop per
        // coordination would be 200 at least.
        #expect(hops < 20, "\(hops) jobs on the caller's executor for 200 coordinations")
    }
}
