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

    @Test("present ended by a terminating signal removes its presenter, then dies by the signal: through a shell, `present --once f && touch ran` does not run on and $? is 128+N; no crash report",
          .timeLimit(.minutes(3)), arguments: [SIGINT, SIGTERM, SIGHUP, SIGQUIT])
    func presentDiesBySignal(number: Int32) async throws {
        let file = scratch.write("f", "v\n")
        let ran = scratch.path + "/ran"
        let script = #""$FILECOORD" present --once --json --space "$1" "$2" && touch "$3"; echo "status=$?""#
        let shell = try LineProcess(["-c", script, "sh", space, file, ran], executable: "/bin/sh",
                                    environment: ["FILECOORD": filecoordBinary])
        var lines = shell.lines.makeAsyncIterator()
        let ready = try #require(await lines.next())
        let object = try #require(try JSONSerialization.jsonObject(with: Data(ready.utf8)) as? [String: Any])
        let pid = try #require(object["pid"] as? Int32)
        #expect(kill(pid, number) == 0)
        // Bounded: a presenter that does not end is killed after 30 s (and the shell then
        // says 137).
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30)) // ok: the bound of a hang
            kill(pid, SIGKILL)
        }
        #expect(await lines.next() == "status=\(128 + number)")
        watchdog.cancel()
        let ended = await shell.wait()
        #expect(!FileManager.default.fileExists(atPath: ran), "the command after && ran")
        #expect(!ended.stderr.contains("crashed") && !ended.stderr.contains("Backtracing"), "\(ended.stderr.prefix(300))")
        #expect(entries("procs").isEmpty && entries("presenters").isEmpty, "left \(entries("procs")) \(entries("presenters"))")
    }

    @Test("SIGQUIT ends a command waiting for a claim as SIGTERM does: it dies by the signal, with no crash report, writes nothing and leaves no files in the space",
          .timeLimit(.minutes(3)))
    func quitWhileWaiting() async throws {
        let file = scratch.write("f", "old\n")
        // One after another: a holder started while another command runs would inherit
        // that command's output pipes and hold them open.
        for command in ["write", "exec", "read"] {
            let fifo = scratch.path + "/release-" + command
            let holder = try await holdUntilReleased(["--write", file], fifo: fifo)
            let arguments: [String]
            switch command {
            case "write": arguments = ["write", "--space", space, file]
            case "exec": arguments = ["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo new > \"$0\"", file]
            default: arguments = ["read", "--space", space, "--cat", file]
            }
            let waiting = try LineProcess(arguments)
            try await waitForStatus { self.waitingPids(in: $0).contains(waiting.pid) }
            waiting.signal(SIGQUIT)
            // Ended (or, past 30 s, killed) before the holder lets go: a command that lived
            // on would take the claim and write.
            var ended = false
            for _ in 0 ..< 3000 where !ended {
                ended = !isAlive(waiting.pid)
                if !ended { try await Task.sleep(for: .milliseconds(10)) } // ok: polling another process's state
            }
            if !ended { waiting.signal(SIGKILL) }
            _ = try await shell("timeout 30 sh -c 'echo go > \"$0\"' '\(fifo)'")
            _ = await ends(holder, within: .seconds(30), "the holder")
            let result = await waiting.wait()
            #expect(ended && waiting.process.terminationReason == .uncaughtSignal && result.status == SIGQUIT,
                    "\(command) ended with \(waiting.process.terminationReason == .exit ? "exit" : "signal") \(result.status)")
            #expect(!result.stderr.contains("crashed") && !result.stderr.contains("Backtracing"), "\(command): \(result.stderr.prefix(300))")
            #expect(try String(contentsOfFile: file, encoding: .utf8) == "old\n", "\(command)")
            #expect(!entries("procs").contains { $0.hasPrefix("\(waiting.pid)-") }, "\(command): \(entries("procs"))")
        }
    }

    @Test("output that cannot be written (stdout on /dev/full) is an error: one line on stderr naming stdout and the cause, exit 1",
          .timeLimit(.minutes(3)), arguments: ["status --json", "status", "present --once", "version"])
    func outputLost(command: String) async throws {
        let file = scratch.write("f", "v\n")
        let words = command.split(separator: " ").map(String.init)
        let arguments = words == ["version"] ? words : [words[0], "--space", space] + words.dropFirst() + (words[0] == "present" ? [file] : [])
        let quoted = arguments.map { "'\($0)'" }.joined(separator: " ")
        // --once ends at the first event (not reached: the first line already fails).
        let result = try await shell("\"$FILECOORD\" \(quoted) > /dev/full; echo \"status=$?\" >&2")
        let lines = result.errorText.split(separator: "\n")
        #expect(lines.last == "status=1", "\(command): \(result.errorText)")
        #expect(lines.count == 2 && lines.first == "filecoord: stdout: write failed: No space left on device (ENOSPC)",
                "\(command): \(result.errorText)")
    }

    @Test("read waiting for a claim says who holds it after a second, and its timeout names the holder and the item absolute, as every claim does",
          .timeLimit(.minutes(3)))
    func readSaysWhoHolds() async throws {
        let file = scratch.write("f", "v\n")
        let fifo = scratch.path + "/release"
        let holder = try await holdUntilReleased(["--write", file], fifo: fifo)
        // A relative name, as a script gives it.
        let result = try await shell("cd '\(scratch.path)' && \"$FILECOORD\" read --space '\(space)' --timeout 3 --cat f")
        try await release(fifo)
        _ = await ends(holder, within: .seconds(30), "the holder")
        #expect(result.status == 3, "\(result.errorText)")
        #expect(result.errorText.contains("filecoord: waiting for pid \(holder.pid) (write claim on \(file))"), "\(result.errorText)")
        #expect(result.errorText.contains("filecoord: \(file): claim failed: held by pid \(holder.pid) (write claim on \(file));"),
                "\(result.errorText)")
    }

    @Test("a trailing slash on a regular file's name is ENOTDIR for write, write --append, read and a --from-list line, as for cat, and the file is left as it was")
    func trailingSlashOnFile() async throws {
        let file = scratch.write("f", "old\n")
        let list = scratch.write("list", file + "/\n")
        for arguments in [["write", file + "/"], ["write", "--append", file + "/"], ["read", "--cat", file + "/"],
                          ["read", "--cat", "--from-list", list], ["present", "--once", "--timeout", "10", file + "/"]] {
            let result = try await run(filecoordBinary, [arguments[0], "--space", space] + arguments.dropFirst(), stdin: Data("new\n".utf8))
            #expect(result.status == 1 && result.errorText.contains("Not a directory (ENOTDIR)"), "\(arguments): \(result.errorText)")
            #expect(result.stdout.isEmpty, "\(arguments)")
        }
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "old\n")
    }

    @Test("status reports each dead process once, and only once its files are gone: entries of the wrong type where a record or mailbox belongs are set aside, not reported again and again")
    func cleanedUpOnce() async throws {
        #expect(try await filecoord("status", "--space", space).status == 0)
        // Pids above the kernel's pid_max: no process has them.
        try FileManager.default.createDirectory(atPath: space + "/procs/999992-aa", withIntermediateDirectories: false)
        #expect(FileManager.default.createFile(atPath: space + "/mail/999993-bb", contents: nil))
        try FileManager.default.createDirectory(atPath: space + "/mail/999994-cc/x", withIntermediateDirectories: true)
        #expect(mkfifo(space + "/procs/999995-dd", 0o600) == 0)
        // Old enough to be a join's leftovers.
        let old = Date(timeIntervalSinceNow: -7200)
        for name in ["mail/999993-bb", "mail/999994-cc"] {
            try FileManager.default.setAttributes([.modificationDate: old], ofItemAtPath: space + "/" + name)
        }
        var reported: [[Int]] = []
        for _ in 0 ..< 3 {
            let result = try await filecoord("status", "--json", "--space", space)
            let object = try #require(try JSONSerialization.jsonObject(with: result.stdout) as? [String: Any], "\(result.errorText)")
            reported.append(try #require(object["cleanedUp"] as? [Int]))
        }
        #expect(reported == [[999992, 999993, 999994, 999995], [], []])
        #expect(entries("procs").isEmpty && entries("mail").isEmpty, "\(entries("procs")) \(entries("mail"))")
    }

    @Test("a presenter in a PID namespace of its own (pid 1 there) is shown by status under the pid the viewer's namespace gives it, and a viewer that cannot see it says the pid is another namespace's",
          .enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare"), "needs root and unshare"),
          .timeLimit(.minutes(3)))
    func presenterInOtherPIDNamespace() async throws {
        let file = scratch.write("f", "v\n")
        let inner = try LineProcess(["--pid", "--fork", filecoordBinary, "present", "--json", "--space", space, file],
                                    executable: "/usr/bin/unshare")
        var lines = inner.lines.makeAsyncIterator()
        let ready = try #require(await lines.next())
        let object = try #require(try JSONSerialization.jsonObject(with: Data(ready.utf8)) as? [String: Any])
        #expect(object["pid"] as? Int == 1, "the presenter sees itself as pid 1: \(ready)")
        // Its pid here: unshare's child.
        let children = (try? String(contentsOfFile: "/proc/\(inner.pid)/task/\(inner.pid)/children", encoding: .utf8)) ?? ""
        let outer = try #require(Int(children.split(separator: " ").first ?? ""), "no child of unshare: \(children)")
        let status = try await filecoord("status", "--json", "--space", space)
        let listed = try #require(try JSONSerialization.jsonObject(with: status.stdout) as? [String: Any])
        let presenters = try #require(listed["presenters"] as? [[String: Any]])
        #expect(presenters.count == 1 && presenters.first?["pid"] as? Int == outer && presenters.first?["otherPidNamespace"] == nil,
                "\(status.outputText)")
        // From a namespace of its own, with its own /proc, the presenter cannot be seen.
        let hidden = try await run("/usr/bin/unshare", ["--pid", "--fork", "--mount-proc", filecoordBinary, "status", "--space", space])
        #expect(hidden.outputText.contains("(pid 1 in another PID namespace)"), "\(hidden.outputText) \(hidden.errorText)")
        kill(Int32(outer), SIGTERM)
        _ = await ends(inner, within: .seconds(30), "the presenter")
    }

    /// Small things a script author meets: each argument list, run in a fresh space, and
    /// the status and a piece of the stderr it must give.
    static let optionCases: [(arguments: [String], status: Int32, says: String)] = [
        (["present", "--timeout", "5", "-e", "", "F"], 2, "--event: an empty event name"),
        (["present", "--timeout", "5", "-e", "didChange,,save", "F"], 2, "--event: an empty event name"),
        (["exec", "-w5", "-E75", "--write", "F", "--", "true"], 0, ""),
        (["exec", "--log-level", "bogus", "--write", "F", "--", "true"], 2, "the levels are critical, error, warning, notice, info, debug, trace"),
        (["exec", "--log-level", "notice", "--write", "F", "--", "true"], 0, ""),
        (["exec", "--timeout", "0x10", "--write", "F", "--", "true"], 2, "'0x10' is invalid"),
        (["exec", "--timeout", "nan", "--write", "F", "--", "true"], 2, "'nan' is invalid"),
        (["exec", "--presenter-timeout", "0", "--write", "F", "--", "true"], 2, "--presenter-timeout must be at least 1ms"),
        (["exec", "--presenter-timeout", "1e-300", "--write", "F", "--", "true"], 2, "--presenter-timeout must be at least 1ms"),
        (["exec", "--timeout", "1e1", "--write", "F", "--", "true"], 0, ""),
        (["read", "--from-list", "L", "--from-list", "L"], 2, "--from-list may be given once"),
        (["read", "--from-list", "NUL"], 1, "line 2 holds a NUL byte"),
    ]

    @Test("small things in options and lists: empty event names, flock's attached -w5 -E75, every log level named, decimal durations only, a presenter timeout that rounds to nothing, one --from-list, a NUL inside a list's line",
          arguments: 0 ..< optionCases.count)
    func optionsAndLists(index: Int) async throws {
        let file = scratch.write("f", "v\n")
        let list = scratch.write("list", file + "\n")
        // The second line names `f` up to a NUL: read, it would be `f`.
        let nul = scratch.path + "/nul"
        try writeFixture(Data((file + "\n" + file + "\u{0}.secret\n").utf8), toPath: nul)
        let (arguments, status, says) = Self.optionCases[index]
        let given = arguments.map { ["F": file, "L": list, "NUL": nul][$0] ?? $0 }
        let result = try await run(filecoordBinary, [given[0], "--space", space] + given.dropFirst())
        #expect(result.status == status && (says.isEmpty || result.errorText.contains(says)), "\(arguments): \(result.status) \(result.errorText)")
        #expect(result.stdout.isEmpty, "\(arguments): nothing of the list was read")
    }

    @Test("present --timeout 0 waits for ever, as inotifywait -t 0 does", .timeLimit(.minutes(3)))
    func presentTimeoutZero() async throws {
        let file = scratch.write("f", "v\n")
        let result = try await shell("timeout 3 \"$FILECOORD\" present --space '\(space)' --timeout 0 '\(file)'; echo \"status=$?\"")
        #expect(result.outputText.hasSuffix("status=124\n"), "\(result.outputText) \(result.errorText)")
    }

    @Test("a standard descriptor closed at start is named as closed: write and read --from-list - with stdin closed, status with stdout closed")
    func closedStandardDescriptors() async throws {
        let file = scratch.write("f", "old\n")
        for (command, says) in [("write '\(file)' <&-", "filecoord: stdin: read failed: it was closed when filecoord started (EBADF)"),
                                ("read --from-list - <&-", "filecoord: stdin: read failed: it was closed when filecoord started (EBADF)"),
                                ("status >&-", "filecoord: stdout: write failed: it was closed when filecoord started (EBADF)")] {
            let words = command.split(separator: " ", maxSplits: 1)
            let result = try await shell("\"$FILECOORD\" \(words[0]) --space '\(space)' \(words[1]); echo \"status=$?\" >&2")
            #expect(result.errorText == says + "\nstatus=1\n", "\(command): \(result.errorText)")
        }
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "old\n")
    }

    @Test("--log-level trace says more than debug: a claim granted at once and its release")
    func traceSaysMore() async throws {
        let file = scratch.write("f", "v\n")
        var said: [String: String] = [:]
        for level in ["debug", "trace"] {
            said[level] = try await run(filecoordBinary, ["exec", "--space", space, "--log-level", level, "--write", file, "--", "true"]).errorText
        }
        #expect(!(said["debug"] ?? "").contains("claim granted"), "\(said["debug"] ?? "")")
        #expect((said["trace"] ?? "").contains("claim granted") && (said["trace"] ?? "").contains("claim released"), "\(said["trace"] ?? "")")
    }

    /// Whether process `pid` runs (a zombie does not).
    func isAlive(_ pid: Int32) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")"),
              let state = stat[stat.index(after: close)...].split(separator: " ").first else { return false }
        return state != "Z" && state != "X"
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
