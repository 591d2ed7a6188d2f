import AsyncFileIO
import CFileCoordinationShims
import FileWatching
import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// How ``SpaceLocks`` and ``SpaceMail`` start the space's watches
/// (``CoordinationSpace/startWatching()``): set once the space exists, called as
/// `await startWatching()`; false until set, and when the watches cannot be had.
final class WatchingHook: Sendable {
    /// The closure is kept inside a struct, not as the lock's value itself: a function
    /// value kept directly in a `Mutex` is re-abstracted by every `withLock { $0 }` (Swift
    /// 6.3.1), and the stored closure grows by one thunk per read. Read once per request,
    /// that made each remote write slower than the one before (docs/performance.md, "A
    /// closure kept in a lock").
    private struct Start: Sendable {
        var run: @Sendable () async -> Bool
    }
    private let start = Locked(Start(run: { false }))

    func set(_ run: @escaping @Sendable () async -> Bool) {
        start.withLock { $0.run = run }
    }

    func callAsFunction() async -> Bool {
        let run = start.withLock { $0.run }
        return await run()
    }
}

/// The directory through which processes coordinate: claims that other processes
/// respect, and presenters that other processes find and message. No daemon: each
/// process joins the space by opening its files, and the kernel releases whatever a
/// process held when it dies.
///
/// ```
/// <space>/claims.lock          the doorbell and the waiting flag of claims (SpaceLocks)
/// <space>/claims/<shard>       byte-range OFD locks, one slot per path (SpaceLocks)
/// <space>/registry.seq         a shared counter, bumped when presenters come or go
/// <space>/procs/<process>      one per process, locked by it while it lives
/// <space>/mail/<process>/      the process's mailbox, watched by its inotify thread
/// <space>/presenters/<process>-<n>   one per registered presenter
/// ```
///
/// The space is created `0700`. A space owned by another user, or writable by group or
/// others, is refused; every file in it is opened with `O_NOFOLLOW` and checked to be a
/// regular file of ours. The layout and the messages are specified in `docs/protocol.md`.
///
/// Every process that coordinates joins one space: by default the per-user space
/// (``defaultDirectory(environment:)``) on first use. ``FileCoordinator/joinCoordinationSpace(at:)``
/// chooses another, and ``FileCoordinator/leaveCoordinationSpace()`` keeps coordination
/// inside the process.
public final class CoordinationSpace: Sendable {
    /// The space's directory (absolute).
    public let directory: FilePath
    /// This process's name in the space: `<pid>-<random>`, unique even when pids are reused.
    public let processName: String

    let locks: SpaceLocks
    let mail: SpaceMail
    /// This process's watches on the space (see ``startWatching()``): nil until asked for.
    private let watching = Locked<Task<Bool, Never>?>(nil)
    /// Set once the watches are in place.
    private let watched = Atomic<Bool>(false)
    /// The watches added, removed when the process leaves (their handlers hold the space's
    /// parts, and would act on a space the process left).
    private let watches = Locked<[InotifyThread.HandlerWatch]>([])
    /// What this process's record says (see ``writeRecord(listening:claims:)``).
    private let record = Locked<(listening: Bool, claims: [SpaceProtocol.ClaimLine], waiting: [SpaceProtocol.ClaimLine], left: Bool)>(
        (false, [], [], false))
    /// The kernel claims of this process's granted requests, by request, to give back with them.
    let heldClaims = Locked<[UInt64: SpaceLocks.Held]>([:])
    /// Bumped whenever this process's claims in the space change.
    private let claimsGeneration = Atomic<UInt64>(0)
    /// Set while a task is on its way to write the claims into the record.
    private let recordingClaims = Atomic<Bool>(false)
    /// That task, which leaving ends.
    private let claimsRecorder = Locked<Task<Void, Never>?>(nil)

    init(directory: FilePath, processName: String, locks: SpaceLocks, mail: SpaceMail) {
        self.directory = directory
        self.processName = processName
        self.locks = locks
        self.mail = mail
    }

    /// Watches the space through inotify, once: `claims.lock` and `claims/` (a waiting
    /// claim wakes on a release, and on a holder's last close), this process's mailbox
    /// (replies, and requests for its presenters; made here) and `procs/` (deaths).
    /// Returns whether the watches are in place.
    ///
    /// Not done on joining: an inotify instance is a per-user resource (128 by default),
    /// and a process that never waits, asks nobody and presents nothing (most `exec`s, a
    /// `write` with no presenter) needs none; a build running hundreds of such processes
    /// would run out. A process that needs the watches and cannot have them (the limit
    /// reached) still works: its claims and its requests poll instead (see
    /// ``SpaceLocks`` and ``SpaceMail``), and a presenter fails to register, saying why.
    /// Until it watches, the process's record says it does not listen, and `status`
    /// reads what it holds from the record instead of asking.
    func startWatching() async -> Bool {
        // Every request asks: once the watches are in place, one load answers.
        if watched.load(ordering: .acquiring) { return true }
        guard !record.withLock({ $0.left }) else { return false }
        let task = watching.withLock { task in
            if let task { return task }
            let (locks, mail, directory) = (locks, mail, directory)
            let started = Task<Bool, Never> { [self] in
                do {
                    // The mailbox is made as the process starts to listen: a process that
                    // never does (one that only claims) has none.
                    _ = try await runOnIOThread { try mail.openMailbox() }
                    let thread = InotifyThread.shared
                    func watch(_ path: FilePath, _ mask: Int32, _ handler: @escaping InotifyThread.Handler) async throws {
                        let added = try await thread.addWatch(path, mask: UInt32(mask), handler: handler)
                        watches.withLock { $0.append(added) }
                    }
                    try await watch(locks.path, IN_MODIFY | IN_CLOSE_WRITE) { [locks] event in
                        // (Events lost to an overflow may have held a close.)
                        locks.somethingChanged(closed: event.mask & UInt32(IN_CLOSE_WRITE | IN_Q_OVERFLOW) != 0)
                    }
                    // A shard's last close: a holder that kept it after `claims.lock` let go.
                    try await watch(directory.appending(SpaceLayout.claims), IN_CLOSE_WRITE) { [locks] _ in locks.shardClosed() }
                    try await watch(mail.files.mailboxPath, IN_CLOSE_WRITE | IN_MOVED_TO) { [mail] event in mail.received(event) }
                    try await watch(directory.appending(SpaceLayout.records), IN_CLOSE_WRITE | IN_DELETE) { [mail] event in
                        mail.processEnded(event)
                    }
                    // Anything that came before the mailbox was watched.
                    try await runOnIOThread {
                        mail.readWholeMailbox()
                        try self.writeRecord(listening: true)
                    }
                    locks.nowListening()
                    watched.store(true, ordering: .releasing)
                    return true
                } catch {
                    // Not a warning: the process works on (its waits poll); a command's
                    // stderr stays clean when hundreds of processes run at once.
                    FileCoordinator.logger.info("cannot watch the coordination space; this process polls instead",
                                                   metadata: ["path": "\(directory)", "error": "\(error)"])
                    return false
                }
            }
            task = started
            return started
        }
        return await task.value
    }

    /// The space used when none is named: `$FILECOORD_SPACE`, else
    /// `$XDG_RUNTIME_DIR/filecoord`, else `/tmp/filecoord-<uid>`.
    public static func defaultDirectory(environment: [String: String]) -> FilePath {
        defaultDirectory { environment[$0] }
    }

    /// The default space by this process's environment.
    public static func defaultDirectory() -> FilePath {
        defaultDirectory(variable: environmentVariable)
    }

    private static func defaultDirectory(variable: (String) -> String?) -> FilePath {
        if let named = variable("FILECOORD_SPACE"), !named.isEmpty { return FileCoordinator.normalized(FilePath(named)) }
        if let runtime = variable("XDG_RUNTIME_DIR"), !runtime.isEmpty, runtime.hasPrefix("/") {
            return FilePath(runtime).appending("filecoord")
        }
        return FilePath("/tmp/filecoord-\(geteuid())")
    }

    /// Opens (creating if needed) the space at `directory` and joins it.
    static func join(_ directory: FilePath, hooks: SpaceHooks) async throws -> CoordinationSpace {
        let directory = FileCoordinator.normalized(directory)
        let processName = "\(getpid())-\(String(UInt32.random(in: 0...UInt32.max), radix: 16))"
        // One hand-off to an I/O thread for the files and the look for dead processes.
        let (files, mail, candidates) = try await runOnIOThread {
            let files = try SpaceFiles(directory: directory, processName: processName)
            let mail = SpaceMail(files: files, hooks: hooks)
            return (files, mail, (try? mail.deadProcessCandidates()) ?? [])
        }
        let locks = SpaceLocks(files: files)
        let space = CoordinationSpace(directory: directory, processName: processName, locks: locks, mail: mail)
        locks.startWatching.set { [weak space] in await space?.startWatching() ?? false }
        mail.startWatching.set { [weak space] in await space?.startWatching() ?? false }
        await mail.cleanUp(candidates)
        return space
    }

    /// Writes the claims this process holds now into its record, for `status` to read
    /// (`filecoord exec`, before its command runs: the command inherits the claims).
    /// Returns the write, a blocking call for an I/O thread: `exec` makes it on the thread
    /// that then starts its command, so that both take one hand-off.
        package func claimsRecordWrite() -> @Sendable () -> Void {
        let claims = mail.server.hooks.claims()
        return { _ = try? self.writeRecord(claims: Self.claimLines(claims.held), waiting: Self.claimLines(claims.waiting)) }
    }

    /// This process's claims in the space changed, or one started to wait: they are
    /// written into its record ``claimRecordDelay`` later, so that `status` can list them
    /// when the process does not answer (it does not read its mailbox, or it is stopped). Cheap on the claim's path
    /// (two atomics); a process that claims without pause writes its record at most once
    /// per delay.
    func claimsChanged() {
        claimsGeneration.add(1, ordering: .releasing)
        guard !recordingClaims.exchange(true, ordering: .acquiringAndReleasing) else { return }
        claimsRecorder.withLock { $0 = Task.detached { [self] in await recordClaims() } }
    }

    /// How long a claim is held before this process's record lists it (for `status` to
    /// read when the process does not answer): a claim shorter than this is gone before
    /// anyone could look, and not writing it keeps a tight loop of claims from writing
    /// the record each time.
    public static let claimRecordDelay = Duration.milliseconds(100)

    private func recordClaims() async {
        while true {
            try? await Task.sleep(for: Self.claimRecordDelay) // ok: the debounce of record writes
            if Task.isCancelled { return } // the process left the space
            let seen = claimsGeneration.load(ordering: .acquiring)
            let claims = mail.server.hooks.claims()
            let (held, waiting) = (Self.claimLines(claims.held), Self.claimLines(claims.waiting))
            _ = try? await runOnIOThread { try self.writeRecord(claims: held, waiting: waiting) }
            if claimsGeneration.load(ordering: .acquiring) != seen { continue }
            recordingClaims.store(false, ordering: .releasing)
            // A change that came between the load and the store saw the flag set and left
            // the writing to this task.
            guard claimsGeneration.load(ordering: .acquiring) != seen,
                  !recordingClaims.exchange(true, ordering: .acquiringAndReleasing) else { return }
        }
    }

    /// Claims as the record and `status` replies list them, as many as fit well inside
    /// a message.
    static func claimLines(_ claims: [CoordinationRules.Claim]) -> [SpaceProtocol.ClaimLine] {
        var lines: [SpaceProtocol.ClaimLine] = []
        var size = 0
        for claim in claims {
            // `claim.N w PATH`, percent-encoding aside.
            size += 12 + claim.path.length
            guard size <= SpaceMessage.maximumSize / 2 else { break }
            lines.append(.init(isWrite: claim.access == .writing, path: claim.path))
        }
        return lines
    }

    /// Rewrites this process's record in place (its descriptor holds the liveness lock),
    /// changing what is given. Blocking; under a lock, so that two writers cannot
    /// interleave.
    func writeRecord(listening: Bool? = nil, claims: [SpaceProtocol.ClaimLine]? = nil,
                     waiting: [SpaceProtocol.ClaimLine]? = nil) throws {
        let files = mail.files
        try record.withLock { record in
            guard !record.left else { return }
            if let listening { record.listening = listening }
            if let claims { record.claims = claims }
            if let waiting { record.waiting = waiting }
            try files.writeRecord(SpaceProtocol.ProcessRecord(pid: files.pid, listening: record.listening, claims: record.claims,
                                                              waiting: record.waiting))
        }
    }

    /// Removes this process's files from the space at once, on the calling thread, and
    /// leaves its claims to the kernel: for a process about to die of a signal
    /// (`filecoord` on SIGHUP, SIGINT, SIGQUIT or SIGTERM), whose claims end with it.
        package func removeFilesBeforeExit() {
        mail.removeFilesNow()
    }

    /// Leaves the space: this process's files are removed (its claims must have ended).
    package func leave() async {
        record.withLock { $0.left = true }
        // The watches first (a watch being added as the process leaves is waited for):
        // after this no event reaches the space's parts, whose files then close with them.
        // (The task holds the space: it is let go of.)
        let started: Task<Bool, Never>? = watching.withLock { task in
            defer { task = nil }
            return task
        }
        _ = await started?.value
        let recorder = claimsRecorder.withLock { $0 }
        recorder?.cancel()
        await recorder?.value
        for watch in watches.withLock({ $0 }) { await InotifyThread.shared.removeWatch(watch) }
        locks.close()
        await mail.leave()
    }

    // MARK: Status

    /// The descriptors that hold this process's claims in the space (`claims.lock` and
    /// the claim shards it holds bytes in): `filecoord exec` passes them on to its
    /// command, so the claims last as long as the command, as `flock(1)`'s lock does.
        package var claimDescriptors: [Int32] { locks.descriptorsHoldingClaims() }

    /// What ``status(timeout:)`` reports.
    public struct Status: Sendable {
        /// A claim held by a live process.
        public struct Claim: Sendable, Equatable {
            /// The item claimed.
            public var path: FilePath
            /// Whether the claim writes (else it reads).
            public var isWrite: Bool
            /// The holding process, as this process's PID namespace numbers it.
            public var processIdentifier: Int32
            /// The holding process's host, in a space shared by hosts (nil in a local space).
            public var host: String? = nil
            /// ``processIdentifier`` is another PID namespace's (a container's): this
            /// process's namespace does not show that process.
            public var isInAnotherPIDNamespace = false

            package init(path: FilePath, isWrite: Bool, processIdentifier: Int32, host: String? = nil,
                         isInAnotherPIDNamespace: Bool = false) {
                (self.path, self.isWrite, self.processIdentifier, self.host) = (path, isWrite, processIdentifier, host)
                self.isInAnotherPIDNamespace = isInAnotherPIDNamespace
            }
        }
        /// A presenter registered by a live process.
        public struct Presenter: Sendable, Equatable {
            /// The item presented.
            public var path: FilePath
            /// The registering process, as this process's PID namespace numbers it.
            public var processIdentifier: Int32
            /// The registering process's host, in a space shared by hosts (nil in a local space).
            public var host: String? = nil
            /// ``processIdentifier`` is another PID namespace's (a container's): this
            /// process's namespace does not show that process.
            public var isInAnotherPIDNamespace = false

            package init(path: FilePath, processIdentifier: Int32, host: String? = nil, isInAnotherPIDNamespace: Bool = false) {
                (self.path, self.processIdentifier, self.host) = (path, processIdentifier, host)
                self.isInAnotherPIDNamespace = isInAnotherPIDNamespace
            }
        }
        /// Claims held by live processes, by path.
        public var claims: [Claim] = []
        /// Claims that live processes are waiting for, by path.
        public var waiting: [Claim] = []
        /// Live presenters, by path.
        public var presenters: [Presenter] = []
        /// Live processes that did not answer in time (stopped or busy). Their presenters
        /// are not listed; their claims are, as their records give them (claims held for
        /// more than ``CoordinationSpace/claimRecordDelay``).
        public var unanswered: [Int32] = []
        /// Processes found dead and cleaned up by this call.
        public var cleanedUp: [Int32] = []

        package init() {}
    }

    /// Asks every live process in the space for its claims and presenters, and cleans up
    /// after dead ones.
    public func status(timeout: Duration = .seconds(2)) async throws -> Status {
        try await mail.status(localClaims: mail.server.hooks.claims(), timeout: timeout)
    }

    /// ``status(timeout:)`` from the processes' records alone, asking none (their claims
    /// as of ``claimRecordDelay`` ago): a process that waits in the kernel, and so reads
    /// no mailbox, says who is in its way without starting to listen, and a hundred
    /// waiters cost no hundred requests to each process.
    package func recordedStatus() async throws -> Status {
        try await mail.status(localClaims: mail.server.hooks.claims(), timeout: .zero, asking: false)
    }
}
