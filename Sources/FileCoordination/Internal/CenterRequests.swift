import SystemPackage

/// The center's requests from submission to release, as one state machine with no I/O.
///
/// The rules (``CoordinationRules``) decide who is granted. This adds what the center
/// remembers of a request that is not simply granted: while it waits here, its owner, its
/// intents and (once its task has parked) the task's waiter; a withdrawal its task has not
/// yet learned of; after the grant, the wait for other processes' kernel locks. A request
/// granted at once has no entry, so the uncontended path adds nothing to a dictionary.
///
/// A step that can end waits returns the waiters to resume; the center takes each step
/// under its lock and resumes them outside it. `Waiter` is the center's continuation (a
/// value in tests).
struct CenterRequests<Waiter> {
    typealias RequestID = CoordinationRules.RequestID
    typealias Claim = CoordinationRules.Claim
    typealias Intents = [(FilePath, FileAccessIntent)]

    enum Phase {
        /// Waiting here for claims of this process's other requests; `parked` once its
        /// task gave its waiter.
        case waiting(owner: ObjectIdentifier, intents: Intents, parked: Waiter?)
        /// Withdrawn before its task parked: the error that task throws when it does.
        case withdrawn(any Error)
        /// Granted here, taking its claims from other processes (waiting while one holds).
        case takingKernelClaims(owner: ObjectIdentifier, claims: [Claim])
    }

    /// What parking a waiting request's task found.
    enum Parked {
        /// Granted in between: resume the task at once.
        case granted
        /// Still waiting: the waiter is kept, and a later step returns it.
        case waiting
        /// Withdrawn in between: resume the task with this error.
        case failed(any Error)
    }

    /// Waiters to resume after a step: `granted` normally, `failed` with their error.
    struct Resumptions {
        var granted: [Waiter] = []
        var failed: [(Waiter, any Error)] = []
    }

    private(set) var rules = CoordinationRules()
    private var phases: [RequestID: Phase] = [:]

    /// Requests with an entry here (for tests: zero once everything ended).
    var trackedCount: Int { phases.count }

    // MARK: Steps

    /// Submits `claims`; a request not granted at once waits, with its owner and intents.
    mutating func submit(_ claims: [Claim], purpose: String, owner: ObjectIdentifier,
                         intents: Intents = []) -> (id: RequestID, granted: Bool) {
        let id = rules.reserveID()
        let granted = rules.submit(id, purpose: purpose, claims: claims)
        if !granted { phases[id] = .waiting(owner: owner, intents: intents, parked: nil) }
        return (id, granted)
    }

    /// Grants `claims` only if that needs no waiting here; nil otherwise, with nothing
    /// kept. The waiters returned were behind the withdrawn request (none in practice: it
    /// was last in line), and are resumed all the same.
    mutating func submitIfFree(_ claims: [Claim], purpose: String) -> (id: RequestID?, unblocked: [Waiter]) {
        let id = rules.reserveID()
        if rules.submit(id, purpose: purpose, claims: claims) { return (id, []) }
        return (nil, grant(rules.withdraw(id)))
    }

    /// A waiting request's task gives its waiter.
    mutating func park(_ id: RequestID, _ waiter: Waiter) -> Parked {
        switch phases[id] {
        case .waiting(let owner, let intents, nil):
            phases[id] = .waiting(owner: owner, intents: intents, parked: waiter)
            return .waiting
        case .withdrawn(let error):
            phases[id] = nil
            return .failed(error)
        case nil where rules.isGranted(id):
            return .granted
        case .waiting(_, _, .some), .takingKernelClaims, nil:
            // Parked twice, or after its grant was taken: a defect of the center. Failing
            // the task beats a task that waits for ever.
            assertionFailure("request \(id) parked twice, or after its grant was taken")
            return .failed(CancellationError())
        }
    }

    /// Withdraws a request still waiting here (cancellation): its task fails with `error`,
    /// now if parked, else when it parks. A granted request is left alone: its accessor
    /// runs, then releases it.
    mutating func withdraw(_ id: RequestID, because error: any Error) -> Resumptions {
        guard case .waiting(_, _, let parked) = phases[id] else { return Resumptions() }
        var resumptions = Resumptions()
        if let parked {
            phases[id] = nil
            resumptions.failed = [(parked, error)]
        } else {
            phases[id] = .withdrawn(error)
        }
        resumptions.granted = grant(rules.withdraw(id))
        return resumptions
    }

    /// Ends a granted request; returns the parked waiters its end grants.
    mutating func release(_ id: RequestID) -> [Waiter] {
        // The usual release has no entry anywhere: no hashing then.
        if !phases.isEmpty { phases[id] = nil }
        return grant(rules.release(id))
    }

    /// ``CoordinationRules/yield(_:to:)``: the parked waiters it grants.
    mutating func yield(_ id: RequestID, to purposes: Set<String>) -> [Waiter] {
        grant(rules.yield(id, to: purposes))
    }

    /// The grant of a request is waiting for other processes' kernel locks.
    mutating func beginTakingKernelClaims(_ id: RequestID, _ claims: [Claim], owner: ObjectIdentifier) {
        phases[id] = .takingKernelClaims(owner: owner, claims: claims)
    }

    /// The kernel locks are taken, or the attempt failed (the caller then releases).
    mutating func endTakingKernelClaims(_ id: RequestID) {
        if case .takingKernelClaims = phases[id] { phases[id] = nil }
    }

    /// Records a move: waiting claims and intents follow the item. Returns the intents
    /// to update, with their new paths.
    mutating func move(from source: FilePath, to destination: FilePath) -> [(FileAccessIntent, FilePath)] {
        var updates: [(FileAccessIntent, FilePath)] = []
        for id in rules.move(from: source, to: destination) {
            guard case .waiting(let owner, var intents, let parked) = phases[id], !intents.isEmpty else { continue }
            for index in intents.indices where intents[index].0.starts(with: source) {
                let newPath = PresenterRegistry.rebase(intents[index].0, from: source, to: destination)
                intents[index].0 = newPath
                updates.append((intents[index].1, newPath))
            }
            phases[id] = .waiting(owner: owner, intents: intents, parked: parked)
        }
        return updates
    }

    /// Parked waiters of requests just granted; their entries go (granted: none kept).
    private mutating func grant(_ ids: [RequestID]) -> [Waiter] {
        ids.compactMap { id in
            guard case .waiting(_, _, let parked) = phases.removeValue(forKey: id) else { return nil }
            return parked
        }
    }

    // MARK: Questions

    /// Requests of `owner` waiting here, and those taking their kernel locks
    /// (``FileCoordinator/cancel()`` ends both).
    func requests(of owner: ObjectIdentifier) -> (waiting: [RequestID], takingKernelClaims: [RequestID]) {
        var waiting: [RequestID] = [], kernel: [RequestID] = []
        for (id, phase) in phases {
            switch phase {
            case .waiting(let o, _, _) where o == owner: waiting.append(id)
            case .takingKernelClaims(let o, _) where o == owner: kernel.append(id)
            default: break
            }
        }
        return (waiting.sorted(), kernel.sorted())
    }

    /// The claims held (granted here and in the kernel) and waited for (here, or for
    /// another process), for `status`.
    var statusClaims: (held: [Claim], waiting: [Claim]) {
        var held: [Claim] = [], waiting = rules.waitingClaims
        for id in rules.grantedIDs {
            if case .takingKernelClaims(_, let claims) = phases[id] { waiting += claims } else { held += rules.claims(of: id) }
        }
        return (held, waiting)
    }
}
