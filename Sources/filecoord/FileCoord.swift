import ArgumentParser
import CFilecoordCommand
import FileCoordination
import Foundation

/// `filecoord`: file coordination for shell scripts and other languages.
/// Its reference is docs/cli.md; exit status 0 success, 1 an operation
/// failed, 2 usage error, 3 timed out.
@main
struct FileCoord: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "filecoord",
        abstract: "Coordinated file access between processes, for Linux.",
        discussion: """
            Readers share, writers are exclusive, and presenters hear about changes \
            before and after they happen. See `filecoord help <subcommand>`.
            """,
        version: "filecoord \(version)",
        subcommands: [Read.self, Write.self, Exec.self, Present.self, StatusCommand.self, Demo.self, Version.self]
    )

    /// The tool's version, as `--version` and `filecoord version` print it.
    static let version = "0.1.0"

    /// Bare `filecoord` is a usage error (exit 2, one line), not a silent success; the
    /// help is `filecoord help` or `--help`.
    func run() throws {
        throw ValidationError("a subcommand is required: read, write, exec, present, status, demo or version")
    }

    /// The parser reports a missing argument before an unknown option (`read --bogus`
    /// says "name files to read"): parsed again with a placeholder argument, arguments
    /// that hold an unknown option say so.
    private static func unknownOption(in arguments: [String]) -> (any Error)? {
        guard let name = subcommandNamed(in: arguments), let index = arguments.firstIndex(of: name) else { return nil }
        var probe = arguments
        probe.insert("placeholder", at: index + 1)
        do { _ = try parseAsRoot(probe) } catch {
            if message(for: error).hasPrefix("Unknown option") { return error }
        }
        return nil
    }

    /// The subcommand the arguments name (the first argument that is one), for the
    /// pointer to its help in a usage error.
    static func subcommandNamed(in arguments: [String]) -> String? {
        let names = subcommandNames
        return arguments.prefix { $0 != "--" }.first { names.contains($0) }
    }

    /// The subcommands' names, as typed.
    static var subcommandNames: [String] { configuration.subcommands.map { $0._commandName } }

    /// Runs the command in a task while the main thread waits for it.
    ///
    /// Not an `async` main: that hands the main thread to `dispatch_main`, which needs a
    /// new descriptor (an eventfd) as the thread leaves, at the same moment as the
    /// command opens its first files; with descriptors nearly exhausted (`ulimit -n 7`)
    /// libdispatch then stops the process with SIGILL instead of the command reporting
    /// EMFILE. The main thread is not one of the cooperative pool's.
    static func main() {
        fc_limit_malloc_arenas()
        fc_note_startup()
        // libdispatch, under the concurrency runtime, takes three descriptors (epoll, an
        // eventfd, a timerfd) and, about once a second, opens a file in /proc to watch its
        // threads; when it cannot it stops the process with SIGILL. With fewer than five
        // descriptors free (three, that one, and one for the command) that happened at any
        // moment, whatever the command did (`ulimit -n 7`): said here, before any starts.
        if let (limit, open) = Descriptors.underLowLimit(), limit - open < 5 {
            Output.error("too few file descriptors: the limit is \(limit) (ulimit -n) and \(open) are open; filecoord needs 5 free (EMFILE)")
            Foundation.exit(1)
        }
        let done = DispatchSemaphore(value: 0)
        // Detached: `main` is on the main actor, whose queue nothing drains here.
        Task.detached {
            await runCommand()
            done.signal()
        }
        done.wait()
    }

    /// Runs the command, then leaves the coordination space (if the command joined one)
    /// before exiting, so that a short-lived command such as `write` or `exec` leaves
    /// no record or mailbox behind for the next process to clean up.
    private static func runCommand() async {
        var status: Int32 = 0
        do {
            let arguments = PresentCommandLine.split(RawArguments.parserArguments)
            // `help NOSUCH` would print the general help and succeed.
            if arguments.first == "help", arguments.count > 1, !arguments[1].hasPrefix("-"),
               !subcommandNames.contains(arguments[1]) {
                throw ValidationError("no subcommand named '\(arguments[1])'")
            }
            if let command = QuickArguments.parse(arguments) {
                try await command.run()
            } else {
                var command = try parseAsRoot(arguments)
                if var command = command as? AsyncParsableCommand {
                    try await command.run()
                } else {
                    try command.run()
                }
            }
        } catch let exit as ExitCode {
            status = exit.rawValue
        } catch {
            let code = exitCode(for: error)
            if code == .success {
                await FileCoordinator.leaveCoordinationSpace()
                self.exit(withError: error)
            }
            // Usage errors exit 2 per the contract (ArgumentParser's own default is 64), and
            // take one line, as every error does (the usage is what --help prints).
            let message = self.message(for: unknownOption(in: RawArguments.parserArguments) ?? error)
                .split(separator: "\n").joined(separator: " ")
            let help = ["filecoord", "help"] + (subcommandNamed(in: RawArguments.parserArguments).map { [$0] } ?? [])
            if !message.isEmpty { Output.error(message + " (see '\(help.joined(separator: " "))')") }
            status = code == .validationFailure ? 2 : code.rawValue
        }
        await FileCoordinator.leaveCoordinationSpace()
        // Output that did not arrive is a failure, whatever else went well.
        if status == 0, let failure = Output.standardOutputFailure {
            Output.report(failure)
            status = Status.failed.rawValue
        }
        Foundation.exit(status)
    }
}

/// `filecoord version`: what `--version` prints.
struct Version: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "version", abstract: "Print the version.")

    func run() {
        Output.writeStandardOutput(Array("filecoord \(FileCoord.version)\n".utf8))
    }
}

/// Exit statuses of the contract.
enum Status {
    static let failed = ExitCode(1)
    static let usage = ExitCode(2)
    static let timedOut = ExitCode(3)
}

/// The descriptor limit, when it is low.
enum Descriptors {
    /// The limit (`ulimit -n`) and how many descriptors below it are open, when the limit
    /// is under 256 (counting costs a system call per descriptor); nil otherwise.
    static func underLowLimit() -> (limit: Int, open: Int)? {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < 256 else { return nil }
        return (Int(limit.rlim_cur), (0 ..< Int32(limit.rlim_cur)).count { fcntl($0, F_GETFD) != -1 })
    }
}
