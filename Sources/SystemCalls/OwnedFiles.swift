import CFileCoordinationShims
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// Opening files that must be this user's own: every file of the coordination space is
/// opened without following a symbolic link (or blocking on a FIFO), then checked with
/// `fstat` before it is used.
package enum OwnedFiles {
    package enum Kind: Sendable { case regularFile, directory }

    /// Why an entry was refused.
    package enum Problem: Error, Sendable, Equatable {
        /// The call failed.
        case system(Errno)
        case notA(Kind)
        /// Owned by the first uid, not by the second (the user expected).
        case ownedBy(uid_t, expected: uid_t)
        case writableByOthers(mode_t)

        /// "is owned by uid 0, not by this user (uid 1000)", and so on.
        package var text: String {
            switch self {
            case .system(let errno): "cannot be opened: \(errno)"
            case .notA(.directory): "is not a directory"
            case .notA(.regularFile): "is not a regular file"
            case .ownedBy(let uid, let expected): "is owned by uid \(uid), not by this user (uid \(expected))"
            case .writableByOthers(let mode): "is writable by other users (mode \(String(mode & 0o7777, radix: 8)))"
            }
        }
    }

    /// Opens `name` (relative to `dirFD`) with `O_NOFOLLOW` (and `O_DIRECTORY` for a
    /// directory), then checks its type and owner (`owner`, this process's effective uid
    /// when nil), and with `privateOnly` that neither group nor others may write it. The
    /// descriptor is closed when a check fails.
    package static func open(_ dirFD: Int32, _ name: UnsafePointer<CChar>, _ flags: Int32, mode: UInt32 = 0o600,
                             kind: Kind, privateOnly: Bool, owner: uid_t? = nil) -> Result<Int32, Problem> {
        let extra = kind == .directory ? fc_O_DIRECTORY : 0
        switch Syscall.openat(dirFD, name, flags | extra | fc_O_NOFOLLOW, mode) {
        case .failure(let errno): return .failure(.system(errno))
        case .success(let fd):
            if case .failure(let problem) = check(fd, kind: kind, privateOnly: privateOnly, owner: owner) {
                _ = Syscall.close(fd)
                return .failure(problem)
            }
            return .success(fd)
        }
    }

    /// The open file `fd`'s `stat`, or what is wrong with it. `owner`: the user it must
    /// belong to, this process's effective uid when nil.
    package static func check(_ fd: Int32, kind: Kind, privateOnly: Bool, owner: uid_t? = nil) -> Result<Glibc.stat, Problem> {
        let info: Glibc.stat
        switch Syscall.fstat(fd) {
        case .failure(let errno): return .failure(.system(errno))
        case .success(let value): info = value
        }
        let type = info.st_mode & S_IFMT
        if type != (kind == .directory ? S_IFDIR : S_IFREG) { return .failure(.notA(kind)) }
        let expected = owner ?? geteuid()
        if info.st_uid != expected { return .failure(.ownedBy(info.st_uid, expected: expected)) }
        if privateOnly && info.st_mode & 0o022 != 0 { return .failure(.writableByOthers(info.st_mode)) }
        return .success(info)
    }

    /// The names in the directory `name` (relative to `dirFD`), without `.` and `..`.
    package static func list(_ dirFD: Int32, _ name: UnsafePointer<CChar>) -> Result<[String], Errno> {
        if let fault = Faults.check(.opendir, name) { return .failure(fault) }
        let fd: Int32
        switch Syscall.openat(dirFD, name, O_RDONLY | fc_O_DIRECTORY | fc_O_NOFOLLOW) {
        case .failure(let errno): return .failure(errno)
        case .success(let value): fd = value
        }
        guard let dir = fdopendir(fd) else {
            let errno = Errno(rawValue: Glibc.errno)
            _ = Syscall.close(fd)
            return .failure(errno)
        }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = String(decoding: directoryEntryName(entry), as: UTF8.self)
            if name != "." && name != ".." { names.append(name) }
        }
        return .success(names)
    }
}

/// A `readdir(3)` entry's name, read in place: `d_name` copied whole would read past the
/// end of glibc's buffer for its last entry (an entry is only `d_reclen` long; a crash
/// seen with a thousand processes listing the space's mailboxes).
package func directoryEntryName(_ entry: UnsafeMutablePointer<dirent>) -> [UInt8] {
    let offset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
    let name = UnsafeRawPointer(entry).advanced(by: offset).assumingMemoryBound(to: CChar.self)
    return Array(UnsafeRawBufferPointer(start: name, count: strlen(name)))
}
