import Foundation
import Testing

/// What a script author brings from `flock(1)` and `inotifywait`: their options, their
/// exit statuses, one spelling of durations, and a tool that says what it is.
@Suite("filecoord as scripts use it")
struct ScriptHabitsTests: CrossProcessFixture {
    let scratch = Scratch()
    /// Where a test lets its claim's holder go (`holdUntilReleased`): the claim must
    /// still be held when the test's next process makes its first try, which on a loaded
    /// machine can come many seconds later.
    var fifo: String { scratch.path + "/go" }

    @Test("--version and 'version' print the version; 'help NOSUCH' is a usage error; a usage error names the subcommand's help")
    func versionAndHelp() async throws {
        let version = try await filecoord("--version")
        #expect(version.status == 0 && version.outputText.hasPrefix("filecoord "), "\(version.errorText)")
        let subcommand = try await filecoord("version")
        #expect(subcommand.status == 0 && subcommand.outputText == version.outputText)
        let nosuch = try await filecoord("help", "nosuch")
        #expect(nosuch.status == 2 && nosuch.outputText.isEmpty)
        #expect(nosuch.errorText == "filecoord: no subcommand named 'nosuch' (see 'filecoord help')\n", "\(nosuch.errorText)")
        for arguments in [["read", "f", "--bogus"], ["read", "--bogus"]] {
            let unknown = try await filecoord(arguments)
            #expect(unknown.status == 2)
            #expect(unknown.errorText == "filecoord: Unknown option '--bogus' (see 'filecoord help read')\n", "\(arguments): \(unknown.errorText)")
        }
    }

    @Test("durations take one rule everywhere: seconds, or a unit (500ms, 2s); a value that is none is a usage error naming the option",
          arguments: ["0.3", "300ms", "0.005m"])
    func durations(spelling: String) async throws {
        let file = scratch.write("f", "x")
        let holder = try await holdUntilReleased(["--write", file], fifo: fifo)
        let started = ContinuousClock.now
        let waited = try await filecoord("write", file, "--space", space, "--timeout", spelling, stdin: Data("new".utf8))
        let elapsed = ContinuousClock.now - started
        #expect(waited.status == 3, "\(waited.errorText)")
        // 0.3 s, not 300 s or 0.3 ms: it ended, and after the wait (start-up is well under 0.3 s).
        #expect(elapsed >= .milliseconds(300), "\(elapsed)")
        try await release(fifo)
        _ = await holder.wait()
        let bad = try await filecoord("present", file, "--space", space, "--settle", "3 fortnights")
        #expect(bad.status == 2 && bad.errorText.contains("--settle"), "\(bad.errorText)")
    }

    @Test("exec -n fails at once on a held claim (exit 3), -E N changes that status, -w is --timeout; a command's own 3 stays 3, an uncontended -n runs",
          .timeLimit(.minutes(3)))
    func flockOptions() async throws {
        let file = scratch.write("f", "x")
        let free = try await filecoord("exec", "--space", space, "-n", "-E", "42", "--write", file, "--", "sh", "-c", "exit 3")
        #expect(free.status == 3, "the command's status: \(free.errorText)")
        let holder = try await holdUntilReleased(["--read", file], fifo: fifo)
        let nonblocking = try await filecoord("exec", "--space", space, "-n", "--write", file, "--", "true")
        #expect(nonblocking.status == 3, "\(nonblocking.errorText)")
        let conflict = try await filecoord("exec", "--space", space, "--nonblock", "-E", "42", "--write", file, "--", "true")
        #expect(conflict.status == 42, "\(conflict.errorText)")
        let waited = try await filecoord("exec", "--space", space, "-w", "0.2", "--conflict-exit-code", "7", "--write", file, "--", "true")
        #expect(waited.status == 7, "\(waited.errorText)")
        let reader = try await filecoord("exec", "--space", space, "-n", "--read", file, "--", "true")
        #expect(reader.status == 0, "readers share: \(reader.errorText)")
        let contradiction = try await filecoord("exec", "--space", space, "-n", "-w", "2", "--write", file, "--", "true")
        #expect(contradiction.status == 2 && contradiction.errorText.contains("--nonblock"), "\(contradiction.errorText)")
        try await release(fifo)
        _ = await holder.wait()
    }

    @Test("present --once exits 0 after the first event, once the writer it let through is done (present --once f && cat f shows the new content)",
          .timeLimit(.minutes(3)))
    func presentOnce() async throws {
        let file = scratch.write("f", "old")
        let presenter = try LineProcess(["present", "--once", file, "--space", space])
        var lines = presenter.lines.makeAsyncIterator()
        #expect(await lines.next() == "ready \(file)")
        // The command writes well after the presenter relinquished.
        let writer = try await filecoord("exec", "--space", space, "--write", file, "--", "sh", "-c", "sleep 0.5; printf new > '\(file)'")
        #expect(writer.status == 0, "\(writer.errorText)")
        #expect(await lines.next() == "relinquishToWriter \(file)")
        #expect(await lines.next() == nil, "one event only")
        #expect(await presenter.wait().status == 0)
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")
    }

    @Test("present --count N with --event and --exclude prints N matching events and exits 0; --timeout exits 2 when nothing comes",
          .timeLimit(.minutes(3)))
    func presentCountFiltersTimeout() async throws {
        let directory = scratch.path + "/d"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let presenter = try LineProcess(["present", directory, "--space", space, "-e", "subitemDidAppear,didChange",
                                         "--exclude", #"\.swp$"#, "--count", "2"])
        var lines = presenter.lines.makeAsyncIterator()
        #expect(await lines.next() == "ready \(directory)")
        let made = try await shell("cd '\(directory)' && echo a > a.swp && echo b > b && echo c > c")
        #expect(made.status == 0)
        #expect(await lines.next() == "subitemDidAppear \(directory)/b")
        #expect(await lines.next() == "subitemDidAppear \(directory)/c")
        #expect(await lines.next() == nil)
        #expect(await presenter.wait().status == 0)

        let quiet = try await filecoord("present", directory, "--space", space, "--timeout", "300ms")
        #expect(quiet.status == 2, "\(quiet.errorText)")
        #expect(quiet.outputText == "ready \(directory)\n")
        let badRegex = try await filecoord("present", directory, "--include", "(")
        #expect(badRegex.status == 2 && badRegex.errorText.contains("--include '('"), "\(badRegex.errorText)")
        let badEvent = try await filecoord("present", directory, "-e", "didChnage")
        #expect(badEvent.status == 2 && badEvent.errorText.contains("no event named 'didChnage'"), "\(badEvent.errorText)")
    }

    @Test("a wait says after a second who is in the way (a claim's holder, or a stopped presenter), and a timeout's error names them, in words, with ETIMEDOUT",
          .timeLimit(.minutes(3)))
    func whoIsInTheWay() async throws {
        let file = scratch.write("f", "x")
        let holder = try await holdUntilReleased(["--write", file], fifo: fifo)
        let waited = try await filecoord("write", file, "--space", space, "-w", "2.5", stdin: Data("new".utf8))
        #expect(waited.status == 3)
        #expect(waited.errorText == """
            filecoord: waiting for pid \(holder.pid) (write claim on \(file))
            filecoord: \(file): claim failed: held by pid \(holder.pid) (write claim on \(file)); a conflicting claim did not end within 2.5 s (ETIMEDOUT)

            """, "\(waited.errorText)")
        // At once (-n): no waiting line, the holder named all the same.
        let nonblocking = try await filecoord("exec", "--space", space, "-n", "--read", file, "--", "true")
        #expect(nonblocking.status == 3)
        #expect(nonblocking.errorText.contains("held by pid \(holder.pid) (write claim on \(file))") && !nonblocking.errorText.contains("waiting"),
                "\(nonblocking.errorText)")
        // --log-level error: no waiting line.
        let quiet = try await filecoord("write", file, "--space", space, "-w", "1.5", "--log-level", "error", stdin: Data("new".utf8))
        #expect(quiet.status == 3 && !quiet.errorText.contains("waiting"), "\(quiet.errorText)")
        try await release(fifo)
        _ = await holder.wait()

        let presenter = try LineProcess(["present", file, "--space", space])
        var presented = presenter.lines.makeAsyncIterator()
        #expect(await presented.next() == "ready \(file)")
        presenter.signal(SIGSTOP)
        let strict = try await filecoord("write", file, "--space", space, "--strict", "--presenter-timeout", "2.5", stdin: Data("new".utf8))
        #expect(strict.status == 3)
        #expect(strict.errorText == """
            filecoord: waiting for pid \(presenter.pid) (presenter of \(file), not answering)
            filecoord: \(file): relinquish to a writer failed: the presenter in process \(presenter.pid) did not answer within 2.5 s (ETIMEDOUT)

            """, "\(strict.errorText)")
        let status = try await filecoord("status", "--space", space)
        #expect(status.outputText.contains("presenters:\n  \(file)  (pid \(presenter.pid))"), "\(status.outputText)")
        presenter.signal(SIGCONT)
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
    }

    @Test("FILECOORD_LOG_LEVEL=trace (or --log-level trace) traces every claim on stderr; a level that does not exist is a usage error")
    func logLevel() async throws {
        let file = scratch.write("f", "x")
        let traced = try await run(filecoordBinary, ["exec", "--space", space, "--write", file, "--", "true"],
                                   environment: ["FILECOORD_LOG_LEVEL": "trace"])
        #expect(traced.status == 0)
        #expect(!logLines(traced.errorText).filter { $0.text == "trace: claim granted #1: writing \(file)" }.isEmpty, "\(traced.errorText)")
        #expect(!logLines(traced.errorText).filter { $0.text == "trace: claim released #1" }.isEmpty, "\(traced.errorText)")
        let plain = try await filecoord("exec", "--space", space, "--write", file, "--", "true")
        #expect(plain.status == 0 && plain.errorText.isEmpty, "\(plain.errorText)")
        let wrong = try await filecoord("exec", "--space", space, "--log-level", "loud", "--write", file, "--", "true")
        #expect(wrong.status == 2 && wrong.errorText.contains("--log-level: no level named 'loud'"), "\(wrong.errorText)")
    }

    @Test("one change, one line: a shell's 'echo x > f' (a truncation, then a write) prints one subitemDidChange (settled, 50 ms by default); JSON lines escape no slash and carry an ISO 8601 date",
          .timeLimit(.minutes(3)))
    func oneChangeOneLine() async throws {
        let help = try await filecoord("help", "present")
        #expect(help.outputText.contains("(default: 0.05s)"), "\(help.outputText)")
        let directory = scratch.path + "/d"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        _ = scratch.write("d/f", "old")
        // A window a loaded machine cannot stretch the shell's two steps past (under the
        // suite's heaviest tests 50 ms was, once); the default's value is checked above.
        let presenter = try LineProcess(["present", directory, "--space", space, "--json", "--settle", "1s"])
        var lines = presenter.lines.makeAsyncIterator()
        let ready = try #require(await lines.next())
        #expect(!ready.contains(#"\/"#) && ready.contains(#""path":"\#(directory)""#), "\(ready)")
        // The marker's lines come after every line of f's change.
        let made = try await shell("cd '\(directory)' && echo x > f && echo y > marker")
        #expect(made.status == 0)
        var heard: [String] = []
        while let line = await lines.next() {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            let date = try #require(object["date"] as? String)
            let time = try #require(object["time"] as? Double)
            let parsed = try #require(try? Date(date, strategy: .iso8601.year().month().day().time(includingFractionalSeconds: true)))
            #expect(abs(parsed.timeIntervalSince1970 - time) < 0.001, "\(line)")
            heard.append("\(object["event"]!) \((object["path"] as? String ?? "").split(separator: "/").last!)")
            if heard.last == "subitemDidAppear marker" { break }
        }
        #expect(heard == ["subitemDidChange f", "subitemDidAppear marker"])
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
    }

    @Test("write of a file whose directory takes no new file (/proc/version) says the temporary failed, not that the file is missing")
    func writeProcVersion() async throws {
        let result = try await filecoord("write", "/proc/version", "--space", space, stdin: Data("x".utf8))
        #expect(result.status == 1)
        #expect(result.errorText.hasPrefix("filecoord: /proc/version: atomic replace failed: no temporary file can be made beside it, in /proc: "),
                "\(result.errorText)")
    }

    @Test("rm -rf of a directory reports each item deleted once; after mv a b; rm b the deletion names b",
          .timeLimit(.minutes(3)))
    func deletionsAsTheyAre() async throws {
        let directory = scratch.path + "/d"
        try FileManager.default.createDirectory(atPath: directory + "/sub", withIntermediateDirectories: true)
        for name in ["sub/g", "sub/h", "a"] { _ = scratch.write("d/" + name, "x") }
        let presenter = try LineProcess(["present", directory, "--space", space])
        var lines = presenter.lines.makeAsyncIterator()
        #expect(await lines.next() == "ready \(directory)")
        let made = try await shell("cd '\(directory)' && rm -rf sub && mv a b && rm b && echo y > marker")
        #expect(made.status == 0)
        var heard: [String] = []
        while let line = await lines.next(), line != "subitemDidAppear \(directory)/marker" {
            heard.append(line.replacingOccurrences(of: directory + "/", with: ""))
        }
        let deletions = heard.filter { $0.hasPrefix("accommodateSubitemDeletion ") }
        #expect(Set(deletions) == ["accommodateSubitemDeletion sub/g", "accommodateSubitemDeletion sub/h",
                                   "accommodateSubitemDeletion sub", "accommodateSubitemDeletion b"], "\(heard)")
        #expect(deletions.count == 4, "each once: \(heard)")
        #expect(heard.contains("subitemDidMove a -> b"), "\(heard)")
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
    }
}
