import AsyncFileIO

/// The requests a process has sent and whose replies it waits for: which process each
/// awaits, and the meeting of a reply with the task that waits for it, which may come in
/// either order. Pure: the caller keeps it under a lock and resumes what it returns.
struct ReplyTable<Continuation> {
    enum Entry {
        case registered(target: String)
        case waiting(target: String, Continuation)
        case arrived(Result<SpaceProtocol.Body?, any Error>)
    }

    /// What the waiting task does as it parks.
    enum Park {
        case resume(Result<SpaceProtocol.Body?, any Error>)
        case parked
    }

    private(set) var entries: [UInt64: Entry] = [:]

    mutating func register(_ id: UInt64, target: String) {
        entries[id] = .registered(target: target)
    }

    /// The task waiting for `id` parks, unless the outcome is in; a request withdrawn
    /// (cancelled before it parked) ends at once.
    mutating func park(_ id: UInt64, _ continuation: Continuation) -> Park {
        switch entries[id] {
        case .arrived(let outcome):
            entries[id] = nil
            return .resume(outcome)
        case .registered(let target):
            entries[id] = .waiting(target: target, continuation)
            return .parked
        case .waiting, .none:
            return .resume(.failure(CancellationError()))
        }
    }

    /// The outcome of `id` is known: the parked task to resume with it, or nil when the
    /// task has not parked yet (it finds the outcome as it does) or no longer waits.
    /// With `sender`, a reply from a process other than the one asked is not `id`'s (its
    /// numbers are this process's own, and any process may write to this one).
    mutating func arrive(_ id: UInt64, from sender: String? = nil, _ outcome: Result<SpaceProtocol.Body?, any Error>) -> Continuation? {
        if let sender {
            switch entries[id] {
            case .registered(let target), .waiting(let target, _): guard target == sender else { return nil }
            case .arrived, .none: return nil
            }
        }
        switch entries[id] {
        case .waiting(_, let continuation):
            entries[id] = nil
            return continuation
        case .registered:
            entries[id] = .arrived(outcome)
            return nil
        case .arrived, .none:
            return nil
        }
    }

    /// The request is given up (its task was cancelled): the parked task to resume.
    mutating func withdraw(_ id: UInt64) -> Continuation? {
        guard case .waiting(_, let continuation) = entries.removeValue(forKey: id) else { return nil }
        return continuation
    }

    func isParked(_ id: UInt64) -> Bool {
        if case .waiting? = entries[id] { true } else { false }
    }

    func isAwaited(_ id: UInt64) -> Bool {
        switch entries[id] { case .registered?, .waiting?: true; default: false }
    }

    /// The requests that await `process`'s answer.
    func awaiting(_ process: String) -> [UInt64] {
        entries.compactMap { id, entry in
            switch entry {
            case .registered(let target), .waiting(let target, _): target == process ? id : nil
            case .arrived: nil
            }
        }
    }

    /// Every process an answer is awaited from.
    var targets: Set<String> {
        Set(entries.values.compactMap { entry in
            switch entry {
            case .registered(let target), .waiting(let target, _): target
            case .arrived: nil
            }
        })
    }
}

/// The replies a space's mail waits for (the directory space's and the etcd space's):
/// one task parks per request until its reply, its deadline, its target's death or its
/// cancellation, whichever comes first.
package final class AwaitedReplies: Sendable {
    private let table = Locked(ReplyTable<UnsafeContinuation<SpaceProtocol.Body?, any Error>>())
    private let deadlines = ReplyDeadlines()

    package init() {}

    /// Registers request `id` to `target`, calls `send` (which must not wait for the
    /// reply), and waits for the outcome. After `timeout` (when given) it throws
    /// ``RemoteNoAnswer``; cancelled, it throws `CancellationError`; when `ending` fires,
    /// the error its coordinator was cancelled with.
    package func request(
        _ id: UInt64, to target: String, timeout: Duration?, ending: CancelSignal? = nil, send: () -> Void
    ) async throws -> SpaceProtocol.Body? {
        table.withLock { $0.register(id, target: target) }
        if let timeout {
            deadlines.add(id, after: timeout) { [self] in resolve(id, with: .failure(RemoteNoAnswer())) }
        }
        defer { deadlines.remove(id) }
        send()
        ending?.onFire { [self] error in resolve(id, with: .failure(error)) }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                if case .resume(let outcome) = table.withLock({ $0.park(id, continuation) }) {
                    continuation.resume(with: outcome)
                }
            }
        } onCancel: {
            table.withLock { $0.withdraw(id) }?.resume(throwing: CancellationError())
        }
    }

    /// The outcome of `id`: its reply, or nil when its target is gone, or an error. With
    /// `sender` (a reply's), only from the process asked.
    package func resolve(_ id: UInt64, from sender: String? = nil, with outcome: Result<SpaceProtocol.Body?, any Error>) {
        table.withLock { $0.arrive(id, from: sender, outcome) }?.resume(with: outcome)
    }

    /// Whether `id` still waits for its outcome.
    package func isAwaited(_ id: UInt64) -> Bool { table.withLock { $0.isAwaited(id) } }

    /// Whether a task waits parked for `id` (for tests).
    func isParked(_ id: UInt64) -> Bool { table.withLock { $0.isParked(id) } }

    /// The requests that await `process`'s answer.
    package func awaiting(_ process: String) -> [UInt64] { table.withLock { $0.awaiting(process) } }

    /// Every process an answer is awaited from.
    package var targets: Set<String> { table.withLock(\.targets) }
}
