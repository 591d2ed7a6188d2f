import ArgumentParser
import CFileCoordinationShims
@_spi(FileCoordinationInternal) import AsyncFileIO
import FileCoordination
import Foundation

struct Exec: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a command while holding coordinated accesses.",
        discussion: """
            Like flock(1), with reader/writer semantics: --read claims are shared, --write \
            and --delete claims exclusive (--delete of a directory covers everything inside \
            it). Presenters are asked to relinquish before COMMAND starts and hear what \
            changed after it ends. All claims are taken together in one canonical order, so \
            two exec's over the same items never deadlock, and every claim is released when \
            either process dies. The exit status is COMMAND's (128+N if a signal N ended it).
            """
    )

    @Option(name: .customLong("read"), help: ArgumentHelp("Hold a read claim on PATH.", valueName: "PATH"))
    var reads: [String] = []

    @Option(name: .customLong("write"), help: ArgumentHelp("Hold a write claim on PATH.", valueName: "PATH"))
    var writes: [String] = []

    @Option(name: .customLong("delete"), help: ArgumentHelp("Hold a delete claim on PATH.", valueName: "PATH"))
    var deletes: [String] = []

    @OptionGroup var coordination: CoordinationOptions

    @Argument(parsing: .postTerminator, help: "The command and its arguments, after --.")
    var command: [String] = []

    func validate() throws {
        guard !command.isEmpty else { throw ValidationError("name a command after --") }
        guard !(reads.isEmpty && writes.isEmpty && deletes.isEmpty) else {
            throw ValidationError("name at least one --read, --write or --delete")
        }
    }

    func run() async throws {
        var wanted = reads.map { FileAccessIntent.readingIntent(with: RawArguments.path($0).fileURL) }
        wanted += writes.map { FileAccessIntent.writingIntent(with: RawArguments.path($0).fileURL) }
        wanted += deletes.map { FileAccessIntent.writingIntent(with: RawArguments.path($0).fileURL, options: .forDeleting) }
        let coordinator = try await coordination.coordinator()
        let (command, intents) = (command, wanted)
        let status = try await coordination.run {
            try await coordinator.coordinate(with: intents) {
                try await Child.run(command)
            }
        }
        throw ExitCode(status)
    }
}

/// Runs a command with this process's standard streams and waits for it without holding
/// a cooperative thread (`waitpid` runs on an I/O thread).
enum Child {
    static func run(_ command: [String]) async throws -> Int32 {
        let arguments = command.map { RawArguments.bytes($0) }
        let pid: pid_t = try await runOnIOThread {
            var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { bytes in
                let pointer = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count + 1)
                for (index, byte) in bytes.enumerated() { pointer[index] = CChar(bitPattern: byte) }
                pointer[bytes.count] = 0
                return pointer
            }
            argv.append(nil)
            defer { for pointer in argv { pointer?.deallocate() } }
            // libinotifytools' descriptor and other inherited ones stay out of the command.
            _ = fc_cloexec_from(3)
            // The command starts with no signal blocked and default dispositions, whatever
            // the thread spawning it had (a blocked SIGCHLD would hang a shell's `wait`).
            var attributes = posix_spawnattr_t()
            posix_spawnattr_init(&attributes)
            defer { posix_spawnattr_destroy(&attributes) }
            var empty = sigset_t(), all = sigset_t()
            sigemptyset(&empty)
            sigfillset(&all)
            posix_spawnattr_setsigmask(&attributes, &empty)
            posix_spawnattr_setsigdefault(&attributes, &all)
            posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
            var pid: pid_t = 0
            let result = posix_spawnp(&pid, argv[0]!, nil, &attributes, argv, environ)
            guard result == 0 else {
                throw FileCoordinationError("posix_spawnp", errno: Errno(rawValue: result), path: FilePath(command[0]))
            }
            return pid
        }
        return try await runOnIOThread {
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 {
                guard errno == EINTR else { throw FileCoordinationError("waitpid", errno: Errno(rawValue: errno), path: nil) }
            }
            // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift does not import.
            if status & 0x7f == 0 { return (status >> 8) & 0xff }
            return 128 + (status & 0x7f)
        }
    }
}
