import ArgumentParser
import CFilecoordCommand
import FileCoordination
import FileCoordinationEtcd
import Foundation
import Logging

/// `--space DIR`, and joining that space (every subcommand that takes part in one).
struct SpaceOption: ParsableArguments {
    @Option(help: ArgumentHelp("The coordination space: a directory, or etcd://HOST:PORT[,HOST:PORT...]/PREFIX for one shared by hosts (default: $FILECOORD_SPACE, else $XDG_RUNTIME_DIR/filecoord, else /tmp/filecoord-<uid>).",
                               valueName: "SPACE"), completion: .directory)
    var space: String?

    @Option(help: ArgumentHelp("In an etcd space, this host's mount point of the shared volume: items are named relative to it (default: $FILECOORD_ROOT, else /).",
                               valueName: "DIR"), completion: .directory)
    var root: String?

    @Option(name: .customLong("lease-ttl"), parsing: .unconditional,
            help: ArgumentHelp("In an etcd space, how long this process's claims outlive it if it dies without leaving (default: $FILECOORD_LEASE_TTL, else 5s; whole seconds).",
                               valueName: "DURATION"))
    var leaseTTL: CommandDuration?

    @Option(name: .customLong("etcd-cacert"), help: ArgumentHelp("In an etcd space, TLS: the CA that signed the members' certificates (default: $FILECOORD_ETCD_CACERT; etcds:// trusts the system's CAs).",
                               valueName: "FILE"), completion: .file())
    var etcdCA: String?

    @Option(name: .customLong("etcd-cert"), help: ArgumentHelp("In an etcd space, TLS: this client's certificate, when etcd checks clients (default: $FILECOORD_ETCD_CERT).",
                               valueName: "FILE"), completion: .file())
    var etcdCertificate: String?

    @Option(name: .customLong("etcd-key"), help: ArgumentHelp("In an etcd space, TLS: the client certificate's key (default: $FILECOORD_ETCD_KEY).",
                               valueName: "FILE"), completion: .file())
    var etcdKey: String?

    @Option(name: .customLong("log-level"), help: ArgumentHelp("Diagnostics on stderr: critical, error, warning (default), notice, info, debug (claims that wait, messages) or trace (every claim) (default: $FILECOORD_LOG_LEVEL).",
                               valueName: "LEVEL"), completion: .list(Logger.Level.allCases.map(\.rawValue)))
    var logLevel: String?

    @Option(name: .customLong("log-format"), help: ArgumentHelp("How diagnostics are written: text (default; each line starts with the time and filecoord[PID]) or json (one object per line, for log collectors) (default: $FILECOORD_LOG_FORMAT).",
                               valueName: "FORMAT"), completion: .list(Logs.Format.allCases.map(\.rawValue)))
    var logFormat: String?

    /// The values given, apart from the parser.
    var settings: SpaceSettings {
        SpaceSettings(space: space, root: root, leaseTTL: leaseTTL, etcdCA: etcdCA, etcdCertificate: etcdCertificate,
                      etcdKey: etcdKey, logLevel: logLevel, logFormat: logFormat)
    }

    func validate() throws { try settings.validate() }

    /// Joins the space (``SpaceSettings/join()``).
    @discardableResult
    func join() async throws -> CoordinationSpace? { try await settings.join() }
}

/// What ``SpaceOption`` holds, and what is done with it: a plain value, which the quick
/// reading of the usual arguments (``QuickArguments``) makes without the parser.
struct SpaceSettings: Sendable {
    var space: String?
    var root: String?
    var leaseTTL: CommandDuration?
    var etcdCA: String?
    var etcdCertificate: String?
    var etcdKey: String?
    var logLevel: String?
    var logFormat: String?

    func validate() throws {
        try Self.validate(space)
        if !EtcdCoordinationSpace.Configuration.isAddress(namedSpace ?? "") {
            for (option, value) in [("--root", root), ("--lease-ttl", leaseTTL?.description), ("--etcd-cacert", etcdCA),
                                    ("--etcd-cert", etcdCertificate), ("--etcd-key", etcdKey)] where value != nil {
                throw ValidationError("\(option) applies to an etcd space only (--space etcd://...)")
            }
        }
        if let leaseTTL {
            guard leaseTTL.seconds > 0 else { throw ValidationError("--lease-ttl must be more than zero") }
        }
        let environment = environmentVariable("FILECOORD_LOG_LEVEL")
        if let (source, name) = logLevel.map({ ("--log-level", $0) }) ?? environment.map({ ("FILECOORD_LOG_LEVEL", $0) }) {
            guard let level = Logs.level(named: name) else {
                throw ValidationError("\(source): no level named '\(name)'; the levels are \(Logs.levelNames)")
            }
            Logs.level = level
        }
        let formatVariable = environmentVariable("FILECOORD_LOG_FORMAT")
        if let (source, name) = logFormat.map({ ("--log-format", $0) }) ?? formatVariable.map({ ("FILECOORD_LOG_FORMAT", $0) }) {
            guard let format = Logs.Format(rawValue: name.lowercased()) else {
                throw ValidationError("\(source): no format named '\(name)'; the formats are text, json")
            }
            Logs.format = format
        }
    }

    /// A `--space` value must name a directory: an empty one would make the current
    /// directory the space.
    static func validate(_ space: String?) throws {
        if space?.isEmpty == true { throw ValidationError("--space names no directory") }
    }

    /// `--space`, else `$FILECOORD_SPACE`.
    var namedSpace: String? {
        space ?? environmentVariable("FILECOORD_SPACE")
    }

    /// Routes library warnings to stderr, then joins the space; a space that cannot be
    /// joined is reported and exits 1. Returns the local space joined (nil for etcd).
    @discardableResult
    func join() async throws -> CoordinationSpace? {
        Logs.bootstrap()
        // `FILECOORD_SPACE=etcd://...` names a space the library alone does not know.
        EtcdCoordinationSpace.register()
        if let address = namedSpace, EtcdCoordinationSpace.Configuration.isAddress(address) {
            do {
                // The environment's settings, then the options over them.
                var configuration = try EtcdCoordinationSpace.Configuration(address: address, environment: ProcessInfo.processInfo.environment)
                if let root { configuration.root = RawArguments.path(root) }
                if let ttl = leaseTTL?.duration { configuration.leaseTTL = ttl }
                if etcdCA != nil || etcdCertificate != nil || etcdKey != nil {
                    var tls = configuration.tls ?? .init()
                    if let etcdCA { tls.caFile = RawArguments.path(etcdCA) }
                    if let etcdCertificate { tls.certificateFile = RawArguments.path(etcdCertificate) }
                    if let etcdKey { tls.keyFile = RawArguments.path(etcdKey) }
                    configuration.tls = tls
                }
                Self.revokeLeaseOnFatalSignals(try await FileCoordinator.joinCoordinationSpace(configuration))
            } catch let error as FileCoordinationError {
                Output.report(error)
                throw Status.failed
            }
            return nil
        }
        let joined: CoordinationSpace
        do {
            joined = try await FileCoordinator.joinCoordinationSpace(at: space.map { RawArguments.path($0) })
        } catch let error as FileCoordinationError {
            Output.report(error)
            throw Status.failed
        }
        Self.removeFilesOnFatalSignals(joined)
        return joined
    }

    /// The terminating signals (``TerminatingSignals``) remove this process's files from
    /// the space, then end it as they would have: otherwise its record and mailbox would
    /// stay until another process joined and cleaned up. Its claims end with it, in the
    /// kernel. (`present` ends on them too, after removing its presenter; `exec` passes
    /// them on to its command while it runs.)
    /// The same for an etcd space: the lease is revoked, so the claims go at once (the
    /// lease of the space joined again, when the first lease was lost).
    private static func revokeLeaseOnFatalSignals(_ space: EtcdCoordinationSpace) {
        try? CaughtSignals.shared.catchSignals(TerminatingSignals.handled) { number in
            (FileCoordinator.etcdCoordinationSpace ?? space).revokeLeaseBeforeExit()
            TerminatingSignals.die(by: number)
        }
    }

    private static func removeFilesOnFatalSignals(_ space: CoordinationSpace) {
        try? CaughtSignals.shared.catchSignals(TerminatingSignals.handled) { number in
            space.removeFilesBeforeExit()
            TerminatingSignals.die(by: number)
        }
    }
}

/// The options every coordinating subcommand shares (`--space`, `--presenter-timeout`,
/// `--strict`, `--timeout` and its flock(1) spellings), and what they do.
struct CoordinationOptions: ParsableArguments {
    @OptionGroup var space: SpaceOption

    /// 30 s, the library's default, where Apple's coordinator waits for ever: a bounded
    /// wait, which the waiting line after a second makes visible; a live presenter on a
    /// loaded machine can take more than 10 s (docs/cli.md).
    @Option(name: .customLong("presenter-timeout"), parsing: .unconditional,
            help: ArgumentHelp("How long presenters may take to acknowledge.", valueName: "DURATION"))
    var presenterTimeout = Self.defaultPresenterTimeout

    /// `--presenter-timeout`'s default.
    static let defaultPresenterTimeout = CommandDuration(seconds: 30)

    @Flag(help: "Fail (exit 3) instead of proceeding when a presenter does not answer in time.")
    var strict = false

    @Option(name: [.customLong("timeout"), .customShort("w", allowingJoined: true), .customLong("wait")], parsing: .unconditional,
            help: ArgumentHelp("How long to wait for a conflicting claim to end (default: forever).", valueName: "DURATION"))
    var timeout: CommandDuration?

    @Flag(name: [.customShort("n"), .customLong("nonblock")],
          help: "Fail at once (exit 3) if a conflicting claim is held: --timeout 0.")
    var nonblock = false

    /// The values given, apart from the parser.
    var settings: CoordinationSettings {
        CoordinationSettings(space: space.settings, presenterTimeout: presenterTimeout, strict: strict, timeout: timeout,
                             nonblock: nonblock)
    }

    func validate() throws { try settings.validate() }

    /// Joins the space and returns a coordinator (``CoordinationSettings/coordinator()``).
    func coordinator() async throws -> FileCoordinator { try await settings.coordinator() }

    /// Runs a coordination (``CoordinationSettings/run(wanted:_:)``).
    func run<T>(wanted: [InTheWay.Wanted] = [], _ body: (WaitReporter) async throws -> T) async throws -> T {
        try await settings.run(wanted: wanted, body)
    }
}

/// What ``CoordinationOptions`` holds, and what is done with it: a plain value, as
/// ``SpaceSettings`` is.
struct CoordinationSettings: Sendable {
    var space: SpaceSettings
    var presenterTimeout: CommandDuration
    var strict: Bool
    var timeout: CommandDuration?
    var nonblock: Bool

    /// Its own options' checks (the space's are ``SpaceSettings/validate()``, made first,
    /// as the parser makes them).
    func validate() throws {
        try presenterTimeout.requireNonNegative("--presenter-timeout")
        // A presenter cannot answer in no time: what rounds to nothing is refused too.
        guard presenterTimeout.seconds >= 0.001 else { throw ValidationError("--presenter-timeout must be at least 1ms") }
        try timeout?.requireNonNegative("--timeout")
        if nonblock, let timeout, timeout.seconds != 0 {
            throw ValidationError("--nonblock and --timeout \(timeout.description) contradict each other")
        }
    }

    /// How long a claim may wait; nil for forever.
    var claimTimeout: Duration? { nonblock ? .zero : timeout?.duration }

    /// Joins the space and returns a coordinator with the chosen presenter policy.
    func coordinator() async throws -> FileCoordinator {
        try await space.join()
        let coordinator = FileCoordinator()
        coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: presenterTimeout.duration ?? .seconds(1e9),
                                                                     action: strict ? .fail : .proceed))
        coordinator.setClaimTimeout(claimTimeout)
        return coordinator
    }

    /// Runs a coordination, mapping its failures to the contract's exit statuses: a claim
    /// that waited past `--timeout`, or a presenter past `--presenter-timeout` under
    /// `--strict`, exits 3; any other failure 1. While the claims on `wanted` wait, a
    /// line after a second says who is in the way (unless `--log-level error`), and a
    /// claim's timeout names them; `body` calls the reporter's `granted()` once the
    /// accessor runs.
    func run<T>(wanted: [InTheWay.Wanted] = [], _ body: (WaitReporter) async throws -> T) async throws -> T {
        let reporter = WaitReporter(wanted, enabled: Logs.level <= .warning)
        defer { reporter.granted() }
        do {
            let observer = reporter.enabled ? WaitObserver { reporter.waiting() } : nil
            return try await WaitObserver.$current.withValue(observer) { try await body(reporter) }
        } catch let failure as FileCoordinationError {
            reporter.granted()
            let error = await Self.explained(failure, wanted: wanted)
            Output.report(error)
            throw error.code == .timedOut ? Status.timedOut : Status.failed
        } catch let error as ExitCode {
            throw error
        } catch {
            Output.error("\(error)")
            throw Status.failed
        }
    }

    /// A claim's failure as the tool reports it: its item named absolute (as a name given
    /// relative is claimed), and, when it timed out, who held it (``InTheWay``).
    static func explained(_ failure: FileCoordinationError, wanted: [InTheWay.Wanted]) async -> FileCoordinationError {
        var error = failure
        guard error.operation == "coordinate" else { return error }
        if let path = error.path, path.isRelative, let absolute = try? FilePath(fileURL: path.fileURL) {
            error.path = absolute
        }
        if error.code == .timedOut, !wanted.isEmpty, let space = FileCoordinator.coordinationSpace {
            let blockers = await InTheWay.describe(wanted, in: space, timeout: .milliseconds(500))
            if !blockers.isEmpty {
                error.message = "held by " + blockers.joined(separator: ", ") + "; " + error.message
            }
        }
        return error
    }
}
