import AsyncFileIO

/// The usual arguments of `exec`, `write` and `read`, read without swift-argument-parser.
///
/// Scripts run these subcommands once per item, and the parser's first use in a process
/// costs about 2 ms, a quarter to a third of the whole command (it asks the runtime for
/// protocol conformances, and each first lookup scans every conformance record in the
/// binary; docs/performance.md). This reads the plain shapes: each option as
/// `--name VALUE`, `--name=VALUE` or a flag, once each (`exec`'s claims any number of
/// times); for `exec`, then `--` and the command; for `write` and `read`, their paths
/// anywhere among the options. Anything else (help, a repeated option, a path or a value
/// other than `-` that begins with `-`, an unknown name, a value the option's own parser
/// or check refuses) gives nil, and the full parser reads the arguments, errors and all.
/// A test parses many arguments both ways and compares the results.
enum QuickArguments {
    /// A subcommand read from its arguments.
    enum Command {
        case exec(ExecSettings)
        case write(WriteSettings)
        case read(ReadSettings)

        func run() async throws {
            switch self {
            case .exec(let exec): try await exec.run()
            case .write(let write): try await write.run()
            case .read(let read): try await read.run()
            }
        }
    }

    /// The command the arguments describe, validated as the parser would; nil when the
    /// full parser has to read them.
    static func parse(_ arguments: [String]) -> Command? {
        switch arguments.first {
        case "exec": exec(arguments).map(Command.exec)
        case "write": write(arguments).map(Command.write)
        case "read": read(arguments).map(Command.read)
        default: nil
        }
    }

    /// `exec`'s arguments: options, `--`, the command.
    static func exec(_ arguments: [String]) -> ExecSettings? {
        guard arguments.first == "exec", let terminator = arguments.firstIndex(of: "--") else { return nil }
        var options = Options(subcommand: .exec)
        var index = 1
        while index < terminator {
            guard options.read(arguments, at: &index, before: terminator) else { return nil }
        }
        return options.exec(command: Array(arguments[(terminator + 1)...]))
    }

    /// `write`'s arguments: options and one path, in any order.
    static func write(_ arguments: [String]) -> WriteSettings? {
        guard arguments.first == "write", let (options, paths) = optionsAndPaths(arguments, .write), paths.count == 1
        else { return nil }
        return options.write(path: paths[0])
    }

    /// `read`'s arguments: options and paths, in any order.
    static func read(_ arguments: [String]) -> ReadSettings? {
        guard arguments.first == "read", let (options, paths) = optionsAndPaths(arguments, .read) else { return nil }
        return options.read(paths: paths)
    }

    /// The options and the paths among them (none after a `--`, none that begins with `-`).
    private static func optionsAndPaths(_ arguments: [String], _ subcommand: Options.Subcommand) -> (Options, [String])? {
        guard !arguments.contains("--") else { return nil }
        var options = Options(subcommand: subcommand)
        var paths: [String] = []
        var index = 1
        while index < arguments.count {
            let argument = arguments[index]
            if !argument.isEmpty, !argument.hasPrefix("-") {
                paths.append(argument)
                index += 1
                continue
            }
            guard options.read(arguments, at: &index, before: arguments.count) else { return nil }
        }
        return (options, paths)
    }

    /// What the options said, before they become the command's settings.
    private struct Options {
        enum Subcommand { case exec, write, read }
        let subcommand: Subcommand
        var reads: [String] = [], writes: [String] = [], deletes: [String] = []
        var strict = false, nonblock = false, append = false, noCoordination = false
        var cat = false, json = false, nullSeparated = false, fromList: String?, concurrency: String?, engine: String?
        var conflictExitCode: String?, presenterTimeout: String?, timeout: String?
        var space: String?, root: String?, leaseTTL: String?, logLevel: String?, logFormat: String?
        var etcdCA: String?, etcdCertificate: String?, etcdKey: String?

        init(subcommand: Subcommand) { self.subcommand = subcommand }

        /// Reads the option at `index` (and its value), moving past them; false when the
        /// parser has to read the arguments.
        mutating func read(_ arguments: [String], at index: inout Int, before end: Int) -> Bool {
            var name = arguments[index]
            var value: String?
            if name.hasPrefix("--"), let equals = name.firstIndex(of: "=") {
                value = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            } else if takesValue(name) {
                index += 1
                guard index < end else { return false }
                value = arguments[index]
            }
            // `-` alone is a value (stdin, for `--from-list -`).
            if let value, value.isEmpty || (value.hasPrefix("-") && value != "-") { return false }
            index += 1
            return take(name, value)
        }

        /// Whether the option `name` takes a value (by any of its names).
        func takesValue(_ name: String) -> Bool {
            switch name {
            case "--read", "--write", "--delete", "-E", "--conflict-exit-code": subcommand == .exec
            case "--from-list", "--concurrency", "--engine": subcommand == .read
            case "--presenter-timeout", "--timeout", "-w", "--wait", "--space", "--root", "--lease-ttl", "--etcd-cacert",
                 "--etcd-cert", "--etcd-key", "--log-level", "--log-format":
                true
            default: false
            }
        }

        /// Records one option; false for a name it does not know, a value where none
        /// belongs or none where one does, and a second use of a single option.
        mutating func take(_ name: String, _ value: String?) -> Bool {
            guard let value else {
                switch (name, subcommand) {
                case ("--strict", _): return Self.set(&strict)
                case ("-n", _), ("--nonblock", _): return Self.set(&nonblock)
                case ("--append", .write): return Self.set(&append)
                case ("--no-coordination", .write), ("--no-coordination", .read): return Self.set(&noCoordination)
                case ("--cat", .read): return Self.set(&cat)
                case ("--json", .read): return Self.set(&json)
                case ("-z", .read), ("--null", .read): return Self.set(&nullSeparated)
                default: return false
                }
            }
            switch (name, subcommand) {
            case ("--read", .exec): reads.append(value)
            case ("--write", .exec): writes.append(value)
            case ("--delete", .exec): deletes.append(value)
            case ("-E", .exec), ("--conflict-exit-code", .exec): return Self.set(&conflictExitCode, value)
            case ("--from-list", .read): return Self.set(&fromList, value)
            case ("--concurrency", .read): return Self.set(&concurrency, value)
            case ("--engine", .read): return Self.set(&engine, value)
            case ("--presenter-timeout", _): return Self.set(&presenterTimeout, value)
            case ("--timeout", _), ("-w", _), ("--wait", _): return Self.set(&timeout, value)
            case ("--space", _): return Self.set(&space, value)
            case ("--root", _): return Self.set(&root, value)
            case ("--lease-ttl", _): return Self.set(&leaseTTL, value)
            case ("--log-level", _): return Self.set(&logLevel, value)
            case ("--log-format", _): return Self.set(&logFormat, value)
            case ("--etcd-cacert", _): return Self.set(&etcdCA, value)
            case ("--etcd-cert", _): return Self.set(&etcdCertificate, value)
            case ("--etcd-key", _): return Self.set(&etcdKey, value)
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

        /// `exec`'s command, checked as the parser checks it.
        func exec(command: [String]) -> ExecSettings? {
            guard let coordination = coordination(), let conflictExitCode = Self.parsed(conflictExitCode, as: { Int32($0) })
            else { return nil }
            let exec = ExecSettings(reads: reads, writes: writes, deletes: deletes, coordination: coordination,
                                    conflictExitCode: conflictExitCode, command: command)
            return (try? exec.validate()) == nil ? nil : exec
        }

        /// `write`'s command, checked as the parser checks it.
        func write(path: String) -> WriteSettings? {
            coordination().map { WriteSettings(path: path, append: append, noCoordination: noCoordination, coordination: $0) }
        }

        /// `read`'s command, checked as the parser checks it.
        func read(paths: [String]) -> ReadSettings? {
            guard let coordination = coordination(), let concurrency = Self.parsed(concurrency, as: { Int($0) }),
                  let engine = Self.parsed(engine, as: FileIOEngine.init(argument:))
            else { return nil }
            let read = ReadSettings(paths: paths, fromList: fromList, nullSeparated: nullSeparated, concurrency: concurrency ?? Read.defaultConcurrency,
                                    noCoordination: noCoordination, cat: cat, json: json, engine: engine ?? .default,
                                    coordination: coordination)
            return (try? read.validate()) == nil ? nil : read
        }

        /// The coordination and space options, checked as the parser checks them.
        private func coordination() -> CoordinationSettings? {
            guard let leaseTTL = Self.parsed(leaseTTL, as: CommandDuration.init(argument:)),
                  let presenterTimeout = Self.parsed(presenterTimeout, as: CommandDuration.init(argument:)),
                  let timeout = Self.parsed(timeout, as: CommandDuration.init(argument:))
            else { return nil }
            let space = SpaceSettings(space: space, root: root, leaseTTL: leaseTTL, etcdCA: etcdCA,
                                      etcdCertificate: etcdCertificate, etcdKey: etcdKey, logLevel: logLevel,
                                      logFormat: logFormat)
            let coordination = CoordinationSettings(space: space,
                                                    presenterTimeout: presenterTimeout ?? CoordinationOptions.defaultPresenterTimeout,
                                                    strict: strict, timeout: timeout, nonblock: nonblock)
            do {
                try space.validate()
                try coordination.validate()
            } catch {
                return nil
            }
            return coordination
        }

        /// An option's value: nil when it does not parse, `.some(nil)` when absent.
        private static func parsed<Value>(_ text: String?, as parse: (String) -> Value?) -> Value?? {
            guard let text else { return .some(nil) }
            return parse(text).map { .some($0) }
        }
    }
}
