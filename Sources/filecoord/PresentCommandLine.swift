import ArgumentParser
import AsyncFileIO
import FileCoordination

/// `present PATH... -- COMMAND`: the command after the terminator, split off before the
/// parser sees the arguments (the parser takes one list of positional values, and the
/// paths are one already).
enum PresentCommandLine {
    /// `present`'s options that take a value (the next argument, unless joined with `=`):
    /// a `--` that is such a value is no terminator. Kept equal to the parser's by a test.
    static let optionsTakingValues: Set<String> = [
        "--fromfile", "--format", "--timefmt", "--ack-delay", "--settle", "--count", "--timeout", "-e", "--event",
        "--include", "--exclude", "--on-busy", "--space", "--root", "--lease-ttl", "--etcd-cacert", "--etcd-cert",
        "--etcd-key", "--log-level", "--log-format",
    ]

    /// The command after the first terminator of a `present` command line.
    static let command = Locked<[String]>([])

    /// `arguments` without the terminator and what follows it, which, for `present`, is
    /// kept in ``command``; other subcommands' arguments unchanged.
    static func split(_ arguments: [String]) -> [String] {
        guard arguments.first == "present" else { return arguments }
        var index = 1
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "--" {
                command.withLock { $0 = Array(arguments[(index + 1)...]) }
                return Array(arguments[..<index])
            }
            index += optionsTakingValues.contains(argument) ? 2 : 1
        }
        return arguments
    }
}
