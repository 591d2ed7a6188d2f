import Foundation
import Testing
import TestSupport

/// What a user trying to break `filecoord` tries: input that is long, odd or hostile, and
/// ends that are not the usual ones. Each case answers with a clear error or the
/// documented behaviour, and the process never crashes.
@Suite("filecoord against a hostile user")
struct HostileUseTests: CrossProcessFixture {
    let scratch = Scratch()

    /// A name under a missing directory with 1,200 missing components (2.4 KB, well
    /// under PATH_MAX): the resolution of directories not made yet walks them one by one.
    static func deeplyMissing(in scratch: Scratch) -> String {
        scratch.path + "/nonexist/" + String(repeating: "y/", count: 1200) + "z"
    }

    @Test("a name under 1,200 missing directories is treated as any name under a missing directory: ENOENT (exit 1) where a file is opened, the command run by exec (which claims names not made yet), and the process's files leave the space",
          arguments: ["read --cat", "read", "write --append", "write", "exec --read", "exec --write", "exec --delete"])
    func deeplyMissingName(command: String) async throws {
        let scratch = Scratch()
        let space = scratch.path + "/space"
        let name = Self.deeplyMissing(in: scratch)
        let words = command.split(separator: " ").map(String.init)
        var arguments = [words[0], "--space", space] + words.dropFirst()
        let runsCommand = command.hasPrefix("exec")
        arguments += runsCommand ? [name, "--", "echo", "ran"] : [name]
        let result = try await run(filecoordBinary, arguments, stdin: Data("x\n".utf8))
        if runsCommand {
            #expect(result.status == 0 && result.outputText == "ran\n", "\(command): status \(result.status): \(result.errorText.prefix(300))")
        } else {
            #expect(result.status == 1, "\(command): status \(result.status): \(result.errorText.prefix(300))")
            #expect(result.errorText.contains("ENOENT"), "\(command): \(result.errorText.prefix(300))")
        }
        // No record of the process is left behind for the next one to clean up.
        let procs = (try? FileManager.default.contentsOfDirectory(atPath: space + "/procs")) ?? []
        #expect(procs.isEmpty, "\(command): left \(procs)")
    }

    @Test("a presented file moved out of its directory, and a subitem moved out of a presented directory, are heard as deleted at once: the rename's other half never comes, and nothing else happens",
          .timeLimit(.minutes(3)))
    func movedOutOfReach() async throws {
        let file = scratch.write("f", "v\n")
        try FileManager.default.createDirectory(atPath: scratch.path + "/o", withIntermediateDirectories: true)
        let (once, _) = try await present(file, "--once")
        #expect(rename(file, scratch.path + "/o/f") == 0)
        // --once ends on the first event: the deletion, with no other event to push it out.
        #expect(await ends(once, within: .seconds(30), "present --once of a file moved away") == 0)

        let directory = scratch.path + "/d"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        _ = scratch.write("d/a", "a\n")
        var (presenter, lines) = try await present(directory)
        #expect(rename(directory + "/a", scratch.path + "/o/a") == 0)
        let heard = await named(events(of: presenter, &lines, within: .seconds(30)) { $0.hasPrefix("accommodateSubitemDeletion") })
        #expect(heard == ["accommodateSubitemDeletion a"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a presented directory deleted and made again is watched again: what the new one holds and what happens in it are heard, and status still lists the presenter",
          .timeLimit(.minutes(3)))
    func presentedDirectoryMadeAgain() async throws {
        let directory = scratch.path + "/d"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        _ = scratch.write("d/a", "1\n")
        var (presenter, lines) = try await present(directory)
        _ = try await shell("rm -rf '\(directory)' && mkdir '\(directory)' && echo 2 > '\(directory)/b'")
        // The deletions, then the new directory and its file (as made, or as found when
        // the new directory is watched).
        let heard = await named(events(of: presenter, &lines, within: .seconds(30)) { $0 == "subitemDidAppear " + directory + "/b" })
        #expect(heard.first == "accommodateSubitemDeletion a", "\(heard)")
        #expect(heard.contains("accommodateDeletion d") && heard.contains("didChange d"), "\(heard)")
        // The new directory is watched: a later change inside it is heard.
        _ = try await shell("echo 3 > '\(directory)/c'")
        let later = await named(events(of: presenter, &lines, within: .seconds(30)) { $0 == "subitemDidAppear " + directory + "/c" })
        #expect(later.last == "subitemDidAppear c", "\(later)")
        let status = try await filecoord("status", "--json", "--space", space)
        #expect(status.outputText.contains(directory), "\(status.outputText)")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a presented file whose directory is deleted and made again is watched again, and hears the file made anew", .timeLimit(.minutes(3)))
    func presentedFileDirectoryMadeAgain() async throws {
        let directory = scratch.path + "/d"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let file = scratch.write("d/f", "1\n")
        var (presenter, lines) = try await present(file)
        _ = try await shell("rm -rf '\(directory)' && mkdir '\(directory)'")
        #expect(await named(events(of: presenter, &lines, within: .seconds(30)) { $0.hasPrefix("accommodateDeletion") }) == ["accommodateDeletion f"])
        _ = try await shell("echo 2 > '\(file)'")
        #expect(await named(events(of: presenter, &lines, within: .seconds(30)) { $0.hasPrefix("didChange") }) == ["didChange f"])
        _ = try await shell("echo 3 >> '\(file)'")
        #expect(await named(events(of: presenter, &lines, within: .seconds(30)) { $0.hasPrefix("didChange") }) == ["didChange f"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    /// The presenter's next events, as "EVENT PATH", up to the first that `stop` accepts;
    /// past `limit` the presenter is ended and a hang recorded.
    func events(of presenter: LineProcess, _ lines: inout AsyncStream<String>.Iterator, within limit: Duration,
                until stop: (String) -> Bool) async -> [String] {
        let expired = Flag()
        let watchdog = Task {
            try await Task.sleep(for: limit) // ok: the bound of a hang
            expired.set()
            presenter.signal(SIGTERM)
        }
        defer { watchdog.cancel() }
        var seen: [String] = []
        while let line = await lines.next() {
            let (name, path) = event(line)
            seen.append(name + " " + path)
            if stop(name + " " + path) { return seen }
        }
        Issue.record(expired.isSet ? "the presenter did not report what was expected within \(limit); it reported \(seen)"
                                   : "the presenter ended; it reported \(seen)")
        return seen
    }

    /// "EVENT PATH" lines with each path's last name only.
    func named(_ events: [String]) -> [String] {
        events.map { line in
            let parts = line.split(separator: " ", maxSplits: 1)
            return "\(parts[0]) \(parts.count > 1 ? parts[1].split(separator: "/").last.map(String.init) ?? "" : "")"
        }
    }
}
