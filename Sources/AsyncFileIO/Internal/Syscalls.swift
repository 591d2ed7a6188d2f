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
/// the Swift cooperative pool; the exception is ``preadNoWait``, which cannot block.
enum Syscall {
    @inline(__always)
    static func retrying<T: BinaryInteger>(_ body: () -> T) -> Result<T, Errno> {
        while true {
            let result = body()
            if result >= 0 { return .success(result) }
            let error = Errno(rawValue: Glibc.errno)
            if error != .interrupted { return .failure(error) }
        }
    }

    static func open(_ path: UnsafePointer<CChar>, _ flags: Int32, _ mode: UInt32 = 0o666) -> Result<Int32, Errno> {
        retrying { fc_open(path, flags | O_CLOEXEC, mode) }
    }

    static func openTemporary(inDirectory path: UnsafePointer<CChar>, mode: UInt32) -> Result<Int32, Errno> {
        retrying { fc_open_tmpfile(path, mode) }
    }

    static func close(_ fd: Int32) -> Result<Void, Errno> {
        // close(2) must not be retried on EINTR on Linux: the descriptor is gone.
        if Glibc.close(fd) == 0 { return .success(()) }
        let error = Errno(rawValue: Glibc.errno)
        return error == .interrupted ? .success(()) : .failure(error)
    }

    static func fstat(_ fd: Int32) -> Result<Glibc.stat, Errno> {
        var info = Glibc.stat()
        return retrying { Glibc.fstat(fd, &info) }.map { _ in info }
    }

    static func stat(path: UnsafePointer<CChar>) -> Result<Glibc.stat, Errno> {
        var info = Glibc.stat()
        return retrying { fstatat(fc_AT_FDCWD, path, &info, 0) }.map { _ in info }
    }

    /// `stat` of the link itself when `path` is a symbolic link.
    static func lstat(path: UnsafePointer<CChar>) -> Result<Glibc.stat, Errno> {
        var info = Glibc.stat()
        return retrying { fstatat(fc_AT_FDCWD, path, &info, AT_SYMLINK_NOFOLLOW) }.map { _ in info }
    }

    /// The bytes a symbolic link holds.
    static func readlink(path: UnsafePointer<CChar>) -> Result<[UInt8], Errno> {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
        return retrying { buffer.withUnsafeMutableBytes { Glibc.readlink(path, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) } }
            .map { Array(buffer[0 ..< $0]) }
    }

    static func read(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> Result<Int, Errno> {
        retrying { Glibc.read(fd, buffer, count) }
    }

    static func pread(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int, _ offset: Int64) -> Result<Int, Errno> {
        retrying { Glibc.pread(fd, buffer, count, off_t(offset)) }
    }

    /// Reads only what the page cache already holds: `EAGAIN` instead of waiting for the device.
    static func preadNoWait(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int, _ offset: Int64) -> Result<Int, Errno> {
        retrying { fc_pread_nowait(fd, buffer, count, offset) }
    }

    static func write(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Result<Int, Errno> {
        retrying { Glibc.write(fd, buffer, count) }
    }

    static func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Result<Int, Errno> {
        retrying { Glibc.pwrite(fd, buffer, count, off_t(offset)) }
    }

    static func fsync(_ fd: Int32) -> Result<Void, Errno> {
        retrying { Glibc.fsync(fd) }.map { _ in () }
    }

    static func fchmod(_ fd: Int32, _ mode: mode_t) -> Result<Void, Errno> {
        retrying { Glibc.fchmod(fd, mode) }.map { _ in () }
    }

    static func setNonBlocking(_ fd: Int32, _ on: Bool) -> Result<Void, Errno> {
        retrying { fc_set_nonblocking(fd, on ? 1 : 0) }.map { _ in () }
    }

    static func rename(_ from: UnsafePointer<CChar>, _ to: UnsafePointer<CChar>) -> Result<Void, Errno> {
        retrying { Glibc.rename(from, to) }.map { _ in () }
    }

    static func renameNoReplace(_ from: UnsafePointer<CChar>, _ to: UnsafePointer<CChar>) -> Result<Void, Errno> {
        retrying { fc_rename_noreplace(from, to) }.map { _ in () }
    }

    static func unlink(_ path: UnsafePointer<CChar>) -> Result<Void, Errno> {
        retrying { Glibc.unlink(path) }.map { _ in () }
    }

    /// Gives an `O_TMPFILE` descriptor a name (through `/proc/self/fd`, which needs no privilege).
    static func linkAnonymous(_ fd: Int32, to path: UnsafePointer<CChar>) -> Result<Void, Errno> {
        let source = "/proc/self/fd/\(fd)"
        return retrying { Glibc.linkat(fc_AT_FDCWD, source, fc_AT_FDCWD, path, fc_AT_SYMLINK_FOLLOW) }.map { _ in () }
    }
}

extension Result where Failure == Errno {
    /// Turns the errno into a ``FileCoordinationError`` naming the operation and path.
    @inline(__always)
    func mapError(_ operation: String, _ path: FilePath?) -> Result<Success, FileCoordinationError> {
        mapError { FileCoordinationError(operation, errno: $0, path: path) }
    }
}

/// The file type bits of `st_mode`.
enum FileType: Equatable {
    case regular, directory, fifo, socket, characterDevice, blockDevice, symbolicLink, unknown

    // The `st_mode` type bits, as literals: Glibc's `S_IF*` macros import as computed
    // properties, a call each, and this runs for every file a batch reads.
    private static let typeMask: mode_t = 0o170000
    private static let regularBits: mode_t = 0o100000

    init(mode: mode_t) {
        switch mode & Self.typeMask {
        case Self.regularBits: self = .regular
        case 0o040000: self = .directory
        case 0o010000: self = .fifo
        case 0o140000: self = .socket
        case 0o020000: self = .characterDevice
        case 0o060000: self = .blockDevice
        case 0o120000: self = .symbolicLink
        default: self = .unknown
        }
    }

    /// Whether `mode` is a regular file's.
    static func isRegular(_ mode: mode_t) -> Bool { mode & typeMask == regularBits }

    /// "a character device", and so on (for messages).
    var description: String {
        switch self {
        case .regular: "a regular file"
        case .directory: "a directory"
        case .fifo: "a FIFO"
        case .socket: "a socket"
        case .characterDevice: "a character device"
        case .blockDevice: "a block device"
        case .symbolicLink: "a symbolic link"
        case .unknown: "not a regular file"
        }
    }
}

/// The name of a directory entry `readdir(3)` returned, read in place.
///
/// Not `entry.pointee.d_name`: that copies the whole 256-byte array, and an entry is only
/// as long as its name (`d_reclen`), so the copy of the last entry of glibc's buffer read
/// past its end (a crash seen with a thousand processes listing the space's mailboxes).
@_spi(FileCoordinationInternal)
public func directoryEntryName(_ entry: UnsafeMutablePointer<dirent>) -> [UInt8] {
    let offset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
    let name = UnsafeRawPointer(entry).advanced(by: offset).assumingMemoryBound(to: CChar.self)
    return Array(UnsafeRawBufferPointer(start: name, count: strlen(name)))
}
