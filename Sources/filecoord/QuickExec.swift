/// `exec`'s usual arguments, read without swift-argument-parser.
///
/// `exec` is the subcommand scripts run once per item, and the parser's first use in a
/// process costs about 2 ms, a quarter of the whole command (it asks the runtime for
/// protocol conformances, and each first lookup scans every conformance record in the
/// binary; docs/performance.md). This reads the plain shapes: `exec`, each option as
/// `--name VALUE`, `--name=VALUE` or a flag, once each (the claims any number of times),
/// then `--` and the command. Anything else (help, a repeated option, a value that
/// begins with `-`, an unknown name, a value the option's own parser or check refuses)
/// gives nil, and the full parser reads the arguments, errors and all.
/// A test parses many arguments both ways and compares the results.
enum QuickExec {
    /// The command the arguments describe, validated as the parser would; nil when the
    /// full parser has to read them.
    static func parse(_ arguments: [String]) -> ExecSettings? {
        guard arguments.first == "exec", let terminator = arguments.firstIndex(of: "--") else { return nil }
        var options = Options()
        var index = 1
        while index < terminator {
            var name = arguments[index]
            var value: String?
            if name.hasPrefix("--"), let equals = name.firstIndex(of: "=") {
                value = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            } else if Options.takesValue(name) {
                index += 1
                guard index < terminator else { return nil }
                value = arguments[index]
            }
            if let value, value.isEmpty || value.hasPrefix("-") { return nil }
            guard options.take(name, value) else { return nil }
            index += 1
        }
        return options.exec(command: Array(arguments[(terminator + 1)...]))
    }

    /// What the options said, before they become the command's settings.
    private struct Options {
        var reads: [String] = [], writes: [String] = [], deletes: [String] = []
        var strict = false, nonblock = false
        var conflictExitCode: String?, presenterTimeout: String?, timeout: String?
        var space: String?, root: String?, leaseTTL: String?, logLevel: String?
        var etcdCA: String?, etcdCertificate: String?, etcdKey: String?

        /// Whether the option `name` takes a value (by any of its names).
        static func takesValue(_ name: String) -> Bool {
            switch name {
            case "--read", "--write", "--delete", "-E", "--conflict-exit-code", "--presenter-timeout", "--timeout", "-w",
                 "--wait", "--space", "--root", "--lease-ttl", "--etcd-cacert", "--etcd-cert", "--etcd-key", "--log-level":
                true
            default: false
            }
        }

        /// Records one option; false for a name it does not know, a value where none
        /// belongs or none where one does, and a second use of a single option.
        mutating func take(_ name: String, _ value: String?) -> Bool {
            guard let value else {
                switch name {
                case "--strict": return Self.set(&strict)
                case "-n", "--nonblock": return Self.set(&nonblock)
                default: return false
                }
            }
            switch name {
            case "--read": reads.append(value)
            case "--write": writes.append(value)
            case "--delete": deletes.append(value)
            case "-E", "--conflict-exit-code": return Self.set(&conflictExitCode, value)
            case "--presenter-timeout": return Self.set(&presenterTimeout, value)
            case "--timeout", "-w", "--wait": return Self.set(&timeout, value)
            case "--space": return Self.set(&space, value)
            case "--root": return Self.set(&root, value)
            case "--lease-ttl": return Self.set(&leaseTTL, value)
            case "--log-level": return Self.set(&logLevel, value)
            case "--etcd-cacert": return Self.set(&etcdCA, value)
            case "--etcd-cert": return Self.set(&etcdCertificate, value)
            case "--etcd-key": return Self.set(&etcdKey, value)
            default: return false
            }
            return true
        }

        private static func set(_ flag: inout Bool) -> Bool {
            defer { flag = true }
            return !flag
        }

        private static func set(_ option: inout String?, _ value: String) -> Bool {
            defer { option = value }
            return option == nil
        }

        /// The command, checked as the parser checks it.
        func exec(command: [String]) -> ExecSettings? {
            guard let leaseTTL = Self.parsed(leaseTTL, as: CommandDuration.init(argument:)),
                  let presenterTimeout = Self.parsed(presenterTimeout, as: CommandDuration.init(argument:)),
                  let timeout = Self.parsed(timeout, as: CommandDuration.init(argument:)),
                  let conflictExitCode = Self.parsed(conflictExitCode, as: { Int32($0) })
            else { return nil }
            let space = SpaceSettings(space: space, root: root, leaseTTL: leaseTTL, etcdCA: etcdCA,
                                      etcdCertificate: etcdCertificate, etcdKey: etcdKey, logLevel: logLevel)
            let coordination = CoordinationSettings(space: space,
                                                    presenterTimeout: presenterTimeout ?? CoordinationOptions.defaultPresenterTimeout,
                                                    strict: strict, timeout: timeout, nonblock: nonblock)
            let exec = ExecSettings(reads: reads, writes: writes, deletes: deletes, coordination: coordination,
                                    conflictExitCode: conflictExitCode, command: command)
            do {
                try space.validate()
                try coordination.validate()
                try exec.validate()
            } catch {
                return nil
            }
            return exec
        }

        /// An option's value: nil when it does not parse, `.some(nil)` when absent.
        private static func parsed<Value>(_ text: String?, as parse: (String) -> Value?) -> Value?? {
            guard let text else { return .some(nil) }
            return parse(text).map { .some($0) }
        }
    }
}
