import AsyncFileIO
import CFileCoordinationShims
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A presented file held by its inode, to find where it went when a program that does
/// not coordinate moves it out of its directory.
///
/// inotify tells such a move as a deletion: the watched directory's `IN_MOVED_FROM`
/// without its pair, which does not name the destination. An `O_PATH` descriptor on the
/// file follows it: `/proc/self/fd` names its current place, and its link count says
/// whether it was deleted. It costs one descriptor per watched presenter of a file, and
/// opens no content.
///
/// Not for a directory: a descriptor on a directory keeps the kernel from reporting its
/// removal (`IN_DELETE_SELF` comes only once the last reference is gone), and a
/// presented directory is watched through itself, not its parent.
final class ItemAnchor: Sendable {
    private let fd: Int32
    private let device: UInt64
    private let inode: UInt64

    /// Holds the file at `path` now; nil for a directory, or when it cannot be opened (it
    /// is gone, or descriptors ran out: a move is then told as a deletion, as inotify
    /// tells it). Blocking: on a thread of the library's own.
    init?(holding path: FilePath) {
        // The name itself: a symbolic link put where the item was is not the item.
        let opened = path.withPlatformString { Syscall.open($0, fc_O_PATH | O_NOFOLLOW) }
        guard case .success(let fd) = opened else { return nil }
        guard case .success(let info) = Syscall.fstat(fd), info.st_mode & S_IFMT != S_IFDIR else {
            _ = Syscall.close(fd)
            return nil
        }
        (self.fd, device, inode) = (fd, UInt64(info.st_dev), UInt64(info.st_ino))
    }

    deinit { _ = Syscall.close(fd) }

    /// Whether the item at `path` is the one held (a save by rename replaces it).
    /// Blocking.
    func holds(_ path: FilePath) -> Bool {
        guard case .success(let info) = path.withPlatformString({ Syscall.lstat(path: $0) }) else { return false }
        return UInt64(info.st_dev) == device && UInt64(info.st_ino) == inode
    }

    /// Where the item is now, when it is no longer at `path` and was not deleted: its
    /// place as this process sees the file system, checked to be the same inode. Nil
    /// when it was deleted, is still at `path`, or has no name this process can reach.
    /// Blocking.
    func movedAway(from path: FilePath) -> FilePath? {
        guard case .success(let info) = Syscall.fstat(fd), info.st_nlink > 0 else { return nil }
        guard case .success(let bytes) = Syscall.readlink(path: "/proc/self/fd/\(fd)"),
              bytes.first == UInt8(ascii: "/") else { return nil }
        let destination = FilePath(platformBytes: bytes)
        guard destination != path, holds(destination) else { return nil }
        return destination
    }
}
