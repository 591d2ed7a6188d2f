@_spi(FileCoordinationInternal) import AsyncFileIO
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
/// process conflicts with it; it waits through a watch for those to be deleted. The rules
/// are the local ones (readers share, writers exclude, a subtree claim covers what is
/// inside, a request's items all together or none), and grants are first come, first
/// served. `docs/distributed.md` has the key layout, the lease and fencing rules, and what
/// happens when a part fails.
public final class EtcdCoordinationSpace: Sendable {
    /// Where the space is and how this process takes part in it.
    public struct Configuration: Sendable {
        /// etcd's client endpoints, `HOST:PORT` each.
        public var endpoints: [String]
        /// The key prefix that holds the space (several spaces can share one etcd).
        public var prefix: String
        /// The local path of the shared volume's root: items are named relative to it,
        /// and paths outside it cannot be coordinated in this space.
        public var root: FilePath
        /// How long the space keeps this process's claims after it stops answering.
        public var leaseTTL: Duration
        /// How long a call waits for an etcd member (joining, and through a failover).
        public var connectTimeout: Duration
        /// etcd credentials, when its authentication is on.
        public var user: String?
        /// The password for ``user``.
        public var password: String?
        /// TLS to etcd, when its client port serves TLS; nil for plain HTTP.
        public var tls: TLS?
        /// The largest answer, and the largest watch message, accepted from etcd (bytes;
        /// at least 64 KiB). A range over a space with tens of thousands of claims or
        /// presenters can need more than the default 16 MiB.
        public var maxAnswerBytes: Int

        /// TLS settings: the CA that signed the members' certificates (nil: the system's
        /// CAs), and this client's certificate and key when etcd checks clients
        /// (`--client-cert-auth`). PEM files. OpenSSL (`libssl3`) is loaded when the space
        /// is joined, not before.
        public struct TLS: Sendable {
            /// The CA bundle to trust; nil for the system's.
            public var caFile: FilePath?
            /// This client's certificate (chain), when etcd asks for one.
            public var certificateFile: FilePath?
            /// The certificate's private key.
            public var keyFile: FilePath?

            /// TLS settings.
            public init(caFile: FilePath? = nil, certificateFile: FilePath? = nil, keyFile: FilePath? = nil) {
                self.caFile = caFile
                self.certificateFile = certificateFile
                self.keyFile = keyFile
            }
        }

        /// A configuration; `leaseTTL` is rounded up to whole seconds (etcd's unit).
        public init(endpoints: [String], prefix: String = "filecoord", root: FilePath = "/",
                    leaseTTL: Duration = .seconds(5), connectTimeout: Duration = .seconds(5),
                    user: String? = nil, password: String? = nil, tls: TLS? = nil, maxAnswerBytes: Int = 16 << 20) {
            self.endpoints = endpoints
            self.prefix = prefix
            self.root = root
            self.leaseTTL = leaseTTL
            self.connectTimeout = connectTimeout
            self.user = user
            self.password = password
            self.tls = tls
            self.maxAnswerBytes = maxAnswerBytes
        }

        /// Parses a space address `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`; `etcds://` is
        /// the same over TLS, trusting the system's CAs (``tls`` chooses others).
        ///
        /// - Throws: `FileCoordinationError` with code `.invalidArgument` naming what is wrong.
        public init(address: String, root: FilePath = "/") throws {
            func invalid(_ why: String) -> FileCoordinationError {
                FileCoordinationError(code: .invalidArgument, path: nil, operation: "join",
                                      message: "\(address): \(why); the form is etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS)")
            }
            let secure = address.hasPrefix("etcds://")
            guard address.hasPrefix("etcd://") || secure else { throw invalid("not an etcd address") }
            let rest = address.dropFirst(secure ? "etcds://".count : "etcd://".count)
            let slash = rest.firstIndex(of: "/") ?? rest.endIndex
            let hosts = rest[..<slash].split(separator: ",")
            guard !hosts.isEmpty else { throw invalid("no endpoint") }
            for host in hosts where EtcdEndpoint(host) == nil { throw invalid("'\(host)' is not HOST:PORT") }
            let prefix = slash < rest.endIndex ? rest[rest.index(after: slash)...] : ""
            self.init(endpoints: hosts.map(String.init), prefix: prefix.isEmpty ? "filecoord" : String(prefix), root: root,
                      tls: secure ? TLS() : nil)
        }

        /// `address` with what the environment sets: `FILECOORD_ROOT`; `FILECOORD_LEASE_TTL`
        /// and `FILECOORD_ETCD_TIMEOUT` (``connectTimeout``, which also bounds the retries
        /// through a failover), in seconds, each ignored unless above zero and at most a
        /// day; `FILECOORD_ETCD_CACERT`, `FILECOORD_ETCD_CERT` and `FILECOORD_ETCD_KEY` (any
        /// of them means TLS); `FILECOORD_ETCD_USER` and `FILECOORD_ETCD_PASSWORD`.
        public init(address: String, environment: [String: String]) throws {
            func value(_ name: String) -> String? { environment[name].flatMap { $0.isEmpty ? nil : $0 } }
            try self.init(address: address, root: value("FILECOORD_ROOT").map { FilePath($0) } ?? "/")
            // At most a day: `Duration` traps on a value it cannot hold (`inf`, `1e30`).
            func seconds(_ name: String) -> Duration? {
                value(name).flatMap(Double.init).flatMap { $0 > 0 && $0 <= 86_400 ? .seconds($0) : nil }
            }
            if let ttl = seconds("FILECOORD_LEASE_TTL") { leaseTTL = ttl }
            if let timeout = seconds("FILECOORD_ETCD_TIMEOUT") { connectTimeout = timeout }
            let (ca, certificate, key) = (value("FILECOORD_ETCD_CACERT"), value("FILECOORD_ETCD_CERT"), value("FILECOORD_ETCD_KEY"))
            if ca != nil || certificate != nil || key != nil {
                tls = TLS(caFile: ca.map { FilePath($0) }, certificateFile: certificate.map { FilePath($0) }, keyFile: key.map { FilePath($0) })
            }
            user = value("FILECOORD_ETCD_USER")
            password = value("FILECOORD_ETCD_PASSWORD")
        }

        /// Whether `address` names an etcd space (`etcd://` or `etcds://`).
        public static func isAddress(_ address: String) -> Bool { address.hasPrefix("etcd://") || address.hasPrefix("etcds://") }
    }

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

    struct Waiting {
        var continuation: CheckedContinuation<Void, any Error>?
        var watch: EtcdWatch?
        var blockers: Set<[UInt8]> = []
    }

    struct State {
        /// The key of each request's claims, with the revision that created it (its
        /// fencing token).
        var held: [UInt64: (key: [UInt8], revision: Int64)] = [:]
        var waiting: [UInt64: Waiting] = [:]
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

    init(configuration: Configuration, client: EtcdClient, leaseID: Int64, host: String, grantSentAt: ContinuousClock.Instant) {
        self.configuration = configuration
        self.client = client
        self.leaseID = leaseID
        self.host = host
        keys = EtcdKeys(prefix: configuration.prefix, member: leaseID)
        names = EtcdNames(root: configuration.root.platformBytes)
        mail = EtcdMail(client: client, keys: keys, names: names, leaseID: leaseID, host: host)
        address = (configuration.tls == nil ? "etcd://" : "etcds://") + configuration.endpoints.joined(separator: ",") + "/" + configuration.prefix
        keeper = EtcdLeaseKeeper(client: client, id: leaseID, ttl: configuration.leaseTTL, grantSentAt: grantSentAt)
    }

    /// Joins: a lease, and this process's member key under it.
    ///
    /// - Throws: `FileCoordinationError` with code `.unreachable` naming the endpoints
    ///   when no member answers within the connect timeout.
    static func join(_ given: Configuration) async throws -> EtcdCoordinationSpace {
        var configuration = given
        guard configuration.root.isAbsolute else {
            throw FileCoordinationError(code: .invalidArgument, path: configuration.root, operation: "join",
                                        message: "the space's root must be an absolute path")
        }
        let endpoints = configuration.endpoints.compactMap { EtcdEndpoint(Substring($0)) }
        guard !endpoints.isEmpty, endpoints.count == configuration.endpoints.count else {
            throw FileCoordinationError(code: .invalidArgument, path: nil, operation: "join",
                                        message: "etcd endpoints must be HOST:PORT: \(configuration.endpoints.joined(separator: ","))")
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
            throw FileCoordinationError(code: .invalidArgument, path: nil, operation: "join",
                                        message: "TLS to etcd cannot be set up: \(error.message)")
        }
        let auth = configuration.user.map { EtcdAuth(user: $0, password: configuration.password ?? "") }
        var limits = EtcdLimits()
        limits.answerBytes = max(64 << 10, configuration.maxAnswerBytes)
        let client = EtcdClient(endpoints: endpoints, connectTimeout: configuration.connectTimeout,
                                retryLimit: configuration.connectTimeout, auth: auth, tls: tls, limits: limits)
        do {
            let grantSentAt = ContinuousClock.now
            let lease = try await client.call("/v3/lease/grant", EtcdJSON.LeaseGrantRequest(TTL: String(ttlSeconds)),
                                              as: EtcdJSON.LeaseGrantResponse.self)
            guard let id = lease.ID.flatMap(Int64.init) else {
                throw EtcdFailure.answer(EtcdAnswer(status: 200, code: nil, message: lease.error ?? "no lease granted"))
            }
            let space = EtcdCoordinationSpace(configuration: configuration, client: client, leaseID: id, host: host,
                                              grantSentAt: grantSentAt)
            space.keeper.start { [weak space] why in space?.leaseLost(why) }
            let member = EtcdMember(host: host, pid: getpid(), root: EtcdJSON.base64(configuration.root.platformBytes))
            do {
                _ = try await client.call("/v3/kv/put", EtcdJSON.PutRequest(key: space.keys.member, value: try EtcdJSON.encode(member), lease: id),
                                          as: EtcdJSON.Empty.self)
            } catch {
                // Not joined: the lease is not kept alive, and goes.
                space.keeper.stop()
                _ = try? await client.call("/v3/lease/revoke", EtcdJSON.LeaseRequest(ID: String(id)), as: EtcdJSON.Empty.self)
                throw error
            }
            return space
        } catch let failure as EtcdFailure {
            client.close()
            throw Self.error(failure, operation: "join", endpoints: configuration.endpoints)
        } catch {
            client.close()
            throw error
        }
    }

    /// `failure` as the library's error, naming the endpoints.
    static func error(_ failure: EtcdFailure, operation: String, endpoints: [String]) -> FileCoordinationError {
        switch failure {
        case .connection:
            FileCoordinationError(code: .unreachable, path: nil, operation: operation,
                                  message: "no etcd member answered at \(endpoints.joined(separator: ",")) (\(failure))")
        case .invalid:
            FileCoordinationError(code: .io, path: nil, operation: operation,
                                  message: "no etcd member at \(endpoints.joined(separator: ",")) gave an answer this client accepts (\(failure))")
        case .answer(let answer) where answer.isUserMissing:
            FileCoordinationError(code: .permissionDenied, path: nil, operation: operation,
                                  message: "\(failure) (etcd's authentication is on: name a user, in the CLI with FILECOORD_ETCD_USER and FILECOORD_ETCD_PASSWORD)")
        case .answer(let answer) where answer.isRefusal:
            FileCoordinationError(code: .permissionDenied, path: nil, operation: operation, message: "\(failure)")
        case .answer:
            FileCoordinationError(code: .io, path: nil, operation: operation, message: "\(failure)")
        }
    }

    // MARK: Leaving and losing the lease

    /// Called once by the lease keeper: every claim made under the lease may be
    /// another process's now. Waits end with ``FileCoordinationError/Code/claimLost``.
    func leaseLost(_ why: String) {
        PresenterMessenger.logger.error("the etcd lease of this process is lost; its claims no longer hold",
                                        metadata: ["space": "\(address)", "why": "\(why)"])
        endClaims(because: why)
    }

    /// From now on no claim of this process holds: running accessors are cancelled, and
    /// waits fail.
    func endClaims(because why: String) {
        let waits = state.withLock { state -> [Waiting] in
            if state.lostBecause == nil { state.lostBecause = why }
            let waits = Array(state.waiting.values)
            state.waiting.removeAll()
            return waits
        }
        running.withLock { running in
            running.lost = true
            for task in running.tasks.values { task.cancel() }
        }
        for wait in waits {
            wait.watch?.cancel()
            wait.continuation?.resume(throwing: lostError(why))
        }
    }

    func lostError(_ why: String, path: FilePath? = nil) -> FileCoordinationError {
        FileCoordinationError(code: .claimLost, path: path, operation: "coordinate",
                              message: "this process's etcd lease was lost (\(why)); its claims no longer hold")
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
        // A lost lease has nothing left to revoke (and etcd may be out of reach).
        if !lost {
            _ = try? await client.call("/v3/lease/revoke", EtcdJSON.LeaseRequest(ID: String(leaseID)), as: EtcdJSON.Empty.self)
        }
        client.close()
    }
}
