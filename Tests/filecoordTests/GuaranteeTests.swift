import Foundation
import Testing
import TestSupport

extension CrossProcessTests {
    /// The promise under faults: exclusion with crossed multi-item claims, timeouts that fire
    /// only while a claim waits, and claims that outlive a killed `exec` wrapper.
    @Suite("guarantees under faults")
    struct GuaranteeTests: CrossProcessFixture {
        let scratch = Scratch()
    }
}

extension CrossProcessTests.GuaranteeTests {
    @Test("crossed multi-item claims in two processes (read X + write Y, read Y + write X) queued behind a reader of both: both complete",
          .timeLimit(.minutes(2)), arguments: ["items", "directories"])
    func crossedClaimsComplete(shape: String) async throws {
        let (x, y) = (scratch.path + "/X", scratch.path + "/Y")
        var (a, b): ([String], [String])
        if shape == "items" {
            scratch.write("X", "x"); scratch.write("Y", "y")
            a = ["--read", x, "--write", y]
            b = ["--read", y, "--write", x]
        } else {
            // A delete of a directory (a claim on everything inside it) crossed with a
            // write inside the other.
            try FileManager.default.createDirectory(atPath: x, withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: y, withIntermediateDirectories: true)
            scratch.write("X/f", "x"); scratch.write("Y/g", "y")
            a = ["--delete", x, "--write", y + "/g"]
            b = ["--delete", y, "--write", x + "/f"]
        }
        let fifo = scratch.path + "/go"
        let holder = try await holdUntilReleased(shape == "items" ? ["--read", x, "--read", y] : ["--read", x + "/f", "--read", y + "/g"],
                                                 fifo: fifo)
        let first = try LineProcess(["exec", "--space", space] + a + ["--", "true"])
        let second = try LineProcess(["exec", "--space", space] + b + ["--", "true"])
        try await waitForStatus { waitingPids(in: $0).isSuperset(of: [first.pid, second.pid]) }
        try await release(fifo)
        #expect(await ends(first, within: .seconds(10), "the first crossed claim") == 0)
        #expect(await ends(second, within: .seconds(10), "the second crossed claim") == 0)
        #expect(await holder.wait().status == 0)
    }

    @Test("--timeout 0 succeeds whenever nothing conflicts (as flock -n), and fails at once (exit 3) when something does")
    func zeroTimeoutUncontended() async throws {
        let file = scratch.write("f", "x")
        for round in 0 ..< 20 {
            let result = try await filecoord("exec", "--space", space, "--timeout", "0", "--write", file, "--", "true")
            #expect(result.status == 0, "round \(round): \(result.errorText)")
        }
        let fifo = scratch.path + "/go"
        let holder = try await holdUntilReleased(["--write", file], fifo: fifo)
        let blocked = try await filecoord("exec", "--space", space, "--timeout", "0", "--read", file, "--", "true")
        #expect(blocked.status == 3, "\(blocked.errorText)")
        try await release(fifo)
        #expect(await holder.wait().status == 0)
    }
}

extension CrossProcessTests.GuaranteeTests {
    @Test("exec's wrapper killed with SIGKILL: the command keeps the claims until it ends (as flock(1)'s inherited lock), then a waiting writer goes on",
          .timeLimit(.minutes(2)))
    func killedWrapperCommandKeepsClaims() async throws {
        let file = scratch.write("f", "x")
        let (go, ready) = (scratch.path + "/go", scratch.path + "/ready")
        #expect(mkfifo(go, 0o600) == 0 && mkfifo(ready, 0o600) == 0)
        // Spawned directly, not through Foundation's Process: the command inherits what
        // the wrapper was started with, and Process sees its child end only when every
        // holder of its socket has closed it.
        let wrapper = try Spawned([filecoordBinary, "exec", "--space", space, "--write", file, "--",
                                   "sh", "-c", "echo $$ > '\(ready)'; read x < '\(go)'"])
        let command = try await pid(writtenTo: ready)
        kill(wrapper.pid, SIGKILL)
        #expect(await wrapper.wait() == 128 + SIGKILL)
        #expect(kill(command, 0) == 0, "the command lives on")
        let meanwhile = try await filecoord("exec", "--space", space, "--timeout", "0", "--write", file, "--", "true")
        #expect(meanwhile.status == 3, "a writer got the claim while the command ran: \(meanwhile.errorText)")
        let waiter = try LineProcess(["exec", "--space", space, "--write", file, "--", "echo", "after"])
        var waiterLines = waiter.lines.makeAsyncIterator()
        try await waitForStatus { waitingPids(in: $0).contains(waiter.pid) }
        try await release(go)
        #expect(await waiterLines.next() == "after")
        #expect(await ends(waiter, within: .seconds(10), "the writer waiting for the command") == 0)
    }

    @Test("exec's command killed with SIGKILL: exec exits 137 and the claims are free at once")
    func killedCommandFreesClaims() async throws {
        let file = scratch.write("f", "x")
        let holder = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo $$; exec sleep 62"]) // ok: the command holding the claim
        var lines = holder.lines.makeAsyncIterator()
        let command = try #require(Int32(await lines.next() ?? ""))
        kill(command, SIGKILL)
        #expect(await holder.wait().status == 137)
        let after = try await filecoord("exec", "--space", space, "--timeout", "0", "--write", file, "--", "true")
        #expect(after.status == 0, "\(after.errorText)")
    }
}

/// A process started with `posix_spawn`, its standard streams on `/dev/null`, no signal
/// blocked; the test reaps it.
struct Spawned {
    let pid: pid_t

    init(pid: pid_t) { self.pid = pid }

    /// `environment`: `NAME=value` entries added to this process's environment.
    /// `output`: a file for its stdout and stderr (else `/dev/null`).
    init(_ arguments: [String], environment: [String] = [], output: String? = nil) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, output ?? "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK))
        let argv = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var inherited: [String] = []
        var index = 0
        while let entry = environ[index] {
            inherited.append(String(cString: entry))
            index += 1
        }
        let envp = (inherited + environment).map { strdup($0) } + [nil]
        defer { for pointer in envp { free(pointer) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, arguments[0], &actions, &attributes, argv, envp)
        guard result == 0 else { throw POSIXError(POSIXErrorCode(rawValue: result) ?? .EIO) }
        self.pid = pid
    }

    /// Its exit status, or 128+N if signal N ended it.
    func wait() async -> Int32 {
        let pid = pid
        return (try? await offThePool {
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            let signal = status & 0x7f
            return signal == 0 ? (status >> 8) & 0xff : 128 + signal
        }) ?? -1
    }
}

extension CrossProcessTests.GuaranteeTests {
    @Test("one file under several names (a symbolic link to it, a linked directory above it, `..` after a linked directory) is one item: exec, write and read through any name exclude each other; a delete of the link claims the link",
          .timeLimit(.minutes(2)))
    func namesOfOneFileExcludeEachOther() async throws {
        let target = scratch.write("target", "x")
        let link = scratch.path + "/link"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: "target")
        try FileManager.default.createDirectory(atPath: scratch.path + "/real", withIntermediateDirectories: true)
        let inner = scratch.write("real/f", "y")
        let linkedDirectory = scratch.path + "/dirlink"
        try FileManager.default.createSymbolicLink(atPath: linkedDirectory, withDestinationPath: scratch.path + "/real")
        // `sublink/../f` is `real/f` (the parent of the link's target), not `f` beside
        // `sublink`, which exists too.
        try FileManager.default.createDirectory(atPath: scratch.path + "/real/sub", withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: scratch.path + "/sublink", withDestinationPath: "real/sub")
        let besideLink = scratch.write("f", "w")
        let throughParent = scratch.path + "/sublink/../f"
        let fifo = scratch.path + "/go"

        for (held, other) in [(link, target), (target, link), (inner, linkedDirectory + "/f"), (linkedDirectory + "/f", inner),
                              (inner, throughParent), (throughParent, inner)] {
            let holder = try await holdUntilReleased(["--write", held], fifo: fifo)
            let exec = try await filecoord("exec", "--space", space, "--timeout", "0", "--write", other, "--", "true")
            #expect(exec.status == 3, "exec --write \(other) while \(held) is held: \(exec.errorText)")
            let write = try await filecoord("write", other, "--space", space, "--timeout", "0", stdin: Data("z".utf8))
            #expect(write.status == 3, "write \(other) while \(held) is held: \(write.errorText)")
            let read = try await filecoord("read", other, "--space", space, "--timeout", "0")
            #expect(read.status == 3, "read \(other) while \(held) is held: \(read.errorText)")
            try await release(fifo)
            #expect(await holder.wait().status == 0)
        }
        // The name beside the link is another file: it is free while `sublink/../f` is held.
        let holder = try await holdUntilReleased(["--write", throughParent], fifo: fifo)
        let beside = try await filecoord("exec", "--space", space, "--timeout", "0", "--write", besideLink, "--", "true")
        #expect(beside.status == 0, "exec --write \(besideLink) while \(throughParent) is held: \(beside.errorText)")
        try await release(fifo)
        #expect(await holder.wait().status == 0)
        // Deleting (or moving) the link acts on the link, not on its target.
        let targetHolder = try await holdUntilReleased(["--write", target], fifo: fifo)
        let delete = try await filecoord("exec", "--space", space, "--timeout", "0", "--delete", link, "--", "true")
        #expect(delete.status == 0, "\(delete.errorText)")
        try await release(fifo)
        #expect(await targetHolder.wait().status == 0)
    }

    @Test("`exec --delete` of a name ending in a slash claims what the kernel reaches through it: the directory a link there leads to, not the link",
          .timeLimit(.minutes(2)))
    func deleteThroughTrailingSlash() async throws {
        try FileManager.default.createDirectory(atPath: scratch.path + "/real", withIntermediateDirectories: true)
        let inside = scratch.write("real/x", "x")
        try FileManager.default.createSymbolicLink(atPath: scratch.path + "/dirlink", withDestinationPath: "real")
        let fifo = scratch.path + "/go"
        try FileManager.default.createSymbolicLink(atPath: scratch.path + "/filelink", withDestinationPath: "real/x")
        let holder = try await holdUntilReleased(["--write", inside], fifo: fifo)
        // `rm -r dirlink/` empties `real`: its delete must wait for the writer inside (3).
        // Without the slash the link itself is the item, and nothing holds it; nor through a
        // slash after a link to a file, which the kernel does not follow (`ENOTDIR`).
        for (name, status) in [("dirlink/", 3), ("dirlink/.", 3), ("dirlink", 0), ("filelink/", 0)] as [(String, Int32)] {
            let delete = try await filecoord("exec", "--space", space, "--timeout", "0", "--delete", scratch.path + "/" + name, "--", "true")
            #expect(delete.status == status, "exec --delete \(name) while real/x is held: \(delete.errorText)")
        }
        try await release(fifo)
        #expect(await holder.wait().status == 0)
    }

    @Test("a relative name, in a current directory whose name is not UTF-8, is claimed under the directory's own bytes by exec and by read alike",
          .timeLimit(.minutes(2)))
    func relativeNameInDirectoryNotUTF8() async throws {
        let fifo = scratch.path + "/go"
        #expect(mkfifo(fifo, 0o600) == 0)
        // The directory `odd\xFF` (no `String` can name it: the shell does).
        let odd = #""$S/$(printf 'odd\377')""#
        let environment = ["FILECOORD": filecoordBinary, "S": scratch.path, "SPACE": space, "FIFO": fifo]
        let setup = try await run("/bin/sh", ["-c", "mkdir \(odd) && echo x > \(odd)/rel"], environment: environment)
        #expect(setup.status == 0, "\(setup.errorText)")
        let holder = try LineProcess(["-c", #"cd \#(odd) && exec "$FILECOORD" exec --space "$SPACE" --write rel -- sh -c 'echo held; exec timeout 300 sh -c "read x < \"\$FIFO\""'"#],
                                     executable: "/bin/sh", environment: environment)
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        let read = try await run("/bin/sh", ["-c", #"cd \#(odd) && "$FILECOORD" read --space "$SPACE" --timeout 0 --json rel"#],
                                 environment: environment)
        #expect(read.status == 3, "read rel while exec --write rel holds it: \(read.errorText)")
        try await release(fifo)
        #expect(await holder.wait().status == 0)
    }

    @Test("a batch read through a symbolic link claims the link's target: with the target held, the link fails and the other files are read, in place and through the sequence",
          .timeLimit(.minutes(2)))
    func batchThroughLink() async throws {
        _ = scratch.write("target", "held")
        let link = scratch.path + "/link"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: "target")
        // Enough free files around the link that the batch's workers claim groups of them.
        let others = (0 ..< 80).map { scratch.write("f\($0)", "free\($0)") }
        let list = Array(others[..<40]) + [link] + Array(others[40...])
        let fifo = scratch.path + "/go"
        let holder = try await holdUntilReleased(["--write", scratch.path + "/target"], fifo: fifo)
        let summary = try await filecoord(["read", "--space", space, "--timeout", "0", "--json"] + list)
        #expect(summary.status == 3, "a claim timed out: \(summary.errorText)")
        #expect(summary.outputText.contains(#""failed":1"#) && summary.outputText.contains(#""files":80"#), "\(summary.outputText)")
        #expect(summary.errorText.contains(link), "\(summary.errorText)")
        let catted = try await filecoord(["read", "--space", space, "--timeout", "0", "--cat"] + list)
        #expect(catted.status == 3, "\(catted.errorText)")
        #expect(!catted.outputText.contains("held") && catted.outputText.contains("free79"), "\(catted.outputText)")
        #expect(catted.errorText.contains(link), "\(catted.errorText)")
        try await release(fifo)
        #expect(await holder.wait().status == 0)
        let free = try await filecoord(["read", "--space", space, "--cat", link])
        #expect(free.status == 0 && free.outputText == "held", "\(free.errorText)")
    }

    @Test("a presenter of a symbolic link is asked by a write of its target, and a presenter of the target by a write through the link")
    func presenterThroughLink() async throws {
        let target = scratch.write("target", "x")
        let link = scratch.path + "/link"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: "target")
        for (presented, written) in [(link, target), (target, link)] {
            let (presenter, stream) = try await present(presented)
            var lines = stream
            let write = try await filecoord("write", written, "--space", space, stdin: Data("new".utf8))
            #expect(write.status == 0, "\(write.errorText)")
            #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["relinquishToWriter", "save", "didChange", "reacquire"],
                    "presenting \(presented), writing \(written)")
            presenter.signal(SIGTERM)
            _ = await presenter.wait()
        }
    }
}

extension CrossProcessTests.GuaranteeTests {
    @Test("garbage in the space (a directory, a foreign file, a dead process's malformed record) is dealt with once: ours removed, the rest set aside with one warning; status reports no pid 0")
    func garbageInTheSpaceOnce() async throws {
        let file = scratch.write("doc", "old")
        #expect(try await filecoord("status", "--space", space).status == 0)
        try FileManager.default.createDirectory(atPath: space + "/presenters/junkdir", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: space + "/procs/weird", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: space + "/presenters/foreign", contents: Data("hello\n".utf8))
        // Named as ours, by a process that is gone, and unreadable: ours to remove.
        _ = FileManager.default.createFile(atPath: space + "/presenters/2147483-dead-1", contents: Data("kind presenter\n".utf8))
        let first = try await filecoord("write", file, "--space", space, stdin: Data("a".utf8))
        #expect(first.status == 0)
        #expect(first.errorText.contains("junkdir") && first.errorText.contains("foreign") && first.errorText.contains("weird"), "\(first.errorText)")
        for round in 0 ..< 2 {
            let again = try await filecoord("write", file, "--space", space, stdin: Data("b".utf8))
            #expect(again.status == 0 && again.errorText.isEmpty, "round \(round): \(again.errorText)")
        }
        let status = try await filecoord("status", "--space", space)
        #expect(!status.outputText.contains("pid 0") && status.errorText.isEmpty, "\(status.outputText)\(status.errorText)")
        #expect(!FileManager.default.fileExists(atPath: space + "/presenters/2147483-dead-1"))
    }
}

extension CrossProcessTests.GuaranteeTests {
    @Test("a command ended by SIGHUP, SIGTERM or SIGINT while it waits removes its record and mailbox on the way out (and still dies of the signal); a presenter ends cleanly on SIGHUP",
          .timeLimit(.minutes(2)), arguments: [SIGHUP, SIGTERM, SIGINT])
    func signalledCommandCleansUp(signal: Int32) async throws {
        let file = scratch.write("f", "x")
        let fifo = scratch.path + "/go"
        let holder = try await holdUntilReleased(["--write", file], fifo: fifo)
        let before = (procs: entries("procs"), mail: entries("mail"))
        let reader = try Spawned([filecoordBinary, "read", "--space", space, file])
        try await waitForStatus { waitingPids(in: $0).contains(reader.pid) }
        kill(reader.pid, signal)
        #expect(await reader.wait() == 128 + signal)
        #expect(entries("procs") == before.procs, "left: \(entries("procs").subtracting(before.procs))")
        #expect(entries("mail") == before.mail, "left: \(entries("mail").subtracting(before.mail))")
        try await release(fifo)
        #expect(await holder.wait().status == 0)
        if signal == SIGHUP {
            let (presenter, _) = try await present(file)
            presenter.signal(SIGHUP)
            #expect(await presenter.endsBy(SIGHUP))
            #expect(entries("presenters").isEmpty && entries("procs").isEmpty)
        }
    }
}
