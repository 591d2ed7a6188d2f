import AsyncFileIO
import CInotifyTools
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// One known item of a watched tree. A directory's children are keyed by name, and
/// each node knows its parent, so that a rename moves one node and a deletion forgets
/// one subtree: the cost of an event does not grow with the size of the tree.
final class WatchNode {
    var name: [UInt8]
    weak var parent: WatchNode?
    var children: [[UInt8]: WatchNode] = [:]
    let isDirectory: Bool
    /// The inode number, when a directory listing gave it (0 otherwise).
    var inode: UInt64 = 0
    /// The node's inotify watch, for a watched directory.
    var wd: Int32 = -1
    /// Its listing found nothing at its path: it was renamed (or removed) meanwhile.
    var unlisted = false

    init(name: [UInt8], parent: WatchNode?, isDirectory: Bool) {
        self.name = name
        self.parent = parent
        self.isDirectory = isDirectory
    }

    /// The path below the root, as bytes (`sub/a.txt`; empty for the root).
    var relativeBytes: [UInt8] {
        var names: [[UInt8]] = []
        var node: WatchNode? = self
        while let current = node, let parent = current.parent {
            names.append(current.name)
            node = parent
        }
        var bytes: [UInt8] = []
        for name in names.reversed() {
            if !bytes.isEmpty { bytes.append(UInt8(ascii: "/")) }
            bytes += name
        }
        return bytes
    }

    /// Every node of this subtree, children before their parent.
    func postOrder(_ body: (WatchNode) -> Void) {
        for child in children.values { child.postOrder(body) }
        body(self)
    }
}

/// A watcher on the watcher thread: it feeds inotify's deliveries to its
/// ``WatchTranslation`` with the kernel as the ``WatchSystem``, and carries out what the
/// translation decides as it decides it (events into the buffer through the filter, syncs
/// completed, the unwatched list).
/// It is an ``InotifyClient``: everything here runs on the watcher thread, except
/// ``stop()``'s first step and the buffer, which consumers share.
final class WatchTree: InotifyClient, @unchecked Sendable {
    /// The filter, or nil when it passes everything (the usual case: no test per event).
    let filter: FileEventFilter?
    let buffer: EventBuffer
    /// Where sync cookies go: the root directory, or the watched file's directory.
    var syncDirectory: FilePath { translation.syncDirectory }

    static let mask = UInt32(IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO
        | IN_DELETE_SELF | IN_MOVE_SELF) | UInt32(IN_DONT_FOLLOW) | UInt32(IN_EXCL_UNLINK)

    // MARK: Owned by the watcher thread

    private let translation: WatchTranslation
    private var stopped = false

    /// Directories of the tree left unwatched because the user's inotify watch limit
    /// was reached (the watcher thread adds to it; anyone may read it).
    private let unwatchedPaths = Locked<[FilePath]>([])
    var unwatched: [FilePath] { unwatchedPaths.withLock { $0 } }

    let metrics: WatchMetrics

    init(root: FilePath, rootIsDirectory: Bool, recursive: Bool, bufferLimit: Int, filter: FileEventFilter,
         metrics: WatchMetrics = .standard) {
        self.filter = filter == .all ? nil : filter
        self.metrics = metrics
        translation = WatchTranslation(root: root, rootIsDirectory: rootIsDirectory, recursive: recursive)
        var resync = FileEvent(.resync, root, isDirectory: rootIsDirectory)
        resync.relativePath = rootIsDirectory ? FilePath() : FilePath(platformBytes: translation.fileName)
        buffer = EventBuffer(limit: bufferLimit, resyncEvent: resync, metrics: metrics)
    }

    /// Adds the first watch and learns the tree, on the watcher thread (reporting what it
    /// finds as created, with `reportingExisting`).
    func start(reportingExisting: Bool = false) async throws {
        let result: Result<Void, FileCoordinationError> = await withCheckedContinuation { continuation in
            InotifyThread.shared.perform { thread in
                continuation.resume(returning: self.translation.start(system: Kernel(thread: thread, tree: self),
                                                                      reportingExisting: reportingExisting))
            } orFail: { error in
                continuation.resume(returning: .failure(error))
            }
        }
        try result.get()
    }

    /// Ends the sequence and removes every watch (the removal runs on the watcher thread).
    func stop() {
        guard buffer.finish() else { return }
        InotifyThread.shared.perform { thread in
            self.stopped = true
            self.translation.removeAllWatches(system: Kernel(thread: thread, tree: self))
        }
    }

    /// The watch descriptors held (tests).
    func watchDescriptors() async -> [Int32] {
        await withCheckedContinuation { continuation in
            InotifyThread.shared.perform { _ in continuation.resume(returning: self.translation.watchDescriptors) } orFail: { _ in
                continuation.resume(returning: [])
            }
        }
    }

    func watchCount() async -> Int {
        await watchDescriptors().count
    }

    func handle(_ delivery: InotifyDelivery, thread: InotifyThread.OnThread) {
        guard !stopped else { return }
        translation.handle(delivery, system: Kernel(thread: thread, tree: self))
    }

    /// One output of the translation (on the watcher thread).
    func carryOut(_ output: WatchOutput) {
        switch output {
        case .event(let event):
            if filter?.accepts(event) ?? true { buffer.append(event) }
        case .cookieSeen(let name):
            buffer.cookieSeen(name)
        case .lost(let cause):
            if cause == .kernelQueue { metrics.kernelOverflows.increment() }
            buffer.lose(FileEvent.Resync(cause: cause))
            // Syncs whose cookie exists by now are complete: whatever happened before
            // them is covered by the rescan.
            for name in buffer.pendingCookies where Kernel.inode(syncDirectory.appending(name)) != 0 {
                buffer.cookieSeen(name)
            }
        case .unwatched(let paths):
            unwatchedPaths.withLock { $0 += paths }
        case .ended:
            buffer.finish()
            stopped = true
        }
    }
}
