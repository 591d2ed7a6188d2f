import ArgumentParser
@testable import filecoord
import Testing

/// The quick reading of `exec`'s, `write`'s and `read`'s arguments against swift-argument-parser's:
/// where the quick one reads arguments, both give the same command; where it cannot, it
/// leaves them to the parser.
@Suite("exec's, write's and read's quick argument reading")
struct QuickArgumentsTests {
    /// Shapes scripts use, which the quick reading must take.
    static let read: [[String]] = [
        ["exec", "--write", "f", "--", "true"],
        ["exec", "--read", "a", "--read", "b", "--write", "c", "--delete", "d", "--", "cmd", "--", "-x", "--write"],
        ["exec", "--read=a b", "--write=c", "--delete=d", "--", "sh", "-c", "exit 7"],
        ["exec", "-n", "--write", "f", "--", "true"],
        ["exec", "--nonblock", "-w", "0", "--write", "f", "--", "true"],
        ["exec", "-w", "1.5", "--strict", "--presenter-timeout", "500ms", "-E", "42", "--write", "f", "--", "true"],
        ["exec", "--wait", "2s", "--conflict-exit-code=0", "--read", "f", "--", "true"],
        ["exec", "--timeout=inf", "--presenter-timeout=1m", "--write", "f", "--", "true"],
        ["exec", "--space", "/tmp/space", "--log-level", "debug", "--write", "f", "--", "true"],
        ["exec", "--space=etcd://127.0.0.1:2379,127.0.0.2:2379/p", "--root", "/r", "--lease-ttl", "3",
         "--etcd-cacert", "ca", "--etcd-cert", "c", "--etcd-key", "k", "--write", "f", "--", "true"],
        ["exec", "--write", "f", "--", "--"],
    ]

    /// Shapes it leaves to the parser (help, errors, forms it does not read).
    static let leftToTheParser: [[String]] = [
        ["exec", "--write", "f"], ["exec", "--", "true"], ["exec", "--write", "f", "--"],
        ["exec", "--help", "--write", "f", "--", "true"], ["exec", "-h", "--", "true"], ["exec", "--version", "--", "x"],
        ["exec", "--write", "-f", "--", "true"], ["exec", "--write", "", "--", "true"], ["exec", "--write=", "--", "true"],
        ["exec", "--write", "--", "true"], ["exec", "-nw", "1", "--write", "f", "--", "true"],
        ["exec", "-w5", "--write", "f", "--", "true"], ["exec", "--strict", "--strict", "--write", "f", "--", "true"],
        ["exec", "-n", "--nonblock", "--write", "f", "--", "true"], ["exec", "-w", "1", "--wait", "2", "--write", "f", "--", "true"],
        ["exec", "-E", "300", "--write", "f", "--", "true"], ["exec", "-E", "x", "--write", "f", "--", "true"],
        ["exec", "-E", "-1", "--write", "f", "--", "true"], ["exec", "--timeout", "-1", "--write", "f", "--", "true"],
        ["exec", "--timeout", "soon", "--write", "f", "--", "true"], ["exec", "--presenter-timeout", "0", "--write", "f", "--", "true"],
        ["exec", "--nonblock", "--timeout", "5", "--write", "f", "--", "true"], ["exec", "--space", "", "--write", "f", "--", "true"],
        ["exec", "--space", "/s", "--root", "/r", "--write", "f", "--", "true"], ["exec", "--lease-ttl", "0", "--write", "f", "--", "true"],
        ["exec", "--log-level", "loud", "--write", "f", "--", "true"], ["exec", "--bogus", "--write", "f", "--", "true"],
        ["exec", "stray", "--write", "f", "--", "true"], ["exec", "--strict=yes", "--write", "f", "--", "true"],
        ["help", "exec"], [], ["--write", "f", "exec", "--", "true"],
    ]

    /// `write`'s shapes, which the quick reading must take.
    static let writeRead: [[String]] = [
        ["write", "f"], ["write", "--space", "/tmp/space", "f"], ["write", "f", "--space=/tmp/space", "--append"],
        ["write", "--no-coordination", "f"], ["write", "-n", "f", "--log-level", "error"],
        ["write", "--timeout", "2.5", "--strict", "--presenter-timeout=300ms", "dir/f"],
        ["write", "--space", "etcd://h:1/p", "--root", "/r", "--lease-ttl", "7", "--etcd-cacert", "ca", "f"],
        ["write", "-w", "0", "a b"], ["write", "help"],
    ]

    /// `write`'s shapes left to the parser.
    static let writeLeft: [[String]] = [
        ["write"], ["write", "a", "b"], ["write", "--", "f"], ["write", "--", "-f"], ["write", "-f"], ["write", ""],
        ["write", "--help"], ["write", "f", "-h"], ["write", "--append", "--append", "f"], ["write", "--append=1", "f"],
        ["write", "--read", "x", "f"], ["write", "-E", "3", "f"], ["write", "f", "--space"], ["write", "--space", "-x", "f"],
        ["write", "-n", "-w", "1", "f"], ["write", "--bogus", "f"], ["write", "--lease-ttl", "0", "f"],
        ["exec", "--append", "--write", "f", "--", "true"], ["exec", "--no-coordination", "--write", "f", "--", "true"],
    ]

    /// `read`'s shapes, which the quick reading must take.
    static let readRead: [[String]] = [
        ["read", "f"], ["read", "a", "b", "c"], ["read", "--cat", "f"], ["read", "f", "--json", "g"],
        ["read", "--from-list", "list", "--null"], ["read", "-z", "--from-list=-", "--concurrency", "4", "extra"], ["read", "--from-list", "-"], ["read", "help", "version"],
        ["read", "--engine", "dispatchIO", "--no-coordination", "f"], ["read", "--engine=threads", "f"],
        ["read", "-n", "--space", "/s", "f", "--log-level", "debug"], ["read", "-w", "1", "--strict", "f"],
    ]

    /// `read`'s shapes left to the parser.
    static let readLeft: [[String]] = [
        ["read"], ["read", "--cat"], ["read", "--", "f"], ["read", "-f"], ["read", "--cat", "--json", "f"],
        ["read", "--concurrency", "0", "f"], ["read", "--concurrency", "x", "f"], ["read", "--engine", "fast", "f"],
        ["read", "--cat", "--cat", "f"], ["read", "--append", "f"], ["read", "-zn", "f"], ["read", "f", "--help"],
        ["read", "--from-list"], ["write", "--cat", "f"], ["write", "--json", "f"],
    ]

    @Test("the shapes scripts use are read, and give the command the parser gives", arguments: read + writeRead + readRead)
    func readAsTheParserReads(arguments: [String]) throws {
        let parsed = try FileCoord.parseAsRoot(arguments)
        switch QuickArguments.parse(arguments) {
        case .exec(let quick)?: #expect(Self.describe(quick) == (parsed as? Exec).map { Self.describe($0.settings) })
        case .write(let quick)?: #expect(Self.describe(quick) == (parsed as? Write).map { Self.describe($0.settings) })
        case .read(let quick)?: #expect(Self.describe(quick) == (parsed as? Read).map { Self.describe($0.settings) })
        case nil: Issue.record("left to the parser: \(arguments)")
        }
    }

    @Test("help, errors and the other shapes are left to the parser", arguments: leftToTheParser + writeLeft + readLeft)
    func leftAlone(arguments: [String]) {
        #expect(QuickArguments.parse(arguments) == nil)
    }

    @Test("every option of exec, write and read, of their coordination and of its space has its place in the settings")
    func everyOptionSet() throws {
        let exec = try #require(try FileCoord.parseAsRoot(Self.read[0]) as? Exec)
        let settings = exec.settings
        // -c STRING has its place in the command (["/bin/sh", "-c", STRING]).
        #expect(Mirror(reflecting: exec).children.count - 1 == Mirror(reflecting: settings).children.count)
        #expect(Mirror(reflecting: exec.coordination).children.count == Mirror(reflecting: settings.coordination).children.count)
        #expect(Mirror(reflecting: exec.coordination.space).children.count == Mirror(reflecting: settings.coordination.space).children.count)
        let write = try #require(try FileCoord.parseAsRoot(Self.writeRead[0]) as? Write)
        #expect(Mirror(reflecting: write).children.count == Mirror(reflecting: write.settings).children.count)
        let read = try #require(try FileCoord.parseAsRoot(Self.readRead[0]) as? Read)
        #expect(Mirror(reflecting: read).children.count == Mirror(reflecting: read.settings).children.count)
    }

    /// Every value the settings hold, as text.
    static func describe(_ exec: ExecSettings) -> String {
        "\(exec.reads) \(exec.writes) \(exec.deletes) \(exec.command) \(String(describing: exec.conflictExitCode)) | "
            + describe(exec.coordination)
    }

    static func describe(_ write: WriteSettings) -> String {
        "\(write.path) \(write.append) \(write.noCoordination) | " + describe(write.coordination)
    }

    static func describe(_ read: ReadSettings) -> String {
        "\(read.paths) \(String(describing: read.fromList)) \(read.nullSeparated) \(read.concurrency) \(read.noCoordination) "
            + "\(read.cat) \(read.json) \(read.engine) | " + describe(read.coordination)
    }

    static func describe(_ coordination: CoordinationSettings) -> String {
        let space = coordination.space
        return [
            "\(coordination.presenterTimeout) \(coordination.strict) \(String(describing: coordination.timeout)) \(coordination.nonblock)",
            "\(String(describing: space.space)) \(String(describing: space.root)) \(String(describing: space.leaseTTL))",
            "\(String(describing: space.etcdCA)) \(String(describing: space.etcdCertificate)) \(String(describing: space.etcdKey))",
            "\(String(describing: space.logLevel))",
        ].joined(separator: " | ")
    }
}
