import AsyncFileIO
import CInotifyTools
import SystemPackage

/// The translation of inotify deliveries into ``FileEvent``s, as a state machine: the
/// known nodes of the tree, the watch descriptor that leads to each watched directory,
/// and what each delivery means. It makes no system call itself: it asks the
/// ``WatchSystem`` it is given, and returns what to report. It lives on the watcher
/// thread (``WatchTree`` drives it); tests drive it with a tree in memory.
final class WatchTranslation {
    static let cookiePrefix: [UInt8] = Array(".filecoord-sync-".utf8)
    static let temporaryMarker: [UInt8] = Array(".filecoord-".utf8)

    /// The root as the caller named it: events are reported under it.
    let root: FilePath
    let rootIsDirectory: Bool
    let recursive: Bool
    /// Where sync cookies go: the root directory, or the watched file's directory.
    let syncDirectory: FilePath
    let rootBytes: [UInt8]

    /// The watched directory (for a watched file, its directory). Its children are the
    /// tree; for a watched file, only the file is kept there.
    private let top: WatchNode
    /// The directory node each watch descriptor leads to.
    private var nodes: [Int32: WatchNode] = [:]
    /// The watched file's current name (a file watcher follows renames within its directory).
    private(set) var fileName: [UInt8]
    /// The directories watched, in the order their watches were added (for the headroom
    /// given back when the user's watch limit is reached).
    private var watchOrder: [WatchNode] = []
    /// Set once adding a watch met the user's watch limit: no more are added.
    private var limited = false

    init(root: FilePath, rootIsDirectory: Bool, recursive: Bool) {
        self.root = root
        self.rootIsDirectory = rootIsDirectory
        self.recursive = recursive
        syncDirectory = rootIsDirectory ? root : root.removingLastComponent()
        rootBytes = syncDirectory.platformBytes
        fileName = rootIsDirectory ? [] : root.lastComponent.map { FilePath(root: nil, [$0]).platformBytes } ?? []
        top = WatchNode(name: [], parent: nil, isDirectory: true)
    }

    /// Adds the first watch and learns the tree, reporting nothing (but a limit met on
    /// the way: ``WatchOutput/unwatched(_:)``), or, with `reportingExisting`, reporting
    /// the root and everything found as created.
    func start(system: any WatchSystem, reportingExisting: Bool = false) -> Result<Void, FileCoordinationError> {
        // The root itself may be a symbolic link to a directory: follow it (the entries
        // inside are watched without following).
        switch system.addWatch(syncDirectory, followingLink: true) {
        case .failure(let error):
            return .failure(error)
        case .success(let wd):
            top.wd = wd
            nodes[wd] = top
            if rootIsDirectory {
                if reportingExisting { emit(.created, path: [], isDirectory: true, absolute: root, to: system) }
                scan(top, report: reportingExisting, system: system)
            } else if system.inode(root) != 0 {
                top.children[fileName] = WatchNode(name: fileName, parent: top, isDirectory: false)
                if reportingExisting { emit(.created, path: fileName, isDirectory: false, to: system) }
            }
            return .success(())
        }
    }

    /// Removes every watch and forgets the tree.
    func removeAllWatches(system: any WatchSystem) {
        for (wd, _) in nodes { system.removeWatch(wd) }
        nodes.removeAll()
        top.children.removeAll()
    }

    /// How many directories the tree keeps in the order it watched them (for tests).
    var rememberedNodes: Int { watchOrder.count }

    /// The watch descriptors held.
    var watchDescriptors: [Int32] { Array(nodes.keys) }

    // MARK: Events

    /// Translates one delivery from the kernel; what it means goes to `system`, in order.
    func handle(_ delivery: InotifyDelivery, system: any WatchSystem) {
        switch delivery {
        case .overflow:
            rescan(system: system, cause: .kernelQueue)
        case .move(let from, let to):
            guard let source = nodes[from.wd], let target = nodes[to.wd] else { break }
            moved(from.name, in: source, to: to.name, in: target, isDirectory: from.mask & UInt32(IN_ISDIR) != 0,
                  system: system)
        case .event(let event):
            handle(event, system: system)
        }
    }

    /// Whether an event's name is an unnamed `O_TMPFILE` being written, which the kernel
    /// names `#INODE` in events: a name of that form that nothing in the directory has (a
    /// file may be named so; a listing never shows an unnamed one).
    private func isUnnamedTemporary(_ name: [UInt8], in directory: WatchNode, system: any WatchSystem) -> Bool {
        guard name.count > 1, name.first == UInt8(ascii: "#"),
              name.dropFirst().allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
        else { return false }
        return directory.children[name] == nil && system.inode(absolute(relative: child(directory, name))) == 0
    }

    private func handle(_ event: InotifyEvent, system: any WatchSystem) {
        let mask = event.mask
        guard let directory = nodes[event.wd] else { return }
        if mask & UInt32(IN_IGNORED | IN_UNMOUNT | IN_DELETE_SELF | IN_MOVE_SELF) != 0 {
            selfEvent(mask, of: directory, wd: event.wd, system: system)
            return
        }
        guard !event.name.isEmpty else { return }
        if directory === top, event.name.starts(with: Self.cookiePrefix) {
            if mask & UInt32(IN_CREATE) != 0 { system.carryOut(.cookieSeen(String(decoding: event.name, as: UTF8.self))) }
            return
        }
        if Self.isInternal(event.name) || !concerns(event.name, in: directory)
            || isUnnamedTemporary(event.name, in: directory, system: system) { return }
        let isDirectory = mask & UInt32(IN_ISDIR) != 0
        if mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0 {
            appeared(event.name, in: directory, isDirectory: isDirectory, movedIn: mask & UInt32(IN_MOVED_TO) != 0,
                     system: system)
        } else if mask & UInt32(IN_DELETE | IN_MOVED_FROM) != 0 {
            removed(event.name, in: directory, system: system)
        } else if mask & UInt32(IN_MODIFY) != 0 {
            emit(.modified, path: child(directory, event.name), isDirectory: isDirectory, to: system)
        } else if mask & UInt32(IN_ATTRIB) != 0 {
            emit(.attributesChanged, path: child(directory, event.name), isDirectory: isDirectory, to: system)
        }
    }

    /// An event about a watched directory itself: its watch dropped (deleted, or its file
    /// system unmounted), or the directory deleted or moved.
    private func selfEvent(_ mask: UInt32, of directory: WatchNode, wd: Int32, system: any WatchSystem) {
        let gone = mask & UInt32(IN_IGNORED) != 0
        if directory === top {
            // A watched file's directory renamed: the file is still watched through it.
            if !rootIsDirectory && mask == UInt32(IN_MOVE_SELF) { return }
            // The root (or a watched file's directory) went away, or its watch did: nothing
            // more can be seen, and a sync could never complete.
            if rootIsDirectory { emit(.deleted, path: [], isDirectory: true, absolute: root, to: system) }
            system.carryOut(.ended)
            removeAllWatches(system: system)
            return
        }
        let unmounted = mask & UInt32(IN_UNMOUNT) != 0
        if gone || unmounted, nodes[wd] === directory {
            nodes[wd] = nil
            directory.wd = -1
            system.removeWatch(wd)
        }
        if unmounted {
            // What was mounted there is gone and the directory below the mount shows
            // through: the rescan watches it and reports the difference.
            rescan(system: system, cause: .unmounted)
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
                          system: any WatchSystem) {
        if let existing = directory.children[name] {
            if existing.isDirectory == isDirectory {
                // Created: the name was free, so the scan saw this very item. Moved in:
                // the same item only if the scan listed it with the inode it has now.
                if !movedIn || (existing.inode != 0 && existing.inode == system.inode(absolute(existing))) { return }
            }
            removed(name, in: directory, system: system)
        }
        let node = WatchNode(name: name, parent: directory, isDirectory: isDirectory)
        directory.children[name] = node
        createdAndScanned(node, in: directory, system: system)
    }

    /// Reports a new node, watching a new directory first: a consumer that reads the
    /// event has already been told (``WatchOutput/unwatched(_:)``) if the watch limit left
    /// the directory out.
    /// Then the directory is listed, so its entries are reported after it.
    private func createdAndScanned(_ node: WatchNode, in directory: WatchNode, report: Bool = true,
                                   system: any WatchSystem) {
        let watched = node.isDirectory && recursive && watch(node, system: system)
        if report { emit(.created, path: child(directory, node.name), isDirectory: node.isDirectory, to: system) }
        if watched { scan(node, report: report, system: system) }
    }

    /// An entry left: report it, if it was known, and forget it with its subtree.
    private func removed(_ name: [UInt8], in directory: WatchNode, system: any WatchSystem) {
        guard let node = directory.children[name] else { return }
        let path = child(directory, name)
        forget(node, system: system)
        emit(.deleted, path: path, isDirectory: node.isDirectory, to: system)
    }

    /// Both halves of a rename, each in a directory of this tree.
    private func moved(_ name: [UInt8], in source: WatchNode, to newName: [UInt8], in target: WatchNode,
                       isDirectory: Bool, system: any WatchSystem) {
        if Self.isInternal(name) {
            // An atomic write renaming its temporary into place: the destination appeared,
            // or changed.
            guard concerns(newName, in: target) else { return }
            if let existing = target.children[newName], existing.isDirectory == isDirectory {
                emit(.modified, path: child(target, newName), isDirectory: isDirectory, to: system)
            } else {
                appeared(newName, in: target, isDirectory: isDirectory, system: system)
            }
            return
        }
        if Self.isInternal(newName) {
            removed(name, in: source, system: system)
            return
        }
        guard rootIsDirectory else {
            if name == fileName {
                // The watched file itself was renamed: it lives on under the new name.
                let from = child(source, name)
                source.children[name] = nil
                fileName = newName
                source.children[newName] = WatchNode(name: newName, parent: source, isDirectory: false)
                emit(.moved, path: from, isDirectory: false, destination: child(source, newName), to: system)
            } else if newName == fileName {
                // The watched file was replaced by a rename (an editor's save): it changed.
                if source.children[newName] == nil {
                    source.children[newName] = WatchNode(name: newName, parent: source, isDirectory: false)
                }
                emit(.modified, path: child(source, newName), isDirectory: false, to: system)
            }
            return
        }
        guard let node = source.children[name] else {
            appeared(newName, in: target, isDirectory: isDirectory, system: system)
            return
        }
        let from = child(source, name)
        source.children[name] = nil
        if let replaced = target.children[newName] { forget(replaced, system: system) }
        node.name = newName
        node.parent = target
        target.children[newName] = node
        emit(.moved, path: from, isDirectory: node.isDirectory, destination: child(target, newName), to: system)
        // Created and renamed before its event was read (`mkdir a; mv a b`): its watch
        // failed under the old name; it is watched and listed under the new one. Renamed
        // while it was being scanned: what failed under the old name (a watch, a listing)
        // is done under the new one.
        guard node.isDirectory && recursive else { return }
        if node.wd < 0 {
            watchAndScan(node, system: system)
        } else if Self.isIncomplete(node) {
            reconcile(node, system: system)
        }
    }

    /// Whether a directory of the subtree went unwatched or unlisted.
    private static func isIncomplete(_ node: WatchNode) -> Bool {
        var incomplete = false
        node.postOrder { item in
            if item.isDirectory && (item.wd < 0 || item.unlisted) { incomplete = true }
        }
        return incomplete
    }

    /// Forgets a node and everything below it, removing the watches of its directories.
    private func forget(_ node: WatchNode, system: any WatchSystem) {
        if let parent = node.parent, parent.children[node.name] === node { parent.children[node.name] = nil }
        node.postOrder { item in
            guard item.wd >= 0 else { return }
            if nodes[item.wd] === item {
                nodes[item.wd] = nil
                system.removeWatch(item.wd)
            }
            item.wd = -1
        }
    }

    private func watchAndScan(_ node: WatchNode, system: any WatchSystem) {
        guard watch(node, system: system) else { return }
        scan(node, report: true, system: system)
    }

    /// Adds the node's watch. False when the directory is already watched under another
    /// node (the same directory reached twice, through a bind mount) or cannot be watched.
    @discardableResult
    private func watch(_ node: WatchNode, system: any WatchSystem) -> Bool {
        let path = absolute(node)
        if limited {
            system.carryOut(.unwatched([path]))
            return false
        }
        let wd: Int32
        switch system.addWatch(path, followingLink: false) {
        case .success(let added): wd = added
        case .failure(let error) where error.code == .watchLimitReached:
            limitReached(at: path, system: system)
            return false
        case .failure: return false
        }
        // Directories forgotten since (removed, moved out) leave the order now and then: a
        // tree under churn would otherwise keep every node it ever watched.
        if watchOrder.count > 2 * nodes.count + 64 { watchOrder.removeAll { $0.wd < 0 } }
        watchOrder.append(node)
        if let other = nodes[wd], other !== node {
            // The same directory under two paths (a bind mount): keep the first. But if
            // the other node's path no longer leads there, it was given this directory's
            // watch by a path that was reused before its event was read (`mkdir a;
            // mv a b; mkdir a`): the watch is this node's, and the other is watched again.
            guard system.inode(absolute(other)) != system.inode(path) else { return false }
            other.wd = -1
            node.wd = wd
            nodes[wd] = node
            // What the other node learned through the wrong watch is corrected too.
            if watch(other, system: system) { reconcile(other, system: system) }
            return true
        }
        node.wd = wd
        nodes[wd] = node
        return true
    }

    /// The user's watch limit was reached at `path`: it and every directory not watched
    /// yet stay unwatched, and the watches added last (the deepest, most recent part of
    /// the scan) are given back, ``WatchSystem/watchHeadroom`` of them, so that the user's
    /// other processes can still watch. Said once, as ``WatchOutput/unwatched(_:)``.
    private func limitReached(at path: FilePath, system: any WatchSystem) {
        limited = true
        var given: [FilePath] = [path]
        var count = 0
        let headroom = system.watchHeadroom
        while count < headroom, let node = watchOrder.popLast() {
            guard node !== top, node.wd >= 0 else { continue }
            nodes[node.wd] = nil
            system.removeWatch(node.wd)
            node.wd = -1
            given.append(absolute(node))
            count += 1
        }
        system.carryOut(.unwatched(given))
    }

    /// Lists a directory (recursively when watching recursively), learning its entries
    /// and reporting those not known yet.
    private func scan(_ directory: WatchNode, report: Bool, system: any WatchSystem) {
        let path = absolute(directory)
        let entries = system.list(path)
        if entries.isEmpty, system.inode(path) == 0 { directory.unlisted = true }
        for entry in entries where !Self.isInternal(entry.name) {
            let (name, isDirectory, inode) = (entry.name, entry.isDirectory, entry.inode)
            if let existing = directory.children[name] {
                if existing.isDirectory == isDirectory { continue }
                forget(existing, system: system)
            }
            let node = WatchNode(name: name, parent: directory, isDirectory: isDirectory)
            node.inode = inode
            directory.children[name] = node
            createdAndScanned(node, in: directory, report: report, system: system)
        }
    }

    /// After lost events: compares the tree on disk with the nodes, reports the
    /// differences (deletions deepest first, then creations), then owes a resync.
    private func rescan(system: any WatchSystem, cause: FileEvent.Resync.Cause) {
        if rootIsDirectory {
            reconcile(top, system: system)
        } else {
            let exists = system.inode(root) != 0
            let known = top.children[fileName] != nil
            if exists && !known {
                top.children[fileName] = WatchNode(name: fileName, parent: top, isDirectory: false)
                emit(.created, path: child(top, fileName), isDirectory: false, to: system)
            } else if !exists && known {
                top.children[fileName] = nil
                emit(.deleted, path: child(top, fileName), isDirectory: false, to: system)
            }
        }
        system.carryOut(.lost(cause))
    }

    /// Whether a watched directory was replaced by another of its name (`rm -rf d; mkdir
    /// d`) whose events were lost: the kernel gives the new one another watch. (The old
    /// one's watch died with it, its `IN_IGNORED` lost too.)
    private func isReplaced(_ node: WatchNode, system: any WatchSystem) -> Bool {
        guard recursive, node.isDirectory, node.wd >= 0,
              case .success(let wd) = system.addWatch(absolute(node), followingLink: false) else { return false }
        return wd != node.wd && nodes[wd] == nil
    }

    private func reconcile(_ directory: WatchNode, system: any WatchSystem) {
        directory.unlisted = false
        var onDisk: [[UInt8]: Bool] = [:]
        for entry in system.list(absolute(directory)) where !Self.isInternal(entry.name) {
            onDisk[entry.name] = entry.isDirectory
        }
        for (_, node) in directory.children where onDisk[node.name] != node.isDirectory || isReplaced(node, system: system) {
            node.postOrder { emit(.deleted, path: $0.relativeBytes, isDirectory: $0.isDirectory, to: system) }
            forget(node, system: system)
        }
        for (name, isDirectory) in onDisk.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            if let existing = directory.children[name] {
                if isDirectory && recursive {
                    if existing.wd < 0 { watch(existing, system: system) }
                    reconcile(existing, system: system)
                }
                continue
            }
            let node = WatchNode(name: name, parent: directory, isDirectory: isDirectory)
            directory.children[name] = node
            createdAndScanned(node, in: directory, system: system)
        }
    }

    // MARK: Paths

    /// The relative bytes of `name` inside `directory`.
    private func child(_ directory: WatchNode, _ name: [UInt8]) -> [UInt8] {
        let base = directory.relativeBytes
        return base.isEmpty ? name : base + [UInt8(ascii: "/")] + name
    }

    /// The absolute path of a node, for system calls.
    private func absolute(_ node: WatchNode) -> FilePath {
        absolute(relative: node.relativeBytes)
    }

    /// The path below the watched directory given by its relative bytes.
    private func absolute(relative: [UInt8]) -> FilePath {
        relative.isEmpty ? syncDirectory : FilePath(platformBytes: rootBytes + [UInt8(ascii: "/")] + relative)
    }

    private func emit(_ kind: FileEvent.Kind, path relative: [UInt8], isDirectory: Bool,
                      destination: [UInt8]? = nil, absolute: FilePath? = nil, to system: any WatchSystem) {
        system.carryOut(.event(FileEvent(kind, absolute ?? self.absolute(relative: relative), relativePath: FilePath(platformBytes: relative),
                                        destination: destination.map { self.absolute(relative: $0) },
                                        relativeDestination: destination.map { FilePath(platformBytes: $0) }, isDirectory: isDirectory)))
    }
}
