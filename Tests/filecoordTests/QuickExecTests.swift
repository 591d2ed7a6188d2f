import ArgumentParser
@testable import filecoord
import Testing

/// `exec`'s quick reading of its arguments against swift-argument-parser's: where the
/// quick one reads arguments, both give the same command; where it cannot, it leaves
/// them to the parser.
@Suite("exec's quick argument reading")
struct QuickExecTests {
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
        ["read", "f"], ["help", "exec"], [], ["--write", "f", "exec", "--", "true"],
    ]

    @Test("the shapes scripts use are read, and give the command the parser gives", arguments: read)
    func readAsTheParserReads(arguments: [String]) throws {
        let quick = try #require(QuickExec.parse(arguments), "left to the parser: \(arguments)")
        let parsed = try #require(try FileCoord.parseAsRoot(arguments) as? Exec)
        #expect(Self.describe(quick) == Self.describe(parsed.settings))
    }

    @Test("help, errors and the other shapes are left to the parser", arguments: leftToTheParser)
    func leftAlone(arguments: [String]) {
        #expect(QuickExec.parse(arguments) == nil)
    }

    @Test("every option of exec, of its coordination and of its space has its place in the settings")
    func everyOptionSet() throws {
        let exec = try #require(try FileCoord.parseAsRoot(Self.read[0]) as? Exec)
        let settings = exec.settings
        #expect(Mirror(reflecting: exec).children.count == Mirror(reflecting: settings).children.count)
        #expect(Mirror(reflecting: exec.coordination).children.count == Mirror(reflecting: settings.coordination).children.count)
        #expect(Mirror(reflecting: exec.coordination.space).children.count == Mirror(reflecting: settings.coordination.space).children.count)
    }

    /// Every value the settings hold, as text.
    static func describe(_ exec: ExecSettings) -> String {
        let space = exec.coordination.space
        let coordination = exec.coordination
        return [
            "\(exec.reads) \(exec.writes) \(exec.deletes) \(exec.command) \(String(describing: exec.conflictExitCode))",
            "\(coordination.presenterTimeout) \(coordination.strict) \(String(describing: coordination.timeout)) \(coordination.nonblock)",
            "\(String(describing: space.space)) \(String(describing: space.root)) \(String(describing: space.leaseTTL))",
            "\(String(describing: space.etcdCA)) \(String(describing: space.etcdCertificate)) \(String(describing: space.etcdKey))",
            "\(String(describing: space.logLevel))",
        ].joined(separator: " | ")
    }
}
