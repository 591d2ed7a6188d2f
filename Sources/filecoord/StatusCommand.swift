import ArgumentParser
import FileCoordination
import FileCoordinationEtcd
import Foundation

struct StatusCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "List the live claims and presenters in the coordination space.",
        discussion: """
            Every live process in the space is asked for its claims and presenters; a \
            process that does not answer within a second (stopped, say) is listed as such, \
            with the claims it has held for more than 100 ms and its presenters (its records \
            in the space list them). \
            Entries left by dead processes are cleaned up, not listed. With --json one \
            object, keys sorted: {"claims":[{"access":"read"|"write","path":P,"pid":N}],\
            "cleanedUp":[N],"presenters":[{"path":P,"pid":N}],"unanswered":[N],"version":1,"waiting":[...]}, \
            a stable schema (docs/cli.md): version changes only if a field changes meaning or goes. \
            A pid is as this process's PID namespace numbers it; a process of another \
            namespace that this one does not show (a container's) keeps its own pid, with \
            "otherPidNamespace":true (in text: "pid N in another PID namespace").
            """
    )

    @Flag(help: "Print one JSON object.")
    var json = false

    @OptionGroup var space: SpaceOption

    func run() async throws {
        let joined = try await space.join()
        let status: CoordinationSpace.Status
        do {
            if let joined {
                status = try await joined.status(timeout: .seconds(1))
            } else {
                // Joined, and not a local space: an etcd one.
                status = try await FileCoordinator.etcdCoordinationSpace!.status()
            }
            await FileCoordinator.leaveCoordinationSpace()
        } catch let error as FileCoordinationError {
            Output.report(error)
            throw Status.failed
        }
        if json {
            func claim(_ claim: CoordinationSpace.Status.Claim) -> JSONLines.Status.Claim {
                let (path, base64) = JSONLines.text(claim.path)
                return .init(path: path, pathBase64: base64, access: claim.isWrite ? "write" : "read", pid: claim.processIdentifier,
                             host: claim.host, otherPidNamespace: claim.isInAnotherPIDNamespace ? true : nil)
            }
            let presenters = status.presenters.map { presenter in
                let (path, base64) = JSONLines.text(presenter.path)
                return JSONLines.Status.Presenter(path: path, pathBase64: base64, pid: presenter.processIdentifier, host: presenter.host,
                                                  otherPidNamespace: presenter.isInAnotherPIDNamespace ? true : nil)
            }
            let line = JSONLines.line(JSONLines.Status(claims: status.claims.map(claim), waiting: status.waiting.map(claim),
                                                       presenters: presenters, unanswered: status.unanswered, cleanedUp: status.cleanedUp))
            Output.writeStandardOutput(line)
            return
        }
        var lines: [String] = []
        lines.append(status.claims.isEmpty ? "no claims" : "claims:")
        for claim in status.claims { lines.append("  \(claim.isWrite ? "write" : "read ") \(Output.displayed(claim.path))  (\(Self.who(claim)))") }
        if !status.waiting.isEmpty { lines.append("waiting:") }
        for claim in status.waiting { lines.append("  \(claim.isWrite ? "write" : "read ") \(Output.displayed(claim.path))  (\(Self.who(claim)))") }
        lines.append(status.presenters.isEmpty ? "no presenters" : "presenters:")
        for presenter in status.presenters {
            lines.append("  \(Output.displayed(presenter.path))  (\(Self.who(presenter.processIdentifier, presenter.host, otherNamespace: presenter.isInAnotherPIDNamespace)))")
        }
        if !status.unanswered.isEmpty { lines.append("not answering: " + status.unanswered.map { "pid \($0)" }.joined(separator: ", ")) }
        if !status.cleanedUp.isEmpty { lines.append("cleaned up after dead processes: " + status.cleanedUp.map { "pid \($0)" }.joined(separator: ", ")) }
        Output.writeStandardOutput(Array((lines.joined(separator: "\n") + "\n").utf8))
    }

    /// `pid N`, with ` on HOST` in a space shared by hosts, and ` in another PID
    /// namespace` when it is not this one's number for the process.
    static func who(_ pid: Int32, _ host: String?, otherNamespace: Bool = false) -> String {
        (host.map { "pid \(pid) on \($0)" } ?? "pid \(pid)") + (otherNamespace ? " in another PID namespace" : "")
    }

    /// ``who(_:_:otherNamespace:)`` of a claim's holder.
    static func who(_ claim: CoordinationSpace.Status.Claim) -> String {
        who(claim.processIdentifier, claim.host, otherNamespace: claim.isInAnotherPIDNamespace)
    }
}
