import FileCoordination
import Foundation
import Testing
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

// What the Apple-style tests share: a scratch directory, a log that can be waited on,
// the test process's coordination space, and other processes (`filecoord`, or this
// test binary again).

/// A directory for one test, removed at the end.
final class Scratch: Sendable {
    let url: URL
    var path: String { url.path }

    init() {
        url = URL(fileURLWithPath: NSTemporaryDirectory(), isDirectory: true)
            .appendingPathComponent("nsfc-\(getpid())-\(UInt64.random(in: 0 ... .max))", isDirectory: true)
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }
    deinit { removeTreeLater(url.path) }

    /// A file `name` holding `content`.
    @discardableResult
    func file(_ name: String, _ content: String = "x") -> URL {
        let file = url.appendingPathComponent(name)
        try! FileManager.default.createDirectory(at: file.deletingLastPathComponent(), withIntermediateDirectories: true)
        try! writeFixture(Data(content.utf8), toPath: file.path)
        return file
    }

    /// A directory `name`.
    func directory(_ name: String) -> URL {
        let directory = url.appendingPathComponent(name, isDirectory: true)
        try! FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }
}

/// Lines appended from any thread, and waited for.
final class Journal: @unchecked Sendable {
    // Unchecked: `lines` is read and written under `condition` only.
    private let condition = NSCondition()
    private var lines: [String] = []

    func append(_ line: String) {
        condition.withLock {
            lines.append(line)
            condition.broadcast()
        }
    }

    var all: [String] { condition.withLock { lines } }

    /// Waits up to `seconds` for `done` to hold; whether it did. Blocks: call it off the pool.
    func wait(seconds: Double = 60, until done: ([String]) -> Bool) -> Bool {
        let deadline = Date(timeIntervalSinceNow: seconds)
        return condition.withLock {
            while !done(lines) {
                if !condition.wait(until: deadline) { return done(lines) }
            }
            return true
        }
    }

    /// ``wait(seconds:until:)`` from a task, on a thread of its own.
    func waitAsync(seconds: Double = 60, until done: @escaping @Sendable ([String]) -> Bool) async throws -> Bool {
        try await offThePool { self.wait(seconds: seconds, until: done) }
    }
}

/// A value set from one thread and read from another.
final class Shared<Value: Sendable>: @unchecked Sendable {
    // Unchecked: `stored` is read and written under `lock` only.
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}

/// The coordination space this test process coordinates through (the default one),
/// joined by a first coordination: its directory, for the other processes.
func joinedSpace(_ scratch: Scratch) async throws -> String {
    let probe = scratch.file(".join")
    try await FileCoordinator().coordinate(readingItemAt: probe) { _ in }
    return try #require(FileCoordinator.coordinationSpace?.directory.string)
}

/// The `filecoord` executable built beside this test binary.
let filecoordBinary: String = {
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent("filecoord").path
}()

/// `filecoord status --json` until `condition` holds (another process's state has no
/// event to await); whether it did.
func waitForStatus(space: String, _ condition: @escaping @Sendable ([String: Any]) -> Bool) async throws -> Bool {
    for _ in 0 ..< 500 {
        let (_, output) = try await runToEnd([filecoordBinary, "status", "--json", "--space", space])
        if let object = try? JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any], condition(object) { return true }
        try await Task.sleep(for: .milliseconds(20)) // ok: polling another process's state
    }
    return false
}

/// Whether `status` lists a presenter of `path` in this process.
func listsPresenter(_ status: [String: Any], of path: String) -> Bool {
    ((status["presenters"] as? [[String: Any]]) ?? []).contains { $0["path"] as? String == path && $0["pid"] as? Int32 == getpid() }
}

/// Whether `status` lists this process as waiting.
func listsThisProcessWaiting(_ status: [String: Any]) -> Bool {
    ((status["waiting"] as? [[String: Any]]) ?? []).contains { $0["pid"] as? Int32 == getpid() }
}

/// The path as the space names it: links resolved.
func resolved(_ url: URL) -> String {
    url.resolvingSymlinksInPath().path
}

/// A child process whose standard output is read line by line.
final class Child: @unchecked Sendable {
    // Unchecked: `process` is set in init; `lines` is the journal's.
    let process = Process()
    let lines = Journal()

    init(_ arguments: [String], environment: [String: String] = [:]) throws {
        process.executableURL = URL(fileURLWithPath: arguments[0])
        process.arguments = Array(arguments.dropFirst())
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let output = Pipe()
        process.standardOutput = output
        try unblockingSignals { try process.run() }
        let handle = output.fileHandleForReading
        Thread.detachNewThread { [lines] in
            var pending = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: 0x0A) {
                    lines.append(String(decoding: pending[..<newline], as: UTF8.self))
                    pending.removeSubrange(...newline)
                }
            }
        }
    }

    /// Its exit status, once it has ended.
    func wait() async throws -> Int32 {
        try await offThePool {
            self.process.waitUntilExit()
            return self.process.terminationStatus
        }
    }
}

/// Runs `body` (which starts a child process) with no signal blocked on this thread, so
/// that the child does not inherit the test harness's blocked signals.
func unblockingSignals<T>(_ body: () throws -> T) rethrows -> T {
    var none = sigset_t(), previous = sigset_t()
    sigemptyset(&none)
    pthread_sigmask(SIG_SETMASK, &none, &previous)
    defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
    return try body()
}

/// Appends `line` and a newline to the file at `path` (one `write` with `O_APPEND`).
func appendLine(_ line: String, to path: String) {
    let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
    guard fd >= 0 else { return }
    defer { close(fd) }
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
}

/// The lines of the file at `path`.
func lines(of path: String) -> [String] {
    ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
}

/// Whether a read of `url` in this process, tried without waiting, finds a writer queued
/// for it; asked again every 10 ms for 30 s at most.
func waitsBehindAWriter(_ url: URL) async throws -> Bool {
    let probe = FileCoordinator()
    probe.setClaimTimeout(.zero)
    for _ in 0 ..< 3000 {
        do {
            try await probe.coordinate(readingItemAt: url) { _ in }
        } catch let error as FileCoordinationError where error.code == .timedOut {
            return true
        }
        try await Task.sleep(for: .milliseconds(10)) // ok: polling a state with no event to await
    }
    return false
}
