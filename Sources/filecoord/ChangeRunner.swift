import CFilecoordCommand
import AsyncFileIO
import FileCoordination
import Foundation

/// `present PATH... -- COMMAND`: runs COMMAND after each settled burst of changes, as
/// ``ChangeRunState`` decides, under a coordinated read of the changed items (unless
/// `coordinated` is false), with their paths in `FILECOORD_CHANGED` and on its stdin.
final class ChangeRunner: PresenterEvents {
    /// The callbacks that say an item changed (not the relinquishes, the saves and the
    /// reacquires that a reader, this process's own runs included, brings).
    static let changes: Set<String> = ["didChange", "didMove", "subitemDidAppear", "subitemDidChange", "subitemDidMove",
                                       "accommodateDeletion", "accommodateSubitemDeletion", "resync"]
    /// At most this many bytes of paths in `FILECOORD_CHANGED` (stdin has them all): an
    /// environment past the kernel's limit would not start the command.
    static let environmentLimit = 64 * 1024

    let command: [String]
    let filter: EventFilter
    let coordinated: Bool
    let settle: Duration
    let idle: Duration?
    private let inputs = AsyncStream.makeStream(of: ChangeRunState.Input.self)

    private struct Run {
        var pid: pid_t?
        /// A signal for the command that came while it was being started.
        var pendingSignal: Int32?
        /// The run's task (its claims, then its command).
        var task: Task<Void, Never>?
        /// The signal the run was given up for: its command is not started.
        var abandoned: Int32?
    }
    private let run = Locked(Run())

    init(command: [String], filter: EventFilter, coordinated: Bool, settle: Duration, idle: Duration?) {
        self.command = command
        self.filter = filter
        self.coordinated = coordinated
        self.settle = settle
        self.idle = idle
    }

    func report(_ event: String, _ path: FilePath, to destination: FilePath?, pid: Int32?) {
        let paths = [path] + (destination.map { [$0] } ?? [])
        guard Self.changes.contains(event), filter.passes(event, paths: paths) else { return }
        inputs.continuation.yield(.changed(paths))
    }

    func relinquish(_ change: Int) {}

    /// A terminating signal came.
    func stop(_ number: Int32, fromTerminal: Bool) {
        inputs.continuation.yield(.stop(number, fromTerminal: fromTerminal))
    }

    /// Runs until the state machine finishes (its status) or dies (the signal).
    func serve(onBusy: ChangeRunState.OnBusy, limit: Int?, initial: [FilePath]?) async -> Result<Int32, SignalEnd> {
        var state = ChangeRunState(onBusy: onBusy, limit: limit)
        // One of each at a time: arming one makes the one before it moot.
        var settleTimer: Task<Void, Never>?, idleTimer: Task<Void, Never>?
        defer { settleTimer?.cancel(); idleTimer?.cancel() }
        var actions = state.begin(initial: initial)
        var iterator = inputs.stream.makeAsyncIterator()
        while true {
            for action in actions {
                switch action {
                case .armSettle(let number):
                    settleTimer?.cancel()
                    settleTimer = fire(.settled(number), after: settle)
                case .armIdle(let number):
                    idleTimer?.cancel()
                    idleTimer = idle.map { fire(.idle(number), after: $0) }
                case .start(let paths):
                    let task = Task { [self] in _ = inputs.continuation.yield(.runEnded(await runCommand(for: paths))) }
                    run.withLock { $0.task = task }
                case .abandonRun(let number):
                    // A run still waiting for its claims stops waiting (a holder may keep
                    // them for long); one starting its command now signals it once started.
                    let task = run.withLock { run -> Task<Void, Never>? in
                        run.abandoned = number
                        if run.pid == nil { run.pendingSignal = number }
                        return run.pid == nil ? run.task : nil
                    }
                    task?.cancel()
                case .signalRun(let number):
                    let pid = run.withLock { run -> pid_t? in
                        if run.pid == nil { run.pendingSignal = number }
                        return run.pid
                    }
                    if let pid { kill(pid, number) }
                case .finish(let status):
                    return .success(status)
                case .die(let number):
                    return .failure(SignalEnd(number: number))
                }
            }
            guard let input = await iterator.next() else { return .success(0) }
            actions = state.handle(input)
        }
    }

    struct SignalEnd: Error { let number: Int32 }

    private func fire(_ input: ChangeRunState.Input, after delay: Duration) -> Task<Void, Never> {
        Task { [inputs] in
            if delay > .zero { try? await Task.sleep(for: delay) }
            if !Task.isCancelled { inputs.continuation.yield(input) }
        }
    }

    /// One run: the read claims, then the command to its end. Its status; 1 when the
    /// claims could not be had (reported).
    private func runCommand(for paths: [FilePath]) async -> Int32 {
        do {
            guard coordinated else { return try await spawnAndWait(paths) }
            let intents = paths.map { FileAccessIntent.readingIntent(with: $0.fileURL) }
            return try await FileCoordinator().coordinate(with: intents) { try await spawnAndWait(paths) }
        } catch let error as FileCoordinationError {
            Output.report(error)
            return 1
        } catch is CancellationError {
            // Given up (``ChangeRunState/Action/abandonRun(_:)``) before its command started.
            return 128 + (run.withLock(\.abandoned) ?? SIGTERM)
        } catch {
            // A presenter's refusal: its own error, as text.
            Output.writeStandardError(Array("filecoord: \(error)\n".utf8))
            return 1
        }
    }

    private func spawnAndWait(_ paths: [FilePath]) async throws -> Int32 {
        var fds: [Int32] = [-1, -1]
        guard fc_pipe_cloexec(&fds) == 0 else { throw FileCoordinationError(.pipe, errno: Errno(rawValue: errno), path: nil) }
        let listed = paths.flatMap { $0.platformBytes + [UInt8(ascii: "\n")] }
        var inEnvironment: [UInt8] = []
        for path in paths {
            let bytes = path.platformBytes
            guard !bytes.contains(0), inEnvironment.count + bytes.count + 1 <= Self.environmentLimit else { break }
            inEnvironment += (inEnvironment.isEmpty ? [] : [UInt8(ascii: "\n")]) + bytes
        }
        let variable = "FILECOORD_CHANGED=" + String(decoding: inEnvironment, as: UTF8.self)
        if let abandoned = run.withLock(\.abandoned) {
            close(fds[0])
            close(fds[1])
            return 128 + abandoned
        }
        let spawned = try await Child.spawn(command, adding: [variable], input: fds[0], forwardingSignals: false)
        close(fds[0])
        let writeEnd = fds[1]
        guard case .success(let pid) = spawned else {
            close(writeEnd)
            if case .failure(let notStarted) = spawned { return notStarted.status }
            return 1
        }
        let pending = run.withLock { run -> Int32? in
            run.pid = pid
            defer { run.pendingSignal = nil }
            return run.pendingSignal
        }
        if let pending { kill(pid, pending) }
        // On a thread of its own: a command that does not read its stdin blocks the write
        // until it exits. The write then fails with EPIPE; the SIGPIPE it raises is
        // blocked on this thread and goes away with it.
        let started = startDetachedThread(named: "filecoord changed paths") {
            var pipeSignal = sigset_t()
            sigemptyset(&pipeSignal)
            sigaddset(&pipeSignal, SIGPIPE)
            pthread_sigmask(SIG_BLOCK, &pipeSignal, nil)
            listed.withUnsafeBytes { buffer in
                var offset = 0
                while offset < buffer.count {
                    let written = write(writeEnd, buffer.baseAddress! + offset, buffer.count - offset)
                    if written < 0 && errno == EINTR { continue }
                    guard written > 0 else { break }
                    offset += written
                }
            }
            close(writeEnd)
        }
        if started != 0 { close(writeEnd) }
        defer { run.withLock { $0.pid = nil } }
        return try await Child.wait(pid)
    }
}
