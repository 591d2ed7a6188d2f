import Foundation
import Testing
import TestSupport

/// The `filecoord` executable built beside this test bundle (`swift build --build-tests`
/// builds it; the tests never build anything themselves).
let filecoordBinary: String = {
    if let override = ProcessInfo.processInfo.environment["FILECOORD_BIN"] { return override }
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent("filecoord").path
}()

struct ProcessResult: Sendable {
    var status: Int32
    var stdout: Data
    var stderr: Data
    var errorText: String { String(decoding: stderr, as: UTF8.self) }
    var outputText: String { String(decoding: stdout, as: UTF8.self) }
    /// Each line of stdout as a JSON object (`read --json`: one per file, then the summary).
    var jsonLines: [[String: Any]] {
        stdout.split(separator: UInt8(ascii: "\n")).compactMap { try? JSONSerialization.jsonObject(with: Data($0)) as? [String: Any] }
    }
}

/// Runs a program to completion on a thread of its own (waiting for a child process
/// blocks, and the cooperative pool must not). Cancelled (a test past its time limit),
/// it kills the program: a script that waits for ever then ends, and the test with it.
func run(_ executable: String, _ arguments: [String], stdin: Data? = nil, environment: [String: String] = [:]) async throws -> ProcessResult {
    let child = RunningChild()
    return try await withTaskCancellationHandler {
        try await run(executable, arguments, stdin: stdin, environment: environment, child: child)
    } onCancel: {
        child.kill()
    }
}

/// The process ``run(_:_:stdin:environment:)`` waits for, to kill it when its task is cancelled.
private final class RunningChild: @unchecked Sendable {
    // Unchecked: `pid` and `cancelled` are read and written under `lock` only.
    private let lock = NSLock()
    private var pid: Int32 = 0
    private var cancelled = false

    /// The child started (`pid`), or ended and reaped (0: its pid may be another's now).
    func set(_ pid: Int32) {
        lock.withLock {
            self.pid = pid
            if cancelled, pid > 0 { Glibc.kill(pid, SIGKILL) }
        }
    }

    func kill() {
        lock.withLock {
            cancelled = true
            if pid > 0 { Glibc.kill(pid, SIGKILL) }
        }
    }
}

private func run(_ executable: String, _ arguments: [String], stdin: Data?, environment: [String: String],
                 child: RunningChild) async throws -> ProcessResult {
    try await offThePool {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        for (key, value) in environment { env[key] = value }
        process.environment = env
        let output = Pipe(), errors = Pipe(), input = Pipe()
        process.standardOutput = output
        process.standardError = errors
        process.standardInput = input
        try withUnblockedSignals { try process.run() }
        child.set(process.processIdentifier)
        let errorReader = Thread.detachedRead(errors.fileHandleForReading)
        if let stdin { writeIgnoringBrokenPipe(stdin, to: input.fileHandleForWriting.fileDescriptor) }
        try input.fileHandleForWriting.close()
        let stdout = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        child.set(0)
        return ProcessResult(status: process.terminationStatus, stdout: stdout, stderr: errorReader.wait())
    }
}

/// `filecoord ARGS...`
func filecoord(_ arguments: String..., stdin: Data? = nil) async throws -> ProcessResult {
    try await run(filecoordBinary, arguments, stdin: stdin)
}

/// What each of process `pid`'s descriptors names (`readlink` of `/proc/PID/fd/N`).
func openFiles(of pid: Int32) -> [String] {
    let directory = "/proc/\(pid)/fd"
    let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
    return names.compactMap { try? FileManager.default.destinationOfSymbolicLink(atPath: directory + "/" + $0) }
}

/// A shell command line (for `ulimit`, `setpriv` and the like); `$FILECOORD` names the binary.
func shell(_ script: String, filecoord binary: String = filecoordBinary) async throws -> ProcessResult {
    try await run("/bin/sh", ["-c", script], environment: ["FILECOORD": binary])
}

/// `script` run by `sh` in `directory` as user and group `uid` (with `setpriv`, as root),
/// `$FILECOORD` naming a copy of the binary in a fresh directory of mode 0755 under
/// `/tmp`: the build's own may sit in a checkout that only its owner can enter (a private
/// home, a `mktemp -d`). Fails at once, saying why, when that user cannot enter
/// `directory` or run the copy, rather than leave the script to wait for its output.
func shell(asUser uid: Int, in directory: String, _ script: String) async throws -> ProcessResult {
    let copies = Scratch(in: "/tmp")
    let binary = copies.path + "/filecoord"
    try FileManager.default.copyItem(atPath: filecoordBinary, toPath: binary)
    try #require(chmod(copies.path, 0o755) == 0 && chmod(binary, 0o755) == 0, "chmod \(binary): errno \(errno)")
    func asUser(_ script: String) -> String {
        "exec setpriv --reuid=\(uid) --regid=\(uid) --clear-groups sh -c '\(script.replacingOccurrences(of: "'", with: "'\\''"))'"
    }
    let check = try await shell(asUser("cd '\(directory)' && \"$FILECOORD\" --version"), filecoord: binary)
    try #require(check.status == 0, "user \(uid) cannot run \(binary) in \(directory) (status \(check.status)): \(check.errorText)")
    defer { withExtendedLifetime(copies) {} }
    return try await shell(asUser("cd '\(directory)' && \(script)"), filecoord: binary)
}

extension Thread {
    /// Reads a handle to its end on another thread.
    final class Reader: @unchecked Sendable {
        private let done = DispatchSemaphore(value: 0)
        private var data = Data()
        init(_ handle: FileHandle) {
            Thread.detachNewThread { [self] in
                data = handle.readDataToEndOfFile()
                done.signal()
            }
        }
        func wait() -> Data {
            done.wait()
            return data
        }
    }

    static func detachedRead(_ handle: FileHandle) -> Reader { Reader(handle) }
}

/// A child process whose stdout arrives as lines and whose stderr is kept.
final class LineProcess: @unchecked Sendable {
    let process = Process()
    let lines: AsyncStream<String>
    private let errors: Thread.Reader
    /// The lines read so far, whether its output has ended, and a signal to send once a
    /// line matches (see `signal(_:onceALineMatches:)`); under `watchLock`, which is
    /// broadcast at each line and at the end.
    private var seen: [String] = []
    private var ended = false
    private var trigger: (number: Int32, matches: @Sendable (String) -> Bool)?
    private let watchLock = NSCondition()

    /// Starts `executable`; `blocked` are the signals it starts with blocked (as a process
    /// started from any libdispatch thread, a Swift task's among them, does).
    init(_ arguments: [String], executable: String = filecoordBinary, environment: [String: String] = [:],
         blocked: [Int32] = []) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        let output = Pipe(), errorPipe = Pipe()
        process.standardOutput = output
        process.standardError = errorPipe
        process.standardInput = FileHandle.nullDevice
        let (stream, continuation) = AsyncStream.makeStream(of: String.self)
        lines = stream
        let child = process
        try withUnblockedSignals(except: blocked) { try child.run() }
        errors = Thread.detachedRead(errorPipe.fileHandleForReading)
        let handle = output.fileHandleForReading
        Thread.detachNewThread { [self] in
            var pending = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: 0x0A) {
                    let line = String(decoding: pending[..<newline], as: UTF8.self)
                    watchLock.withLock {
                        seen.append(line)
                        if let trigger, trigger.matches(line) {
                            self.trigger = nil
                            kill(process.processIdentifier, trigger.number)
                        }
                        watchLock.broadcast()
                    }
                    continuation.yield(line)
                    pending.removeSubrange(...newline)
                }
            }
            watchLock.withLock {
                ended = true
                watchLock.broadcast()
            }
            continuation.finish()
        }
    }

    /// Hands each line, from the first, to `done` until it returns true (then true), its
    /// output ends or `limit` passes (then false). On a thread of its own: thousands of
    /// lines taken from ``lines`` are as many hops on the cooperative pool, which the
    /// suite's other tests share. `done` runs on that thread only, one line after another.
    func waitForLines(within limit: Duration, until done: @escaping @Sendable (String) -> Bool) async -> Bool {
        let deadline = Date(timeIntervalSinceNow: Double(limit.components.seconds) + Double(limit.components.attoseconds) * 1e-18)
        return await withCheckedContinuation { continuation in
            Thread.detachNewThread { [self] in
                var next = 0
                let found = watchLock.withLock { () -> Bool in
                    while true {
                        while next < seen.count {
                            next += 1
                            if done(seen[next - 1]) { return true }
                        }
                        if ended || !watchLock.wait(until: deadline) { return false }
                    }
                }
                continuation.resume(returning: found)
            }
        }
    }

    /// Waits until the kernel shows it stopped (after SIGSTOP), up to 10 s; whether it did.
    func waitUntilStopped() async throws -> Bool {
        let path = "/proc/\(process.processIdentifier)/stat"
        for _ in 0 ..< 10_000 {
            // The state follows the command's name, in parentheses.
            if let stat = try? String(contentsOfFile: path, encoding: .utf8), let close = stat.lastIndex(of: ")"),
               stat[stat.index(after: close)...].split(separator: " ").first == "T" { return true }
            try await Task.sleep(for: .milliseconds(1)) // ok: polling another process's state, bounded
        }
        return false
    }

    /// Sends it `number` as soon as it prints a line that `matches` (at once, if it printed
    /// one already), from the thread that reads its output. A test's task can run many
    /// seconds after the process printed a line when the suite loads the machine: the
    /// process may have moved on, or ended, by then.
    func signal(_ number: Int32, onceALineMatches matches: @escaping @Sendable (String) -> Bool) {
        watchLock.withLock {
            if seen.contains(where: matches) {
                if process.isRunning { kill(process.processIdentifier, number) }
            } else {
                trigger = (number, matches)
            }
        }
    }

    var pid: Int32 { process.processIdentifier }

    /// Sends it `number`, unless it has ended: its pid may then be another process's
    /// already (a run of the suite starts thousands, and `pid_max` may be 32768).
    func signal(_ number: Int32) {
        guard process.isRunning else { return }
        kill(process.processIdentifier, number)
    }

    /// Waits until it has ended (a zombie not yet reaped counts: its descriptors are
    /// closed), not for its output, which a child it started may hold open; past `limit`,
    /// records a hang and returns.
    func waitUntilEnded(within limit: Duration = .seconds(120)) async throws {
        let path = "/proc/\(process.processIdentifier)/stat"
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            // The state follows the command's name, in parentheses.
            guard let stat = try? String(contentsOfFile: path, encoding: .utf8),
                  let close = stat.lastIndex(of: ")"),
                  let state = stat[stat.index(after: close)...].split(separator: " ").first,
                  state != "Z", state != "X"
            else { return }
            try await Task.sleep(for: .milliseconds(1)) // ok: polling another process's state
        }
        Issue.record("process \(process.processIdentifier) had not ended after \(limit)")
    }

    /// Waits for it to end; whether signal `number` ended it (as a command that caught it
    /// and cleaned up then dies by it).
    func endsBy(_ number: Int32) async -> Bool {
        let status = await wait().status
        return process.terminationReason == .uncaughtSignal && status == number
    }

    /// Waits for it to end; its status and stderr.
    func wait() async -> (status: Int32, stderr: String) {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread { [process, errors] in
                process.waitUntilExit()
                continuation.resume(returning: (process.terminationStatus, String(decoding: errors.wait(), as: UTF8.self)))
            }
        }
    }
}

/// A temporary directory for one test.
final class Scratch: Sendable {
    let path: String
    /// A new directory under `base` (the temporary directory unless given).
    init(in base: String = NSTemporaryDirectory()) {
        path = base + (base.hasSuffix("/") ? "" : "/") + "filecoord-cli-\(getpid())-\(UInt64.random(in: 0 ... .max))"
        try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { removeTreeLater(path) }

    @discardableResult
    func write(_ name: String, _ content: String) -> String {
        let file = "\(path)/\(name)"
        try! writeFixture(Data(content.utf8), toPath: file)
        return file
    }
}

/// Runs `body` (which starts a child process) with no signal blocked on this thread but
/// `blocked`, so that the child does not inherit a blocked SIGCHLD from the test harness's
/// threads (a shell's `wait` would never return).
func withUnblockedSignals<T>(except blocked: [Int32] = [], _ body: () throws -> T) rethrows -> T {
    var mask = sigset_t(), previous = sigset_t()
    sigemptyset(&mask)
    for number in blocked { sigaddset(&mask, number) }
    pthread_sigmask(SIG_SETMASK, &mask, &previous)
    defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
    return try body()
}

/// Runs blocking work (many system calls) on a thread of its own, off the cooperative pool.
func onThread(_ body: @escaping @Sendable () -> Void) async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        Thread {
            body()
            continuation.resume()
        }.start()
    }
}

/// Writes `data` to a pipe whose reader may already have exited (a command that failed
/// before reading its input): `EPIPE` is ignored, and the SIGPIPE it raises on this thread
/// is blocked and consumed, so that it does not end the test process.
func writeIgnoringBrokenPipe(_ data: Data, to fd: Int32) {
    var pipeSignal = sigset_t(), previous = sigset_t()
    sigemptyset(&pipeSignal)
    sigaddset(&pipeSignal, SIGPIPE)
    pthread_sigmask(SIG_BLOCK, &pipeSignal, &previous)
    defer {
        var none = timespec()
        while sigtimedwait(&pipeSignal, nil, &none) == SIGPIPE {}
        pthread_sigmask(SIG_SETMASK, &previous, nil)
    }
    data.withUnsafeBytes { raw in
        var offset = 0
        while offset < raw.count {
            let written = write(fd, raw.baseAddress! + offset, raw.count - offset)
            if written < 0 {
                if errno == EINTR { continue }
                return
            }
            offset += written
        }
    }
}
