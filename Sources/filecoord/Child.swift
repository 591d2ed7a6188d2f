import CFilecoordCommand
import AsyncFileIO
import FileCoordination
import Foundation

/// Runs a command with this process's standard streams and waits for it without holding
/// a cooperative thread (`waitpid` runs on an I/O thread).
///
/// As `flock(1)` does, the command inherits what this process was started with: the
/// descriptors (`3<file`, `<(…)`) and the signals ignored (`nohup`, a background job).
/// While it runs, SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to `filecoord` are passed on to
/// it (unless the caller handles them itself), and the claims are held until it exits.
enum Child {
    /// Variables of this process's environment that its command does not get: the etcd
    /// password is `filecoord`'s to use, not every program's it starts.
    static let withheld = ["FILECOORD_ETCD_PASSWORD"]

    /// Whether a `NAME=value` entry of `environ` names a withheld variable.
    static func isWithheld(_ entry: UnsafeMutablePointer<CChar>) -> Bool {
        withheld.contains { name in "\(name)=".withCString { strncmp(entry, $0, strlen($0)) == 0 } }
    }

    /// Runs `command` to its end: ``spawn(_:keeping:adding:input:forwardingSignals:first:)``
    /// with the signals passed on, then ``wait(_:)``. Its status, or 127 (not found) or 126
    /// (not runnable), reported as a shell does.
    static func run(_ command: [String], keeping kept: [Int32] = [], adding environment: [String] = [],
                    first: (@Sendable () -> Void)? = nil) async throws -> Int32 {
        switch try await spawn(command, keeping: kept, adding: environment, forwardingSignals: true, first: first) {
        case .success(let pid): return try await wait(pid)
        case .failure(let notStarted): return notStarted.status
        }
    }

    /// A command that could not start, as a shell's status: 127 not found, 126 not runnable.
    struct NotStarted: Error { let status: Int32 }

    /// Starts `command`. `kept`: descriptors of this process's own to pass on (the
    /// claims'), beside those it was started with; `environment`: `NAME=value` entries for
    /// its environment, which is this process's but for ``withheld``; `input`: its stdin,
    /// unless -1; `forwardingSignals`: the terminating signals sent to this process go to
    /// the command until ``wait(_:)`` reaps it; `first`: a blocking step to take on the I/O
    /// thread before it starts. A command that cannot start is reported, and its status
    /// returned.
    static func spawn(_ command: [String], keeping kept: [Int32] = [], adding environment: [String] = [], input: Int32 = -1,
                      forwardingSignals: Bool, first: (@Sendable () -> Void)? = nil) async throws -> Result<pid_t, NotStarted> {
        let arguments = command.map { RawArguments.bytes($0) }
        let spawned: Result<pid_t, Errno> = try await runOnIOThread {
            first?()
            var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { bytes in
                let pointer = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count + 1)
                for (index, byte) in bytes.enumerated() { pointer[index] = CChar(bitPattern: byte) }
                pointer[bytes.count] = 0
                return pointer
            }
            argv.append(nil)
            defer { for pointer in argv { pointer?.deallocate() } }
            var pid: pid_t = 0
            if forwardingSignals { fc_forward_signals_begin() }
            let added: [UnsafeMutablePointer<CChar>?] = environment.map { strdup($0) }
            defer { for pointer in added { free(pointer) } }
            var entries = added
            var inherited = environ
            while let entry = inherited.pointee {
                if !Self.isWithheld(entry) { entries.append(entry) }
                inherited += 1
            }
            var envp = entries + [nil]
            let result = fc_spawn_command(&pid, argv[0]!, argv, &envp, kept, Int32(kept.count), input)
            guard result == 0 else {
                if forwardingSignals { fc_forward_signals_end() }
                return .failure(Errno(rawValue: result))
            }
            if forwardingSignals { fc_forward_signals_to(pid) }
            return .success(pid)
        }
        switch spawned {
        case .success(let child): return .success(child)
        case .failure(let errno):
            // As a shell reports it: 127 for a command not found, 126 for one that cannot run.
            Output.report(FileCoordinationError(.exec, errno: errno, path: FilePath(platformBytes: arguments[0])))
            return .failure(NotStarted(status: errno == .noSuchFileOrDirectory ? 127 : 126))
        }
    }

    /// Waits for a command ``spawn(_:keeping:adding:input:forwardingSignals:first:)``
    /// started, whatever happens to the task: a cancellation tells the command (SIGTERM),
    /// and the wait goes on until it has ended. Its status (128+N for signal N).
    static func wait(_ pid: pid_t) async throws -> Int32 {
        let status = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Int32, Never>) in
                submitToIOThread { continuation.resume(returning: fc_wait_command(pid)) }
            }
        } onCancel: {
            kill(pid, SIGTERM)
        }
        guard status >= 0 else { throw FileCoordinationError(.waitpid, errno: Errno(rawValue: -status), path: nil) }
        return status
    }
}
