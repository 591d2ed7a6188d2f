import AsyncFileIO
import SystemPackage

/// The coordination space as the center's transport: claims are byte locks in the claim
/// shards (``SpaceLocks``), presenters and messages go through ``SpaceMail``.
extension CoordinationSpace: CoordinationTransport {
    package var address: String { directory.string }

    package func takeClaimsNow(_ claims: [CoordinationRules.Claim], for id: UInt64) -> Bool {
        guard let held = locks.tryAcquireNow(locks.cachedPlan(for: claims)) else { return false }
        hold(held, for: id)
        return true
    }

    package func takeClaims(_ claims: [CoordinationRules.Claim], for id: UInt64, whenWaiting: @escaping @Sendable () -> Void) async throws {
        // Once it waits, the record lists the wait (a process waiting in the kernel does
        // not read its mailbox, and `status` reads its record).
        hold(try await locks.acquire(locks.cachedPlan(for: claims), token: id, waits: { [weak self] in self?.claimsChanged() },
                                     parks: whenWaiting), for: id)
    }

    package func batchCanTake(_ claims: [CoordinationRules.Claim]) -> Bool {
        locks.fitsBudget(SpaceLocks.shardMask(of: SpaceLocks.plan(for: claims)))
    }

    package func takeClaimsForBatch(_ claims: [CoordinationRules.Claim], for id: UInt64, opening: Bool) -> Bool {
        // Not the one-entry plan cache: batch workers claim distinct files, and would only
        // contend for its lock.
        let plan = SpaceLocks.plan(for: claims)
        let held = opening ? locks.tryAcquireOpening(plan, mask: SpaceLocks.shardMask(of: plan)) : locks.tryAcquireNow(plan)
        guard let held else { return false }
        hold(held, for: id)
        return true
    }

    package var takesClaimsForBatch: Bool { true }

    package func cancelWaiting(for id: UInt64) {
        locks.cancel(token: id)
    }

    package func releaseClaims(of id: UInt64) {
        guard let held = heldClaims.withLock({ $0.removeValue(forKey: id) }) else { return }
        locks.release(held)
        claimsChanged()
    }

    private func hold(_ held: SpaceLocks.Held, for id: UInt64) {
        heldClaims.withLock { $0[id] = held }
        claimsChanged()
    }

    package func prepareForBatch() async throws -> Bool {
        try await locks.openAllShards()
    }

    package func readsFitting(_ paths: some Collection<[UInt8]>) -> Int? {
        locks.shardBudget < SpaceLocks.shardCount ? locks.readsFitting(paths) : nil
    }

    package var otherPresentersAreCurrent: Bool { mail.isRemoteCurrent }
    package func refreshOtherPresenters() async { await mail.refreshRemote() }
    package var otherPresenterCount: Int { mail.remoteCount }
    package func otherPresentersConcern(_ key: PathKey) -> Bool { mail.remoteConcernsAny(key) }
    package func otherPresenters(for path: FilePath, subtree: Bool) -> PresenterRegistry.Concerned {
        mail.remotePresenters(for: path, subtree: subtree)
    }
    package func moveOtherPresenters(from source: FilePath, to destination: FilePath) -> [PresenterRegistry.Moved] {
        mail.moveRemote(from: source, to: destination)
    }

    package func publish(_ presenter: any FilePresenter, at path: FilePath) async -> Bool {
        // Other processes' requests come through the mailbox: it must be watched.
        guard await startWatching() else { return false }
        await mail.register(presenter, at: path)
        return true
    }

    package func withdraw(_ presenter: any FilePresenter) async { await mail.unregister(presenter) }
    package func messagesWritten() async { await mail.flush() }
}
