import SystemPackage
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Watches on an inotify instance (the one libinotifytools opened, on the watcher thread).
extension Syscall {
    /// Watches `path` for the `IN_*` events in `mask`: the watch descriptor, the same for
    /// every watch of one inode on `instance`.
    package static func inotifyAddWatch(_ instance: Int32, _ path: UnsafePointer<CChar>, _ mask: UInt32) -> Result<Int32, Errno> {
        if let fault = Faults.check(.inotifyAddWatch, path) { return .failure(fault) }
        return retrying { inotify_add_watch(instance, path, mask) }
    }

    /// Removes watch `wd` (`EINVAL` when the kernel has dropped it already).
    package static func inotifyRemoveWatch(_ instance: Int32, _ wd: Int32) -> Result<Void, Errno> {
        if let fault = Faults.check(.inotifyRemoveWatch) { return .failure(fault) }
        return retrying { inotify_rm_watch(instance, wd) }.map { _ in () }
    }
}
