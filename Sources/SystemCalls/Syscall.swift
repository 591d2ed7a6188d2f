import CFileCoordinationShims
import SystemPackage
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Typed wrappers over the blocking system calls the library makes. Each retries
/// `EINTR` and returns the errno instead of setting a global. Every call here may
/// block, so callers run them on threads the library owns (``IOThreadPool``), never on
/// the Swift cooperative pool; the exceptions are ``preadNoWait``, ``openCached(at:_:_:sameMount:)``
/// and ``deviceCached(_:)``, whose lookups are answered from the kernel's caches (or fail),
/// and ``rootDeviceCached()``, which ends in the root file system's revalidation: for
/// callers that know what else the call does on the file system at hand.
package enum Syscall {
    @inline(__always)
    package static func retrying<T: BinaryInteger>(_ body: () -> T) -> Result<T, Errno> {
        while true {
            let result = body()
            if result >= 0 { return .success(result) }
            let error = Errno(rawValue: Glibc.errno)
            if error != .interrupted { return .failure(error) }
        }
    }

    package static func open(_ path: UnsafePointer<CChar>, _ flags: Int32, _ mode: UInt32 = 0o666) -> Result<Int32, Errno> {
        if let fault = Faults.check(.open, path) { return .failure(fault) }
        return retrying { fc_open(path, flags | O_CLOEXEC, mode) }
    }

    /// An unnamed `O_TMPFILE` in the directory `path`.
    package static func openTemporary(inDirectory path: UnsafePointer<CChar>, mode: UInt32) -> Result<Int32, Errno> {
        if let fault = Faults.check(.open, path) { return .failure(fault) }
        return retrying { fc_open_tmpfile(path, mode) }
    }

    /// `openat2` that resolves `path` from the kernel's lookup cache alone: `EAGAIN`
    /// instead of reading a directory from a device or asking a server. With
    /// `sameMount`, a path that crosses a mount point fails (with `EAGAIN` too: the
    /// lookup from the cache stops at the mount point before `EXDEV` is decided). The file
    /// system's own open still runs: only callers that know the mount is a local disk's
    /// (``deviceCached(_:)``) may call this where a thread must not block.
    package static func openCached(at dirfd: Int32, _ path: UnsafePointer<CChar>, _ flags: Int32, sameMount: Bool) -> Result<Int32, Errno> {
        if let fault = Faults.check(.open, path) { return .failure(fault) }
        return retrying { fc_openat2_cached(dirfd, path, flags, sameMount ? 1 : 0) }
    }

    /// The device (major, minor) holding `fd`'s file, and its mount, as the kernel has them
    /// cached (no server asked), or nil. An `fstat`-like call on the descriptor itself: no
    /// lookup runs.
    package static func deviceCached(_ fd: Int32) -> CachedDevice? {
        deviceCached(at: fd, "")
    }

    /// The same for the calling thread's root directory (a `statx` of `/`). Its walk has no
    /// step, but ends in the root file system's weak revalidation, which a network file
    /// system may answer by asking its server (9p in a cached mode does): only a caller that
    /// knows the root is a local disk's may call this where a thread must not block.
    package static func rootDeviceCached() -> CachedDevice? {
        deviceCached(at: fc_AT_FDCWD, "/")
    }

    private static func deviceCached(at dirfd: Int32, _ path: UnsafePointer<CChar>) -> CachedDevice? {
        var major: UInt32 = 0, minor: UInt32 = 0, mount: UInt64 = 0
        return fc_device_cached(dirfd, path, &major, &minor, &mount) == 0 ? CachedDevice(major: major, minor: minor, mount: mount) : nil
    }

    package static func close(_ fd: Int32) -> Result<Void, Errno> {
        // close(2) must not be retried on EINTR on Linux: the descriptor is gone.
        if Glibc.close(fd) == 0 { return .success(()) }
        let error = Errno(rawValue: Glibc.errno)
        return error == .interrupted ? .success(()) : .failure(error)
    }

    package static func fstat(_ fd: Int32) -> Result<Glibc.stat, Errno> {
        if let fault = Faults.check(.fstat) { return .failure(fault) }
        var info = Glibc.stat()
        return retrying { Glibc.fstat(fd, &info) }.map { _ in info }
    }

    package static func stat(path: UnsafePointer<CChar>) -> Result<Glibc.stat, Errno> {
        if let fault = Faults.check(.stat, path) { return .failure(fault) }
        var info = Glibc.stat()
        return retrying { fstatat(fc_AT_FDCWD, path, &info, 0) }.map { _ in info }
    }

    /// `stat` of the link itself when `path` is a symbolic link.
    package static func lstat(path: UnsafePointer<CChar>) -> Result<Glibc.stat, Errno> {
        if let fault = Faults.check(.lstat, path) { return .failure(fault) }
        var info = Glibc.stat()
        return retrying { fstatat(fc_AT_FDCWD, path, &info, AT_SYMLINK_NOFOLLOW) }.map { _ in info }
    }

    /// The bytes a symbolic link holds.
    package static func readlink(path: UnsafePointer<CChar>) -> Result<[UInt8], Errno> {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
        return buffer.withUnsafeMutableBytes { readlink(path: path, into: $0) }.map { Array(buffer[0 ..< $0]) }
    }

    /// The bytes a symbolic link holds, written into `buffer` (cut to its size): their
    /// count. `EINVAL` when `path` is no link. A one-byte buffer asks only whether it is one.
    package static func readlink(path: UnsafePointer<CChar>, into buffer: UnsafeMutableRawBufferPointer) -> Result<Int, Errno> {
        if let fault = Faults.check(.readlink, path) { return .failure(fault) }
        return retrying { Glibc.readlink(path, buffer.baseAddress!.assumingMemoryBound(to: CChar.self), buffer.count) }
    }

    /// ``readlink(path:into:)`` of `name` in the directory `dirFD` (which may be an
    /// `O_PATH` descriptor): one component walked.
    package static func readlinkat(_ dirFD: Int32, _ name: UnsafePointer<CChar>, into buffer: UnsafeMutableRawBufferPointer) -> Result<Int, Errno> {
        if let fault = Faults.check(.readlink, name) { return .failure(fault) }
        return retrying { Glibc.readlinkat(dirFD, name, buffer.baseAddress!.assumingMemoryBound(to: CChar.self), buffer.count) }
    }

    /// `realpath(3)`: `path` absolute, with every symbolic link resolved and no `.` or
    /// `..` left. A library function that walks the path with `lstat` and `readlink`; it
    /// is not retried on `EINTR` (those calls do not return it).
    package static func realpath(_ path: UnsafePointer<CChar>) -> Result<[UInt8], Errno> {
        if let fault = Faults.check(.realpath, path) { return .failure(fault) }
        guard let result = Glibc.realpath(path, nil) else { return .failure(Errno(rawValue: Glibc.errno)) }
        defer { free(result) }
        return .success(Array(UnsafeRawBufferPointer(start: result, count: strlen(result))))
    }

    /// Whether this process may access `path` as `mode` asks (`F_OK`, or `R_OK`, `W_OK`,
    /// `X_OK` together): checked against its effective ids with `effective`, else its real
    /// ones (`access(2)`).
    package static func access(_ path: UnsafePointer<CChar>, _ mode: Int32, effective: Bool = false) -> Result<Void, Errno> {
        if let fault = Faults.check(.access, path) { return .failure(fault) }
        return retrying { faccessat(fc_AT_FDCWD, path, mode, effective ? AT_EACCESS : 0) }.map { _ in () }
    }

    /// Makes a new private directory from `template`, whose last six characters are
    /// `XXXXXX` (replaced in place by the name given; NUL-terminated).
    package static func mkdtemp(_ template: inout [CChar]) -> Result<Void, Errno> {
        if let fault = template.withUnsafeBufferPointer({ Faults.check(.mkdtemp, $0.baseAddress!) }) { return .failure(fault) }
        // Not retried on EINTR: a directory may have been made (mkdir(2) does not return it).
        guard template.withUnsafeMutableBufferPointer({ Glibc.mkdtemp($0.baseAddress!) }) != nil else {
            return .failure(Errno(rawValue: Glibc.errno))
        }
        return .success(())
    }

    package static func read(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> Result<Int, Errno> {
        if let fault = Faults.check(.read) { return .failure(fault) }
        return retrying { Glibc.read(fd, buffer, count) }
    }

    /// The bytes of the file at `path` (a small one: a `/proc` file), read to its end, or
    /// until `limit` bytes or more are read.
    package static func contents(path: UnsafePointer<CChar>, limit: Int = .max) -> Result<[UInt8], Errno> {
        let fd: Int32
        switch open(path, O_RDONLY) {
        case .success(let opened): fd = opened
        case .failure(let errno): return .failure(errno)
        }
        defer { _ = close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while bytes.count < limit {
            switch buffer.withUnsafeMutableBytes({ read(fd, $0.baseAddress!, $0.count) }) {
            case .success(0): return .success(bytes)
            case .success(let count): bytes += buffer[..<count]
            case .failure(let errno): return bytes.isEmpty ? .failure(errno) : .success(bytes)
            }
        }
        return .success(bytes)
    }

    package static func pread(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int, _ offset: Int64) -> Result<Int, Errno> {
        retrying { Glibc.pread(fd, buffer, count, off_t(offset)) }
    }

    /// Reads only what the page cache already holds: `EAGAIN` instead of waiting for the device.
    package static func preadNoWait(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int, _ offset: Int64) -> Result<Int, Errno> {
        retrying { fc_pread_nowait(fd, buffer, count, offset) }
    }

    package static func write(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Result<Int, Errno> {
        if let fault = Faults.check(.write) { return .failure(fault) }
        return retrying { Glibc.write(fd, buffer, count) }
    }

    package static func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Result<Int, Errno> {
        if let fault = Faults.check(.pwrite) { return .failure(fault) }
        return retrying { Glibc.pwrite(fd, buffer, count, off_t(offset)) }
    }

    package static func fsync(_ fd: Int32) -> Result<Void, Errno> {
        if let fault = Faults.check(.fsync) { return .failure(fault) }
        return retrying { Glibc.fsync(fd) }.map { _ in () }
    }

    package static func fchmod(_ fd: Int32, _ mode: mode_t) -> Result<Void, Errno> {
        retrying { Glibc.fchmod(fd, mode) }.map { _ in () }
    }

    package static func fchown(_ fd: Int32, _ owner: uid_t, _ group: gid_t) -> Result<Void, Errno> {
        if let fault = Faults.check(.fchown) { return .failure(fault) }
        return retrying { Glibc.fchown(fd, owner, group) }.map { _ in () }
    }

    /// Maps `length` bytes of `fd`'s file, shared with every process that maps it, to read
    /// and write.
    package static func mapShared(_ fd: Int32, _ length: Int) -> Result<UnsafeMutableRawPointer, Errno> {
        if let fault = Faults.check(.mmap) { return .failure(fault) }
        guard let map = fc_map_shared(fd, length) else { return .failure(Errno(rawValue: Glibc.errno)) }
        return .success(map)
    }

    /// Unmaps what ``mapShared(_:_:)`` mapped.
    package static func unmap(_ map: UnsafeMutableRawPointer, _ length: Int) -> Result<Void, Errno> {
        Glibc.munmap(map, length) == 0 ? .success(()) : .failure(Errno(rawValue: Glibc.errno))
    }

    /// Waits until `fd` is ready for `events` (`POLLIN`, `POLLOUT`): true when it is,
    /// false when `milliseconds` passed first (-1: no limit). The time is asked again
    /// after an `EINTR`, so that a deadline stays the same.
    package static func poll(_ fd: Int32, _ events: Int16, milliseconds: () -> Int32) -> Result<Bool, Errno> {
        if let fault = Faults.check(.poll) { return .failure(fault) }
        var target = pollfd(fd: fd, events: events, revents: 0)
        return retrying { Glibc.poll(&target, 1, milliseconds()) }.map { $0 > 0 }
    }

    /// Sends `signal` to process `pid` (0: only whether the process exists and may be
    /// signalled).
    package static func kill(_ pid: pid_t, _ signal: Int32) -> Result<Void, Errno> {
        if let fault = Faults.check(.kill) { return .failure(fault) }
        return retrying { Glibc.kill(pid, signal) }.map { _ in () }
    }

    /// The limit on this process's open descriptors (`RLIMIT_NOFILE`).
    package static func descriptorLimit() -> Result<rlimit, Errno> {
        if let fault = Faults.check(.getrlimit) { return .failure(fault) }
        var limit = rlimit()
        return retrying { getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) }.map { _ in limit }
    }

    package static func setNonBlocking(_ fd: Int32, _ on: Bool) -> Result<Void, Errno> {
        retrying { fc_set_nonblocking(fd, on ? 1 : 0) }.map { _ in () }
    }

    package static func rename(_ from: UnsafePointer<CChar>, _ to: UnsafePointer<CChar>) -> Result<Void, Errno> {
        if let fault = Faults.check(.rename, to) { return .failure(fault) }
        return retrying { Glibc.rename(from, to) }.map { _ in () }
    }

    package static func renameNoReplace(_ from: UnsafePointer<CChar>, _ to: UnsafePointer<CChar>) -> Result<Void, Errno> {
        retrying { fc_rename_noreplace(from, to) }.map { _ in () }
    }

    package static func unlink(_ path: UnsafePointer<CChar>) -> Result<Void, Errno> {
        if let fault = Faults.check(.unlink, path) { return .failure(fault) }
        return retrying { Glibc.unlink(path) }.map { _ in () }
    }

    /// Gives an `O_TMPFILE` descriptor a name (through `/proc/self/fd`, which needs no privilege).
    package static func linkAnonymous(_ fd: Int32, to path: UnsafePointer<CChar>) -> Result<Void, Errno> {
        let source = "/proc/self/fd/\(fd)"
        return retrying { Glibc.linkat(fc_AT_FDCWD, source, fc_AT_FDCWD, path, fc_AT_SYMLINK_FOLLOW) }.map { _ in () }
    }

    // MARK: Relative to a directory (the coordination space)

    /// `openat`, always `O_CLOEXEC`.
    package static func openat(_ dirFD: Int32, _ name: UnsafePointer<CChar>, _ flags: Int32, _ mode: UInt32 = 0o600) -> Result<Int32, Errno> {
        if let fault = Faults.check(.open, name) { return .failure(fault) }
        return retrying { fc_openat(dirFD, name, flags | O_CLOEXEC, mode) }
    }

    /// `fstatat` of the entry itself (a symbolic link is not followed).
    package static func lstatat(_ dirFD: Int32, _ name: UnsafePointer<CChar>) -> Result<Glibc.stat, Errno> {
        if let fault = Faults.check(.fstatat, name) { return .failure(fault) }
        var info = Glibc.stat()
        return retrying { fstatat(dirFD, name, &info, AT_SYMLINK_NOFOLLOW) }.map { _ in info }
    }

    package static func mkdirat(_ dirFD: Int32, _ name: UnsafePointer<CChar>, _ mode: mode_t) -> Result<Void, Errno> {
        if let fault = Faults.check(.mkdirat, name) { return .failure(fault) }
        return retrying { Glibc.mkdirat(dirFD, name, mode) }.map { _ in () }
    }

    /// `unlinkat`; with `directory`, an empty directory.
    package static func unlinkat(_ dirFD: Int32, _ name: UnsafePointer<CChar>, directory: Bool = false) -> Result<Void, Errno> {
        if let fault = Faults.check(.unlinkat, name) { return .failure(fault) }
        return retrying { Glibc.unlinkat(dirFD, name, directory ? AT_REMOVEDIR : 0) }.map { _ in () }
    }

    /// `renameat` within one directory tree.
    package static func renameat(_ dirFD: Int32, _ from: UnsafePointer<CChar>, _ to: UnsafePointer<CChar>) -> Result<Void, Errno> {
        if let fault = Faults.check(.renameat, to) { return .failure(fault) }
        return retrying { Glibc.renameat(dirFD, from, dirFD, to) }.map { _ in () }
    }

    package static func ftruncate(_ fd: Int32, _ size: Int64) -> Result<Void, Errno> {
        if let fault = Faults.check(.ftruncate) { return .failure(fault) }
        return retrying { Glibc.ftruncate(fd, off_t(size)) }.map { _ in () }
    }

    package static func truncate(_ path: UnsafePointer<CChar>, _ size: Int64) -> Result<Void, Errno> {
        if let fault = Faults.check(.truncate, path) { return .failure(fault) }
        return retrying { Glibc.truncate(path, off_t(size)) }.map { _ in () }
    }

    // MARK: Open-file-description locks

    /// Takes (`F_RDLCK`, `F_WRLCK`) or gives back (`F_UNLCK`) a byte range; with `wait`, blocks.
    package static func lock(_ fd: Int32, _ type: Int16, _ start: Int64, _ length: Int64, wait: Bool = false) -> Result<Void, Errno> {
        if type != fc_F_UNLCK, let fault = Faults.check(.lock) { return .failure(fault) }
        return retrying { fc_ofd_lock(fd, type, start, length, wait ? 1 : 0) }.map { _ in () }
    }

    /// Takes a byte range, blocking while another open file description holds a lock in
    /// the way (`F_OFD_SETLKW`), once: a signal ends the wait with `EINTR`, which is
    /// returned, not retried (the caller decides whether to wait again).
    package static func lockWaitingOnce(_ fd: Int32, _ type: Int16, _ start: Int64, _ length: Int64) -> Result<Void, Errno> {
        if let fault = Faults.check(.lock) { return .failure(fault) }
        guard fc_ofd_lock(fd, type, start, length, 1) == 0 else { return .failure(Errno(rawValue: Glibc.errno)) }
        return .success(())
    }

    /// The type of a lock another open file description holds in the way of `type`
    /// (`F_UNLCK` when none).
    package static func conflictingLock(_ fd: Int32, _ type: Int16, _ start: Int64, _ length: Int64) -> Result<Int16, Errno> {
        var conflicting: Int16 = fc_F_UNLCK
        return retrying { fc_ofd_getlock(fd, type, start, length, &conflicting) }.map { _ in conflicting }
    }
}

/// A device and a mount as ``Syscall/deviceCached(_:)`` reports them.
package struct CachedDevice: Sendable, Equatable {
    package var major: UInt32
    package var minor: UInt32
    /// The mount's ID: from Linux 6.8 one that no other mount is ever given; before, one
    /// that a mount made after this one's unmount may get again; 0 when the kernel does
    /// not say (before Linux 5.8).
    package var mount: UInt64

    /// The device number, as `stat`'s `st_dev` has it.
    package var number: UInt64 { fc_device_number(major, minor) }

    /// Whether it is an anonymous device (major 0): a network, FUSE, in-memory or pseudo
    /// file system's.
    package var isAnonymous: Bool { major == 0 }
}
