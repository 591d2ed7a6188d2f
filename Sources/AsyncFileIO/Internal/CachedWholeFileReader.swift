import CFileCoordinationShims
import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Reads a whole file on the calling thread, but only where no step waits for a device,
/// a server or a daemon: the same non-blocking first attempt that io_uring makes before
/// it hands an open or a read to a worker, so a caller may read without a thread hop.
///
/// - The file's directory is looked up from the kernel's lookup cache alone (`openat2`
///   with `RESOLVE_CACHED`, an `O_PATH` descriptor: no file system open runs), and only a
///   directory on a local disk's file system (ext4, XFS and a few more, by the type
///   `/proc/self/mountinfo` gives its device) is read from. Network, FUSE and in-memory
///   file systems are not: their opens may ask a server or a daemon.
/// - The file is opened from the lookup cache alone, within that directory's mount
///   (`RESOLVE_NO_XDEV`: nothing mounted over it, and a link that leads out of the mount
///   fails) and without blocking (`O_NONBLOCK`: a FIFO or a lease does not hold it up);
///   only a non-empty regular file within the size limit is read.
/// - Its bytes are copied from the page cache alone (`preadv2(RWF_NOWAIT)`).
///
/// Anything else is ``Outcome/elsewhere``: a worker reads the file as every file is read
/// there, and reports its errors, so a result never depends on which thread read it.
/// What the kernel may still do on the way is its own short work: the first read after
/// a write updates the access time (a journal handle, on ext4), the last close of a file
/// deleted meanwhile frees it, and a device node's driver sees the open (with
/// `O_NONBLOCK`) before `fstat` turns it away.
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
    /// Devices (major << 32 | minor) seen, and whether they hold such a file system.
    private static let devices = Locked<[UInt64: Bool]>([:])

    /// Whether `fd`'s file lies on a local disk's file system: its device as the kernel
    /// has it cached (`statx`, `AT_STATX_DONT_SYNC`), looked up in `/proc/self/mountinfo`
    /// (read again when a device is new: memory only, no file system's call).
    static func isOnLocalDisk(_ fd: Int32) -> Bool {
        guard let device = Syscall.deviceCached(fd) else { return false }
        return isLocalDisk(device)
    }

    private static func isLocalDisk(_ device: (major: UInt32, minor: UInt32)) -> Bool {
        guard device.major != 0 else { return false }
        let key = UInt64(device.major) << 32 | UInt64(device.minor)
        if let known = devices.withLock({ $0[key] }) { return known }
        var found = mountedDevices()
        if found[key] == nil { found[key] = false }
        devices.withLock { $0.merge(found) { _, new in new } }
        return found[key] ?? false
    }

    private static let openedOnRootMount = Atomic<Int>(0)
    /// Files opened by ``openOnRootMount(_:length:)`` so far (for tests).
    static var filesOpenedOnRootMount: Int { openedOnRootMount.load(ordering: .relaxed) }
    /// The root directory's device (`dev_t`) plus 2 while it is a local disk's, 1 when it
    /// is not, 0 when not known (yet, or again: a file opened on the root's mount lay on
    /// another device, after a `chroot(2)`).
    private static let rootDevice = Atomic<UInt64>(0)
    /// Set once `openat2` with `RESOLVE_CACHED` turned out to be missing (a kernel before
    /// 5.12, or a filter that refuses the call): no call tries it again.
    private static let cachedLookupsMissing = Atomic<Bool>(false)

    /// Opens the file at the absolute `path` (`length` bytes) for reading, without
    /// blocking, when it lies on the same mount as the process's root directory and that
    /// mount is a local disk's: the descriptor and the root's device, which the caller
    /// checks against the file's (``readOpened(_:maximumSize:rootDevice:)``); else nil.
    /// One lookup from the cache (`RESOLVE_NO_XDEV`: a path into any other mount fails, a
    /// mount made over a directory on the way included) instead of the directory's open,
    /// check and close. No descriptor is kept (one would hold its file system busy, and an
    /// unmount would fail), and the lookup starts from the process's root as it is now.
    static func openOnRootMount(_ path: UnsafePointer<CChar>, length: Int) -> (fd: Int32, rootDevice: UInt64)? {
        guard length > 1, path[0] == CChar(UInt8(ascii: "/")) else { return nil }
        var root = rootDevice.load(ordering: .relaxed)
        if root == 0 {
            // A statx of `/` looks nothing up, but costs as much as the open: asked once.
            if let device = Syscall.deviceCached(at: fc_AT_FDCWD, "/"), isLocalDisk(device) {
                root = fc_device_number(device.major, device.minor) + 2
            } else {
                root = 1
            }
            rootDevice.store(root, ordering: .relaxed)
        }
        guard root >= 2 else { return nil }
        switch Syscall.openCached(at: fc_AT_FDCWD, path, O_RDONLY | O_NONBLOCK | O_NOCTTY, sameMount: true) {
        case .success(let fd):
            openedOnRootMount.add(1, ordering: .relaxed)
            return (fd, root - 2)
        case .failure(.noFunction), .failure(.invalidArgument):
            cachedLookupsMissing.store(true, ordering: .relaxed)
            return nil
        case .failure:
            return nil
        }
    }

    /// Each mount's device in `/proc/self/mountinfo`, and whether its type is a local
    /// disk's: `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [TAGS...] - TYPE SOURCE OPTIONS`.
    private static func mountedDevices() -> [UInt64: Bool] {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return [:] }
        var found: [UInt64: Bool] = [:]
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 3, let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count else { continue }
            let numbers = fields[2].split(separator: ":")
            guard numbers.count == 2, let major = UInt64(numbers[0]), let minor = UInt64(numbers[1]) else { continue }
            let local = localDiskTypes.contains(String(fields[dash + 1]))
            // (Several mounts of one device: any that is not a local disk's type wins.)
            found[major << 32 | minor] = (found[major << 32 | minor] ?? true) && local
        }
        return found
    }

    /// The directory last looked up, NUL-terminated, and its descriptor: nil when its
    /// files are not read here.
    private var directory: [CChar] = []
    private var directoryFD: Int32?

    deinit { close() }

    /// Closes the directory kept open (after each claim the batch's consumer reads, and
    /// at the batch's end); a later read opens it again.
    func close() {
        if let directoryFD { _ = Syscall.close(directoryFD) }
        directoryFD = nil
        directory = []
    }

    /// Reads the file at `path` (a batch's next file: its directory is kept for the next).
    func read(_ path: PlatformPath, maximumSize: Int) -> Outcome {
        path.withCString { read($0, length: strlen($0), maximumSize: maximumSize) }
    }

    /// Reads the file at `path` alone (`Data(asyncContentsOf:)`): opened in one call when
    /// it lies on the root directory's mount (``openOnRootMount(_:length:)``), else by its
    /// directory.
    func readAlone(_ path: PlatformPath, maximumSize: Int) -> Outcome {
        guard !Self.cachedLookupsMissing.load(ordering: .relaxed) else { return .unsupported }
        return path.withCString { path in
            let length = strlen(path)
            if let (fd, root) = Self.openOnRootMount(path, length: length) {
                return readOpened(fd, maximumSize: maximumSize, rootDevice: root)
            }
            return read(path, length: length, maximumSize: maximumSize)
        }
    }

    private func read(_ path: UnsafePointer<CChar>, length: Int, maximumSize: Int) -> Outcome {
        // A name without a directory, or a path ending in a slash, goes to a worker.
        guard let found = strrchr(path, Int32(UInt8(ascii: "/"))) else { return .elsewhere }
        let slash = UnsafePointer(found) - path
        guard slash + 1 < length else { return .elsewhere }
        // (The root's files: the directory is "/".)
        let directoryLength = max(slash, 1)
        if directory.count != directoryLength + 1 || memcmp(directory, path, directoryLength) != 0 {
            if let outcome = lookUp(path, directoryLength) { return outcome }
        }
        guard let directoryFD else { return .elsewhere }
        guard case .success(let fd) = Syscall.openCached(at: directoryFD, path + slash + 1, O_RDONLY | O_NONBLOCK | O_NOCTTY, sameMount: true)
        else { return .elsewhere }
        return readOpened(fd, maximumSize: maximumSize)
    }

    /// Makes the first `length` bytes of `path` the directory; an outcome when the
    /// file cannot be read here on that account.
    private func lookUp(_ path: UnsafePointer<CChar>, _ length: Int) -> Outcome? {
        close()
        directory = Array(UnsafeBufferPointer(start: path, count: length)) + [0]
        switch Syscall.openCached(at: fc_AT_FDCWD, directory, fc_O_PATH | fc_O_DIRECTORY, sameMount: false) {
        case .success(let fd):
            if Self.isOnLocalDisk(fd) {
                directoryFD = fd
            } else {
                _ = Syscall.close(fd)
            }
            return nil
        case .failure(.noFunction), .failure(.invalidArgument):
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
    /// With `rootDevice`, a file on another device is not read (the process's root is no
    /// longer the one asked for), and the root is asked for again by the next call.
    private func readOpened(_ fd: Int32, maximumSize: Int, rootDevice: UInt64? = nil) -> Outcome {
        defer { _ = Syscall.close(fd) }
        guard case .success(let info) = Syscall.fstat(fd) else { return .elsewhere }
        if let rootDevice, UInt64(info.st_dev) != rootDevice {
            Self.rootDevice.store(0, ordering: .relaxed)
            return .elsewhere
        }
        guard FileType.isRegular(info.st_mode),
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
