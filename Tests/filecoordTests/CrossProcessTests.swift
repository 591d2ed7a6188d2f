import AsyncFileIO
import FileCoordination
import Foundation
import Synchronization
import Testing

/// One JSON line of `filecoord present --json`.
func event(_ line: String) -> (event: String, path: String) {
    let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? [:]
    return (object["event"] as? String ?? "?", object["path"] as? String ?? "")
}

/// A flag tasks poll.
final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    var isSet: Bool { value.load(ordering: .acquiring) }
    func set() { value.store(true, ordering: .releasing) }
}

/// Tests with several real processes sharing one coordination space (a fresh one each).
/// One at a time: the counter test keeps both cores busy, and the SIGKILL test measures
/// a latency.
@Suite("across processes", .serialized)
struct CrossProcessTests: CrossProcessFixture {
    let scratch = Scratch()

    @Test("8 processes x 125 increments under exec --write: the counter ends at exactly 1,000")
    func counter() async throws {
        let counter = scratch.write("counter", "0")
        // A claim that waits over a second says who is in the way; with eight writers on
        // a loaded machine one of the 1,000 can. Errors still reach stderr at this level.
        let script = """
            export FILECOORD_LOG_LEVEL=error
            for p in 1 2 3 4 5 6 7 8; do
              ( i=0; while [ $i -lt 125 ]; do
                  "$FILECOORD" exec --space '\(space)' --write '\(counter)' -- sh -c 'n=$(cat "$0"); echo $((n+1)) > "$0"' '\(counter)' || echo "exec failed: $?" >&2
                  i=$((i+1)); done ) &
            done
            wait
            """
        let result = try await shell(script)
        #expect(result.status == 0 && result.errorText.isEmpty, "\(result.errorText)")
        let value = try String(contentsOfFile: counter, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(value == "1000")
        // The same loop without coordination, for the record: it usually loses updates.
        let loose = scratch.write("loose", "0")
        _ = try await shell("""
            for p in 1 2 3 4 5 6 7 8; do ( i=0; while [ $i -lt 125 ]; do n=$(cat '\(loose)'); echo $((n+1)) > '\(loose)'; i=$((i+1)); done ) & done; wait
            """)
        let lost = (try? String(contentsOfFile: loose, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
        print("counter without coordination: \(lost) of 1000")
    }

    @Test("a coordinated read under ulimit -n 40 (few claim shards, claimed on the workers) waits for a writer in another process",
          .timeLimit(.minutes(3)))
    func fewDescriptorsReadWaitsForWriter() async throws {
        let files = (0 ..< 10).map { scratch.write("f\($0)", "old\($0)\n") }
        let list = scratch.write("list", files.joined(separator: "\n") + "\n")
        let fifo = scratch.path + "/go"
        #expect(mkfifo(fifo, 0o600) == 0)
        let holder = try LineProcess(["exec", "--space", space, "--write", files[5], "--",
                                      "sh", "-c", "echo held; read x < '\(fifo)'; echo new5 > '\(files[5])'"])
        var holderLines = holder.lines.makeAsyncIterator()
        #expect(await holderLines.next() == "held")
        let reader = try LineProcess(["-c", "ulimit -n 40 && exec '\(filecoordBinary)' read --space '\(space)' --cat --from-list '\(list)'"],
                                     executable: "/bin/sh")
        try await waitForStatus { status in
            ((status["waiting"] as? [[String: Any]]) ?? []).contains { $0["pid"] as? Int32 == reader.pid && $0["path"] as? String == files[5] }
        }
        _ = try await shell("echo go > '\(fifo)'")
        #expect(await holder.wait().status == 0)
        var lines: [String] = []
        for await line in reader.lines { lines.append(line) }
        let ended = await reader.wait()
        #expect(ended.status == 0, "\(ended.stderr)")
        #expect(lines == (0 ..< 10).map { $0 == 5 ? "new5" : "old\($0)" })
    }

    /// The wall clock in nanoseconds, as `date +%s%N` prints it.
    static func wallClockNanoseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    }

    /// How long after `instant` (``wallClockNanoseconds()``) a waiter's `date +%s%N` ran,
    /// from the line it prints.
    static func startDelay(of lines: inout AsyncStream<String>.Iterator, after instant: Int64) async throws -> Duration {
        let line = await lines.next() ?? ""
        let started = try #require(Int64(line), "the waiter printed \(line)")
        return .nanoseconds(started - instant)
    }

    @Test("a holder killed with SIGKILL (exec's wrapper, then its command, which keeps the claims): the waiting writer proceeds within 100 ms of the last death")
    func killedHolder() async throws {
        let file = scratch.write("held", "x")
        let holder = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo $$; exec sleep 61 >/dev/null 2>&1"])
        var holderLines = holder.lines.makeAsyncIterator()
        let command = try #require(Int32(await holderLines.next() ?? ""))
        // The command prints the wall-clock time it started, in nanoseconds.
        let waiter = try LineProcess(["exec", "--space", space, "--write", file, "--", "date", "+%s%N"])
        var waiterLines = waiter.lines.makeAsyncIterator()
        try await waitForStatus { status in
            ((status["waiting"] as? [[String: Any]]) ?? []).contains { $0["pid"] as? Int32 == waiter.pid }
        }
        holder.signal(SIGKILL)
        let killed = Self.wallClockNanoseconds()
        kill(command, SIGKILL)
        let elapsed = try await Self.startDelay(of: &waiterLines, after: killed)
        #expect(elapsed < .milliseconds(100), "the waiter's command started \(elapsed) after the kill")
        #expect(await waiter.wait().status == 0)
        _ = await holder.wait()
    }

    @Test("a holder's command that let go of claims.lock before its claims: the waiting writer proceeds when the command ends",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/bin/bash"), "needs bash"), .timeLimit(.minutes(1)))
    func claimsOutliveTheLockFile() async throws {
        let file = scratch.write("kept", "x")
        let gate = scratch.path + "/gate"
        guard mkfifo(gate, 0o600) == 0 else { throw POSIXError(.EEXIST) }
        let lockFile = URL(fileURLWithPath: space).resolvingSymlinksInPath().path + "/claims.lock"
        // The command closes its copy of `claims.lock` (the last one, once the wrapper is
        // gone), keeps the claim shards it inherited, and ends when the test says so.
        let script = #"for f in /proc/$$/fd/*; do [ "$(readlink "$f")" = "$1" ] && eval "exec ${f##*/}>&-"; done; echo $$; read line < "$2""#
        let holder = try LineProcess(["exec", "--space", space, "--write", file, "--", "/bin/bash", "-c", script, "bash", lockFile, gate])
        var holderLines = holder.lines.makeAsyncIterator()
        _ = try #require(Int32(await holderLines.next() ?? ""))
        holder.signal(SIGKILL)
        try await holder.waitUntilEnded()
        // Now only the command holds the claim: the waiter finds it taken, and sleeps.
        let waiter = try LineProcess(["exec", "--space", space, "--write", file, "--", "date", "+%s%N"])
        var waiterLines = waiter.lines.makeAsyncIterator()
        try await waitForStatus { status in
            ((status["waiting"] as? [[String: Any]]) ?? []).contains { $0["pid"] as? Int32 == waiter.pid }
        }
        // The command ends: its shards' last close is the only event left to come.
        let release = Process()
        release.executableURL = URL(fileURLWithPath: "/bin/sh")
        release.arguments = ["-c", "echo go > \"$0\"", gate]
        try release.run()
        let elapsed = try await Self.startDelay(of: &waiterLines, after: Self.wallClockNanoseconds())
        #expect(elapsed < .seconds(1), "the waiter's command started \(elapsed) after the holder's command was told to end")
        #expect(await waiter.wait().status == 0)
        _ = await holder.wait()
    }

    @Test("a presenter stopped with SIGSTOP: the writer proceeds after the presenter timeout, or fails with --strict (exit 3)")
    func stoppedPresenter() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, _) = try await present(file)
        presenter.signal(SIGSTOP)
        defer { presenter.signal(SIGCONT); presenter.signal(SIGTERM) }
        let clock = ContinuousClock()
        let start = clock.now
        let proceed = try await filecoord("write", file, "--space", space, "--presenter-timeout", "0.5", stdin: Data("new".utf8))
        let elapsed = clock.now - start
        #expect(proceed.status == 0, "\(proceed.errorText)")
        #expect(elapsed >= .milliseconds(500) && elapsed < .seconds(10))
        #expect(proceed.errorText.contains("warning") && proceed.errorText.contains("process \(presenter.pid)"), "\(proceed.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")

        let strict = try await filecoord("write", file, "--space", space, "--presenter-timeout", "0.5", "--strict", stdin: Data("newer".utf8))
        #expect(strict.status == 3, "\(strict.errorText)")
        #expect(strict.errorText.contains("did not answer"))
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")
    }

    @Test("--ack-delay 300ms delays the writer; relinquishToWriter comes before the file changes, didChange after")
    func ordering() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file, "--ack-delay", "300ms")
        var lines = stream
        let clock = ContinuousClock()
        let start = clock.now
        async let writer = filecoord("write", file, "--space", space, stdin: Data("new".utf8))
        let first = try #require(await lines.next())
        #expect(event(first).event == "relinquishToWriter")
        // The writer's pid: not the presenter's, and a live process that is filecoord write.
        let asker = try #require((try JSONSerialization.jsonObject(with: Data(first.utf8)) as? [String: Any])?["pid"] as? Int32)
        #expect(asker != presenter.pid)
        let command = FileManager.default.contents(atPath: "/proc/\(asker)/cmdline").map { String(decoding: $0, as: UTF8.self) }
        #expect(command?.contains("write") == true, "\(String(describing: command))")
        // Told first: the file has not changed yet.
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "old")
        let result = try await writer
        #expect(result.status == 0, "\(result.errorText)")
        #expect(clock.now - start >= .milliseconds(300))
        var rest: [String] = []
        while rest.count < 3, let line = await lines.next() { rest.append(event(line).event) }
        #expect(rest == ["save", "didChange", "reacquire"])
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
    }

    @Test("relative paths are taken from the current directory: a presenter, write and exec given `doc` act on the file there",
          .timeLimit(.minutes(3)))
    func relativePaths() async throws {
        let file = scratch.write("doc", "old")
        let presenter = try LineProcess(["-c", "cd '\(scratch.path)' && exec '\(filecoordBinary)' present doc --json --space '\(space)'"],
                                        executable: "/bin/sh")
        var lines = presenter.lines.makeAsyncIterator()
        let ready = try #require(await lines.next())
        #expect(event(ready).event == "ready")
        #expect(event(ready).path == file)
        let write = try await shell("cd '\(scratch.path)' && printf new | \"$FILECOORD\" write doc --space '\(space)'")
        #expect(write.status == 0, "\(write.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")
        let exec = try await shell("cd '\(scratch.path)' && \"$FILECOORD\" exec --space '\(space)' --write doc -- sh -c 'printf exec > doc'")
        #expect(exec.status == 0, "\(exec.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "exec")
        var heard: [String] = []
        while heard.count < 8, let line = await lines.next() { heard.append(event(line).event) }
        let steps = ["relinquishToWriter", "save", "didChange", "reacquire"]
        #expect(heard == steps + steps)
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
    }

    @Test("another process's coordinated writes are not echoed by the presenter's watch; a change outside coordination is heard",
          .timeLimit(.minutes(3)))
    func noEchoAcrossProcesses() async throws {
        let file = scratch.write("doc", "old")
        // Settling holds the watch's events back, so the writes' events are still unchecked
        // when their reacquire arrives (the suppression must reach past them).
        let (presenter, stream) = try await present(file, "--settle", "0.2")
        var lines = stream
        for round in 0 ..< 3 {
            let result = try await filecoord("write", file, "--space", space, stdin: Data("new \(round)".utf8))
            #expect(result.status == 0, "\(result.errorText)")
        }
        try await Task.sleep(for: .milliseconds(400)) // ok: the writes' settle interval passes, so an echo would be heard on its own
        let append = try await shell("printf more >> '\(file)'")
        #expect(append.status == 0)
        var heard: [String] = []
        while heard.filter({ $0 == "didChange" }).count < 4, let line = await lines.next() { heard.append(event(line).event) }
        let write = ["relinquishToWriter", "save", "didChange", "reacquire"]
        #expect(heard == write + write + write + ["didChange"])
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
    }

    @Test("a presenter that refuses writers fails the writer (exit 1) with its message; the file is untouched")
    func refusal() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, _) = try await present(file, "--refuse-writers")
        let result = try await filecoord("write", file, "--space", space, stdin: Data("new".utf8))
        #expect(result.status == 1)
        #expect(result.errorText.contains("refuses writers"), "\(result.errorText)")
        #expect(result.errorText.contains("process \(presenter.pid)"))
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "old")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("malformed, truncated and foreign files in the space are ignored with a warning, never crash or block")
    func malformedFiles() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream, box) = try await presentAlone(file)
        var lines = stream
        let junk: [(String, Data)] = [
            ("truncated", Data("filecoord 1\nkind relinquish\npresenter 1\n".utf8)),
            ("foreign", Data("hello, world\n".utf8)),
            ("binary", Data((0 ..< 512).map { UInt8(truncatingIfNeeded: $0 &* 37) })),
            ("future", Data("filecoord 99\nkind relinquish\nend\n".utf8)),
            ("badfield", Data("filecoord 1\nkind relinquish\npath %ZZ\nend\n".utf8)),
            ("huge", Data(repeating: 0x41, count: 200_000)),
            ("unknown", Data("filecoord 1\nkind explode\nfrom x\nid 1\nend\n".utf8)),
        ]
        for (name, data) in junk {
            _ = FileManager.default.createFile(atPath: box + "/" + name, contents: data)
            _ = FileManager.default.createFile(atPath: space + "/presenters/" + name, contents: data)
        }
        try FileManager.default.createSymbolicLink(atPath: box + "/link", withDestinationPath: "/etc/passwd")
        #expect(mkfifo(box + "/fifo", 0o600) == 0)
        let result = try await filecoord("write", file, "--space", space, "--presenter-timeout", "5", "--strict", stdin: Data("new".utf8))
        #expect(result.status == 0, "\(result.errorText)")
        #expect(event(try #require(await lines.next())).event == "relinquishToWriter")
        presenter.signal(SIGTERM)
        let ended = await presenter.wait()
        #expect(ended.status == SIGTERM && presenter.process.terminationReason == .uncaughtSignal)
        #expect(ended.stderr.contains("ignored a file in the coordination space"), "\(ended.stderr)")
    }

    @Test("a message whose sender is not a process's name (`from ../../escape`) is ignored with a warning: nothing is written outside the space", .timeLimit(.minutes(2)))
    func forgedSender() async throws {
        let file = scratch.write("doc", "old")
        let escape = scratch.path + "/escape"
        try FileManager.default.createDirectory(atPath: escape, withIntermediateDirectories: false)
        let errors = try await presenterReading(relinquishFrom: "../../escape", named: "forged", of: file)
        #expect(try FileManager.default.contentsOfDirectory(atPath: escape).isEmpty, "a reply was written outside the space")
        #expect(errors.contains("ignored a file in the coordination space") && errors.contains("forged"), "\(errors)")
    }

    @Test("a presenter request from a process that is not in the space (a valid name with no record) is ignored with a warning, not served", .timeLimit(.minutes(2)))
    func requestFromNoMember() async throws {
        let file = scratch.write("doc", "old")
        let errors = try await presenterReading(relinquishFrom: "1-0", named: "1-0-1", of: file)
        #expect(errors.contains("is not in the space") && errors.contains("1-0-1"), "\(errors)")
    }

    /// A presenter of `file` that reads a real relinquish (left unread while it was
    /// stopped) copied under the sender `sender`, in its mailbox's file `name`: what it
    /// wrote on stderr once it has read it (it reads its mailbox in order: once it has
    /// answered `status`, it has read the copy) and ended.
    func presenterReading(relinquishFrom sender: String, named name: String, of file: String) async throws -> String {
        let (presenter, _, box) = try await presentAlone(file)
        presenter.signal(SIGSTOP)
        let gaveUp = try await filecoord("write", file, "--space", space, "--presenter-timeout", "0.3", stdin: Data("new".utf8))
        #expect(gaveUp.status == 0, "\(gaveUp.errorText)")
        let names = try FileManager.default.contentsOfDirectory(atPath: box)
        let request = try #require(names.lazy.compactMap { try? String(contentsOfFile: box + "/" + $0, encoding: .utf8) }
            .first { $0.contains("kind relinquish") })
        let forged = request.split(separator: "\n").map { $0.hasPrefix("from ") ? "from \(sender)" : String($0) }.joined(separator: "\n") + "\n"
        #expect(FileManager.default.createFile(atPath: box + "/" + name, contents: Data(forged.utf8)))
        presenter.signal(SIGCONT)
        #expect(try await filecoord("status", "--space", space).status == 0)
        presenter.signal(SIGTERM)
        return await presenter.wait().stderr
    }

    @Test("a slot of a live sender read while the sender still writes it (cut short) is left for its own close, then served; the presenter hears the message", .timeLimit(.minutes(2)))
    func slotReadMidWrite() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream, box) = try await presentAlone(file)
        var lines = stream
        let record = try #require(try FileManager.default.contentsOfDirectory(atPath: space + "/presenters").first { !$0.hasPrefix(".") })
        let number = try #require(record.split(separator: "-").last.map(String.init))
        // A sender of the space, alive while this test holds its record's lock.
        let sender = "99998-beef"
        let senderRecord = space + "/procs/" + sender
        #expect(FileManager.default.createFile(atPath: senderRecord, contents: Data("filecoord 1\nkind process\npid 1\nlistening 0\nend\n".utf8)))
        let recordFD = open(senderRecord, O_RDWR | O_CLOEXEC)
        defer { close(recordFD) }
        var lock = flock()
        (lock.l_type, lock.l_whence, lock.l_start, lock.l_len) = (Int16(F_WRLCK), Int16(SEEK_SET), 0, 1)
        #expect(recordFD >= 0 && fcntl(recordFD, F_SETLK, &lock) == 0)
        let message = Array("filecoord 1\nkind did-change\npresenter \(number)\npath \(file)\nfrom \(sender)\nid 1\npid 1\nend\n".utf8)
        let slot = box + "/\(sender)-r1"
        // Its first half, closed: what a receiver sees of a message not yet whole.
        #expect(FileManager.default.createFile(atPath: slot, contents: Data(message[..<(message.count / 2)])))
        // Read by then: `status` is answered after what came before it.
        #expect(try await filecoord("status", "--space", space).status == 0)
        #expect(FileManager.default.fileExists(atPath: slot), "the slot was removed while its sender wrote it")
        let handle = try #require(FileHandle(forWritingAtPath: slot))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(message[(message.count / 2)...]))
        try handle.close()
        let heard = await lines.next().map { event($0).event }
        #expect(heard == "didChange", "\(heard ?? "nothing")")
        presenter.signal(SIGTERM)
        let ended = await presenter.wait()
        #expect(!ended.stderr.contains("ignored a file"), "\(ended.stderr)")
    }

    @Test("a presenter record whose process is not the one its name gives (`from ../../escape`) is ignored: a writer messages no one outside the space", .timeLimit(.minutes(2)))
    func forgedPresenterRecord() async throws {
        let file = scratch.write("doc", "old")
        let escape = scratch.path + "/escape" // mail/../../escape, from the space
        try FileManager.default.createDirectory(atPath: escape, withIntermediateDirectories: false)
        let (presenter, _, _) = try await presentAlone(file)
        let real = try #require(try FileManager.default.contentsOfDirectory(atPath: space + "/presenters").first { !$0.hasPrefix(".") })
        let record = try String(contentsOfFile: space + "/presenters/" + real, encoding: .utf8)
        // The record of another presenter of the same live process, naming another process.
        let forged = record.split(separator: "\n").map { $0.hasPrefix("from ") ? "from ../../escape" : String($0) }.joined(separator: "\n") + "\n"
        let dash = try #require(real.lastIndex(of: "-"))
        let owner = real[..<dash]
        #expect(FileManager.default.createFile(atPath: space + "/presenters/\(owner)-99", contents: Data(forged.utf8)))
        let result = try await filecoord("write", file, "--space", space, "--presenter-timeout", "2", stdin: Data("new".utf8))
        #expect(result.status == 0, "\(result.errorText)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: escape).isEmpty, "a message was written outside the space")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a writer's message files made ahead are removed after it exits or is killed, without a warning", .timeLimit(.minutes(3)))
    func spareMessageFiles() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream, box) = try await presentAlone(file)
        var lines = stream
        let fifo = scratch.path + "/go"
        #expect(mkfifo(fifo, 0o600) == 0)
        // One writer ends normally (after its did-change and reacquire), one is killed while
        // it holds the claim: both leave a message file made ahead in the presenter's mailbox.
        let graceful = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo held; read x < '\(fifo)'"])
        var gracefulLines = graceful.lines.makeAsyncIterator()
        #expect(await gracefulLines.next() == "held")
        #expect(event(try #require(await lines.next())).event == "relinquishToWriter")
        _ = try await shell("echo go > '\(fifo)'")
        #expect(await graceful.wait().status == 0)
        let killed = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo held; exec sleep 61 >/dev/null 2>&1"])
        var killedLines = killed.lines.makeAsyncIterator()
        #expect(await killedLines.next() == "held")
        killed.signal(SIGKILL)
        _ = try await shell("pkill -f 'sleep 61' || true")
        _ = await killed.wait()
        // The presenter reads its mailbox in order: once it has answered `status`, it has
        // seen both writers' files closed.
        #expect(try await filecoord("status", "--space", space).status == 0)
        let left = try FileManager.default.contentsOfDirectory(atPath: box)
        #expect(!left.contains { $0.hasPrefix("\(graceful.pid)-") || $0.hasPrefix("\(killed.pid)-") }, "\(left)")
        presenter.signal(SIGTERM)
        let ended = await presenter.wait()
        #expect(ended.status == SIGTERM && presenter.process.terminationReason == .uncaughtSignal)
        #expect(!ended.stderr.contains("ignored a file"), "\(ended.stderr)")
        // Every process has left or was cleaned up (the killed writer by `status`): no
        // mailbox is left, although the presenter made a spare in `status`'s as it left.
        #expect(try FileManager.default.contentsOfDirectory(atPath: space + "/mail") == [])
    }

    @Test("20 writers in turn: the presenter hears each write's steps in order; each leaves the space as it exits, and none of their message files is left",
          .timeLimit(.minutes(3)))
    func manyWriters() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream, box) = try await presentAlone(file)
        var lines = stream
        for round in 0 ..< 20 {
            let result = try await filecoord("write", file, "--space", space, stdin: Data("new \(round)".utf8))
            #expect(result.status == 0, "\(result.errorText)")
        }
        var heard: [String] = []
        while heard.count < 80, let line = await lines.next() { heard.append(event(line).event) }
        #expect(heard == Array(repeating: ["relinquishToWriter", "save", "didChange", "reacquire"], count: 20).flatMap { $0 })
        // Each writer left the space as it exited: `status` finds no one to clean up
        // after, only the presenter's record is left, and the writers' slots in its
        // mailbox are gone (the status request is read after the last reacquire).
        let listed = try await filecoord("status", "--json", "--space", space)
        #expect(listed.status == 0)
        let object = try #require(try JSONSerialization.jsonObject(with: listed.stdout) as? [String: Any])
        #expect((object["cleanedUp"] as? [Int32]) == [])
        let records = try FileManager.default.contentsOfDirectory(atPath: space + "/procs")
        #expect(records.count == 1 && records.allSatisfy { $0.hasPrefix("\(presenter.pid)-") }, "\(records)")
        let left = try FileManager.default.contentsOfDirectory(atPath: box)
        #expect(left.isEmpty, "\(left)")
        // Nor does the presenter keep a descriptor open in a writer's mailbox (the spare
        // for its next message there): it is closed once the writer's record goes, on an
        // I/O thread, with no event to await from here. Kept, it held the deleted mailbox.
        let deadline = ContinuousClock.now + .seconds(10)
        var held = openFiles(of: presenter.pid).filter { $0.hasPrefix(space + "/mail/") && $0.hasSuffix("(deleted)") }
        while !held.isEmpty, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10)) // ok: polling another process's descriptor table
            held = openFiles(of: presenter.pid).filter { $0.hasPrefix(space + "/mail/") && $0.hasSuffix("(deleted)") }
        }
        #expect(held.isEmpty, "\(held)")
        presenter.signal(SIGTERM)
        let ended = await presenter.wait()
        #expect(ended.status == SIGTERM && presenter.process.terminationReason == .uncaughtSignal)
        #expect(!ended.stderr.contains("ignored a file"), "\(ended.stderr)")
    }

    @Test("status lists live claims and presenters with their pids, and cleans up after a killed presenter")
    func status() async throws {
        let file = scratch.write("doc", "x")
        // Not the scratch directory itself: the space is made inside it as the presenter joins.
        let presented = scratch.path + "/presented"
        try FileManager.default.createDirectory(atPath: presented, withIntermediateDirectories: false)
        let (presenter, _) = try await present(presented)
        let holder = try LineProcess(["exec", "--space", space, "--read", file, "--", "sh", "-c", "echo held; exec sleep 62 >/dev/null 2>&1"])
        var holderLines = holder.lines.makeAsyncIterator()
        #expect(await holderLines.next() == "held")
        let listed = try await filecoord("status", "--json", "--space", space)
        let object = try #require(try JSONSerialization.jsonObject(with: listed.stdout) as? [String: Any])
        let claims = try #require(object["claims"] as? [[String: Any]])
        #expect(claims.contains { $0["path"] as? String == file && $0["access"] as? String == "read" && $0["pid"] as? Int32 == holder.pid })
        let presenters = try #require(object["presenters"] as? [[String: Any]])
        #expect(presenters.contains { $0["path"] as? String == presented && $0["pid"] as? Int32 == presenter.pid })

        presenter.signal(SIGKILL)
        _ = await presenter.wait()
        let after = try await filecoord("status", "--json", "--space", space)
        let cleaned = try #require(try JSONSerialization.jsonObject(with: after.stdout) as? [String: Any])
        #expect((cleaned["presenters"] as? [Any])?.isEmpty == true)
        #expect((cleaned["cleanedUp"] as? [Int32]) == [presenter.pid])
        #expect(try FileManager.default.contentsOfDirectory(atPath: space + "/presenters").filter { !$0.hasPrefix(".") }.isEmpty)
        holder.signal(SIGKILL)
        _ = try await shell("pkill -f 'sleep 62' || true")
        _ = await holder.wait()
    }

    @Test("what a process that died while joining left (a mailbox with no record, a record never renamed) is removed once old")
    func abandonedJoinCleanedUp() async throws {
        // A space exists once one process joined it.
        #expect(try await filecoord("status", "--json", "--space", space).status == 0)
        let dead = try await shell("true & echo $!; wait").outputText.trimmingCharacters(in: .whitespacesAndNewlines)
        let (old, young) = ("\(dead)-01d", "\(dead)-70a")
        let fileManager = FileManager.default
        for process in [old, young] {
            try fileManager.createDirectory(atPath: space + "/mail/" + process, withIntermediateDirectories: false)
            #expect(fileManager.createFile(atPath: space + "/procs/." + process, contents: Data("filecoord 1\nkind process\nend\n".utf8)))
        }
        let longAgo = Date(timeIntervalSinceNow: -120)
        try fileManager.setAttributes([.modificationDate: longAgo], ofItemAtPath: space + "/mail/" + old)
        try fileManager.setAttributes([.modificationDate: longAgo], ofItemAtPath: space + "/procs/." + old)
        // The next process to join cleans up: the old leftovers go; the young ones may be
        // a process joining right now, and stay.
        #expect(try await filecoord("status", "--json", "--space", space).status == 0)
        #expect(!fileManager.fileExists(atPath: space + "/mail/" + old) && !fileManager.fileExists(atPath: space + "/procs/." + old))
        #expect(fileManager.fileExists(atPath: space + "/mail/" + young) && fileManager.fileExists(atPath: space + "/procs/." + young))
    }

    @Test("a coordinated read waits for another process's writer; --timeout ends the wait with exit 3, failing only that file of a batch")
    func readWaitsForWriter() async throws {
        let file = scratch.write("doc", "content")
        let free = try await filecoord("read", file, "--cat", "--space", space)
        #expect(free.status == 0 && free.outputText == "content", "\(free.errorText)")
        let holder = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo held; exec sleep 63 >/dev/null 2>&1"])
        var holderLines = holder.lines.makeAsyncIterator()
        #expect(await holderLines.next() == "held")
        let blocked = try await filecoord("read", file, "--cat", "--space", space, "--timeout", "0.3")
        #expect(blocked.status == 3, "\(blocked.errorText)")
        #expect(blocked.outputText.isEmpty)
        // In a batch only that file fails: the others are read, in the sequence (--cat) and
        // in place (--json), and the exit status is still 3.
        let before = scratch.write("before", "B"), after = scratch.write("after", "A")
        let mixed = try await filecoord("read", before, file, after, "--cat", "--space", space, "--timeout", "0.3")
        #expect(mixed.status == 3, "\(mixed.errorText)")
        #expect(mixed.outputText == "BA")
        #expect(mixed.errorText.contains("\(file): claim failed"), "\(mixed.errorText)")
        let summary = try await filecoord("read", before, file, after, "--json", "--space", space, "--timeout", "0.3")
        #expect(summary.status == 3, "\(summary.errorText)")
        let object = summary.jsonLines.last
        #expect(object?["files"] as? Int == 2 && object?["failed"] as? Int == 1, "\(summary.outputText)")
        holder.signal(SIGKILL)
        _ = try await shell("pkill -f 'sleep 63' || true")
        _ = await holder.wait()
    }

    @Test("a space writable by others, or a symbolic link, is refused with a clear error")
    func insecureSpace() async throws {
        let open = scratch.path + "/open"
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: false)
        chmod(open, 0o777)
        let result = try await filecoord("exec", "--space", open, "--read", scratch.path, "--", "true")
        #expect(result.status == 1)
        #expect(result.errorText.contains(open) && result.errorText.contains("writable by other users"), "\(result.errorText)")
        let link = scratch.path + "/link"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: open)
        let linked = try await filecoord("exec", "--space", link, "--read", scratch.path, "--", "true")
        #expect(linked.status == 1)
        #expect(linked.errorText.contains("symbolic link"), "\(linked.errorText)")
    }

    @Test("a presenter process stopped while more events happen than the kernel queues: a resync, nothing lost, then it goes on",
          .timeLimit(.minutes(3)))
    func kernelQueueOverflow() async throws {
        let (tmpfs, limit) = try overflowSetting()
        let (presenter, _) = try await present(tmpfs.path)

        // Stopped, the whole process (its watcher thread too) reads nothing: the kernel's
        // queue is the only place the events can wait, and it holds `limit` of them. The
        // files are made only once the kernel shows it stopped.
        presenter.signal(SIGSTOP)
        try #require(try await presenter.waitUntilStopped(), "the presenter did not stop")
        let created = limit + 1000
        await createFiles(in: tmpfs.path, count: created)
        presenter.signal(SIGCONT)
        // Watching goes on after the overflow, and the rescan reports what the lost
        // events would have: every file, the one created after the pause included. Some
        // 17,000 lines: taken on a thread of their own, whatever the suite's other tests
        // do with the cooperative pool meanwhile.
        close(open("\(tmpfs.path)/after", O_CREAT | O_WRONLY | O_CLOEXEC, 0o644))
        let tally = OverflowTally(expected: created + 1)
        let complete = await presenter.waitForLines(within: .seconds(150)) { tally.add($0) }
        #expect(complete, "after 150 s: \(tally.appeared.count) of \(created + 1) files appeared, \(tally.resyncs) resyncs")
        #expect(tally.resyncs == 1, "\(created) creations against a queue of \(limit): the kernel's queue must overflow")
        #expect(tally.appeared.count == created + 1 && tally.appeared.contains(tmpfs.path + "/after"))
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
    }

    @Test("after a queue overflow, the messages waiting in a mailbox are served in the order they were written: each writer's relinquish before its reacquire",
          .timeLimit(.minutes(3)))
    func overflowRescanKeepsOrder() async throws {
        let (tmpfs, limit) = try overflowSetting()
        let (presenter, stream, box) = try await presentAlone(tmpfs.path)
        var lines = stream
        let record = try #require(try FileManager.default.contentsOfDirectory(atPath: space + "/presenters").first { !$0.hasPrefix(".") })
        let number = try #require(record.split(separator: "-").last.map(String.init))
        presenter.signal(SIGSTOP)
        // More events than the kernel queues, so that the presenter rescans its mailbox;
        // then six writers' requests, whose events are lost. Their times are set so that
        // neither the directory's order nor the times alone put them right: each
        // writer's reacquire is older than its relinquish (the rescan must go by each
        // writer's message numbers), and the relinquishes are newer the lower the writer
        // (across writers, the rescan goes by time: writer 5 first).
        await createFiles(in: tmpfs.path, count: limit + 1000)
        let writers = 6
        let base = Date(timeIntervalSinceNow: -1000)
        var held: [Int32] = []
        defer { for fd in held { close(fd) } }
        for writer in 0 ..< writers {
            let from = "99999\(writer)-fade", item = tmpfs.path + "/c\(writer)"
            // A process of the space, alive as long as this test holds its record's lock (a
            // relinquish from a process that is not in the space is ignored, and records
            // of dead ones are removed by the next process that joins).
            let record = space + "/procs/" + from
            #expect(FileManager.default.createFile(atPath: record, contents: Data("filecoord 1\nkind process\npid 1\nlistening 0\nend\n".utf8)))
            let fd = open(record, O_RDWR | O_CLOEXEC)
            var lock = flock()
            (lock.l_type, lock.l_whence, lock.l_start, lock.l_len) = (Int16(F_WRLCK), Int16(SEEK_SET), 0, 1)
            #expect(fd >= 0 && fcntl(fd, F_SETLK, &lock) == 0)
            held.append(fd)
            let reacquire = "filecoord 1\nkind reacquire\npresenter \(number)\npath \(item)\nre 1\nfrom \(from)\nid 2\npid 1\nend\n"
            let relinquish = "filecoord 1\nkind relinquish\npresenter \(number)\npath \(item)\naccess write\npurpose test\nre 1\nfrom \(from)\nid 1\npid 1\nend\n"
            #expect(FileManager.default.createFile(atPath: box + "/\(from)-2", contents: Data(reacquire.utf8),
                                                   attributes: [.modificationDate: base + Double(writer)]))
            #expect(FileManager.default.createFile(atPath: box + "/\(from)-1", contents: Data(relinquish.utf8),
                                                   attributes: [.modificationDate: base + 100 + Double(writers - 1 - writer)]))
        }
        presenter.signal(SIGCONT)
        // A real write afterwards marks the end of what the rescan served.
        let real = tmpfs.path + "/real"
        let write = try await filecoord("write", real, "--space", space, stdin: Data("x".utf8))
        #expect(write.status == 0, "\(write.errorText)")
        var steps: [String] = []
        var sawReal = false
        while let line = await lines.next() {
            let (kind, path) = event(line)
            guard kind == "relinquishToWriter" || kind == "reacquire" else { continue }
            if kind == "relinquishToWriter" && path == real { sawReal = true; continue }
            if sawReal && kind == "reacquire" { break }
            steps.append(kind == "reacquire" ? kind : "\(kind) \(URL(fileURLWithPath: path).lastPathComponent)")
        }
        #expect(steps == (0 ..< writers).reversed().flatMap { ["relinquishToWriter c\($0)", "reacquire"] })
        presenter.signal(SIGTERM)
        #expect(await presenter.endsBy(SIGTERM))
    }

    @Test("a presenter record left by a process that has no mailbox any more (it left while registering) is removed by the first writer that asks it",
          .timeLimit(.minutes(3)))
    func strayPresenterRecordRemoved() async throws {
        let file = scratch.write("doc", "old")
        #expect(try await filecoord("status", "--space", space).status == 0) // makes the space
        let stray = space + "/presenters/999998-0dead-1"
        let record = "filecoord 1\nkind presenter\nfrom 999998-0dead\npath \(file)\npid 999998\npresenter 1\nend\n"
        #expect(FileManager.default.createFile(atPath: stray, contents: Data(record.utf8)))
        let write = try await filecoord("write", file, "--space", space, "--presenter-timeout", "5", "--strict", stdin: Data("new".utf8))
        #expect(write.status == 0, "\(write.errorText)")
        #expect(!FileManager.default.fileExists(atPath: stray))
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")
    }

    @Test("claims this process keeps after use (idle) never block another process: it gives them back when asked")
    func idleClaimsGiveWay() async throws {
        let file = scratch.write("idle", "old")
        let url = URL(fileURLWithPath: file)
        // This test process reads, in its own space (the default one): its shared kernel
        // claims on the file and its directories stay, idle, after the coordination ends.
        let before = try await FileCoordinator().coordinate(readingItemAt: url) { try await Data(asyncContentsOf: $0) }
        #expect(String(decoding: before, as: UTF8.self) == "old")
        let space = try #require(FileCoordinator.coordinationSpace?.directory.string)
        // Another process of that space writes the file, which needs the item exclusively;
        // then deletes the directory, which needs everything inside it. Without the idle
        // claims given back, each would wait for its --timeout and exit 3.
        let write = try await filecoord("write", file, "--space", space, "--timeout", "10", stdin: Data("theirs".utf8))
        #expect(write.status == 0, "\(write.errorText)")
        let after = try await FileCoordinator().coordinate(readingItemAt: url) { try await Data(asyncContentsOf: $0) }
        #expect(String(decoding: after, as: UTF8.self) == "theirs")
        let directory = scratch.path + "/tree"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        _ = try await FileCoordinator().coordinate(readingItemAt: URL(fileURLWithPath: directory + "/f")) { _ in }
        let delete = try await filecoord("exec", "--space", space, "--delete", directory, "--timeout", "10", "--", "rm", "-r", directory)
        #expect(delete.status == 0, "\(delete.errorText)")
        #expect(!FileManager.default.fileExists(atPath: directory))
    }

    @Test("another process's request is served on the watcher thread that read it (unless the presenter's callbacks may block); a callback there that needs the watcher (a new presenter, a coordinated read) completes",
          .timeLimit(.minutes(3)))
    func servedOnTheWatcherThread() async throws {
        let file = scratch.write("served", "old")
        let other = scratch.write("other", "theirs")
        // This test process joins its space (the default one) with a first coordination.
        _ = try await FileCoordinator().coordinate(readingItemAt: URL(fileURLWithPath: other)) { _ in }
        let space = try #require(FileCoordinator.coordinationSpace?.directory.string)
        let presenter = WatcherProbe(URL(fileURLWithPath: file), other: URL(fileURLWithPath: other))
        await FileCoordinator.addFilePresenter(presenter)
        let write = try await filecoord("write", file, "--space", space, "--presenter-timeout", "20", stdin: Data("new".utf8))
        await FileCoordinator.removeFilePresenter(presenter)
        #expect(write.status == 0, "\(write.errorText)")
        #expect(!write.errorText.contains("did not answer"), "\(write.errorText)")
        // The callback started on the thread that read the request, and what it awaited
        // there (watches added by that same thread, claims) came through.
        #expect(presenter.log.withLock { $0 } == ["relinquishToWriter on filecoord-watch", "registered", "read theirs"])
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")

        // A presenter whose callbacks may block is served from an I/O thread.
        let blocking = WatcherProbe(URL(fileURLWithPath: file), other: URL(fileURLWithPath: other), mayBlock: true)
        await FileCoordinator.addFilePresenter(blocking)
        let again = try await filecoord("write", file, "--space", space, "--presenter-timeout", "20", stdin: Data("newer".utf8))
        await FileCoordinator.removeFilePresenter(blocking)
        #expect(again.status == 0, "\(again.errorText)")
        let log = blocking.log.withLock { $0 }
        #expect(log.count == 3 && log[0].hasPrefix("relinquishToWriter on filecoord-io-"), "\(log)")
    }

    /// Three readers of `url` in this process, each 5 ms inside its accessor, started 2 ms
    /// apart, until `done` is set: the item is never free of readers here, so this
    /// process's kernel claims on it (and its directories) never end by themselves.
    func overlappingReaders(of url: URL, until done: Flag) -> [Task<Int, any Error>] {
        (0 ..< 3).map { index in
            Task {
                try await Task.sleep(for: .milliseconds(2 * index)) // ok: staggers the readers
                var reads = 0
                while !done.isSet {
                    try await FileCoordinator().coordinate(readingItemAt: url) { _ in
                        try await Task.sleep(for: .milliseconds(5)) // ok: the reader's work
                    }
                    reads += 1
                }
                return reads
            }
        }
    }

    @Test("overlapping readers in this process never starve a writer in another", .timeLimit(.minutes(3)))
    func readersDoNotStarveAWriter() async throws {
        let file = scratch.write("busy", "old")
        let url = URL(fileURLWithPath: file)
        // Joins this test process's (default) space, and names it for the other process.
        try await FileCoordinator().coordinate(readingItemAt: url) { _ in }
        let space = try #require(FileCoordinator.coordinationSpace?.directory.string)
        let done = Flag()
        let readers = overlappingReaders(of: url, until: done)
        // The writer queues; the readers that come after it wait behind it. Without that,
        // it would wait out its --timeout and exit 3.
        let write = try await filecoord("write", file, "--space", space, "--timeout", "10", stdin: Data("theirs".utf8))
        done.set()
        var reads = 0
        for reader in readers { reads += try await reader.value }
        #expect(write.status == 0, "\(write.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "theirs")
        #expect(reads > 3, "the readers kept reading while the writer started")
    }

    @Test("overlapping readers inside a directory here never starve its delete in another process", .timeLimit(.minutes(3)))
    func innerReadersDoNotStarveADirectoryDelete() async throws {
        let directory = scratch.path + "/busy-tree"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        let url = URL(fileURLWithPath: scratch.write("busy-tree/f", "x"))
        try await FileCoordinator().coordinate(readingItemAt: url) { _ in }
        let space = try #require(FileCoordinator.coordinationSpace?.directory.string)
        let done = Flag()
        let readers = overlappingReaders(of: url, until: done)
        // The delete queues on the directory; readers inside it that come after wait
        // behind it (they test the directories' queue bytes too).
        let delete = try await filecoord("exec", "--space", space, "--delete", directory, "--timeout", "10", "--", "rm", "-r", directory)
        done.set()
        var reads = 0
        for reader in readers { reads += try await reader.value }
        #expect(delete.status == 0, "\(delete.errorText)")
        #expect(!FileManager.default.fileExists(atPath: directory))
        #expect(reads > 3, "the readers kept reading while the delete started")
    }

    @Test("cancel() ends a coordination that waits for another process's claim, with .cancelled", .timeLimit(.minutes(3)))
    func cancelWhileWaitingForAnotherProcess() async throws {
        let file = scratch.write("held", "x")
        // Joins this test process's (default) space, and names it for the other process.
        try await FileCoordinator().coordinate(readingItemAt: URL(fileURLWithPath: scratch.path)) { _ in }
        let space = try #require(FileCoordinator.coordinationSpace?.directory.string)
        let holder = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo held; exec sleep 64 >/dev/null 2>&1"])
        var holderLines = holder.lines.makeAsyncIterator()
        #expect(await holderLines.next() == "held")
        let coordinator = FileCoordinator()
        let reader = Task { try await coordinator.coordinate(readingItemAt: URL(fileURLWithPath: file)) { _ in "read" } }
        // This process's claim shows as waiting once it waits for the other process.
        var sawWaiting = false
        for _ in 0 ..< 200 where !sawWaiting {
            let result = try await filecoord("status", "--json", "--space", space)
            let object = try JSONSerialization.jsonObject(with: result.stdout) as? [String: Any]
            let waiting = object?["waiting"] as? [[String: Any]] ?? []
            sawWaiting = waiting.contains { $0["path"] as? String == file && $0["pid"] as? Int32 == getpid() }
            if !sawWaiting { try await Task.sleep(for: .milliseconds(20)) } // ok: polling another process's view of this one
        }
        #expect(sawWaiting)
        coordinator.cancel()
        do {
            _ = try await reader.value
            Issue.record("the read ran while another process held the file")
        } catch let error as FileCoordinationError {
            #expect(error.code == .cancelled)
        }
        holder.signal(SIGKILL)
        _ = try await shell("pkill -f 'sleep 64' || true")
        _ = await holder.wait()
    }
}

/// A presenter whose relinquish-to-writer callback notes the thread it starts on, then
/// awaits what needs the watcher thread: registering another presenter (its watch is
/// added by that thread) and a coordinated read.
final class WatcherProbe: FilePresenter {
    let presentedItemURL: URL?
    let other: URL
    let presentedItemCallbacksMayBlock: Bool
    let log = Locked<[String]>([])

    init(_ url: URL, other: URL, mayBlock: Bool = false) {
        presentedItemURL = url
        self.other = other
        presentedItemCallbacksMayBlock = mayBlock
    }

    final class Plain: FilePresenter {
        let presentedItemURL: URL?
        init(_ url: URL) { presentedItemURL = url }
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        let thread = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8))?
            .trimmingCharacters(in: .newlines) ?? "?"
        log.withLock { $0.append("relinquishToWriter on \(thread)") }
        let extra = Plain(other)
        await FileCoordinator.addFilePresenter(extra)
        log.withLock { $0.append("registered") }
        let data = try await FileCoordinator().coordinate(readingItemAt: other) { try await Data(asyncContentsOf: $0) }
        log.withLock { $0.append("read " + String(decoding: data, as: UTF8.self)) }
        await FileCoordinator.removeFilePresenter(extra)
        return nil
    }
}
