@_spi(FileCoordinationInternal) import AsyncFileIO
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

/// A watcher's state on the watcher thread: its nodes, the watch descriptors that lead
/// to them, and the translation of inotify events into ``FileEvent``s. It is an
/// ``InotifyClient``: everything here runs on the watcher thread, except ``stop()``'s
/// first step and the buffer, which consumers share.
final class WatchTree: InotifyClient, @unchecked Sendable {
    /// The root as the caller named it: events are reported under it.
    let root: FilePath
    let rootIsDirectory: Bool
    let recursive: Bool
    /// The filter, or nil when it passes everything (the usual case: no test per event).
    let filter: FileEventFilter?
    let buffer: EventBuffer
    /// Where sync cookies go: the root directory, or the watched file's directory.
    let syncDirectory: FilePath

    static let cookiePrefix: [UInt8] = Array(".filecoord-sync-".utf8)
    static let temporaryMarker: [UInt8] = Array(".filecoord-".utf8)
    static let mask = UInt32(IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO
        | IN_DELETE_SELF | IN_MOVE_SELF) | UInt32(IN_DONT_FOLLOW) | UInt32(IN_EXCL_UNLINK)

    // MARK: Owned by the watcher thread

    /// The watched directory (for a watched file, its directory). Its children are the
    /// tree; for a watched file, only the file is kept there.
    private let top: WatchNode
    /// The directory node each watch descriptor leads to.
    private var nodes: [Int32: WatchNode] = [:]
    let rootBytes: [UInt8]
    /// The watched file's current name (a file watcher follows renames within its directory).
    private var fileName: [UInt8]
    private var stopped = false
    /// The directories watched, in the order their watches were added (for the headroom
    /// given back when the user's watch limit is reached).
    private var watchOrder: [WatchNode] = []
    /// Set once adding a watch met the user's watch limit: no more are added.
    private var limited = false

    /// Directories of the tree left unwatched because the user's inotify watch limit
    /// was reached (the watcher thread adds to it; anyone may read it).
    private let unwatchedPaths = Locked<[FilePath]>([])
    var unwatched: [FilePath] { unwatchedPaths.withLock { $0 } }

    /// Watches given back when the limit is reached, so that the user's other processes
    /// can still watch what they need (a waiting claim needs three): 1% of the user's
    /// limit, at least 64.
    static var headroom: Int { Swift.max(64, Int(inotifytools_get_max_user_watches()) / 100) }

    init(root: FilePath, rootIsDirectory: Bool, recursive: Bool, bufferLimit: Int, filter: FileEventFilter) {
        self.root = root
        self.rootIsDirectory = rootIsDirectory
        self.recursive = recursive
        self.filter = filter == .all ? nil : filter
        syncDirectory = rootIsDirectory ? root : root.removingLastComponent()
        rootBytes = syncDirectory.platformBytes
        fileName = rootIsDirectory ? [] : root.lastComponent.map { FilePath(root: nil, [$0]).platformBytes } ?? []
        top = WatchNode(name: [], parent: nil, isDirectory: true)
        var resync = FileEvent(.resync, root, isDirectory: rootIsDirectory)
        resync.relativePath = rootIsDirectory ? FilePath() : FilePath(platformBytes: fileName)
        buffer = EventBuffer(limit: bufferLimit, resyncEvent: resync)
    }

    /// Adds the first watch and learns the tree, on the watcher thread.
    func start() async throws {
        let result: Result<Void, FileCoordinationError> = await withCheckedContinuation { continuation in
            InotifyThread.shared.perform { thread in
                // The root itself may be a symbolic link to a directory: follow it (the
                // entries inside are watched without following).
                let mask = Self.mask & ~UInt32(IN_DONT_FOLLOW)
                switch thread.addWatch(self.syncDirectory, mask: mask, client: self) {
                case .failure(let error):
                    continuation.resume(returning: .failure(error))
                case .success(let wd):
                    self.top.wd = wd
                    self.nodes[wd] = self.top
                    if self.rootIsDirectory {
                        self.scan(self.top, report: false, thread: thread)
                    } else if Self.exists(self.root) {
                        self.top.children[self.fileName] = WatchNode(name: self.fileName, parent: self.top, isDirectory: false)
                    }
                    continuation.resume(returning: .success(()))
                }
            } orFail: { error in
                continuation.resume(returning: .failure(error))
            }
        }
        try result.get()
    }

    /// Ends the sequence and removes every watch (the removal runs on the watcher thread).
    func stop() {
        guard buffer.finish() else { return }
        InotifyThread.shared.perform { thread in self.removeAllWatches(thread: thread) }
    }

    private func removeAllWatches(thread: InotifyThread.OnThread) {
        stopped = true
        for (wd, _) in nodes { thread.removeWatch(wd, client: self) }
        nodes.removeAll()
        top.children.removeAll()
    }

    /// The watch descriptors held (tests).
    func watchDescriptors() async -> [Int32] {
        await withCheckedContinuation { continuation in
            InotifyThread.shared.perform { _ in continuation.resume(returning: Array(self.nodes.keys)) } orFail: { _ in
                continuation.resume(returning: [])
            }
        }
    }

    func watchCount() async -> Int {
        await withCheckedContinuation { continuation in
            InotifyThread.shared.perform { _ in continuation.resume(returning: self.nodes.count) } orFail: { _ in
                continuation.resume(returning: 0)
            }
        }
    }

    // MARK: Events

    /// Transient names that are not entries: sync cookies, the temporaries atomic writes
    /// rename into place (`.NAME.filecoord-PID-N-R`), and unnamed `O_TMPFILE`s being
    /// written (`#INODE`). Watchers never report them.
    static func isInternal(_ name: [UInt8]) -> Bool {
        if name.count > 1, name.first == UInt8(ascii: "#"),
           name.dropFirst().allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
        {
            return true
        }
        guard name.first == UInt8(ascii: "."), name.count > temporaryMarker.count else { return false }
        if name.starts(with: cookiePrefix) { return true }
        let marker = temporaryMarker
        for start in 1 ... (name.count - marker.count) where name[start] == marker[0] {
            if name[start ..< start + marker.count].elementsEqual(marker) { return true }
        }
        return false
    }

    func handle(_ delivery: InotifyDelivery, thread: InotifyThread.OnThread) {
        guard !stopped else { return }
        switch delivery {
        case .overflow:
            rescan(thread: thread, cause: .kernelQueue)
        case .move(let from, let to):
            guard let source = nodes[from.wd], let target = nodes[to.wd] else { return }
            moved(from.name, in: source, to: to.name, in: target, isDirectory: from.mask & UInt32(IN_ISDIR) != 0,
                  thread: thread)
        case .event(let event):
            handle(event, thread: thread)
        }
    }

    private func handle(_ event: InotifyEvent, thread: InotifyThread.OnThread) {
        let mask = event.mask
        guard let directory = nodes[event.wd] else { return }
        if mask & UInt32(IN_IGNORED | IN_UNMOUNT | IN_DELETE_SELF | IN_MOVE_SELF) != 0 {
            selfEvent(mask, of: directory, wd: event.wd, thread: thread)
            return
        }
        guard !event.name.isEmpty else { return }
        if directory === top, event.name.starts(with: Self.cookiePrefix) {
            if mask & UInt32(IN_CREATE) != 0 { buffer.cookieSeen(String(decoding: event.name, as: UTF8.self)) }
            return
        }
        if Self.isInternal(event.name) || !concerns(event.name, in: directory) { return }
        let isDirectory = mask & UInt32(IN_ISDIR) != 0
        if mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0 {
            appeared(event.name, in: directory, isDirectory: isDirectory, movedIn: mask & UInt32(IN_MOVED_TO) != 0,
                     thread: thread)
        } else if mask & UInt32(IN_DELETE | IN_MOVED_FROM) != 0 {
            removed(event.name, in: directory, thread: thread)
        } else if mask & UInt32(IN_MODIFY) != 0 {
            emit(.modified, path: child(directory, event.name), isDirectory: isDirectory)
        } else if mask & UInt32(IN_ATTRIB) != 0 {
            emit(.attributesChanged, path: child(directory, event.name), isDirectory: isDirectory)
        }
    }

    /// An event about a watched directory itself: its watch dropped (deleted, or its file
    /// system unmounted), or the directory deleted or moved.
    private func selfEvent(_ mask: UInt32, of directory: WatchNode, wd: Int32, thread: InotifyThread.OnThread) {
        let gone = mask & UInt32(IN_IGNORED) != 0
        if directory === top {
            // A watched file's directory renamed: the file is still watched through it.
            if !rootIsDirectory && mask == UInt32(IN_MOVE_SELF) { return }
            // The root (or a watched file's directory) went away, or its watch did: nothing
            // more can be seen, and a sync could never complete.
            if rootIsDirectory { emit(.deleted, path: [], isDirectory: true, absolute: root) }
            buffer.finish()
            removeAllWatches(thread: thread)
            return
        }
        let unmounted = mask & UInt32(IN_UNMOUNT) != 0
        if gone || unmounted, nodes[wd] === directory {
            nodes[wd] = nil
            directory.wd = -1
            thread.removeWatch(wd, client: self)
        }
        if unmounted {
            // What was mounted there is gone and the directory below the mount shows
            // through: the rescan watches it and reports the difference.
            rescan(thread: thread, cause: .unmounted)
        }
    }

    /// For a watched file, only the file concerns the watcher.
    private func concerns(_ name: [UInt8], in directory: WatchNode) -> Bool {
        rootIsDirectory || name == fileName
    }

    /// A new entry: report it; a new directory is watched first, then listed, so that
    /// what was created inside it before the watch existed is reported too. An entry
    /// already known (listed by its parent's scan before its own event came) is not
    /// reported or watched again. An entry moved in over a known one replaced it.
    private func appeared(_ name: [UInt8], in directory: WatchNode, isDirectory: Bool, movedIn: Bool = false,
                          thread: InotifyThread.OnThread) {
        if let existing = directory.children[name] {
            if existing.isDirectory == isDirectory {
                // Created: the name was free, so the scan saw this very item. Moved in:
                // the same item only if the scan listed it with the inode it has now.
                if !movedIn || (existing.inode != 0 && existing.inode == Self.inode(absolute(existing))) { return }
            }
            removed(name, in: directory, thread: thread)
        }
        let node = WatchNode(name: name, parent: directory, isDirectory: isDirectory)
        directory.children[name] = node
        createdAndScanned(node, in: directory, thread: thread)
    }

    /// Reports a new node, watching a new directory first: a consumer that reads the
    /// event then finds the directory in ``unwatched`` if the watch limit left it out.
    /// Then the directory is listed, so its entries are reported after it.
    private func createdAndScanned(_ node: WatchNode, in directory: WatchNode, report: Bool = true,
                                   thread: InotifyThread.OnThread) {
        let watched = node.isDirectory && recursive && watch(node, thread: thread)
        if report { emit(.created, path: child(directory, node.name), isDirectory: node.isDirectory) }
        if watched { scan(node, report: report, thread: thread) }
    }

    /// An entry left: report it, if it was known, and forget it with its subtree.
    private func removed(_ name: [UInt8], in directory: WatchNode, thread: InotifyThread.OnThread) {
        guard let node = directory.children[name] else { return }
        let path = child(directory, name)
        forget(node, thread: thread)
        emit(.deleted, path: path, isDirectory: node.isDirectory)
    }

    /// Both halves of a rename, each in a directory of this tree.
    private func moved(_ name: [UInt8], in source: WatchNode, to newName: [UInt8], in target: WatchNode,
                       isDirectory: Bool, thread: InotifyThread.OnThread) {
        if Self.isInternal(name) {
            // An atomic write renaming its temporary into place: the destination appeared,
            // or changed.
            guard concerns(newName, in: target) else { return }
            if let existing = target.children[newName], existing.isDirectory == isDirectory {
                emit(.modified, path: child(target, newName), isDirectory: isDirectory)
            } else {
                appeared(newName, in: target, isDirectory: isDirectory, thread: thread)
            }
            return
        }
        if Self.isInternal(newName) {
            removed(name, in: source, thread: thread)
            return
        }
        guard rootIsDirectory else {
            if name == fileName {
                // The watched file itself was renamed: it lives on under the new name.
                let from = child(source, name)
                source.children[name] = nil
                fileName = newName
                source.children[newName] = WatchNode(name: newName, parent: source, isDirectory: false)
                emit(.moved, path: from, isDirectory: false, destination: child(source, newName))
            } else if newName == fileName {
                // The watched file was replaced by a rename (an editor's save): it changed.
                if source.children[newName] == nil {
                    source.children[newName] = WatchNode(name: newName, parent: source, isDirectory: false)
                }
                emit(.modified, path: child(source, newName), isDirectory: false)
            }
            return
        }
        guard let node = source.children[name] else {
            appeared(newName, in: target, isDirectory: isDirectory, thread: thread)
            return
        }
        let from = child(source, name)
        source.children[name] = nil
        if let replaced = target.children[newName] { forget(replaced, thread: thread) }
        node.name = newName
        node.parent = target
        target.children[newName] = node
        emit(.moved, path: from, isDirectory: node.isDirectory, destination: child(target, newName))
        // Created and renamed before its event was read (`mkdir a; mv a b`): its watch
        // failed under the old name; it is watched and listed under the new one.
        if node.isDirectory && recursive && node.wd < 0 { watchAndScan(node, thread: thread) }
    }

    /// Forgets a node and everything below it, removing the watches of its directories.
    private func forget(_ node: WatchNode, thread: InotifyThread.OnThread) {
        if let parent = node.parent, parent.children[node.name] === node { parent.children[node.name] = nil }
        node.postOrder { item in
            guard item.wd >= 0 else { return }
            if nodes[item.wd] === item {
                nodes[item.wd] = nil
                thread.removeWatch(item.wd, client: self)
            }
            item.wd = -1
        }
    }

    private func watchAndScan(_ node: WatchNode, thread: InotifyThread.OnThread) {
        guard watch(node, thread: thread) else { return }
        scan(node, report: true, thread: thread)
    }

    /// Adds the node's watch. False when the directory is already watched under another
    /// node (the same directory reached twice, through a bind mount) or cannot be watched.
    @discardableResult
    private func watch(_ node: WatchNode, thread: InotifyThread.OnThread) -> Bool {
        let path = absolute(node)
        if limited {
            unwatchedPaths.withLock { $0.append(path) }
            return false
        }
        let wd: Int32
        switch thread.addWatch(path, mask: Self.mask, client: self) {
        case .success(let added): wd = added
        case .failure(let error) where error.code == .watchLimitReached:
            limitReached(at: path, thread: thread)
            return false
        case .failure: return false
        }
        watchOrder.append(node)
        if let other = nodes[wd], other !== node {
            // The same directory under two paths (a bind mount): keep the first. But if
            // the other node's path no longer leads there, it was given this directory's
            // watch by a path that was reused before its event was read (`mkdir a;
            // mv a b; mkdir a`): the watch is this node's, and the other is watched again.
            guard Self.inode(absolute(other)) != Self.inode(path) else { return false }
            other.wd = -1
            node.wd = wd
            nodes[wd] = node
            // What the other node learned through the wrong watch is corrected too.
            if watch(other, thread: thread) { reconcile(other, thread: thread) }
            return true
        }
        node.wd = wd
        nodes[wd] = node
        return true
    }

    /// The user's watch limit was reached at `path`: it and every directory not watched
    /// yet stay unwatched, and the watches added last (the deepest, most recent part of
    /// the scan) are given back, ``headroom`` of them, so that the user's other processes
    /// can still watch. Said once, through ``unwatched`` and the presenter's warning.
    private func limitReached(at path: FilePath, thread: InotifyThread.OnThread) {
        limited = true
        var given: [FilePath] = [path]
        var count = 0
        while count < Self.headroom, let node = watchOrder.popLast() {
            guard node !== top, node.wd >= 0 else { continue }
            nodes[node.wd] = nil
            thread.removeWatch(node.wd, client: self)
            node.wd = -1
            given.append(absolute(node))
            count += 1
        }
        unwatchedPaths.withLock { $0 += given }
    }

    /// Lists a directory (recursively when watching recursively), learning its entries
    /// and reporting those not known yet.
    private func scan(_ directory: WatchNode, report: Bool, thread: InotifyThread.OnThread) {
        let path = absolute(directory)
        for (name, isDirectory, inode) in Self.list(path) where !Self.isInternal(name) {
            if let existing = directory.children[name] {
                if existing.isDirectory == isDirectory { continue }
                forget(existing, thread: thread)
            }
            let node = WatchNode(name: name, parent: directory, isDirectory: isDirectory)
            node.inode = inode
            directory.children[name] = node
            createdAndScanned(node, in: directory, report: report, thread: thread)
        }
    }

    /// After lost events: compares the tree on disk with the nodes, reports the
    /// differences (deletions deepest first, then creations), then owes a resync.
    /// Syncs whose cookie exists by now are complete: whatever happened before them is
    /// covered by the rescan.
    private func rescan(thread: InotifyThread.OnThread, cause: FileEvent.Resync.Cause) {
        if rootIsDirectory {
            reconcile(top, thread: thread)
        } else {
            let exists = Self.exists(root)
            let known = top.children[fileName] != nil
            if exists && !known {
                top.children[fileName] = WatchNode(name: fileName, parent: top, isDirectory: false)
                emit(.created, path: child(top, fileName), isDirectory: false)
            } else if !exists && known {
                top.children[fileName] = nil
                emit(.deleted, path: child(top, fileName), isDirectory: false)
            }
        }
        buffer.lose(FileEvent.Resync(cause: cause))
        for name in buffer.pendingCookies where Self.exists(syncDirectory.appending(name)) {
            buffer.cookieSeen(name)
        }
    }

    private func reconcile(_ directory: WatchNode, thread: InotifyThread.OnThread) {
        var onDisk: [[UInt8]: Bool] = [:]
        for (name, isDirectory, _) in Self.list(absolute(directory)) where !Self.isInternal(name) {
            onDisk[name] = isDirectory
        }
        for (_, node) in directory.children where onDisk[node.name] != node.isDirectory {
            node.postOrder { emit(.deleted, path: $0.relativeBytes, isDirectory: $0.isDirectory) }
            forget(node, thread: thread)
        }
        for (name, isDirectory) in onDisk.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            if let existing = directory.children[name] {
                if isDirectory && recursive {
                    if existing.wd < 0 { watch(existing, thread: thread) }
                    reconcile(existing, thread: thread)
                }
                continue
            }
            let node = WatchNode(name: name, parent: directory, isDirectory: isDirectory)
            directory.children[name] = node
            createdAndScanned(node, in: directory, thread: thread)
        }
    }

}
