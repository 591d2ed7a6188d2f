import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage

/// Runs `body`, failing with `what` if it takes longer than `limit`: a bound on a wait
/// that a defect would make endless, so that the test fails instead of hanging the suite.
/// The body runs in a task of its own, left behind if it never ends (a task group would
/// wait for it).
func within<T: Sendable>(_ limit: Duration, _ what: String,
                         _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let once = Locked<CheckedContinuation<T, any Error>?>(nil)
    let resume: @Sendable (Result<T, any Error>) -> Void = { result in
        once.withLock { continuation in
            continuation?.resume(with: result)
            continuation = nil
        }
    }
    return try await withCheckedThrowingContinuation { continuation in
        once.withLock { $0 = continuation }
        let work = Task { resume(await Result(catching: { try await body() })) }
        Task {
            try? await Task.sleep(for: limit) // ok: the bound on a hang, not a stand-in for an event
            resume(.failure(Hang(what: what, limit: limit)))
            work.cancel()
        }
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}

struct Hang: Error, CustomStringConvertible {
    let what: String, limit: Duration
    var description: String { "\(what) did not finish within \(limit)" }
}
