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
            var info = stat()
            return path.withPlatformString { lstat($0, &info) } == 0 ? UInt64(info.st_ino) : 0
        }

        /// The entries of a directory with whether each is a directory (not following links)
        /// and its inode number.
        func list(_ directory: FilePath) -> [WatchEntry] {
            guard let handle = directory.withPlatformString({ opendir($0) }) else { return [] }
            defer { closedir(handle) }
            var entries: [WatchEntry] = []
            while let entry = readdir(handle) {
                let name = directoryEntryName(entry)
                if name == [0x2E] || name == [0x2E, 0x2E] { continue }
                var isDirectory = entry.pointee.d_type == UInt8(DT_DIR)
                if entry.pointee.d_type == UInt8(DT_UNKNOWN) {
                    var info = stat()
                    let full = FilePath(platformBytes: directory.platformBytes + [UInt8(ascii: "/")] + name)
                    isDirectory = full.withPlatformString { lstat($0, &info) } == 0 && info.st_mode & S_IFMT == S_IFDIR
                }
                entries.append(WatchEntry(name: name, isDirectory: isDirectory, inode: UInt64(entry.pointee.d_ino)))
            }
            return entries
        }
    }
}
