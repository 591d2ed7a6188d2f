import AsyncFileIO
import SystemPackage

/// What translating needs of the system (watches, listings, inodes), and where its
/// results go, each as soon as it is decided: a scan of a big tree reaches consumers as
/// it goes, through the buffer's limit. The watcher thread gives the kernel and its
/// buffer (``WatchTree``); tests give a tree in memory.
protocol WatchSystem {
    /// Adds an inotify watch of the directory at `path` (following a last symbolic link
    /// only when asked: the root may be one).
    func addWatch(_ path: FilePath, followingLink: Bool) -> Result<Int32, FileCoordinationError>
    /// Ends this tree's interest in a watch (the kernel may have dropped it already).
    func removeWatch(_ wd: Int32)
    /// The entries of a directory (not `.` and `..`), not following links.
    func list(_ directory: FilePath) -> [WatchEntry]
    /// The inode number of `path`, not following a last link; 0 when nothing is there.
    func inode(_ path: FilePath) -> UInt64
    /// How many watches to give back when the user's watch limit is met (asked then only).
    var watchHeadroom: Int { get }
    /// Carries out one output, in order.
    func carryOut(_ output: WatchOutput)
}

/// One entry of a directory listing.
struct WatchEntry {
    var name: [UInt8]
    var isDirectory: Bool
    var inode: UInt64
}

/// What the driver does, in order, as a delivery is translated.
enum WatchOutput {
    /// Report this event (through the watcher's filter).
    case event(FileEvent)
    /// A sync's cookie appeared: the sync is complete.
    case cookieSeen(String)
    /// Events were lost and the tree rescanned: a resync is owed, and syncs whose cookie
    /// exists by now are complete (the rescan covered what came before them).
    case lost(FileEvent.Resync.Cause)
    /// These directories stay unwatched (the user's watch limit).
    case unwatched([FilePath])
    /// The root (or a watched file's directory) went away: nothing more can be seen.
    case ended
}
