import CFileCoordinationShims
import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Reads a whole file on the calling thread, but only where no step waits for a device or
/// a server: the same non-blocking first attempt that io_uring makes before
/// it hands an open or a read to a worker, so a caller may read without a thread hop.
///
/// - A file on a local disk's file system (ext4, XFS and a few more, by the type
///   `/proc/self/mountinfo` gives its device) is opened; network, FUSE and in-memory file
///   systems are not: their opens may ask a server or a daemon. When the root directory
///   is on such a disk (``RootVerdict``), a path read alone (``readAlone(_:maximumSize:)``)
///   is opened in one call from the kernel's lookup cache alone (`openat2` with
///   `RESOLVE_CACHED`), within the root's mount (`RESOLVE_NO_XDEV`). Any other path, and
///   every path of a batch, is opened through its directory: the directory
///   looked up from the cache alone (an `O_PATH` descriptor: no file system open runs)
///   and checked, the file opened from the cache alone within the directory's mount.
///   Each open is made without blocking (`O_NONBLOCK`: a FIFO or a lease does not hold it
///   up), and only a non-empty regular file within the size limit is read.
/// - Its bytes are copied from the page cache alone (`preadv2(RWF_NOWAIT)`).
///
/// Anything else is ``Outcome/elsewhere``: a worker reads the file as every file is read
/// there, and reports its errors, so a result never depends on which thread read it.
/// What the kernel may still do on the way is its own short work: the first read after
/// a write updates the access time (a journal handle, on ext4), the last close of a file
/// deleted meanwhile frees it, and a device node's driver sees the open (with
/// `O_NONBLOCK`) before `fstat` turns it away. A security module that asks a daemon about
/// each open (fapolicyd, an on-access scanner through fanotify) holds the open as it
/// holds any.
///
/// Owned by one caller (not thread-safe); keeps its last directory open until ``close()``.
final class CachedWholeFileReader {
    enum Outcome {
        case read(Data)
        /// Not read here: a worker must read it.
        case elsewhere
        /// Not read here, and nothing will be: the kernel cannot tell without waiting
        /// (no `RESOLVE_CACHED`, or no `RWF_NOWAIT` on this file system).
        case unsupported
    }

    /// The largest file read on a caller's thread: a larger one's copy would hold that
    /// thread (the main thread, it may be) for milliseconds, and a hand-off to another
    /// thread costs such a file nothing to speak of.
    static let inlineLimit = 1 << 20

    /// Whether a caller that just read a file on its thread should now yield: a loop of
    /// such reads, which never suspends by itself, would otherwise hold its thread (one of
    /// the cooperative pool's two on this machine, or the main thread) until it ends. Once
    /// a run of such reads on the thread (reads less than 2 ms apart, a task's loop runs on
    /// one thread) has lasted 2 ms: well within a frame for a main thread, and seldom
    /// enough that the yield costs a loop little (every 500 us, the batch read 2-4% fewer
    /// files a second).
    static func shouldYield() -> Bool {
        // [0]: when the run began (0: none), [1]: the run's last read.
        let run = fc_thread_read_run()!
        let now = monotonicNanoseconds()
        defer { run[1] = now }
        if run[0] == 0 || now - run[1] >= 2_000_000 {
            run[0] = now
            return false
        }
        guard now - run[0] >= 2_000_000 else { return false }
        run[0] = 0
        return true
    }

    /// The file systems whose open of a cached file asks no one: a disk's, run by the
    /// kernel. (FUSE on a block device, `fuseblk`, has the device's numbers too, and its
    /// opens go to a daemon; btrfs and the others on anonymous devices are left out.)
    private static let localDiskTypes: Set<String> = ["ext2", "ext3", "ext4", "xfs", "f2fs", "jfs"]
    /// Mounts seen (with their device), and whether they hold such a file system.
    private static let mounts = Locked<[MountKey: Bool]>([:])

    private struct MountKey: Hashable {
        var device: UInt64
        var mount: UInt64
    }

    /// Whether `device` holds a local disk's file system: its type looked up in
    /// `/proc/self/mountinfo` (read again for each mount not seen before: memory only, no
    /// file system's call, though a host with many mounts makes it a long one). The answer
    /// is kept per mount, so that a device mounted again with another file system (a
    /// partition reformatted, a loop device attached to another image) is looked up again;
    /// before Linux 6.8, whose mount IDs are reused, a new mount given the old one's ID is
    /// not, and before Linux 5.8 (no mount IDs) a device is judged once.
    static func isLocalDisk(_ device: CachedDevice) -> Bool {
        guard !device.isAnonymous else { return false }
        let key = MountKey(device: device.number, mount: device.mount)
        if let known = mounts.withLock({ $0[key] }) { return known }
        let local = mountedDevices()[key.device] ?? false
        mounts.withLock { known in
            // (Mounts come and go on some hosts: the answers are forgotten now and then.)
            if known.count >= 4096 { known.removeAll() }
            known[key] = local
        }
        return local
    }

    /// Set once `openat2` with `RESOLVE_CACHED` turned out to be missing (a kernel before
    /// 5.12, or a seccomp filter that refuses the call): no call tries it again.
    private static let cachedLookupsMissing = Atomic<Bool>(false)
    /// The directory (NUL-terminated) last found on another mount than the root's: its
    /// files go through it without trying the one call first.
    private static let offRootDirectory = Locked<[CChar]>([])

    enum RootMountOpen {
        /// Opened; the root's device, which the file must lie on too.
        case opened(Int32, rootDevice: UInt64)
        /// Not opened here (the root is not a local disk's, the path leads into another
        /// mount, is not cached or not there, or an error): the caller tries its directory.
        /// The root's mount, when the root is a local disk's.
        case no(rootMount: UInt64?)
    }

    /// Opens the file at the absolute `path` for reading, without blocking, when it lies on
    /// the same mount as the process's root directory and that mount is a local disk's
    /// (as `verdict` finds it). One lookup from the cache (`RESOLVE_NO_XDEV`: a path into
    /// any other mount fails, a mount made over a directory on the way included) instead
    /// of the directory's open, check and close. No descriptor is kept, which would hold
    /// its file system busy (an unmount would fail).
    static func openOnRootMount(_ path: UnsafePointer<CChar>, verdict: RootVerdict = .shared) -> RootMountOpen {
        guard path[0] == CChar(UInt8(ascii: "/")), let root = verdict.localRoot() else { return .no(rootMount: nil) }
        // (A path into another mount fails with EAGAIN, as one not cached does: the
        // lookup from the cache stops at the mount point.)
        guard case .success(let fd) = Syscall.openCached(at: fc_AT_FDCWD, path, O_RDONLY | O_NONBLOCK | O_NOCTTY, sameMount: true)
        else { return .no(rootMount: root.mount) }
        return .opened(fd, rootDevice: root.number)
    }

    /// Each mount's device in `/proc/self/mountinfo`, and whether its type is a local
    /// disk's: `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [TAGS...] - TYPE SOURCE OPTIONS`.
    /// Read to its end (a read of a `/proc` file hands out at most a page, and Foundation's
    /// stops after the first for a file whose size is 0), up to 16 MiB.
    private static func mountedDevices() -> [UInt64: Bool] {
        guard case .success(let bytes) = Syscall.contents(path: "/proc/self/mountinfo", limit: 16 << 20) else { return [:] }
        var found: [UInt64: Bool] = [:]
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 3, let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count else { continue }
            let numbers = fields[2].split(separator: ":")
            guard numbers.count == 2, let major = UInt32(numbers[0]), let minor = UInt32(numbers[1]) else { continue }
            let local = localDiskTypes.contains(String(fields[dash + 1]))
            let key = fc_device_number(major, minor)
            // (Several mounts of one device: any that is not a local disk's type wins.)
            found[key] = (found[key] ?? true) && local
        }
        return found
    }

    /// The directory last looked up, NUL-terminated, and its descriptor: nil when its
    /// files are not read here.
    private var directory: [CChar] = []
    private var directoryFD: Int32?

    /// How a file reaches this reader.
    enum Way {
        /// Opened in one call (``openOnRootMount(_:verdict:)``).
        case oneCall
        /// Opened through its directory.
        case directory
        /// Not opened here.
        case none
    }

    /// How many files this thread opened in one call (for tests: `Data(asyncContentsOf:)`
    /// reads on the caller's thread).
    static var oneCallOpensOnThisThread: UInt64 { fc_thread_read_run()![2] }

    /// How the last file was opened, and whether any directory looked up was found on
    /// another mount than the root's (for tests).
    private(set) var lastWay = Way.none
    private(set) var foundOffRoot = false
    private let verdict: RootVerdict

    init(verdict: RootVerdict = .shared) {
        self.verdict = verdict
    }

    deinit { close() }

    /// Closes the directory kept open (after each claim the batch's consumer reads, and
    /// at the batch's end); a later read opens it again.
    func close() {
        if let directoryFD { _ = Syscall.close(directoryFD) }
        directoryFD = nil
        directory = []
    }

    /// Reads the file at `path` through its directory, which is kept for the next file (a
    /// batch's: the directory's open, check and close are made once for a run of its files).
    /// Without `followingLast`, a symbolic link there is not followed (``Outcome/elsewhere``).
    func read(_ path: PlatformPath, maximumSize: Int, followingLast: Bool = true) -> Outcome {
        read(path, maximumSize: maximumSize, alone: false, followingLast: followingLast)
    }

    /// Reads the file at `path` alone (`Data(asyncContentsOf:)`): opened in one call when it
    /// lies on the root directory's mount (``openOnRootMount(_:verdict:)``), else through
    /// its directory.
    func readAlone(_ path: PlatformPath, maximumSize: Int) -> Outcome {
        read(path, maximumSize: maximumSize, alone: true, followingLast: true)
    }

    private func read(_ path: PlatformPath, maximumSize: Int, alone: Bool, followingLast: Bool) -> Outcome {
        lastWay = .none
        guard !Self.cachedLookupsMissing.load(ordering: .relaxed) else { return .unsupported }
        return path.withCString { path in
            let length = strlen(path)
            // A name without a directory, or a path ending in a slash, goes to a worker.
            guard let found = strrchr(path, Int32(UInt8(ascii: "/"))) else { return .elsewhere }
            let slash = UnsafePointer(found) - path
            guard slash + 1 < length else { return .elsewhere }
            // (The root's files: the directory is "/".)
            let directoryLength = max(slash, 1)
            func isDirectory(_ known: [CChar]) -> Bool {
                known.count == directoryLength + 1 && memcmp(known, path, directoryLength) == 0
            }
            var rootMount: UInt64?
            if alone, !Self.offRootDirectory.withLock({ isDirectory($0) }) {
                switch Self.openOnRootMount(path, verdict: verdict) {
                case .opened(let fd, let root):
                    lastWay = .oneCall
                    fc_thread_read_run()![2] &+= 1
                    return readOpened(fd, maximumSize: maximumSize, rootDevice: root)
                case .no(let mount): rootMount = mount
                }
            }
            if !isDirectory(directory), let outcome = lookUp(path, directoryLength, rootMount: rootMount) { return outcome }
            guard let directoryFD else { return .elsewhere }
            let flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | (followingLast ? 0 : fc_O_NOFOLLOW)
            guard case .success(let fd) = Syscall.openCached(at: directoryFD, path + slash + 1, flags, sameMount: true)
            else { return .elsewhere }
            lastWay = .directory
            return readOpened(fd, maximumSize: maximumSize)
        }
    }

    /// Whether the same lookup of `.` is refused with `EPERM`: a filter that refuses the
    /// call itself, not a module that refuses one directory. (`.` walks no component and
    /// ends in no revalidation, where `/` would end in the root file system's.)
    private static func isRefusedEverywhere() -> Bool {
        switch Syscall.openCached(at: fc_AT_FDCWD, ".", fc_O_PATH | fc_O_DIRECTORY, sameMount: false) {
        case .success(let fd):
            _ = Syscall.close(fd)
            return false
        case .failure(let error):
            return error == .notPermitted
        }
    }

    /// Makes the first `length` bytes of `path` the directory; an outcome when the
    /// file cannot be read here on that account. With `rootMount` (the root's mount, a
    /// local disk's), a directory on another mount becomes ``offRootDirectory``.
    private func lookUp(_ path: UnsafePointer<CChar>, _ length: Int, rootMount: UInt64? = nil) -> Outcome? {
        close()
        directory = Array(UnsafeBufferPointer(start: path, count: length)) + [0]
        switch Syscall.openCached(at: fc_AT_FDCWD, directory, fc_O_PATH | fc_O_DIRECTORY, sameMount: false) {
        case .success(let fd):
            let device = Syscall.deviceCached(fd)
            if let device, let rootMount, rootMount != 0, device.mount != rootMount {
                Self.offRootDirectory.withLock { $0 = directory }
                foundOffRoot = true
            }
            if let device, Self.isLocalDisk(device) {
                directoryFD = fd
            } else {
                _ = Syscall.close(fd)
            }
            return nil
        case .failure(let error) where error == .noFunction || error == .invalidArgument
            // (EPERM: a seccomp filter's answer, unless a security module refuses only this
            // directory so.)
            || (error == .notPermitted && Self.isRefusedEverywhere()):
            directory = []
            Self.cachedLookupsMissing.store(true, ordering: .relaxed)
            return .unsupported
        case .failure:
            // Not cached yet (a worker's read of its first file will bring it in), or
            // not there: looked up again with the next file.
            directory = []
            return .elsewhere
        }
    }

    /// Reads the file opened as `fd` (without blocking, on a local disk) and closes it.
    /// With `rootDevice`, a file on another device is not read: the root changed between
    /// its `statx` and the open (the open has run by then).
    private func readOpened(_ fd: Int32, maximumSize: Int, rootDevice: UInt64? = nil) -> Outcome {
        defer { _ = Syscall.close(fd) }
        guard case .success(let info) = Syscall.fstat(fd), rootDevice == nil || UInt64(info.st_dev) == rootDevice,
              FileType.isRegular(info.st_mode),
              info.st_size > 0, info.st_size <= Int64(maximumSize),
              let buffer = BufferRecycler.allocate(Int(info.st_size))
        else { return .elsewhere }
        let size = Int(info.st_size)
        var got = 0
        while got < size {
            switch Syscall.preadNoWait(fd, buffer + got, size - got, Int64(got)) {
            case .success(let n) where n > 0:
                got += n
                continue
            case .failure(.notSupported), .failure(.invalidArgument):
                BufferRecycler.release(buffer, count: size)
                return .unsupported
            default:
                // Not all cached, an error, or the file shrank: a worker reads it.
                BufferRecycler.release(buffer, count: size)
                return .elsewhere
            }
        }
        return .read(BufferRecycler.data(buffer, count: size))
    }
}

/// Whether the process's root directory is on a local disk's file system, where a `statx`
/// of `/` asks no one (``Syscall/rootDeviceCached()``). The first answer is found by an I/O
/// thread (until then, files are opened through their directories); once it is "local",
/// each one-call open asks again on the caller's thread, so a `chroot(2)` onto another file
/// system is seen at the next open, whose `statx` of the new root is then the one call that
/// may ask a server (a `chroot` made between that `statx` and the open is seen by the
/// open's own device check, after the open). A root found elsewhere keeps that answer for
/// the process's life: reads then go through their directories.
final class RootVerdict: Sendable {
    private enum State: UInt8 { case unknown, probing, local, elsewhere }
    private let state = Atomic<UInt8>(State.unknown.rawValue)
    private let submit: @Sendable (@escaping @Sendable () -> Void) -> Void

    /// The process's verdict, found on the library's I/O threads.
    static let shared = RootVerdict { IOThreadPool.shared.submit($0) }

    /// A verdict whose first answer is found by the work `submit` is given (for tests).
    init(submit: @escaping @Sendable (@escaping @Sendable () -> Void) -> Void) {
        self.submit = submit
    }

    /// The root's device and mount when the root is a local disk's; nil when that is not
    /// known yet (an I/O thread is then asked), or not so.
    func localRoot() -> CachedDevice? {
        switch State(rawValue: state.load(ordering: .acquiring)) {
        case .local:
            if let root = Syscall.rootDeviceCached(), CachedWholeFileReader.isLocalDisk(root) { return root }
            state.store(State.elsewhere.rawValue, ordering: .releasing)
            return nil
        case .unknown:
            if state.compareExchange(expected: State.unknown.rawValue, desired: State.probing.rawValue, ordering: .acquiringAndReleasing).exchanged {
                submit { self.probe() }
            }
            return nil
        default:
            return nil
        }
    }

    /// Finds the answer now, on the calling thread, which may block (for tests).
    func settle() {
        probe()
    }

    /// Asks where the root is, on a thread that may block.
    private func probe() {
        let local = Syscall.rootDeviceCached().map(CachedWholeFileReader.isLocalDisk) ?? false
        state.store((local ? State.local : .elsewhere).rawValue, ordering: .releasing)
    }
}

/// Whether the directory at `path` lies on a local disk's file system, where a batch's
/// consumer and `Data(asyncContentsOf:)` read cached files on the caller's thread (for
/// tests that need such a directory).
package func isOnLocalDisk(_ path: String) -> Bool {
    guard case .success(let fd) = Syscall.open(path, O_RDONLY | O_DIRECTORY) else { return false }
    defer { _ = Syscall.close(fd) }
    return Syscall.deviceCached(fd).map(CachedWholeFileReader.isLocalDisk) ?? false
}
