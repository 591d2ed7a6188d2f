import Foundation
import Testing

/// `present` as inotifywait's and watchexec's users use it: several paths and a list of
/// them, a directory without its subtree, `--format`, inotify's event names, and a command
/// run on each change that never reads a file in the middle of a coordinated save.
@Suite("present for script authors")
struct PresentScriptTests: CrossProcessFixture {
    let scratch = Scratch()

    /// Starts `present` with `arguments` and waits for its `count` ready lines (text).
    func started(_ arguments: [String], ready count: Int = 1) async throws -> (LineProcess, AsyncStream<String>.Iterator) {
        let process = try LineProcess(["present", "--space", space] + arguments)
        var lines = process.lines.makeAsyncIterator()
        for _ in 0 ..< count {
            guard let line = await lines.next() else {
                Issue.record("present ended before its ready lines: \(await process.wait().stderr)")
                throw CancellationError()
            }
            #expect(line.contains("ready"), "\(line)")
        }
        return (process, lines)
    }

    /// The lines up to and including the first that contains `marker`.
    func lines(until marker: String, in lines: inout AsyncStream<String>.Iterator) async -> [String] {
        var seen: [String] = []
        while let line = await lines.next() {
            seen.append(line)
            if line.contains(marker) { return seen }
        }
        Issue.record("the output ended before \(marker): \(seen)")
        return seen
    }

    @Test("several paths and --fromfile (with @PATH left out), and --shallow: a directory's own entries only", .timeLimit(.minutes(2)))
    func severalPathsAndShallow() async throws {
        for name in ["d/deep", "e/skip", "e/kept"] { try FileManager.default.createDirectory(atPath: scratch.path + "/" + name, withIntermediateDirectories: true) }
        let file = scratch.write("f", "")
        let list = scratch.write("list", "\(scratch.path)/e\n@\(scratch.path)/e/skip\n\n")
        let (presenter, iterator) = try await started([scratch.path + "/d", file, "--fromfile", list, "--shallow",
                                                       "--format", "%e %w%f"], ready: 3)
        var lines = iterator
        // Deeper first, then a direct entry: the deeper one would come first if heard.
        touch(scratch.path + "/d/deep/x")
        touch(scratch.path + "/d/direct")
        let inD = await self.lines(until: "/d/direct", in: &lines)
        #expect(inD.allSatisfy { !$0.contains("deep/x") }, "\(inD)")
        touch(scratch.path + "/e/skip/y")
        touch(scratch.path + "/e/z")
        let inE = await self.lines(until: "/e/z", in: &lines)
        #expect(inE.allSatisfy { !$0.contains("skip") }, "\(inE)")
        try Data("x".utf8).write(to: URL(fileURLWithPath: file))
        #expect(await self.lines(until: "didChange", in: &lines).last == "didChange \(file)")
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))

        let none = try await filecoord("present", "--space", space)
        #expect(none.status == 2 && none.errorText.contains("--fromfile"), "\(none.errorText)")
        let missing = try await filecoord("present", "--space", space, file, scratch.path + "/nothing")
        #expect(missing.status == 1 && missing.errorText.contains("\(scratch.path)/nothing"), "\(missing.errorText)")
    }

    @Test("--format writes inotifywait's %w %f %e %T %%, the exact bytes of a name, and %xf escaped; -e takes inotify's names",
          .timeLimit(.minutes(2)))
    func formatAndInotifyNames() async throws {
        let directory = scratch.path + "/d"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let (presenter, iterator) = try await started([directory, "-e", "create", "--format", "%e|%w|%f|%xf|%T|%%|%0", "--timefmt", "%Y"])
        var lines = iterator
        touch(directory + "/plain")
        let year = Calendar.current.component(.year, from: Date())
        let first = try #require(await lines.next())
        #expect(first == "subitemDidAppear|\(directory)/|plain|plain|\(year)|%|\u{0}", "\(first)")
        // A name that is not UTF-8 (\xff): %f writes its byte, %xf escapes it as `ls -b`.
        let odd = Array((directory + "/odd").utf8) + [0xFF, 0]
        close(odd.withUnsafeBufferPointer { $0.withMemoryRebound(to: CChar.self) { open($0.baseAddress!, O_CREAT | O_WRONLY | O_CLOEXEC, 0o644) } })
        let second = try #require(await lines.next())
        #expect(second.hasPrefix("subitemDidAppear|\(directory)/|odd\u{FFFD}|odd\\377|"), "\(second)")
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))

        let bad = try await filecoord("present", "--space", space, directory, "-e", "open")
        #expect(bad.status == 2 && bad.errorText.contains("close_write"), "\(bad.errorText)")
        let badFormat = try await filecoord("present", "--space", space, directory, "--format", "%q")
        #expect(badFormat.status == 2 && badFormat.errorText.contains("'%q' is no conversion"), "\(badFormat.errorText)")
        let both = try await filecoord("present", "--space", space, directory, "--format", "%f", "--json")
        #expect(both.status == 2 && both.errorText.contains("contradict"), "\(both.errorText)")
    }

    /// A save in three writes with pauses between them, 48 times, each under a coordinated
    /// write; `present FILE -- CHECK` beside it, coordinated or not. CHECK takes the file's
    /// first byte, then (a reader that takes its time) half a second later its size and the
    /// bytes that differ from that first one, and logs `whole`, or `torn SIZE OTHER-BYTES`
    /// when a save came between its reads. Under a coordinated read none can: the writer
    /// waits for the read claim. Without it the next save, started while CHECK waits, is
    /// seen however loaded the machine is.
    func savesWatched(coordinatedCommand: Bool) async throws -> [String] {
        let file = scratch.path + "/doc", log = scratch.path + "/log-\(coordinatedCommand)"
        let save = "{ for part in 1 2 3; do head -c 65536 /dev/zero | tr '\\0' \\$1; sleep 0.003; done; } > '\(file)'"
        let shellSave = "'\(filecoordBinary)' exec --space '\(space)' --write '\(file)' -- sh -c \"\(save)\" sh"
        _ = try await shell("\(shellSave) A")
        let check = "a=$(head -c 1 '\(file)'); sleep 0.5; n=$(wc -c < '\(file)'); k=$(tr -d \"$a\" < '\(file)' | wc -c); " +
            "if [ $n -eq 196608 ] && [ $k -eq 0 ]; then echo whole >> '\(log)'; else echo \"torn $n $k\" >> '\(log)'; fi"
        let (presenter, _) = try await started([file] + (coordinatedCommand ? [] : ["--no-coordination"]) + ["--", "sh", "-c", check])
        // 2 x 24 saves, each of another letter; without the read, only until a run saw one torn.
        let stop = coordinatedCommand ? "" : "grep -q torn '\(log)' 2>/dev/null && exit 0; "
        let saves = try await shell("for i in 1 2; do for letter in B C D E F G H I J K L M N O P Q R S T U V W X Y; do " +
                                    "\(stop)\(shellSave) $letter || exit 1; done; done")
        #expect(saves.status == 0, "\(saves.errorText)")
        // The run for the last save, if one is still to come, ends before the signal's end.
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
        return (try? String(contentsOfFile: log, encoding: .utf8))?.split(separator: "\n").map(String.init) ?? []
    }

    @Test("a command on each change, under a coordinated read, never sees a save half done; without the read it does",
          .timeLimit(.minutes(4)))
    func commandNeverSeesATornSave() async throws {
        let coordinated = try await savesWatched(coordinatedCommand: true)
        #expect(!coordinated.isEmpty, "the command never ran")
        #expect(coordinated.allSatisfy { $0 == "whole" }, "\(coordinated.filter { $0 != "whole" })")
        let uncoordinated = try await savesWatched(coordinatedCommand: false)
        #expect(uncoordinated.contains { $0.hasPrefix("torn") }, "\(uncoordinated.count) runs, none saw a save half done")
    }

    @Test("the command: one run per settled burst, never two at once, the changed paths on stdin and in FILECOORD_CHANGED; --count ends with its status",
          .timeLimit(.minutes(2)))
    func commandRuns() async throws {
        let directory = scratch.path + "/d", log = scratch.path + "/runs"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let command = "mkdir '\(scratch.path)/running' || echo overlap >> '\(log)'; " +
            "{ echo \"env $FILECOORD_CHANGED\" | tr '\\n' ' '; echo; sed 's/^/in /'; } >> '\(log)'; " +
            "rmdir '\(scratch.path)/running'; exit 7"
        // A quiet time of 1 s: under the whole suite's load the two changes below can come
        // more than the default 50 ms apart, and would be two bursts.
        let (presenter, _) = try await started([directory, "--count", "2", "--initial", "--settle", "1s", "--", "sh", "-c", command])
        // The initial run, then one burst of two files.
        try await waitForFile(log) { $0.contains("in \(directory)\n") }
        for name in ["a", "b"] { touch(directory + "/" + name) }
        let ended = await presenter.wait()
        #expect(ended.status == 7, "\(ended.stderr)")
        let text = try String(contentsOfFile: log, encoding: .utf8)
        #expect(!text.contains("overlap"))
        #expect(text.contains("in \(directory)/a\n") && text.contains("in \(directory)/b\n"), "\(text)")
        #expect(text.contains("env \(directory)/a \(directory)/b") || text.contains("env \(directory)/b \(directory)/a"), "\(text)")
    }

    @Test("--exclude and --timefmt given bytes that are not UTF-8 use those bytes: the name they spell is excluded, the time format printed as given",
          .timeLimit(.minutes(1)))
    func patternsNotUTF8() async throws {
        let directory = scratch.path + "/latin1"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let command = """
            exec "$0" present --space '\(space)' '\(directory)' --exclude "$(printf 'caf\\351')" --format '%e %T %f' --timefmt "$(printf 'T\\351')"
            """
        let presenter = try LineProcess(["-c", command, filecoordBinary], executable: "/bin/sh")
        var lines = presenter.lines.makeAsyncIterator()
        #expect(await lines.next()?.contains("ready") == true)
        _ = try await shell("cd '\(directory)' && touch \"$(printf 'caf\\351')\" && touch other")
        // The time format's byte 0xE9 is printed as it is (read here as U+FFFD).
        let line = await lines.next()
        #expect(line?.hasSuffix(" T\u{FFFD} other") == true, "the excluded name reported, or the time format changed: \(line ?? "none")")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a signal while a run waits for its read claim ends present at once, by the signal, without starting the command",
          .timeLimit(.minutes(1)), arguments: [SIGTERM, SIGINT])
    func signalWhileRunWaits(number: Int32) async throws {
        let file = scratch.write("held-\(number)", "x")
        let fifo = scratch.path + "/release-\(number)"
        let holder = try await holdUntilReleased(["--write", file], fifo: fifo)
        let ran = scratch.path + "/ran-\(number)"
        let (presenter, _) = try await started([file, "--initial", "--", "sh", "-c", "touch '\(ran)'"])
        try await waitForStatus { waitingPids(in: $0).contains(presenter.pid) }
        let sent = ContinuousClock.now
        presenter.signal(number)
        let ended = await presenter.endsBy(number)
        let took = ContinuousClock.now - sent
        #expect(ended, "present did not die by signal \(number)")
        #expect(took < .seconds(10), "present went on waiting for the claim after the signal: \(took)")
        try await release(fifo)
        _ = await holder.wait()
        #expect(access(ran, F_OK) != 0, "the command ran after the signal")
    }

    @Test("a signal during a run goes to the command, and present dies by it once the command has ended; --on-busy restart ends a run on a change",
          .timeLimit(.minutes(4)))
    func commandSignalsAndRestart() async throws {
        let file = scratch.write("f", ""), log = scratch.path + "/log"
        let (presenter, _) = try await started([file, "--on-busy", "restart", "--", "sh", "-c",
                                                "trap 'kill $!; echo term >> \(log); exit 143' TERM; trap 'kill $!; echo int >> \(log); exit 130' INT; " +
                                                "echo start >> \(log); sleep 60 & wait"]) // ok: a run that lasts until it is ended
        try Data("1".utf8).write(to: URL(fileURLWithPath: file))
        try await waitForFile(log) { $0 == "start\n" }
        // A change during the run ends it (SIGTERM) and runs it again.
        try Data("2".utf8).write(to: URL(fileURLWithPath: file))
        try await waitForFile(log) { $0 == "start\nterm\nstart\n" }
        presenter.signal(SIGINT)
        #expect(await presenter.endsBy(SIGINT))
        #expect(try String(contentsOfFile: log, encoding: .utf8) == "start\nterm\nstart\nint\n")

        let alone = try await filecoord("present", "--space", space, file, "--on-busy", "restart")
        #expect(alone.status == 2 && alone.errorText.contains("--on-busy goes with a command"), "\(alone.errorText)")
    }

    /// Creates an empty file in place (FileManager's writes a temporary file and renames it).
    func touch(_ path: String) {
        close(open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o644))
    }

    /// Polls `path` until its text satisfies `condition` (another process writes it), for
    /// up to 90 s: when the whole suite starts at once on two cores, a change's run has
    /// been seen to take over 30 s (the tests' own time limits stay the bound on a hang).
    func waitForFile(_ path: String, _ condition: (String) -> Bool) async throws {
        for _ in 0 ..< 9000 {
            if let text = try? String(contentsOfFile: path, encoding: .utf8), condition(text) { return }
            try await Task.sleep(for: .milliseconds(10)) // ok: polling a file another process writes
        }
        Issue.record("\(path) never read as expected: \((try? String(contentsOfFile: path, encoding: .utf8)) ?? "missing")")
    }
}
