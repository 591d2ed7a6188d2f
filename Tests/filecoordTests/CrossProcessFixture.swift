import FileCoordination
import Foundation
import SystemPackage
import Testing
import TestSupport

/// What the suites across processes share: a fresh space in a scratch directory each,
/// and the steps their tests take (presenters started, claims held, status read).
protocol CrossProcessFixture {
    var scratch: Scratch { get }
}

extension CrossProcessFixture {
    var space: String { scratch.path + "/space" }

    /// Starts `filecoord present PATH --json ...` and waits for its ready line.
    func present(_ path: String, _ extra: String...) async throws -> (LineProcess, AsyncStream<String>.Iterator) {
        let presenter = try LineProcess(["present", path, "--json", "--space", space] + extra)
        var lines = presenter.lines.makeAsyncIterator()
        let ready = try #require(await lines.next())
        #expect(event(ready).event == "ready")
        return (presenter, lines)
    }

    /// ``present(_:_:)`` as the space's first process: also its mailbox's path.
    func presentAlone(_ path: String) async throws -> (LineProcess, AsyncStream<String>.Iterator, String) {
        let (presenter, lines) = try await present(path)
        let mail = try #require(try FileManager.default.contentsOfDirectory(atPath: space + "/mail").first)
        return (presenter, lines, space + "/mail/" + mail)
    }

    /// Polls `filecoord status --json` until `condition` holds (the state of other
    /// processes has no event to await).
    func waitForStatus(attempts: Int = 200, _ condition: ([String: Any]) -> Bool) async throws {
        for _ in 0 ..< attempts {
            let result = try await filecoord("status", "--json", "--space", space)
            if let object = try? JSONSerialization.jsonObject(with: result.stdout) as? [String: Any], condition(object) { return }
            try await Task.sleep(for: .milliseconds(20)) // ok: polling another process's state
        }
        Issue.record("status never showed the expected state")
    }

    /// For the overflow tests: a scratch directory on tmpfs when there is one (creating
    /// files there is not bound by a disk journal), and the kernel's inotify queue length,
    /// required small enough to overflow.
    func overflowSetting() throws -> (Scratch, Int) {
        let tmpfs = Scratch(in: FileManager.default.fileExists(atPath: "/dev/shm") ? "/dev/shm" : NSTemporaryDirectory())
        let limit = Int((try String(contentsOfFile: "/proc/sys/fs/inotify/max_queued_events", encoding: .utf8))
            .trimmingCharacters(in: .whitespacesAndNewlines)) ?? 16384
        try #require(limit <= 1_000_000, "max_queued_events is \(limit): too many files to overflow it")
        return (tmpfs, limit)
    }

    /// Creates `count` empty files `f0`, `f1`, ... in `directory`, on a thread of its own.
    func createFiles(in directory: String, count: Int) async {
        await onThread {
            for index in 0 ..< count { close(open("\(directory)/f\(index)", O_CREAT | O_WRONLY | O_CLOEXEC, 0o644)) }
        }
    }

    /// Waits for `process` to end within `limit`; past it, kills it and records a hang.
    func ends(_ process: LineProcess, within limit: Duration, _ what: String) async -> Int32? {
        let killed = Flag()
        let watchdog = Task {
            try await Task.sleep(for: limit) // ok: the bound of a hang
            killed.set()
            process.signal(SIGKILL)
        }
        let status = await process.wait().status
        watchdog.cancel()
        if killed.isSet {
            Issue.record("\(what) did not end within \(limit)")
            return nil
        }
        return status
    }

    /// Starts `exec --space S ARGS -- sh -c 'echo held; read x < FIFO'` and waits for its
    /// line: the claims are held until `release(fifo)`, or for 300 s at most (a test that
    /// fails before it releases leaves no holder for the rest of the suite).
    func holdUntilReleased(_ claims: [String], fifo: String) async throws -> LineProcess {
        if access(fifo, F_OK) != 0 { #expect(mkfifo(fifo, 0o600) == 0) }
        let holder = try LineProcess(["exec", "--space", space] + claims + ["--", "sh", "-c",
                                      "echo held; exec timeout 300 sh -c 'read x < \"$0\"' \"$0\"", fifo])
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        return holder
    }

    func release(_ fifo: String) async throws {
        _ = try await shell("echo go > '\(fifo)'")
    }

    /// The pids `status --json` lists as waiting.
    func waitingPids(in status: [String: Any]) -> Set<Int32> {
        Set(((status["waiting"] as? [[String: Any]]) ?? []).compactMap { $0["pid"] as? Int32 })
    }

    /// The pid a command wrote into the FIFO `fifo` (`echo $$ > FIFO`), read on a thread of
    /// its own (opening a FIFO waits for its writer).
    func pid(writtenTo fifo: String) async throws -> Int32 {
        let text = try await offThePool { String(decoding: FileHandle(forReadingAtPath: fifo)?.readDataToEndOfFile() ?? Data(), as: UTF8.self) }
        return try #require(Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)), "\(fifo) gave \(text)")
    }

    /// The names in one of the space's folders, hidden ones left out.
    func entries(_ folder: String) -> Set<String> {
        spaceEntries(folder).filter { !$0.hasPrefix(".") }
    }

    /// How many writers ``CrossProcessTests/UserLimitTests/manyProcessesUnderInstanceLimit()`` runs at once
    /// (`FILECOORD_MANY_WRITERS`; `make limits` runs 1,000).
    static var manyWriters: Int { Int(ProcessInfo.processInfo.environment["FILECOORD_MANY_WRITERS"] ?? "") ?? 150 }

    /// `filecoord ARGS...` with `faults` armed in it.
    func filecoordWith(faults: String, _ arguments: String..., stdin: Data? = nil) async throws -> ProcessResult {
        try await run(filecoordBinary, arguments, stdin: stdin, environment: ["FILECOORD_FAULTS": faults])
    }

    /// Every name in one of the space's folders, hidden ones included.
    func spaceEntries(_ folder: String) -> Set<String> {
        Set((try? FileManager.default.contentsOfDirectory(atPath: space + "/" + folder)) ?? [])
    }

    /// The presenter's next events, up to the first that `stop` accepts. Past `limit`
    /// the presenter is ended (SIGTERM ends its lines) and a hang is recorded.
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
            seen.append(event(line).event)
            if stop(event(line).event) { return seen }
        }
        Issue.record(expired.isSet ? "the presenter did not report what was expected within \(limit); it reported \(seen)"
                                   : "the presenter ended; it reported \(seen)")
        return seen
    }

    /// `filecoord exec --write file` whose command holds the claim, once it runs: the
    /// wrapper, and the command's pid.
    func holdingWriter(of file: String) async throws -> (wrapper: Spawned, command: Int32) {
        let ready = scratch.path + "/ready"
        #expect(mkfifo(ready, 0o600) == 0)
        let wrapper = try Spawned([filecoordBinary, "exec", "--space", space, "--write", file, "--",
                                   "sh", "-c", "echo $$ > '\(ready)'; exec sleep 63"]) // ok: the command holding the claim
        return (wrapper, try await pid(writtenTo: ready))
    }

    /// SIGKILL for a ``holdingWriter(of:)``, wrapper and command.
    func killWriter(_ writer: (wrapper: Spawned, command: Int32)) async {
        kill(writer.wrapper.pid, SIGKILL)
        kill(writer.command, SIGKILL)
        _ = await writer.wrapper.wait()
    }

    /// Whether `status --json` lists a claim of `pid` on `path`.
    func lists(_ status: [String: Any], claimOf pid: Int32, on path: String, access: String = "write") -> Bool {
        ((status["claims"] as? [[String: Any]]) ?? []).contains {
            $0["pid"] as? Int32 == pid && $0["path"] as? String == path && $0["access"] as? String == access
        }
    }
}

/// What a presenter's lines said after a queue overflow: the resyncs and the items that
/// appeared. Fed by one thread at a time (``LineProcess/waitForLines(within:until:)``), read after.
final class OverflowTally: @unchecked Sendable {
    let expected: Int
    var appeared = Set<String>()
    var resyncs = 0
    init(expected: Int) { self.expected = expected }

    /// Counts `line`; whether the resync and every item have come.
    func add(_ line: String) -> Bool {
        let (kind, path) = event(line)
        if kind == "resync" { resyncs += 1 }
        if kind == "subitemDidAppear" { appeared.insert(path) }
        return resyncs > 0 && appeared.count >= expected
    }
}
