import AsyncFileIO
import Dispatch
import SystemPackage
import SystemCalls

/// Messages that could not be read: left in the mailbox and read again, in order.
extension SpaceMail {
    /// Whether the mailbox waits to be read again: how many reads of it failed since a
    /// message was left unread (0: none waits).
    struct Rereading {
        var failures = 0
    }

    /// Whether an `open` of a message that failed with `errno` may succeed later: the
    /// process or the system out of descriptors or memory, an I/O error.
    static func mayPass(_ errno: Errno) -> Bool {
        [.tooManyOpenFiles, .tooManyOpenFilesInSystem, .noMemory, .ioError, .resourceTemporarilyUnavailable, .interrupted].contains(errno)
    }

    /// The warning for a message left unread, to be read again.
    static func unread(_ path: FilePath, _ cause: String) {
        FileCoordinator.logger.warning("a message could not be read; reading it again", metadata: ["path": "\(path)", "error": "\(cause)"])
    }

    /// A message was left unread: the events of the mailbox are set aside (the read that
    /// follows finds their files), and the whole mailbox is read again, in order, after a
    /// pause (``RetryPause``). The last try removes what still cannot be read, with the
    /// warning for a file that is not a message. Called under ``receiving``.
    func readAgainLater(_ rereading: inout Rereading) {
        rereading.failures += 1
        let pause = RetryPause.milliseconds(afterFailures: rereading.failures)
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(pause)) { [self] in
            submitToIOThread { [self] in readAgain() }
        }
    }

    /// Reads the mailbox again after a message was left unread (on an I/O thread); once it
    /// is read, the processes that ended meanwhile are looked at (the watch of the records
    /// leaves them until then, so that their messages come first).
    private func readAgain() {
        let done = receiving.withLock { rereading -> Bool in
            guard rereading.failures > 0 else { return false }
            guard readInOrder(lastTry: rereading.failures + 1 >= RetryPause.attempts) else {
                readAgainLater(&rereading)
                return false
            }
            rereading.failures = 0
            return true
        }
        if done { recheckAfterOverflow() }
    }

    /// Whether a message was left unread and the mailbox waits to be read again.
    var waitsToReadAgain: Bool { receiving.withLock { $0.failures > 0 } }
}
