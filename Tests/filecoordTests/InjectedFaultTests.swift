import Foundation
import Testing

extension CrossProcessTests {
    /// System calls made to fail in a real `filecoord` process (`FILECOORD_FAULTS`, read by
    /// debug builds): each failure ends the command with one line naming the path and the
    /// cause, and leaves nothing behind.
    @Suite("injected system-call faults")
    struct InjectedFaultTests: CrossProcessFixture {
        let scratch = Scratch()
    }
}

extension CrossProcessTests.InjectedFaultTests {
    @Test("a call failing while a process joins the space (its registry's counter mapped, its record's lock) or makes its mailbox (to hear a presenter's reply) fails the command with one line naming the path, and leaves nothing behind",
          arguments: [("mmap:ENOMEM", "mmap failed: Cannot allocate memory (ENOMEM)"),
                      ("mkdirat:ENOSPC:mail/", "mkdir failed: No space left on device (ENOSPC)"),
                      ("F_OFD_SETLK:EIO", "F_OFD_SETLK failed: Input/output error (EIO)"),
                      ("open:EMFILE:procs/.", "open failed: Too many open files (EMFILE)")])
    func failedJoin(_ fault: String, _ expected: String) async throws {
        let file = scratch.write("doc", "old")
        let (presenter, _) = try await present(file)
        let before = (spaceEntries("mail"), spaceEntries("procs"))
        let failed = try await filecoordWith(faults: fault, "write", file, "--space", space, stdin: Data("new".utf8))
        #expect(failed.status == 1)
        let lines = failed.errorText.split(separator: "\n").map(String.init)
        let line = lines.first ?? ""
        #expect(lines.count == 1 && line.hasPrefix("filecoord: \(space)/") && line.hasSuffix(expected), "\(failed.errorText)")
        #expect(spaceEntries("mail") == before.0 && spaceEntries("procs") == before.1, "the failed process left files in the space")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "old")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a request that cannot be written into a presenter's mailbox (ENOSPC) fails the write with one line naming that mailbox and saying the request was not delivered; the presenter keeps its item and the next write goes through",
          .timeLimit(.minutes(2)))
    func failedRequest() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file)
        var lines = stream
        let mailbox = try #require(spaceEntries("mail").first)
        let failed = try await filecoordWith(faults: "open:ENOSPC:mail/\(mailbox)/", "write", file, "--space", space, stdin: Data("new".utf8))
        #expect(failed.status == 1)
        let lineCount = failed.errorText.split(separator: "\n").count
        let named = failed.errorText.contains("\(space)/mail/\(mailbox): open failed: No space left on device (ENOSPC)")
        #expect(lineCount == 1 && named, "\(failed.errorText)")
        // The presenter refused nothing: the request never reached it.
        #expect(failed.errorText.contains("could not be delivered to the presenter in process") && !failed.errorText.contains("refused"),
                "\(failed.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "old")
        let written = try await filecoord("write", file, "--space", space, stdin: Data("new".utf8))
        #expect(written.status == 0, "\(written.errorText)")
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" }
                    == ["relinquishToWriter", "save", "didChange", "reacquire"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a live presenter's record that cannot be opened (EMFILE) for the liveness check counts as alive: nothing of its process is removed, and the writer asks it",
          .timeLimit(.minutes(2)))
    func unknownLivenessIsAlive() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file)
        var lines = stream
        let before = (spaceEntries("procs"), spaceEntries("mail"), spaceEntries("presenters"))
        // Every open of the presenter's record fails in the writer: joining looks at it
        // (a dead process is cleaned up), and so does each request's check after writing.
        let written = try await filecoordWith(faults: "open:EMFILE:procs/\(presenter.pid)-", "write", file, "--space", space,
                                              stdin: Data("new".utf8))
        #expect(written.status == 0, "\(written.errorText)")
        #expect(spaceEntries("procs") == before.0 && spaceEntries("mail") == before.1 && spaceEntries("presenters") == before.2,
                "the live presenter's files were removed")
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["relinquishToWriter", "save", "didChange", "reacquire"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a writer whose descriptors below 1024 are all in use gets no inotify instance libinotifytools can wait on: it polls for the presenter's reply instead of aborting",
          .enabled(if: hardDescriptorLimit >= 2048), .timeLimit(.minutes(2)))
    func inotifyInstanceAbove1023() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file)
        var lines = stream
        let written = try await shell("""
            printf new | exec bash -c 'ulimit -n 2048 && for i in $(seq 3 1100); do eval "exec $i</dev/null"; done && exec "$FILECOORD" write --space "$1" "$2"' _ '\(space)' '\(file)'
            """)
        #expect(written.status == 0, "\(written.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["relinquishToWriter", "save", "didChange", "reacquire"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("an append to a file that did not exist, failing (ENOSPC), leaves no file behind: PATH is as it was")
    func failedAppendToNewFile() async throws {
        let file = scratch.path + "/new.txt"
        // Without coordination: the write that fails is the append's (joining the space writes too).
        let failed = try await filecoordWith(faults: "write:ENOSPC", "write", "--append", "--no-coordination", file,
                                             stdin: Data("hello".utf8))
        #expect(failed.status == 1)
        #expect(failed.errorText.split(separator: "\n").count == 1 && failed.errorText.contains("(ENOSPC)"), "\(failed.errorText)")
        #expect(!FileManager.default.fileExists(atPath: file), "the failed append left \(file)")
    }

    @Test("a file this process may not write (access says EACCES) is not replaced: the write fails with one line naming the file and the cause, and the file keeps its content")
    func refusedReplacement() async throws {
        let file = scratch.write("doc", "old")
        let failed = try await filecoordWith(faults: "access:EACCES:\(file)", "write", file, "--space", space, stdin: Data("new".utf8))
        #expect(failed.status == 1)
        #expect(failed.errorText == "filecoord: \(file): open failed: Permission denied (EACCES)\n", "\(failed.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "old")
    }

    @Test("the watcher thread's inotify_add_watch failing (ENOSPC) gives the watcher's error: one warning naming the item, the directory and the watch limit; the presenter still starts")
    func failedWatch() async throws {
        // The item in a directory of its own: the space's watches are not the ones failed.
        let directory = scratch.path + "/items"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        let file = scratch.write("items/doc", "old")
        let presenter = try LineProcess(["present", file, "--json", "--space", space],
                                        environment: ["FILECOORD_FAULTS": "inotify_add_watch:ENOSPC:\(directory)"])
        var lines = presenter.lines.makeAsyncIterator()
        // The item's watch is set up (or refused) before the ready line.
        #expect(event(await lines.next() ?? "").event == "ready")
        presenter.signal(SIGTERM)
        let errors = await presenter.wait().stderr.split(separator: "\n")
        let warnings = errors.filter { $0.contains("cannot watch a presenter's item") }
        #expect(warnings.count == 1 && errors.count == 1, "\(errors)")
        let warning = warnings.first ?? ""
        #expect(warning.contains("\(directory): inotify_add_watch failed: the inotify watch limit (fs.inotify.max_user_watches = ")
                    && warning.contains("(ENOSPC)") && warning.contains("path: \(file)"), "\(warning)")
    }

    @Test("a socket that cannot be made (EMFILE) for an etcd space: one line naming the member and the cause, exit 1")
    func failedEtcdSocket() async throws {
        let port = try freePort()
        let item = scratch.write("item", "x")
        let failed = try await filecoordWith(faults: "socket:EMFILE", "exec", "--space", "etcd://127.0.0.1:\(port)/x", "--write", item, "--", "true")
        #expect(failed.status == 1)
        let lines = failed.errorText.split(separator: "\n")
        #expect(lines.count == 1 && lines[0].contains("127.0.0.1:\(port): Too many open files"), "\(failed.errorText)")
    }
}

/// The hard limit on this process's descriptors (what `ulimit -n` may raise the soft one to).
var hardDescriptorLimit: rlim_t {
    var limit = rlimit()
    return getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 ? limit.rlim_max : 0
}
