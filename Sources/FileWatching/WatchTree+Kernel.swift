import AsyncFileIO
import CInotifyTools
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

extension WatchTree {
    /// The kernel as a watch tree's ``WatchSystem``: the watcher thread's inotify
    /// instance and libinotifytools, blocking listings (fine on that thread), and the
    /// tree that carries out the translation's outputs.
    struct Kernel: WatchSystem {
        let thread: InotifyThread.OnThread
        let tree: WatchTree

        func addWatch(_ path: FilePath, followingLink: Bool) -> Result<Int32, FileCoordinationError> {
            thread.addWatch(path, mask: followingLink ? WatchTree.mask & ~UInt32(IN_DONT_FOLLOW) : WatchTree.mask, client: tree)
        }

        func removeWatch(_ wd: Int32) {
            thread.removeWatch(wd, client: tree)
        }

        /// 1% of the user's limit, at least 64: enough for the user's other processes to
        /// watch what they need (a waiting claim needs three).
        var watchHeadroom: Int { Swift.max(64, Int(inotifytools_get_max_user_watches()) / 100) }

        func carryOut(_ output: WatchOutput) {
            tree.carryOut(output)
        }

        /// The inode number of `path` (not following a link), 0 when nothing is there.
        func inode(_ path: FilePath) -> UInt64 { Self.inode(path) }

        static func inode(_ path: FilePath) -> UInt64 {
            guard case .success(let info) = path.withPlatformString({ Syscall.lstat(path: $0) }) else { return 0 }
            return UInt64(info.st_ino)
        }

        /// The entries of a directory with whether each is a directory (not following links)
        /// and its inode number.
        func list(_ directory: FilePath) -> [WatchEntry] {
            guard case .success(let listed) = directory.withPlatformString({ Syscall.listDirectory(path: $0) }) else { return [] }
            return listed.map { entry in
                var isDirectory = entry.type == UInt8(DT_DIR)
                if entry.type == UInt8(DT_UNKNOWN) {
                    let full = FilePath(platformBytes: directory.platformBytes + [UInt8(ascii: "/")] + entry.name)
                    if case .success(let info) = full.withPlatformString({ Syscall.lstat(path: $0) }) {
                        isDirectory = info.st_mode & S_IFMT == S_IFDIR
                    }
                }
                return WatchEntry(name: entry.name, isDirectory: isDirectory, inode: entry.inode)
            }
        }
    }
}
