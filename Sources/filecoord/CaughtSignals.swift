import CFilecoordCommand
import AsyncFileIO
import FileCoordination
import Foundation
import Synchronization

/// Signals caught by a handler of this process's own and handed, one at a time, to
/// closures on a thread of their own.
///
/// Not a dispatch signal source. On Linux libdispatch's own handler passes each signal on
/// with `pthread_kill` to the thread that registered the source, to be read back from a
/// `signalfd`: delivery then depends on that thread and on every thread's signal mask.
/// Here the handler itself writes the signal's number into a pipe, on whichever thread
/// the kernel picks, and the catching thread reads it.
final class CaughtSignals: Sendable {
    /// The one per process (a signal's handler is per process).
    static let shared = CaughtSignals()

    private let handlers = Locked<[Int32: @Sendable (Int32, _ fromTerminal: Bool) -> Void]>([:])
    /// Whether the thread that reads the pipe runs.
    private let reading = Locked(false)

    private init() {}

    /// Catches `numbers` from now on: each time one comes, `handler` runs with its number
    /// on the catching thread. A later call for the same signal replaces its handler.
    func catchSignals(_ numbers: [Int32], handler: @escaping @Sendable (Int32) -> Void) throws {
        try catchSignals(numbers) { number, _ in handler(number) }
    }

    /// ``catchSignals(_:handler:)``, with whether the signal came from the kernel (a
    /// terminal's Ctrl-C, sent to the whole foreground process group) rather than from a
    /// process (`kill`).
    func catchSignals(_ numbers: [Int32], handler: @escaping @Sendable (Int32, _ fromTerminal: Bool) -> Void) throws {
        handlers.withLock { handlers in
            for number in numbers { handlers[number] = handler }
        }
        let pipe = numbers.withUnsafeBufferPointer { fc_catch_signals($0.baseAddress, Int32($0.count)) }
        guard pipe >= 0 else {
            throw FileCoordinationError(.sigaction, errno: Errno(rawValue: errno), path: nil)
        }
        try reading.withLock { reading in
            guard !reading else { return }
            let result = startDetachedThread(named: "filecoord signals") { CaughtSignals.shared.read(from: pipe) }
            guard result == 0 else {
                // Caught with nobody to read them, they would do nothing at all.
                release(numbers)
                throw FileCoordinationError(.pthreadCreate, errno: Errno(rawValue: result), path: nil)
            }
            reading = true
        }
    }

    /// Puts the default action back for `numbers` (a signal already caught is still handled).
    func release(_ numbers: [Int32]) {
        numbers.withUnsafeBufferPointer { fc_uncatch_signals($0.baseAddress, Int32($0.count)) }
    }

    private func read(from pipe: Int32) {
        var number: UInt8 = 0
        while true {
            let count = Glibc.read(pipe, &number, 1)
            if count == 1 {
                let handler = handlers.withLock { $0[Int32(number & 0x7F)] }
                handler?(Int32(number & 0x7F), number & 0x80 != 0)
            } else if count < 0, errno == EINTR {
                continue
            } else {
                return
            }
        }
    }
}

/// The signals that end a command: SIGHUP, SIGINT, SIGQUIT and SIGTERM, those not ignored
/// when `filecoord` started (`nohup`, a shell's background job). A command that caught
/// one cleans up, then dies by it (``die(by:)``), so that the shell sees 128 + N and
/// `filecoord present --once f && make` does not run make after Ctrl-C.
enum TerminatingSignals {
    static var handled: [Int32] { [SIGHUP, SIGINT, SIGQUIT, SIGTERM].filter { fc_ignored_at_start($0) == 0 } }

    /// Ends the process by `number`, as if it had not been caught.
    static func die(by number: Int32) -> Never {
        fc_die_by_signal(number)
    }
}

