@_spi(FileCoordinationInternal) import AsyncFileIO
import SystemPackage

/// The coordination space as the center's transport: claims are byte locks in the claim
/// shards (``SpaceLocks``), presenters and messages go through ``SpaceMail``.
extension CoordinationSpace: CoordinationTransport {
    var address: String { directory.string }

    func takeClaimsNow(_ claims: [CoordinationRules.Claim], for id: UInt64) -> Bool {
        guard let held = locks.tryAcquireNow(locks.cachedPlan(for: claims)) else { return false }
        hold(held, for: id)
        return true
    }

    func takeClaims(_ claims: [CoordinationRules.Claim], for id: UInt64) async throws {
        hold(try await locks.acquire(locks.cachedPlan(for: claims), token: id), for: id)
    }

    func batchCanTake(_ claims: [CoordinationRules.Claim]) -> Bool {
        locks.fitsBudget(SpaceLocks.shardMask(of: SpaceLocks.plan(for: claims)))
    }

    func takeClaimsForBatch(_ claims: [CoordinationRules.Claim], for id: UInt64, opening: Bool) -> Bool {
        // Not the one-entry plan cache: batch workers claim distinct files, and would only
        // contend for its lock.
        let plan = SpaceLocks.plan(for: claims)
        let held = opening ? locks.tryAcquireOpening(plan, mask: SpaceLocks.shardMask(of: plan)) : locks.tryAcquireNow(plan)
        guard let held else { return false }
        hold(held, for: id)
        return true
    }

    var takesClaimsForBatch: Bool { true }

    func cancelWaiting(for id: UInt64) {
        locks.cancel(token: id)
    }

    func releaseClaims(of id: UInt64) {
        guard let held = heldClaims.withLock({ $0.removeValue(forKey: id) }) else { return }
        locks.release(held)
        claimsChanged()
    }

    private func hold(_ held: SpaceLocks.Held, for id: UInt64) {
        heldClaims.withLock { $0[id] = held }
        claimsChanged()
    }

    func prepareForBatch() async throws -> Bool {
        try await locks.openAllShards()
    }

    func readsFitting(_ paths: some Collection<[UInt8]>) -> Int? {
        locks.shardBudget < SpaceLocks.shardCount ? locks.readsFitting(paths) : nil
    }

    var otherPresentersAreCurrent: Bool { mail.isRemoteCurrent }
    func refreshOtherPresenters() async { await mail.refreshRemote() }
    var otherPresenterCount: Int { mail.remoteCount }
    func otherPresentersConcern(_ key: PathKey) -> Bool { mail.remoteConcernsAny(key) }
    func otherPresenters(for path: FilePath, subtree: Bool) -> PresenterRegistry.Concerned {
        mail.remotePresenters(for: path, subtree: subtree)
    }
    func moveOtherPresenters(from source: FilePath, to destination: FilePath) -> [PresenterRegistry.Moved] {
        mail.moveRemote(from: source, to: destination)
    }

    func publish(_ presenter: any FilePresenter, at path: FilePath) async -> Bool {
        // Other processes' requests come through the mailbox: it must be watched.
        guard await startWatching() else { return false }
        await mail.register(presenter, at: path)
        return true
    }

    func withdraw(_ presenter: any FilePresenter) async { await mail.unregister(presenter) }
    func messagesWritten() async { await mail.flush() }
}
