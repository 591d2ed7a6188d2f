import FileCoordination
import AsyncFileIO
import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A coordination space kept in etcd, for processes on several hosts that share a volume.
///
/// Each process holds one etcd lease, kept alive while it lives and revoked when it
/// leaves; a process that dies loses it after the lease's TTL, and its claims with it.
/// Items are named relative to the process's *root*, the local mount point of the shared
/// volume (hosts may mount it at different paths), so one item has one name in etcd:
///
/// ```
/// <prefix>/members/<lease>             the process: host, pid, root   (under its lease)
/// <prefix>/claims/<lease>/<request>    one claim request: its items and access (under its lease)
/// ```
///
/// A request is granted when no earlier request (by etcd's create revision) of another
/// process conflicts with it; it waits for those to be deleted, which the process's one
/// watch stream (``EtcdWatchHub``) tells it of. The rules
/// are the local ones (readers share, writers exclude, a subtree claim covers what is
/// inside, a request's items all together or none), and grants are first come, first
/// served. `docs/distributed.md` has the key layout, the lease and fencing rules, and what
/// happens when a part fails.
public final class EtcdCoordinationSpace: Sendable {
    /// The configuration joined with (the root made canonical).
    public let configuration: Configuration
    /// This process's lease: its identity in the space.
    public let leaseID: Int64
    /// `etcd://endpoints/prefix`.
    public let address: String

    let client: EtcdClient
    let keeper: EtcdLeaseKeeper
    let keys: EtcdKeys
    let names: EtcdNames
    let mail: EtcdMail
    let host: String
    /// Every watch of this process, on one stream.
    let hub: EtcdWatchHub
    /// What the space calls back above it (a lost lease's space is replaced through it).
    let hooks: SpaceHooks

    /// A request that waits: its task's continuation once it is suspended, or how the
    /// wait ended if that came first.
    struct Waiting {
        var continuation: CheckedContinuation<Void, any Error>?
        var outcome: Result<Void, any Error>?
    }

    struct State {
        /// The key of each request's claims, with the revision that created it (its
        /// fencing token).
        var held: [UInt64: (key: [UInt8], revision: Int64)] = [:]
        var waiting: [UInt64: Waiting] = [:]
        /// Which waiting requests wait for which keys.
        var waits = EtcdWaits()
        var cancelled: Set<UInt64> = []
        var lostBecause: String?
        var left = false
        /// Requests whose task was cancelled before their wait was recorded.
        var cancelledTasks: Set<UInt64> = []
    }
    let state = Locked(State())

    /// The tasks of accessors running under this process's claims, cancelled when the
    /// lease is lost, under a lock of their own: a task is cancelled under it, so that it
    /// cannot end meanwhile (``accessorEnds(_:)`` takes the lock before its task goes
    /// on), and no cancellation handler of an accessor takes it.
    struct Running {
        var tasks: [UInt64: AccessorTask] = [:]
        var lost = false
    }
    let running = Locked(Running())

    init(configuration: Configuration, client: EtcdClient, leaseID: Int64, host: String, grantSentAt: ContinuousClock.Instant,
         hooks: SpaceHooks) {
        self.configuration = configuration
        self.client = client
        self.leaseID = leaseID
        self.host = host
        self.hooks = hooks
        keys = EtcdKeys(prefix: configuration.prefix, member: leaseID)
        names = EtcdNames(root: configuration.root.platformBytes)
        hub = EtcdWatchHub(client: client, prefix: keys.base)
        mail = EtcdMail(client: client, hub: hub, keys: keys, names: names, leaseID: leaseID, host: host, hooks: hooks)
        address = (configuration.tls == nil ? "etcd://" : "etcds://") + configuration.endpoints.joined(separator: ",") + "/" + configuration.prefix
        keeper = EtcdLeaseKeeper(client: client, id: leaseID, ttl: configuration.leaseTTL, grantSentAt: grantSentAt)
    }

    /// Joins: a lease, and this process's member key under it. `metrics`: where its calls
    /// and a lost lease are counted (tests give a set of their own).
    ///
    /// - Throws: `FileCoordinationError` with code `.unreachable` naming the endpoints
    ///   when no member answers within the connect timeout.
    package static func join(_ given: Configuration, metrics: EtcdMetrics = .standard, hooks: SpaceHooks) async throws -> EtcdCoordinationSpace {
        var configuration = given
        guard configuration.root.isAbsolute else {
            throw FileCoordinationError(.join, code: .invalidArgument, path: configuration.root, message: "the space's root must be an absolute path")
        }
        let endpoints = configuration.endpoints.compactMap { EtcdEndpoint(Substring($0)) }
        guard !endpoints.isEmpty, endpoints.count == configuration.endpoints.count else {
            throw FileCoordinationError(.join, code: .invalidArgument, path: nil, message: "etcd endpoints must be HOST:PORT: \(configuration.endpoints.joined(separator: ","))")
        }
        let ttlSeconds = max(1, configuration.leaseTTL.components.seconds + (configuration.leaseTTL.components.attoseconds > 0 ? 1 : 0))
        configuration.leaseTTL = .seconds(ttlSeconds)
        // What may block (the root on a hung mount, loading OpenSSL and reading its files,
        // the host's name) is done on an I/O thread.
        let given = configuration
        let (root, loaded, host) = try await runOnIOThread { () -> (FilePath, Result<EtcdTLS?, EtcdTLS.Failure>, String) in
            let root = CanonicalPaths.canonicalNow(given.root.normalizedKeepingParents(), followingLast: true)
            let tls = Result { () throws(EtcdTLS.Failure) in
                try given.tls.map { settings throws(EtcdTLS.Failure) in
                    try EtcdTLS(caFile: settings.caFile?.string, certificateFile: settings.certificateFile?.string,
                                keyFile: settings.keyFile?.string)
                }
            }
            return (root, tls, ProcessInfo.processInfo.hostName)
        }
        configuration.root = root
        let tls: EtcdTLS?
        switch loaded {
        case .success(let made): tls = made
        case .failure(let error):
            // The message names the file at fault.
            throw FileCoordinationError(.join, code: .invalidArgument, path: nil, message: "TLS to etcd cannot be set up: \(error.message)")
        }
        let auth = configuration.user.map { EtcdAuth(user: $0, password: configuration.password ?? "") }
        var limits = EtcdLimits()
        limits.answerBytes = max(64 << 10, configuration.maxAnswerBytes)
        let client = EtcdClient(endpoints: endpoints, connectTimeout: configuration.connectTimeout,
                                retryLimit: configuration.connectTimeout, auth: auth, tls: tls, limits: limits, metrics: metrics)
        do {
            let grantSentAt = ContinuousClock.now
            let lease = try await client.call("/v3/lease/grant", EtcdJSON.LeaseGrantRequest(TTL: String(ttlSeconds)),
                                              as: EtcdJSON.LeaseGrantResponse.self)
            guard let id = lease.ID.flatMap(Int64.init) else {
                throw EtcdFailure.answer(EtcdAnswer(status: 200, code: nil, message: lease.error ?? "no lease granted"))
            }
            let space = EtcdCoordinationSpace(configuration: configuration, client: client, leaseID: id, host: host,
                                              grantSentAt: grantSentAt, hooks: hooks)
            space.keeper.start { [weak space] why in space?.leaseLost(why) }
            let member = EtcdMember(host: host, pid: getpid(), root: EtcdJSON.base64(configuration.root.platformBytes))
            do {
                let put = try await client.call("/v3/kv/put", EtcdJSON.PutRequest(key: space.keys.member, value: try EtcdJSON.encode(member), lease: id),
                                                as: EtcdJSON.RangeResponse.self)
                // Every watch of the process from here on, on one stream.
                space.watchClaims()
                space.hub.start(from: (EtcdJSON.revision(put.header?.revision) ?? 0) + 1)
            } catch {
                // Not joined: the lease is not kept alive, and goes.
                space.keeper.stop()
                _ = try? await client.call("/v3/lease/revoke", EtcdJSON.LeaseRequest(ID: String(id)), as: EtcdJSON.Empty.self)
                throw error
            }
            return space
        } catch let failure as EtcdFailure {
            client.close()
            throw Self.error(failure, operation: .join, endpoints: configuration.endpoints)
        } catch {
            client.close()
            throw error
        }
    }

    /// `failure` as the library's error, naming the endpoints.
    static func error(_ failure: EtcdFailure, operation: FileCoordinationError.Operation, endpoints: [String]) -> FileCoordinationError {
        switch failure {
        case .connection:
            FileCoordinationError(operation, code: .unreachable, path: nil,
                                  message: "no etcd member answered at \(endpoints.joined(separator: ",")) (\(failure))")
        case .invalid:
            FileCoordinationError(operation, code: .io, path: nil,
                                  message: "no etcd member at \(endpoints.joined(separator: ",")) gave an answer this client accepts (\(failure))")
        case .answer(let answer) where answer.isUserMissing:
            FileCoordinationError(operation, code: .permissionDenied, path: nil,
                                  message: "\(failure) (etcd's authentication is on: name a user, in the CLI with FILECOORD_ETCD_USER and FILECOORD_ETCD_PASSWORD)")
        case .answer(let answer) where answer.isRefusal:
            FileCoordinationError(operation, code: .permissionDenied, path: nil, message: "\(failure)")
        case .answer:
            FileCoordinationError(operation, code: .io, path: nil, message: "\(failure)")
        }
    }

    // MARK: Leaving and losing the lease

    /// Called once by the lease keeper: every claim made under the lease may be
    /// another process's now. Waits end with ``FileCoordinationError/Code/claimLost``.
    /// The process joins the space again with a new lease (``rejoin()``): its presenters'
    /// keys went with the lost one, and writers elsewhere would no longer ask them.
    func leaseLost(_ why: String) {
        client.metrics.lostLeases.increment()
        FileCoordinator.logger.error("the etcd lease of this process is lost; its claims no longer hold",
                                        metadata: ["space": "\(address)", "why": "\(why)"])
        endClaims(because: why)
        Task { await rejoin() }
    }

    /// Joins the space again, in this space's place, until that is done or this space is
    /// left: tries after pauses doubling from 1 s to 30 s (etcd may be out of reach for a
    /// while, as when a partition took the lease). Coordinations meanwhile fail with
    /// ``FileCoordinationError/Code/claimLost``.
    func rejoin() async {
        var pause = Duration.seconds(1)
        var told = false
        while !state.withLock(\.left) {
            do {
                let (configuration, metrics) = (configuration, client.metrics)
                guard try await hooks.rejoin(self, { hooks in try await Self.join(configuration, metrics: metrics, hooks: hooks) }) else { return }
                FileCoordinator.logger.notice("this process joined the etcd space again, with a new lease; its presenters are published again",
                                              metadata: ["space": "\(address)"])
                return
            } catch {
                if !told {
                    FileCoordinator.logger.warning("this process cannot join the etcd space again yet; it tries until it can",
                                                   metadata: ["space": "\(address)", "error": "\(error)"])
                    told = true
                }
                try? await Task.sleep(for: pause)
                pause = min(pause * 2, .seconds(30))
            }
        }
    }

    /// From now on no claim of this process holds: running accessors are cancelled, and
    /// waits fail.
    func endClaims(because why: String) {
        let waiting = state.withLock { state -> [UInt64] in
            if state.lostBecause == nil { state.lostBecause = why }
            return state.waiting.keys.sorted()
        }
        running.withLock { running in
            running.lost = true
            for task in running.tasks.values { task.cancel() }
        }
        for id in waiting { finishWait(id, .failure(lostError(why))) }
    }

    func lostError(_ why: String, path: FilePath? = nil) -> FileCoordinationError {
        FileCoordinationError(.coordinate, code: .claimLost, path: path, message: "this process's etcd lease was lost (\(why)); its claims no longer hold")
    }

    /// Leaves: the lease is revoked, and every key under it goes at once.
    func leaveSpace() async {
        let (first, lost) = state.withLock { state -> (Bool, Bool) in
            defer { state.left = true }
            return (!state.left, state.lostBecause != nil)
        }
        guard first else { return }
        // Claims still held or awaited go with the lease: their tasks are told.
        endClaims(because: "this process left the space")
        keeper.stop()
        mail.stop()
        hub.stop()
        // A lost lease has nothing left to revoke (and etcd may be out of reach).
        if !lost {
            _ = try? await client.call("/v3/lease/revoke", EtcdJSON.LeaseRequest(ID: String(leaseID)), as: EtcdJSON.Empty.self)
        }
        client.close()
    }
}
