import Foundation
import Testing

/// The promise under faults: exclusion with crossed multi-item claims, timeouts that fire
/// only while a claim waits, and claims that outlive a killed `exec` wrapper.
extension CrossProcessTests {
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
    /// line: the claims are held until `release(fifo)`.
    func holdUntilReleased(_ claims: [String], fifo: String) async throws -> LineProcess {
        if access(fifo, F_OK) != 0 { #expect(mkfifo(fifo, 0o600) == 0) }
        let holder = try LineProcess(["exec", "--space", space] + claims + ["--", "sh", "-c", "echo held; read x < '\(fifo)'"])
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        return holder
    }

    func release(_ fifo: String) async throws {
        _ = try await shell("echo go > '\(fifo)'")
    }

    func waitingPids() async throws -> Set<Int32> {
        let result = try await filecoord("status", "--json", "--space", space)
        let object = try JSONSerialization.jsonObject(with: result.stdout) as? [String: Any]
        return Set(((object?["waiting"] as? [[String: Any]]) ?? []).compactMap { $0["pid"] as? Int32 })
    }

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
        for _ in 0 ..< 500 {
            if try await waitingPids().isSuperset(of: [first.pid, second.pid]) { break }
            try await Task.sleep(for: .milliseconds(20)) // ok: polling another process's state
        }
        #expect(try await waitingPids().isSuperset(of: [first.pid, second.pid]))
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
