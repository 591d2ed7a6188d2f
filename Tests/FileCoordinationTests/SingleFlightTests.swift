import Foundation
import AsyncFileIO
import Testing
@testable import FileCoordination

/// Work shared by the tasks that ask for it at once: a directory not resolved yet, asked
/// for by many coordinations starting together.
@Suite("one piece of work per key at a time")
struct SingleFlightTests {
    @Test("tasks that ask for a key while its work is under way wait for it and share its value; another key has work of its own")
    func shared() async throws {
        let flight = SingleFlight<Int, Int>()
        let made = Locked(0)
        let release = AsyncStream.makeStream(of: Void.self)
        let started = AsyncStream.makeStream(of: Void.self)
        let first = Task {
            await flight.value(for: 1, late: { -1 }) {
                made.withLock { $0 += 1 }
                started.continuation.yield()
                for await _ in release.stream { break }
                return 7
            }
        }
        for await _ in started.stream { break }
        let others = (0 ..< 10).map { _ in
            Task { await flight.value(for: 1, late: { -1 }) { made.withLock { $0 += 1 }; return 99 } }
        }
        try await until { flight.waiters(for: 1) == 10 }
        #expect(await flight.value(for: 2, late: { -1 }) { 5 } == 5, "another key waited for the first one's work")
        release.continuation.yield()
        #expect(await first.value == 7)
        for other in others { #expect(await other.value == 7) }
        #expect(made.withLock { $0 } == 1, "the work was made again for a task that asked while it was under way")
        #expect(flight.waiters(for: 1) == 0)
    }

    /// Waits, bounded, until `condition` holds.
    private func until(_ condition: () -> Bool) async throws {
        for _ in 0 ..< 20_000 where !condition() {
            try await Task.sleep(for: .milliseconds(1)) // ok: in-process state with no event to await
        }
        #expect(condition())
    }
}
