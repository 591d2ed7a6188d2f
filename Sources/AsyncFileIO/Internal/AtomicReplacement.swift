import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A file being written aside, to replace its target in one rename when committed.
///
/// The content goes into an unnamed `O_TMPFILE` in the target's directory (or, on a
/// file system without `O_TMPFILE`, into a hidden temporary name there). A writer
/// killed before ``commit`` leaves the target untouched and, with `O_TMPFILE`, nothing
/// else behind. ``commit`` fsyncs the data, links it in under a temporary name, renames
/// it over the target and fsyncs the directory, so readers see the old or the new
/// content and never a mixture.
struct AtomicReplacement: Sendable {
    let target: FilePath
    let directory: FilePath
    let fd: Int32
    /// The visible temporary name when `O_TMPFILE` was not available.
    let namedTemporary: FilePath?
    let withoutOverwriting: Bool

    private static let counter = Atomic<Int>(0)
    private static let procAvailable: Bool = if case .success = Syscall.access("/proc/self/fd", F_OK) { true } else { false }

    /// A name beside the target's, unique to this process and call. Within a name's 255
    /// bytes: the target's name is cut to 180 (the rest takes at most 50).
    static func temporaryName(for target: FilePath, in directory: FilePath) -> FilePath {
        var name = target.lastComponent?.string ?? "file"
        while name.utf8.count > 180 { name.removeLast() }
        let serial = counter.add(1, ordering: .relaxed).newValue
        return directory.appending(".\(name).filecoord-\(getpid())-\(serial)-\(UInt32.random(in: 0 ... .max))")
    }

    /// Opens the temporary file. Keeps the target's permission bits when it exists.
    static func begin(target given: FilePath, withoutOverwriting: Bool) -> Result<AtomicReplacement, FileCoordinationError> {
        // Through symbolic links, as `cat >` writes: the link stays, its file is replaced.
        // Not when nothing may be overwritten: then a link there, even a dangling one, is
        // something that exists (following it would create the file it names, wherever
        // that is: the classic attack in a shared directory).
        let target: FilePath
        if withoutOverwriting {
            if case .success = given.withPlatformString({ Syscall.lstat(path: $0) }) {
                return .failure(FileCoordinationError(.open, errno: .fileExists, path: given))
            }
            target = given
        } else {
            switch resolvingLinks(given) {
            case .success(let resolved): target = resolved
            case .failure(let error): return .failure(error)
            }
        }
        var directory = target.removingLastComponent()
        if directory.isEmpty { directory = "." }
        var mode: mode_t?
        var owner: (uid: uid_t, gid: gid_t)?
        var exists = false
        switch target.withPlatformString({ Syscall.stat(path: $0) }) {
        case .success(let info):
            exists = true
            switch FileType(mode: info.st_mode) {
            case .regular: break
            case .directory:
                return .failure(FileCoordinationError(.open, code: .isDirectory, path: target, errno: .isDirectory,
                                                      message: "is a directory, not a file"))
            case let type:
                // A device, FIFO or socket must not be renamed over with a regular file.
                return .failure(FileCoordinationError(.open, code: .unsupportedFileType, path: target, message: "is \(type.description); an atomic write replaces only regular files (append to write into it)"))
            }
            if withoutOverwriting {
                return .failure(FileCoordinationError(.open, errno: .fileExists, path: target))
            }
            // A file this process may not write is not replaced either (rename needs only
            // the directory's permission).
            if case .failure(let errno) = target.withPlatformString({ Syscall.access($0, W_OK, effective: true) }) {
                return .failure(FileCoordinationError(.open, errno: errno, path: target))
            }
            mode = info.st_mode & 0o7777
            if info.st_uid != geteuid() || info.st_gid != getegid() { owner = (info.st_uid, info.st_gid) }
        case .failure(.noSuchFileOrDirectory):
            break
        case .failure(let errno):
            return .failure(FileCoordinationError(.stat, errno: errno, path: target))
        }

        var fd: Int32 = -1
        var named: FilePath?
        if procAvailable {
            switch directory.withPlatformString({ Syscall.openTemporary(inDirectory: $0, mode: 0o666) }) {
            case .success(let descriptor): fd = descriptor
            case .failure(.notSupported), .failure(.isDirectory), .failure(.invalidArgument): break
            case .failure(let errno): return .failure(temporaryFailed(errno, target: target, exists: exists, in: directory))
            }
        }
        if fd < 0 {
            let name = temporaryName(for: target, in: directory)
            switch name.withPlatformString({ Syscall.open($0, O_WRONLY | O_CREAT | O_EXCL, 0o666) }) {
            case .success(let descriptor): fd = descriptor; named = name
            case .failure(let errno): return .failure(temporaryFailed(errno, target: target, exists: exists, in: directory))
            }
        }
        // The replacement keeps the file's owner and group, as `cat >` (which writes in
        // place) does, where this process may give them (root may; anyone else gets EPERM
        // and the file becomes theirs, as with any editor that saves by rename). Before
        // the mode: a change of owner clears the set-user and set-group bits.
        if let owner { _ = Syscall.fchown(fd, owner.uid, owner.gid) }
        if let mode, case .failure(let errno) = Syscall.fchmod(fd, mode) {
            let replacement = AtomicReplacement(target: target, directory: directory, fd: fd, namedTemporary: named,
                                                withoutOverwriting: withoutOverwriting)
            replacement.abort()
            return .failure(FileCoordinationError(.fchmod, errno: errno, path: target))
        }
        return .success(AtomicReplacement(target: target, directory: directory, fd: fd, namedTemporary: named,
                                          withoutOverwriting: withoutOverwriting))
    }

    /// The temporary file could not be made. For a target that exists, say that it is the
    /// temporary that failed: `/proc/version` is there, but `/proc` takes no new file
    /// (ENOENT), and "open failed: No such file" would name the wrong file.
    private static func temporaryFailed(_ errno: Errno, target: FilePath, exists: Bool, in directory: FilePath) -> FileCoordinationError {
        guard exists else { return FileCoordinationError(.open, errno: errno, path: target) }
        return FileCoordinationError(.atomicReplace, code: .init(errno), path: target, errno: errno,
                                     message: "no temporary file can be made beside it, in \(directory): \(FileCoordinationError.strerror(errno))")
    }

    /// `path` with every symbolic link on its last component followed (at most 40), each
    /// relative link taken from its own directory. A dangling link resolves to the file
    /// it names, which the write then creates.
    static func resolvingLinks(_ path: FilePath) -> Result<FilePath, FileCoordinationError> {
        var current = path
        for _ in 0 ..< 40 {
            guard case .success(let info) = current.withPlatformString({ Syscall.lstat(path: $0) }),
                  FileType(mode: info.st_mode) == .symbolicLink else { return .success(current) }
            switch current.withPlatformString({ Syscall.readlink(path: $0) }) {
            case .success(let bytes):
                let link = FilePath(platformBytes: bytes)
                current = link.isAbsolute ? link : current.removingLastComponent().pushing(link)
            case .failure(let errno):
                return .failure(FileCoordinationError(.readlink, errno: errno, path: current))
            }
        }
        return .failure(FileCoordinationError(.open, errno: .tooManySymbolicLinkLevels, path: path))
    }

    /// Publishes the content under the target's name and closes the descriptor.
    func commit(sync: Bool) -> Result<Void, FileCoordinationError> {
        let result = publish(sync: sync)
        let closed = Syscall.close(fd).mapError(.close, target)
        if case .failure = result { return result }
        return closed
    }

    /// fsyncs, renames into place and fsyncs the directory; leaves the descriptor open.
    /// On failure a visible temporary is removed and the target is left as it was.
    func publish(sync: Bool) -> Result<Void, FileCoordinationError> {
        let result = rename(sync: sync)
        if case .failure = result, let namedTemporary {
            _ = namedTemporary.withPlatformString { Syscall.unlink($0) }
        }
        return result
    }

    private func rename(sync: Bool) -> Result<Void, FileCoordinationError> {
        if sync, case .failure(let error) = FileOperations.fsync(fd: fd, path: target) { return .failure(error) }
        let renamed: Result<Void, FileCoordinationError>
        if let namedTemporary {
            renamed = namedTemporary.withPlatformString { from in
                target.withPlatformString { to in
                    withoutOverwriting ? Syscall.renameNoReplace(from, to) : Syscall.rename(from, to)
                }
            }.mapError(.rename, target)
        } else if withoutOverwriting {
            renamed = target.withPlatformString { Syscall.linkAnonymous(fd, to: $0) }.mapError(.link, target)
        } else {
            let temporary = Self.temporaryName(for: target, in: directory)
            renamed = temporary.withPlatformString { Syscall.linkAnonymous(fd, to: $0) }.mapError(.link, target)
                .flatMap {
                    temporary.withPlatformString { from in
                        target.withPlatformString { to in Syscall.rename(from, to) }
                    }.mapError(.rename, target).flatMapError { error in
                        _ = temporary.withPlatformString { Syscall.unlink($0) }
                        return .failure(error)
                    }
                }
        }
        if case .failure = renamed { return renamed }
        return sync ? FileOperations.syncDirectory(directory) : .success(())
    }

    /// Discards the content: the target is left as it was.
    func abort() {
        _ = Syscall.close(fd)
        if let namedTemporary { _ = namedTemporary.withPlatformString { Syscall.unlink($0) } }
    }
}
