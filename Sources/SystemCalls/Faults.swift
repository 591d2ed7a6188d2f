import Dispatch
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The system calls that ``Faults`` can make fail.
package enum SystemCall: String, Sendable, CaseIterable {
    case open, read, write, pwrite, fstat, fstatat, mkdirat, unlinkat, renameat, ftruncate, truncate, fsync, rename, unlink
    case lock = "F_OFD_SETLK"
    case opendir
    case stat, lstat, readlink, realpath, access, fchown, mkdtemp, mmap, kill, getrlimit, poll
    case inotifyAddWatch = "inotify_add_watch", inotifyRemoveWatch = "inotify_rm_watch"
    case socket, connect, send, recv, setsockopt, getsockopt, shutdown
}

/// Makes chosen system calls fail with a chosen errno, so that failure paths (EMFILE,
/// ENOSPC, EACCES) are tested without exhausting a real limit.
///
/// A call checks one atomic counter when nothing is armed. Tests arm faults with
/// ``inject(_:_:times:whereNameContains:)``; in a debug build a process also arms the
/// faults in `FILECOORD_FAULTS` (`call:ERRNO[:text][,...]`, for example
/// `open:ENOSPC:mail/`), so that tests can inject them into the processes they start.
package enum Faults {
    struct Fault {
        var call: SystemCall
        var errno: Errno
        var remaining: Int
        var nameContains: [UInt8]?
        /// Instead of failing, the call waits until the hold is let go, then runs.
        var hold: Hold?
    }

    /// One call held before it runs (``hold(_:whereNameContains:)``): the test sees it
    /// reached, does what must happen meanwhile, and lets it go.
    package final class Hold: Sendable {
        private let arrived = DispatchSemaphore(value: 0)
        private let released = DispatchSemaphore(value: 0)

        /// Blocks until the call reached the hold, up to `seconds`; whether it did.
        package func waitUntilReached(seconds: Double) -> Bool {
            arrived.wait(timeout: .now() + seconds) == .success
        }

        /// Lets the call run (at once, if it comes later).
        package func letGo() { released.signal() }

        func reach() {
            arrived.signal()
            released.wait()
        }
    }

    /// Holds the next call of `call` (on a path or name containing `whereNameContains`,
    /// when given) on its thread until the hold returned is let go.
    package static func hold(_ call: SystemCall, whereNameContains text: String? = nil) -> Hold {
        let hold = Hold()
        storage.faults.withLock {
            $0.append(Fault(call: call, errno: .invalidArgument, remaining: 1, nameContains: text.map { Array($0.utf8) }, hold: hold))
        }
        storage.armed.add(1, ordering: .releasing)
        return hold
    }

    final class Storage: Sendable {
        let armed = Atomic<Int>(0)
        // A lock ThreadSanitizer sees, as every lock of the package is (a bare Mutex is a
        // futex it cannot see, and reports the accesses under it as races).
        let faults = LockedValue<[Fault]>([])

        init() {
            #if DEBUG
            let parsed = Faults.parse(getenv("FILECOORD_FAULTS").map { String(cString: $0) } ?? "")
            faults.withLock { $0 = parsed }
            armed.store(parsed.count, ordering: .releasing)
            #endif
        }
    }

    static let storage = Storage()

    /// Makes the next `times` calls of `call` fail with `errno` (those whose path or name
    /// contains `whereNameContains`, when given).
    package static func inject(_ call: SystemCall, _ errno: Errno, times: Int = 1, whereNameContains text: String? = nil) {
        storage.faults.withLock { $0.append(Fault(call: call, errno: errno, remaining: times, nameContains: text.map { Array($0.utf8) })) }
        storage.armed.add(1, ordering: .releasing)
    }

    /// Disarms every fault.
    package static func clear() {
        let count = storage.faults.withLock { faults in
            defer { faults.removeAll() }
            return faults.count
        }
        storage.armed.subtract(count, ordering: .releasing)
    }

    /// Whether any fault is armed: a fast path that makes calls ``check(_:_:)`` does not
    /// see stands aside while one is.
    package static var isArmed: Bool { storage.armed.load(ordering: .acquiring) > 0 }

    /// The errno `call` on `name` must fail with, if a fault is armed for it.
    @inline(__always)
    package static func check(_ call: SystemCall, _ name: UnsafePointer<CChar>? = nil) -> Errno? {
        guard storage.armed.load(ordering: .acquiring) > 0 else { return nil }
        return take(call, name)
    }

    private static func take(_ call: SystemCall, _ name: UnsafePointer<CChar>?) -> Errno? {
        let bytes = name.map { Array(UnsafeRawBufferPointer(start: $0, count: strlen($0))) }
        let hit = storage.faults.withLock { faults -> (Errno?, Hold?) in
            guard let index = faults.firstIndex(where: { fault in
                fault.call == call && fault.remaining > 0 && (fault.nameContains.map { text in bytes.map { contains($0, text) } ?? false } ?? true)
            }) else { return (nil, nil) }
            faults[index].remaining -= 1
            let fault = faults[index]
            if fault.remaining == 0 {
                // Spent: disarmed, so that fast paths that stand aside while any fault is armed come back.
                faults.remove(at: index)
                storage.armed.subtract(1, ordering: .releasing)
            }
            return fault.hold.map { (nil, $0) } ?? (fault.errno, nil)
        }
        hit.1?.reach()
        return hit.0
    }

    private static func contains(_ bytes: [UInt8], _ text: [UInt8]) -> Bool {
        guard !text.isEmpty else { return true }
        guard bytes.count >= text.count else { return false }
        return (0 ... bytes.count - text.count).contains { bytes[$0 ..< $0 + text.count].elementsEqual(text) }
    }

    /// `call:ERRNO[:text]` entries, comma-separated; unknown ones are skipped.
    static func parse(_ text: String) -> [Fault] {
        let names: [String: Errno] = [
            "ENOSPC": .noSpace, "EMFILE": .tooManyOpenFiles, "ENFILE": .tooManyOpenFilesInSystem, "EACCES": .permissionDenied,
            "EPERM": .notPermitted, "EIO": .ioError, "ENOENT": .noSuchFileOrDirectory, "EROFS": .readOnlyFileSystem,
            "EDQUOT": .diskQuotaExceeded, "EAGAIN": .resourceTemporarilyUnavailable, "ENOMEM": .noMemory,
            "EINVAL": .invalidArgument, "ESRCH": .noSuchProcess, "ECONNREFUSED": .connectionRefused,
            "ECONNRESET": .connectionReset, "ETIMEDOUT": .timedOut,
        ]
        return text.split(separator: ",").compactMap { entry in
            let parts = entry.split(separator: ":", maxSplits: 2).map(String.init)
            guard parts.count >= 2, let call = SystemCall(rawValue: parts[0]), let errno = names[parts[1]] else { return nil }
            return Fault(call: call, errno: errno, remaining: .max, nameContains: parts.count == 3 ? Array(parts[2].utf8) : nil, hold: nil)
        }
    }
}
