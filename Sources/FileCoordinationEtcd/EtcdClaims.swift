import FileCoordination
import AsyncFileIO
import Foundation
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The space's keys.
struct EtcdKeys: Sendable {
    /// `<prefix>/`
    let base: [UInt8]
    /// This process's name in the space: its lease in 16 hex digits.
    let memberName: String

    init(prefix: String, member: Int64) {
        base = Array(prefix.utf8) + [UInt8(ascii: "/")]
        memberName = Self.hex(UInt64(bitPattern: member))
    }

    var members: [UInt8] { base + Array("members/".utf8) }
    var member: [UInt8] { members + Array(memberName.utf8) }
    var claims: [UInt8] { base + Array("claims/".utf8) }
    func claim(_ id: UInt64) -> [UInt8] { claims + Array("\(memberName)/\(Self.hex(id))".utf8) }

    /// The member that wrote a key under `claims/` (or another per-member folder).
    func memberName(of key: [UInt8], under folder: [UInt8]) -> String? {
        guard key.starts(with: folder) else { return nil }
        return String(decoding: key.dropFirst(folder.count).prefix { $0 != UInt8(ascii: "/") }, as: UTF8.self)
    }

    static func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}

/// A member key's value.
struct EtcdMember: Codable, Sendable {
    var host: String
    var pid: Int32
    /// The member's root, base64 of its bytes.
    var root: String
}

/// A claim key's value: one request's items in the space (names relative to the root).
struct EtcdClaimRecord: Codable, Sendable {
    struct Item: Codable, Sendable {
        /// base64 of the name's bytes (names need not be UTF-8).
        var path: String
        var write: Bool
        var subtree: Bool
    }
    var host: String
    var pid: Int32
    var items: [Item]

    var claims: [CoordinationRules.Claim] {
        items.map { CoordinationRules.Claim(key: PathKey(EtcdJSON.bytes($0.path)), access: $0.write ? .writing : .reading,
                                            scope: $0.subtree ? .subtree : .item) }
    }
}

/// First come, first served across hosts, as a pure function: a request waits for every
/// earlier request (by create revision) of another process that conflicts with it.
/// Requests of the same process were already ordered by its own rules.
enum EtcdClaimOrder {
    struct Entry: Sendable {
        var key: [UInt8]
        var member: String
        var revision: Int64
        var claims: [CoordinationRules.Claim]
    }

    /// The keys of the entries that `claims` (created at `revision` by `member`) waits for.
    static func blockers(of claims: [CoordinationRules.Claim], revision: Int64, member: String,
                         among entries: [Entry]) -> Set<[UInt8]> {
        var blockers: Set<[UInt8]> = []
        for entry in entries where entry.revision < revision && entry.member != member {
            if entry.claims.contains(where: { theirs in claims.contains { CoordinationRules.conflict($0, theirs) } }) {
                blockers.insert(entry.key)
            }
        }
        return blockers
    }
}

extension EtcdCoordinationSpace {
    /// The claims as named in the space. Throws for a path outside the root.
    func shared(_ claims: [CoordinationRules.Claim]) throws -> [CoordinationRules.Claim] {
        try claims.map { claim in
            guard let name = names.shared(claim.key.bytes) else {
                throw FileCoordinationError(.coordinate, code: .invalidArgument, path: claim.path, message: "outside the coordination space's root \(configuration.root)")
            }
            return CoordinationRules.Claim(key: PathKey(name), access: claim.access, scope: claim.scope)
        }
    }

    /// The claim entries of a range over `claims/`.
    func entries(_ kvs: [EtcdJSON.KeyValue]) -> [EtcdClaimOrder.Entry] {
        kvs.compactMap { kv in
            let key = kv.keyBytes
            guard let member = keys.memberName(of: key, under: keys.claims),
                  let record = try? EtcdJSON.decode(EtcdClaimRecord.self, kv.valueBytes) else { return nil }
            return EtcdClaimOrder.Entry(key: key, member: member, revision: kv.createRevision, claims: record.claims)
        }
    }

    /// Puts the request's key and reads every claim in one transaction, then waits for
    /// the earlier conflicting ones to be deleted (the process's watch stream tells).
    func take(_ claims: [CoordinationRules.Claim], for id: UInt64, whenWaiting: @Sendable () -> Void = {}) async throws {
        if let why = state.withLock({ $0.lostBecause }) { throw lostError(why, path: claims.first?.path) }
        let named = try shared(claims)
        let key = keys.claim(id)
        let record = EtcdClaimRecord(host: host, pid: getpid(), items: named.map {
            .init(path: EtcdJSON.base64($0.key.bytes), write: $0.access == .writing, subtree: $0.scope == .subtree)
        })
        var transaction = EtcdJSON.TxnRequest()
        transaction.success = [
            .init(request_put: EtcdJSON.PutRequest(key: key, value: try EtcdJSON.encode(record), lease: leaseID)),
            .init(request_range: EtcdJSON.RangeRequest(key: keys.claims, prefix: true)),
        ]
        // Deletions the stream brings while the transaction is under way count for it.
        state.withLock { $0.waits.transactionStarts(id) }
        let answer: EtcdJSON.TxnResponse
        do {
            answer = try await client.call("/v3/kv/txn", transaction, as: EtcdJSON.TxnResponse.self)
        } catch {
            state.withLock { $0.waits.transactionFailed(id) }
            // It may have reached etcd before the connection failed: the key must not stay.
            release(key)
            guard let failure = error as? EtcdFailure else { throw error }
            throw Self.error(failure, operation: .coordinate, endpoints: configuration.endpoints)
        }
        let kvs = answer.responses?.last?.response_range?.kvs ?? []
        let all = entries(kvs)
        guard let mine = all.first(where: { $0.key == key }) else {
            state.withLock { $0.waits.transactionFailed(id) }
            throw FileCoordinationError(.coordinate, code: .io, path: claims.first?.path, message: "etcd did not keep this process's claim (its lease may be gone)")
        }
        let found = EtcdClaimOrder.blockers(of: named, revision: mine.revision, member: keys.memberName, among: all)
        let waits = state.withLock { state -> Bool in
            guard !state.waits.transactionDone(id, found: found).isEmpty else { return false }
            state.waiting[id] = Waiting()
            return true
        }
        if waits {
            do {
                // A wait needs the stream: while it is down, none starts.
                guard hub.isAvailable else {
                    state.withLock { state in
                        state.waits.forget(id)
                        state.waiting[id] = nil
                    }
                    throw Self.error(.connection(client.endpoints[0], "the watch on the space is down"), operation: .coordinate,
                                     endpoints: configuration.endpoints)
                }
                // The claim timeout counts from here (`FileCoordinator.setClaimTimeout`).
                whenWaiting()
                try await wait(id)
            } catch {
                release(key)
                throw error
            }
        }
        state.withLock { $0.held[id] = (key, mine.revision) }
    }

    /// Suspends until request `id`'s wait (recorded in `waiting`) ends.
    private func wait(_ id: UInt64) async throws {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let ready: Result<Void, any Error>? = state.withLock { state in
                    func end(_ error: any Error) -> Result<Void, any Error> {
                        state.waits.forget(id)
                        state.waiting[id] = nil
                        return .failure(error)
                    }
                    if state.cancelled.remove(id) != nil { return end(FileCoordinationError.coordinatorCancelled()) }
                    // Cancelled before it got here (during the transaction, say).
                    if state.cancelledTasks.remove(id) != nil || Task.isCancelled { return end(CancellationError()) }
                    guard let waiting = state.waiting[id] else { return .failure(lostError(state.lostBecause ?? "the wait ended")) }
                    if let outcome = waiting.outcome {
                        state.waiting[id] = nil
                        return outcome
                    }
                    state.waiting[id]!.continuation = continuation
                    return nil
                }
                if let ready { continuation.resume(with: ready) }
            }
        } onCancel: {
            let registered = state.withLock { state -> Bool in
                if state.waiting[id] != nil { return true }
                state.cancelledTasks.insert(id)
                return false
            }
            if registered { finishWait(id, .failure(CancellationError())) }
        }
        state.withLock { _ = $0.cancelledTasks.remove(id) }
    }

    /// Deletes a claim's key, trying again (every half second, on the client's thread)
    /// while etcd cannot be reached and the lease lives: a key left behind would keep
    /// other hosts' conflicting requests waiting until the lease ends.
    func release(_ key: [UInt8]) {
        client.send("/v3/kv/deleterange", EtcdJSON.DeleteRangeRequest(key: key)) { [weak self] in
            guard let self, state.withLock({ $0.lostBecause == nil }) else { return false }
            return true
        }
    }

    /// The route of deletions under `claims/` on the process's stream, for every wait.
    func watchClaims() {
        _ = hub.add(EtcdWatchHub.Route(prefix: keys.claims, events: .deletions) { [weak self] events in
            self?.deleted(events.compactMap { $0.kv?.keyBytes })
        } failed: { [weak self] failure in
            guard let self else { return }
            // Deletions may be lost meanwhile: every wait fails, as its own watch would have.
            let waiting = state.withLock { $0.waiting.keys.sorted() }
            let error = Self.error(failure, operation: .coordinate, endpoints: configuration.endpoints)
            for id in waiting { finishWait(id, .failure(error)) }
        } missed: { [weak self] in
            self?.recheckWaits()
        })
    }

    /// Deletions were compacted away before the stream saw them: the claims are read
    /// again, and every key waited for that is gone counts as deleted (a claim key is
    /// never made again). If they cannot be read, every wait fails, as in an outage.
    private func recheckWaits() {
        Task { [self] in
            let answer: EtcdJSON.RangeResponse
            do {
                answer = try await client.call("/v3/kv/range", EtcdJSON.RangeRequest(key: keys.claims, prefix: true),
                                               as: EtcdJSON.RangeResponse.self)
            } catch {
                let failure = error as? EtcdFailure ?? .connection(client.endpoints[0], "the claims could not be read again")
                let failed = Self.error(failure, operation: .coordinate, endpoints: configuration.endpoints)
                for id in state.withLock({ $0.waiting.keys.sorted() }) { finishWait(id, .failure(failed)) }
                return
            }
            let present = Set((answer.kvs ?? []).compactMap { $0.keyBytes })
            let done = state.withLock { state in state.waits.deleted(state.waits.blockingKeys.filter { !present.contains($0) }) }
            for id in done { finishWait(id, .success(())) }
        }
    }

    /// On the stream's thread: keys deleted; each wait whose last blocker went ends.
    private func deleted(_ keys: [[UInt8]]) {
        let done = state.withLock { $0.waits.deleted(keys) }
        for id in done { finishWait(id, .success(())) }
    }

    /// Ends request `id`'s wait, once, with `outcome`: resumes its task, or keeps the
    /// outcome for it when it is not suspended yet.
    func finishWait(_ id: UInt64, _ outcome: Result<Void, any Error>) {
        let continuation = state.withLock { state -> CheckedContinuation<Void, any Error>? in
            guard let waiting = state.waiting[id], waiting.outcome == nil else { return nil }
            state.waits.forget(id)
            if let continuation = waiting.continuation {
                state.waiting[id] = nil
                return continuation
            }
            state.waiting[id]!.outcome = outcome
            return nil
        }
        continuation?.resume(with: outcome)
    }
}

/// The etcd space as the center's transport. Claims always take a round trip to etcd
/// (``takeClaimsNow(_:for:)`` says no, so the center awaits ``takeClaims(_:for:whenWaiting:)``).
extension EtcdCoordinationSpace: CoordinationTransport {
    package func takeClaimsNow(_ claims: [CoordinationRules.Claim], for id: UInt64) -> Bool { false }

    package func takeClaims(_ claims: [CoordinationRules.Claim], for id: UInt64, whenWaiting: @escaping @Sendable () -> Void) async throws {
        defer { state.withLock { _ = $0.cancelled.remove(id) } }
        try await take(claims, for: id, whenWaiting: whenWaiting)
    }

    package func batchCanTake(_ claims: [CoordinationRules.Claim]) -> Bool { false }
    package func takeClaimsForBatch(_ claims: [CoordinationRules.Claim], for id: UInt64, opening: Bool) -> Bool { false }
    package var takesClaimsForBatch: Bool { false }

    package func cancelWaiting(for id: UInt64) {
        let waiting = state.withLock { state -> Bool in
            if state.waiting[id] != nil { return true }
            state.cancelled.insert(id)
            return false
        }
        if waiting { finishWait(id, .failure(FileCoordinationError.coordinatorCancelled())) }
    }

    package func releaseClaims(of id: UInt64) {
        guard let held = state.withLock({ $0.held.removeValue(forKey: id) }) else { return }
        release(held.key)
    }

    package var fencesClaims: Bool { true }

    package func accessorStarts(_ id: UInt64, task: AccessorTask) {
        running.withLock { running in
            if running.lost { task.cancel() }
            running.tasks[id] = task
        }
    }

    package func accessorEnds(_ id: UInt64) async -> Bool {
        // Once this returns, the task may end: it is not cancelled after.
        let lost = running.withLock { running -> Bool in
            running.tasks[id] = nil
            return running.lost
        }
        if lost { return false }
        // Renewed within the TTL: surely held. Else (a slow election, a pause) etcd says.
        return keeper.holdsNow ? true : await keeper.confirm()
    }

    package func fencingToken(of id: UInt64) -> Int64? { state.withLock { $0.held[id]?.revision } }

    package func prepareForBatch() async throws -> Bool { true }
    package func readsFitting(_ paths: some Collection<[UInt8]>) -> Int? { nil }

    package var otherPresentersAreCurrent: Bool { mail.isCurrent }
    package func refreshOtherPresenters() async { await mail.refresh() }
    package var otherPresenterCount: Int { mail.remoteCount }
    package func otherPresentersConcern(_ key: PathKey) -> Bool { mail.concernsAny(key) }
    package func otherPresenters(for path: FilePath, subtree: Bool) -> PresenterRegistry.Concerned {
        mail.presenters(for: path, subtree: subtree)
    }
    package func moveOtherPresenters(from source: FilePath, to destination: FilePath) -> [PresenterRegistry.Moved] {
        mail.move(from: source, to: destination)
    }
    package func publish(_ presenter: any FilePresenter, at path: FilePath) async -> Bool { await mail.register(presenter, at: path) }
    package func withdraw(_ presenter: any FilePresenter) async { await mail.unregister(presenter) }
    package func messagesWritten() async { await client.barrier() }
    package func leave() async { await leaveSpace() }
}

extension EtcdCoordinationSpace {
    /// The claims and presenters of every host in the space, read in one transaction;
    /// paths as this process's root names them. A claim is held when no earlier
    /// conflicting request of another process stands before it, else waiting.
    public func status() async throws -> CoordinationSpace.Status {
        var transaction = EtcdJSON.TxnRequest()
        transaction.success = [
            .init(request_range: EtcdJSON.RangeRequest(key: keys.members, prefix: true)),
            .init(request_range: EtcdJSON.RangeRequest(key: keys.claims, prefix: true)),
            .init(request_range: EtcdJSON.RangeRequest(key: mail.presentersFolder, prefix: true)),
        ]
        let answer: EtcdJSON.TxnResponse
        do {
            answer = try await client.call("/v3/kv/txn", transaction, as: EtcdJSON.TxnResponse.self)
        } catch let failure as EtcdFailure {
            throw Self.error(failure, operation: .status, endpoints: configuration.endpoints)
        }
        let ranges = answer.responses ?? []
        var members: [String: EtcdMember] = [:]
        for kv in ranges.first?.response_range?.kvs ?? [] {
            guard let name = keys.memberName(of: kv.keyBytes, under: keys.members),
                  let member = try? EtcdJSON.decode(EtcdMember.self, kv.valueBytes) else { continue }
            members[name] = member
        }
        let kvs = ranges.count > 1 ? ranges[1].response_range?.kvs ?? [] : []
        let all = entries(kvs)
        var status = CoordinationSpace.Status()
        for entry in all {
            let member = members[entry.member]
            let waiting = !EtcdClaimOrder.blockers(of: entry.claims, revision: entry.revision, member: entry.member, among: all).isEmpty
            for claim in entry.claims {
                let shown = CoordinationSpace.Status.Claim(path: names.local(claim.key.bytes), isWrite: claim.access == .writing,
                                                           processIdentifier: member?.pid ?? 0, host: member?.host)
                if waiting { status.waiting.append(shown) } else { status.claims.append(shown) }
            }
        }
        for kv in ranges.count > 2 ? ranges[2].response_range?.kvs ?? [] : [] {
            guard let record = try? EtcdJSON.decode(EtcdMail.PresenterRecord.self, kv.valueBytes) else { continue }
            status.presenters.append(.init(path: names.local(EtcdJSON.bytes(record.path)), processIdentifier: record.pid, host: record.host))
        }
        status.presenters.sort { ($0.path.string, $0.processIdentifier) < ($1.path.string, $1.processIdentifier) }
        status.claims.sort { ($0.path.string, $0.processIdentifier) < ($1.path.string, $1.processIdentifier) }
        status.waiting.sort { ($0.path.string, $0.processIdentifier) < ($1.path.string, $1.processIdentifier) }
        return status
    }

    /// Revokes this process's lease at once, on the calling thread, with a connection of
    /// its own: for a process about to die of a signal, so that its claims go now rather
    /// than after the lease's TTL.
    package func revokeLeaseBeforeExit() {
        keeper.stop()
        var connection: EtcdConnection?
        guard let body = try? EtcdJSON.encode(EtcdJSON.LeaseRequest(ID: String(leaseID))) else { return }
        _ = try? client.perform("/v3/lease/revoke", body, on: &connection, tryTimeout: .seconds(1), retryLimit: .seconds(1))
    }
}
