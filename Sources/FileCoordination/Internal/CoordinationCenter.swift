import AsyncFileIO
import Foundation
import Logging
import Synchronization
import SystemPackage

/// The process-wide side of coordination: the rules, the tasks waiting for claims, and
/// the registered presenters. Every ``FileCoordinator`` in the process talks to the one
/// shared center, which is what makes coordinators exclude each other.
///
/// The rules (``CoordinationRules``) decide; the center carries out: it resumes the
/// waiting tasks the rules granted, always outside its lock.
package final class CoordinationCenter: Sendable {
    package static let shared = CoordinationCenter()

    typealias RequestID = CoordinationRules.RequestID

    /// A task waiting for its claims: resumed when they are granted, or with an error.
    typealias Waiter = UnsafeContinuation<Void, any Error>

    struct State {
        /// Every request from submission to release: the rules and what waits on them.
        var requests = CenterRequests<Waiter>()
        var presenters = PresenterRegistry()
        /// Tasks in ``waitUntilWaiting(_:)``, with the count each waits for.
        var waitingWatchers: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
        /// Items another process's coordination holds while it waits for a presenter of
        /// this process to save them (``lend(_:_:)``).
        var lent: [Lent] = []
    }

    let state = Locked(State())
    /// Registered presenters, readable without the lock (the fast path's question).
    let presenterCount = Atomic<Int>(0)
    /// A transport of this center's own, in place of the process's space (tests).
    private let ownTransport: (any CoordinationTransport)?
    /// Where claims and presenters' answers are counted.
    let metrics: CoordinationMetrics

    /// A center; with `transport`, it reaches other processes through that one only;
    /// with `metrics`, it counts in a set of its own (tests).
    init(transport: (any CoordinationTransport)? = nil, metrics: CoordinationMetrics = .standard) {
        ownTransport = transport
        self.metrics = metrics
    }

    /// Whether any presenter is registered, in this process or (as last read) another.
    var hasPresenters: Bool {
        presenterCount.load(ordering: .acquiring) > 0 || (transport?.otherPresenterCount ?? 0) > 0
    }

    /// Whether an item access at the path with these bytes concerns any presenter (of
    /// the item, or of a directory containing it): the fast path's question.
    func hasPresenters(concerning key: PathKey) -> Bool {
        guard hasPresenters else { return false }
        if state.withLock({ $0.presenters.concernsAny(key) }) { return true }
        guard let transport, transport.otherPresenterCount > 0 else { return false }
        return transport.otherPresentersConcern(key)
    }

    // MARK: The coordination space

    private enum SpaceSetting {
        case automatic
        case joining(Task<any CoordinationTransport, any Error>)
        case joined(any CoordinationTransport)
        case local
    }

    /// One space per process, whatever the number of centers (tests make private ones):
    /// the kernel sees one owner per process, and the process counts its tasks' claims.
    private static let spaceSetting = Locked(SpaceSetting.automatic)

    /// The space joined, if any (no waiting).
    package var joinedTransport: (any CoordinationTransport)? {
        Self.spaceSetting.withLock { if case .joined(let space) = $0 { space } else { nil } }
    }

    /// The local space joined, if any (no waiting).
    var joinedSpace: CoordinationSpace? { joinedTransport as? CoordinationSpace }

    /// How this process reaches the others, once it has joined them (no waiting). The
    /// center goes through this protocol only; `spaceSetting` chooses the transport.
    var transport: (any CoordinationTransport)? { ownTransport ?? joinedTransport }

    /// Returns once every message this process posted to other processes' presenters (a
    /// `reacquire` above all) is written.
    func messagesWritten() async {
        await transport?.messagesWritten()
    }

    /// The space named by the environment: `FILECOORD_SPACE` as the address of a kind of
    /// space registered (``SpaceKinds``: the etcd space's `etcd://`), else the local default.
    static func joinDefault() async throws -> any CoordinationTransport {
        let hooks = spaceHooks
        if let named = environmentVariable("FILECOORD_SPACE"), let join = try SpaceKinds.joiner(for: named) {
            return try await join(named, ProcessInfo.processInfo.environment, hooks)
        }
        return try await CoordinationSpace.join(CoordinationSpace.defaultDirectory(), hooks: hooks)
    }

    /// The space to coordinate through: joins the default one on first use, unless the
    /// process chose to stay local.
    func space(isolation: isolated (any Actor)? = #isolation) async throws -> (any CoordinationTransport)? {
        if let ownTransport { return ownTransport }
        enum Next { case ready((any CoordinationTransport)?), wait(Task<any CoordinationTransport, any Error>) }
        let next: Next = Self.spaceSetting.withLock { setting in
            switch setting {
            case .joined(let space): return .ready(space)
            case .local: return .ready(nil)
            case .joining(let task): return .wait(task)
            case .automatic:
                // On the I/O threads: a blocking form waits for it from a pool thread.
                let task = Task(executorPreference: ioThreadTaskExecutor) { try await Self.joinDefault() }
                setting = .joining(task)
                return .wait(task)
            }
        }
        switch next {
        case .ready(let space): return space
        case .wait(let task):
            do {
                let space = try await task.value
                Self.spaceSetting.withLock { setting in
                    if case .joining = setting { setting = .joined(space) }
                }
                return space
            } catch {
                Self.spaceSetting.withLock { setting in
                    if case .joining = setting { setting = .automatic }
                }
                throw error
            }
        }
    }

    /// Joins the space that `join` makes (leaving the current one).
    package func join<Space: CoordinationTransport>(_ join: (SpaceHooks) async throws -> Space) async throws -> Space {
        let space = try await join(Self.spaceHooks)
        let previous = Self.spaceSetting.withLock { setting -> (any CoordinationTransport)? in
            defer { setting = .joined(space) }
            if case .joined(let old) = setting { return old }
            return nil
        }
        await previous?.leave()
        for (presenter, path) in state.withLock({ $0.presenters.entries }) { _ = await space.publish(presenter, at: path) }
        return space
    }

    /// ``SpaceHooks/rejoin``: the space `join` makes replaces `lost` if `lost` is still
    /// the process's space (not left, not replaced meanwhile).
    static func replace(_ lost: any CoordinationTransport,
                                with join: @Sendable (SpaceHooks) async throws -> any CoordinationTransport) async throws -> Bool {
        func isCurrent(_ setting: SpaceSetting) -> Bool {
            if case .joined(let current) = setting { current === lost } else { false }
        }
        guard spaceSetting.withLock({ isCurrent($0) }) else { return false }
        let space = try await join(spaceHooks)
        let replaced = spaceSetting.withLock { setting in
            defer { if isCurrent(setting) { setting = .joined(space) } }
            return isCurrent(setting)
        }
        await (replaced ? lost : space).leave()
        guard replaced else { return false }
        for (presenter, path) in shared.state.withLock({ $0.presenters.entries }) { _ = await space.publish(presenter, at: path) }
        return true
    }

    /// Coordinates within this process only from now on.
    func leaveSpace() async {
        let previous = Self.spaceSetting.withLock { setting -> (any CoordinationTransport)? in
            defer { setting = .local }
            if case .joined(let old) = setting { return old }
            return nil
        }
        await previous?.leave()
    }

    /// Where coordinations go now: a transport ready or not, or undecided (the default
    /// space not joined yet, or being joined).
    private enum SpaceNow { case local, joined(any CoordinationTransport), undecided }

    private var spaceNow: SpaceNow {
        ownTransport.map { .joined($0) } ?? Self.spaceSetting.withLock { setting -> SpaceNow in
            switch setting {
            case .local: .local
            case .joined(let space): .joined(space)
            case .automatic, .joining: .undecided
            }
        }
    }

    /// Whether ``prepareSpace()`` has nothing to do, answered with no suspension point
    /// (a coordination's fast path calls no async function for it): staying local, or
    /// joined with the registry unchanged since it was last read.
    var spaceIsPrepared: Bool {
        switch spaceNow {
        case .local: true
        case .joined(let transport): transport.otherPresentersAreCurrent
        case .undecided: false
        }
    }

    /// Before a coordination: the space joined and other processes' presenters current.
    func prepareSpace(isolation: isolated (any Actor)? = #isolation) async throws {
        let now = spaceNow
        switch now {
        case .local:
            return
        case .joined(let joined):
            if joined.otherPresentersAreCurrent { return }
            await joined.refreshOtherPresenters()
            return
        case .undecided:
            break
        }
        guard let transport: any CoordinationTransport = try await space() else { return }
        await transport.refreshOtherPresenters()
    }

    // MARK: Claims

    /// Waits until `claims` are granted together; returns the request to release.
    /// Throws `CancellationError` if the task is cancelled while waiting, or
    /// `FileCoordinationError.Code.cancelled` if `coordinator`'s ``FileCoordinator/cancel()``
    /// is called before the claims are held.
    func acquire(_ claims: [CoordinationRules.Claim], purpose: String, coordinator: FileCoordinator,
                 intents: [(FilePath, FileAccessIntent)] = [], since generation: Int? = nil,
                 isolation: isolated (any Actor)? = #isolation) async throws -> (id: RequestID, waited: Bool) {
        switch try submit(claims, purpose: purpose, coordinator: coordinator, intents: intents, since: generation) {
        case .held(let id): (id, false)
        case .pending(let pending): try await complete(pending)
        }
    }

    /// The synchronous start of ``acquire(_:purpose:coordinator:intents:since:)``: submits the
    /// request, and when its claims are free (in this process and in the space's kernel
    /// claims) holds them with no suspension point, so that an uncontended coordination
    /// calls no async function to take them. `since`: the coordinator's cancellations
    /// when the coordination began (a `cancel()` since, while its path resolved, ends it
    /// here: that cancel's look for requests to end came before this one existed).
    func submit(_ claims: [CoordinationRules.Claim], purpose: String, coordinator: FileCoordinator,
                intents: [(FilePath, FileAccessIntent)] = [], since generation: Int? = nil) throws -> Submitted {
        try Task.checkCancellation()
        let owner = ObjectIdentifier(coordinator)
        // Read before the request exists: a cancel() from here on is one this request must heed.
        let cancellations = generation ?? coordinator.cancellations.load(ordering: .relaxed)
        // Fast path: free claims are granted under the lock, with no suspension. A cancel()
        // counts before it looks for requests under the lock: looked at under the lock, a
        // count unchanged means that look will find this request.
        let submitted = state.withLock { state -> (RequestID, Bool, Bool, [CheckedContinuation<Void, Never>])? in
            guard coordinator.cancellations.load(ordering: .relaxed) == cancellations else { return nil }
            let (id, granted) = state.requests.submit(claims, purpose: purpose, owner: owner, intents: intents)
            let covered = granted && Lent.cover(&state.lent, claims, purpose: purpose, id: id)
            return (id, granted, covered, granted || state.waitingWatchers.isEmpty ? [] : Self.takeWatchers(from: &state))
        }
        guard let (id, granted, covered, watchers) = submitted else {
            throw FileCoordinationError.coordinatorCancelled(path: claims.first?.path)
        }
        for watcher in watchers { watcher.resume() }
        if granted, covered || transport?.takeClaimsNow(claims, for: id.raw) ?? true {
            Self.trace("claim granted", id, claims, level: .trace)
            metrics.granted(claims, waited: .zero)
            return .held(id)
        }
        return .pending(Pending(id: id, claims: claims, coordinator: coordinator, granted: granted, cancellations: cancellations,
                                since: .now))
    }

    /// Waits for a request ``submit(_:purpose:coordinator:intents:since:)`` could not hold.
    func complete(_ pending: Pending, isolation: isolated (any Actor)? = #isolation) async throws -> (id: RequestID, waited: Bool) {
        let (id, claims, coordinator, cancellations) = (pending.id, pending.claims, pending.coordinator, pending.cancellations)
        if pending.granted {
            // Free here; another process holds a kernel claim.
            try await takeKernelClaims(id, claims, coordinator: coordinator, since: cancellations)
            Self.trace("claim granted", id, claims, level: .trace)
            metrics.granted(claims, waited: .now - pending.since)
            return (id, false)
        }
        Self.trace("claim waits for another in this process", id, claims)
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: Waiter) in
                let parked = state.withLock { $0.requests.park(id, continuation) }
                switch parked {
                case .waiting: ClaimWait.noteWaiting()
                case .granted: continuation.resume()
                case .failed(let error): continuation.resume(throwing: error)
                }
            }
        } onCancel: {
            withdraw(id, because: CancellationError())
        }
        // As they are now: a coordinator that moved an item while this request waited
        // moved its claims too (``CoordinationRules/move(from:to:)``), and other processes
        // must meet them where the item is.
        let (current, covered) = state.withLock { state in
            let current = state.requests.rules.claims(of: id)
            return (current, Lent.cover(&state.lent, current, purpose: state.requests.rules.purpose(of: id), id: id))
        }
        if !covered, let transport, !transport.takeClaimsNow(current, for: id.raw) {
            try await takeKernelClaims(id, current, coordinator: coordinator, since: cancellations)
        }
        Self.trace("claim granted after waiting", id, current)
        metrics.granted(current, waited: .now - pending.since)
        return (id, true)
    }

    /// A debug line for a claim's step ("why is my write blocked"); nothing is built
    /// below the debug level.
    /// A claim's step, at `debug` where it waits or waited (what a user asks "why is my
    /// write blocked" about), at `trace` for a claim granted at once.
    static func trace(_ step: @autoclosure () -> String, _ id: RequestID, _ claims: [CoordinationRules.Claim],
                      level: Logger.Level = .debug) {
        guard LibraryLogger.logs(level) else { return }
        FileCoordinator.logger.log(level: level, "\(step()) \(id): \(claims.map { "\($0.access) \($0.path)" }.joined(separator: ", "))")
    }

    /// Grants `claims` only if that needs no waiting here or in another process; nil
    /// otherwise, with nothing held. Never suspends (the batch's workers call it). With
    /// `openingShards` it may open claim shards, a blocking call: only on an I/O thread,
    /// for a process that may not keep every shard open; claims needing more shards than
    /// it may keep get nil at once.
    func tryAcquireNow(_ claims: [CoordinationRules.Claim], purpose: String, openingShards: Bool = false) -> RequestID? {
        let transport = self.transport
        if openingShards, let transport, !transport.batchCanTake(claims) { return nil }
        let (id, unblocked) = state.withLock { $0.requests.submitIfFree(claims, purpose: purpose) }
        for waiter in unblocked { waiter.resume() }
        guard let id else { return nil }
        if let transport, !transport.takeClaimsForBatch(claims, for: id.raw, opening: openingShards) {
            release(id)
            return nil
        }
        metrics.granted(claims, waited: .zero)
        return id
    }

    /// After the in-process grant, the claims other processes see, when
    /// ``CoordinationTransport/takeClaimsNow(_:for:)`` could not take them: waiting for
    /// another process, or opening claim files first. On failure the grant is given back.
    /// `since`: the coordinator's cancellations when the request was submitted.
    private func takeKernelClaims(_ id: RequestID, _ claims: [CoordinationRules.Claim], coordinator: FileCoordinator,
                                  since cancellations: Int) async throws {
        guard let transport else { return }
        state.withLock { $0.requests.beginTakingKernelClaims(id, claims, owner: ObjectIdentifier(coordinator)) }
        Self.trace("claim takes its kernel locks (opening its claim files first, or waiting for another process)", id, claims,
                   level: .trace)
        do {
            // A cancel() between the grant and the line above found no request of this
            // coordinator waiting; it is seen here. (One after it finds this request
            // taking its kernel claims, and ends that wait.)
            if coordinator.cancellations.load(ordering: .relaxed) != cancellations {
                throw FileCoordinationError.coordinatorCancelled()
            }
            try await transport.takeClaims(claims, for: id.raw, whenWaiting: ClaimWait.notifier())
            state.withLock { $0.requests.endTakingKernelClaims(id) }
        } catch {
            state.withLock { $0.requests.endTakingKernelClaims(id) }
            release(id)
            throw error
        }
    }

    /// The claims of a granted request as they stand now (after any moves while it waited).
    func claims(of id: RequestID) -> [CoordinationRules.Claim] {
        state.withLock { $0.requests.rules.claims(of: id) }
    }

    /// Ends a granted request; grants whatever was waiting for it.
    func release(_ id: RequestID) {
        if LibraryLogger.logs(.trace) { FileCoordinator.logger.trace("claim released \(id)") }
        transport?.releaseClaims(of: id.raw)
        let (granted, loanEnded) = state.withLock { state in
            (state.requests.release(id), state.lent.isEmpty ? nil : Lent.released(id, &state.lent))
        }
        for waiter in granted { waiter.resume() }
        loanEnded?.resume()
    }

    /// Fails every waiting request of `owner` (``FileCoordinator/cancel()``).
    func cancel(owner: ObjectIdentifier) {
        let (ids, kernelIDs) = state.withLock { $0.requests.requests(of: owner) }
        for id in ids {
            withdraw(id, because: FileCoordinationError.coordinatorCancelled())
        }
        // Granted here, waiting for another process: that wait ends with `.cancelled`.
        if let transport {
            for id in kernelIDs { transport.cancelWaiting(for: id.raw) }
        }
    }

    private func withdraw(_ id: RequestID, because error: any Error) {
        let resumptions = state.withLock { $0.requests.withdraw(id, because: error) }
        for (waiter, error) in resumptions.failed { waiter.resume(throwing: error) }
        for waiter in resumptions.granted { waiter.resume() }
    }

    /// Returns once `count` requests or more wait here for their claims: for tests, the
    /// moment another task is known to be blocked.
    func waitUntilWaiting(_ count: Int) async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state in
                guard state.requests.rules.waitingCount < count else { return true }
                state.waitingWatchers.append((count, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// The watchers whose count is reached, removed.
    private static func takeWatchers(from state: inout State) -> [CheckedContinuation<Void, Never>] {
        let waiting = state.requests.rules.waitingCount
        let reached = state.waitingWatchers.filter { $0.count <= waiting }.map(\.continuation)
        state.waitingWatchers.removeAll { $0.count <= waiting }
        return reached
    }

    /// Counts for tests and `status`.
    var counts: (granted: Int, waiting: Int) {
        state.withLock { ($0.requests.rules.grantedCount, $0.requests.rules.waitingCount) }
    }

    /// The claims held and waited for now (for `status`).
    func statusClaims() -> (held: [CoordinationRules.Claim], waiting: [CoordinationRules.Claim]) {
        state.withLock { $0.requests.statusClaims }
    }

    // MARK: Presenters

    /// The watch of each registered presenter's item (changes made outside coordination).
    let watches = Locked<[ObjectIdentifier: PresenterWatch]>([:])
}
