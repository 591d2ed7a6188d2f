import ArgumentParser
import CFilecoordCommand
import AsyncFileIO
import FileCoordination
import Foundation

struct Exec: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exec",
        abstract: "Run a command while holding coordinated accesses.",
        discussion: """
            Like flock(1), with reader/writer semantics: --read claims are shared, --write \
            and --delete claims exclusive (--delete of a directory covers everything inside \
            it; of a link, the link, unless the name ends in a slash: dirlink/ is the \
            directory it leads to, as rm -r dirlink/ empties). Presenters are asked to \
            relinquish before COMMAND starts and hear what changed after it ends. All \
            claims are taken together in one canonical order, so \
            two exec's over the same items never deadlock. The claims last as long as \
            COMMAND: it inherits the descriptors that hold them, so if filecoord is killed \
            they are released when COMMAND (and whatever it passed them on to) ends, as \
            flock(1)'s lock is; if COMMAND dies, filecoord releases them at once. COMMAND inherits the descriptors and ignored signals \
            filecoord was started with, and its environment but FILECOORD_ETCD_PASSWORD; SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to \
            filecoord by another process are passed on to it (one sent to the whole process \
            group by a process, as `kill -- -PGID` does, so reaches it twice), and the claims \
            are held until it exits. The exit \
            status is COMMAND's (128+N if a signal N ended it; 127 if it was not found, 126 if \
            it could not be run); when the claims could not be had in time it is 3, or N \
            with -E N. With -o (--close), as flock -o, COMMAND does not inherit the claims: \
            filecoord alone holds them until COMMAND exits, and if filecoord is killed they \
            end with it, while COMMAND and what it started run on. (Without -o, once \
            COMMAND exits filecoord releases the claims, whoever else holds their \
            descriptors: a daemon COMMAND started holds nothing then.) -c STRING runs \
            `sh -c STRING`, as flock -c.
            """
    )

    @Option(name: .customLong("read"), help: ArgumentHelp("Hold a read claim on PATH.", valueName: "PATH"), completion: .file())
    var reads: [String] = []

    @Option(name: .customLong("write"), help: ArgumentHelp("Hold a write claim on PATH.", valueName: "PATH"), completion: .file())
    var writes: [String] = []

    @Option(name: .customLong("delete"), help: ArgumentHelp("Hold a delete claim on PATH.", valueName: "PATH"), completion: .file())
    var deletes: [String] = []

    @OptionGroup var coordination: CoordinationOptions

    @Option(name: [.customShort("E", allowingJoined: true), .customLong("conflict-exit-code")], parsing: .unconditional,
            help: ArgumentHelp("Exit with N instead of 3 when the claims could not be had in time (a conflicting claim, or a presenter under --strict), so that a script tells that from COMMAND's own status.",
                               valueName: "N"))
    var conflictExitCode: Int32?

    @Flag(name: [.customShort("o"), .customLong("close")],
          help: "COMMAND does not inherit the claims: filecoord alone holds them until COMMAND exits (as flock -o); if filecoord is killed they end with it.")
    var close = false

    @Option(name: [.customShort("c"), .customLong("command")],
            help: ArgumentHelp("Run `sh -c STRING` (as flock -c) instead of a command after --.", valueName: "STRING"))
    var commandString: String?

    @Argument(parsing: .postTerminator, help: "The command and its arguments, after --.", completion: .file())
    var command: [String] = []

    /// The values given, apart from the parser.
    var settings: ExecSettings {
        ExecSettings(reads: reads, writes: writes, deletes: deletes, coordination: coordination.settings,
                     conflictExitCode: conflictExitCode, command: commandString.map { ["/bin/sh", "-c", $0] } ?? command,
                     closingClaims: close)
    }

    func validate() throws {
        if commandString != nil, !command.isEmpty { throw ValidationError("-c and a command after -- contradict each other") }
        try settings.validate()
    }

    func run() async throws { try await settings.run() }
}

/// What ``Exec`` holds, and what it does: a plain value, which ``QuickArguments`` makes from
/// the usual arguments without the parser.
struct ExecSettings: Sendable {
    var reads: [String]
    var writes: [String]
    var deletes: [String]
    var coordination: CoordinationSettings
    var conflictExitCode: Int32?
    var command: [String]
    /// `-o`: the claims are held by this process alone, not inherited by the command.
    var closingClaims = false

    /// Its own options' checks (those of ``CoordinationSettings`` are made first).
    func validate() throws {
        if let conflictExitCode, !(0 ... 255).contains(conflictExitCode) {
            throw ValidationError("--conflict-exit-code must be from 0 to 255")
        }
        guard !command.isEmpty else { throw ValidationError("name a command after --, or give -c STRING") }
        guard !(reads.isEmpty && writes.isEmpty && deletes.isEmpty) else {
            throw ValidationError("name at least one --read, --write or --delete")
        }
    }

    func run() async throws {
        // Each claim as an intent, and as the wait's line and a timeout name it.
        var claims = reads.map { (FileAccessIntent.readingIntent(with: RawArguments.path($0).fileURL),
                                  InTheWay.Wanted(path: RawArguments.path($0), isWrite: false)) }
        claims += writes.map { (FileAccessIntent.writingIntent(with: RawArguments.path($0).fileURL),
                                InTheWay.Wanted(path: RawArguments.path($0), isWrite: true)) }
        // A delete acts on the name, a link there included; but a name ending in a slash
        // (or `/.`) is what the kernel reaches through it (`rm -r dirlink/` empties the
        // directory the link leads to), and that directory is the item.
        let slash = UInt8(ascii: "/"), dot = UInt8(ascii: ".")
        let deleted = deletes.map { argument in
            let bytes = RawArguments.bytes(argument)
            return (path: RawArguments.path(argument), through: bytes.count > 1 && (bytes.last == slash || bytes.suffix(2) == [slash, dot]))
        }
        let deletedPaths = deleted.contains(where: \.through)
            ? try await runOnIOThread {
                deleted.map { entry in
                    guard entry.through else { return entry.path }
                    // Only a directory is reached so: through a link to anything else, or
                    // to nothing, the kernel stops (`ENOTDIR`, `ENOENT`) at the name.
                    let reached = FileCoordinator.claimPath(of: entry.path, followingLast: true)
                    var info = stat()
                    let isDirectory = reached.withPlatformString { stat($0, &info) } == 0 && info.st_mode & S_IFMT == S_IFDIR
                    return isDirectory ? reached : entry.path
                }
            }
            : deleted.map(\.path)
        claims += deletedPaths.map { (FileAccessIntent.writingIntent(with: $0.fileURL, options: .forDeleting),
                                      InTheWay.Wanted(path: $0, isWrite: true, followingLast: false)) }
        // The items' directories are resolved (cached for the claims) while the space is
        // joined, on two I/O threads at once.
        let paths = claims.map(\.1.path)
        async let resolved: Void = { _ = try? await runOnIOThread { for path in paths { _ = FileCoordinator.claimPath(of: path, followingLast: false) } } }()
        let coordinator = try await coordination.coordinator()
        await resolved
        let (command, intents) = (command, claims.map(\.0))
        let status: Int32
        do {
            status = try await coordination.run(wanted: claims.map(\.1)) { reporter in
                try await coordinator.coordinate(with: intents) {
                    reporter.granted()
                    let space = FileCoordinator.coordinationSpace
                    // In an etcd space, the claims' fencing token, for storage that checks one.
                    let environment = FileCoordinator.fencingToken.map { ["FILECOORD_FENCING_TOKEN=\($0)"] } ?? []
                    // The claims go into the record first: `status` reads them there (a
                    // process that never waited does not listen).
                    // With -o the claims stay this process's alone.
                    let kept = closingClaims ? [] : space?.claimDescriptors ?? []
                    return try await Child.run(command, keeping: kept, adding: environment,
                                               first: space?.claimsRecordWrite())
                }
            }
        } catch let exit as ExitCode where exit == Status.timedOut && conflictExitCode != nil {
            // Only the claims' timeout: the command has not run.
            throw ExitCode(conflictExitCode!)
        }
        // A command ended by a terminating signal (a terminal's Ctrl-C, or one passed on):
        // this process dies by it too, as the shell would have seen had it run the command
        // itself (bash stops a script only for a child that died by SIGINT, not one that
        // exited 130), and as flock(1), which the terminal's signal ends, does.
        let signal = fc_last_command_signal()
        if TerminatingSignals.handled.contains(signal) {
            await FileCoordinator.leaveCoordinationSpace()
            TerminatingSignals.die(by: signal)
        }
        throw ExitCode(status)
    }
}
