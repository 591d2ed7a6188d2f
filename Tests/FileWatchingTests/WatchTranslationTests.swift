import CInotifyTools
import SystemPackage
import Testing
import AsyncFileIO
@testable import FileWatching

/// The translation of inotify deliveries into events (``WatchTranslation``), driven with a
/// tree in memory: each case is a race or a limit that real processes meet only by chance
/// (a directory renamed before its creation is read, the watch limit, a lost queue).
@Suite("Watch translation")
struct WatchTranslationTests {
    @Test("a directory created and filled before its event is read: reported, then its entries, and watched")
    func createdAndFilled() {
        let disk = MemoryTree()
        let watch = disk.start()
        disk.mkdir("a")
        disk.touch("a/x")
        #expect(watch.deliver(disk.event("", IN_CREATE | IN_ISDIR, "a")) == ["created a/", "created a/x"])
        #expect(watch.deliver(disk.event("a", IN_CREATE, "x")).isEmpty, "listed already: not reported twice")
        #expect(disk.watches.count == 2)
    }

    @Test("directories made and removed for ever (a build's output): what the tree remembers of them stays bounded")
    func churnStaysBounded() {
        let disk = MemoryTree()
        let watch = disk.start()
        for round in 0 ..< 2_000 {
            disk.mkdir("out\(round)")
            disk.mkdir("out\(round)/obj")
            _ = watch.deliver(disk.event("", IN_CREATE | IN_ISDIR, "out\(round)"))
            let deleted = disk.event("", IN_DELETE | IN_ISDIR, "out\(round)")
            disk.remove("out\(round)")
            _ = watch.deliver(deleted)
        }
        #expect(disk.watches.count == 1)
        #expect(watch.translation.rememberedNodes < 200, "\(watch.translation.rememberedNodes) nodes kept for 1 watched directory")
    }

    @Test("a subtree moved in is reported as it is scanned: each directory's entries go out before the next directory is listed")
    func reportedAsScanned() {
        let disk = MemoryTree()
        let watch = disk.start()
        disk.mkdir("big")
        for index in 0 ..< 3 {
            disk.mkdir("big/d\(index)")
            disk.touch("big/d\(index)/f")
        }
        // The buffer (and its limit) sees events while the scan goes on, not at its end.
        var pendingAtLastList: [String]?
        disk.onList = { directory in
            if directory.string.hasSuffix("/d2") { pendingAtLastList = disk.pending }
        }
        let reported = watch.deliver(disk.event("", IN_CREATE | IN_ISDIR, "big"))
        #expect(reported.count == 7 && reported.first == "created big/")
        #expect(pendingAtLastList?.contains("created big/d0/f") == true, "big/d0's entry still held back when d2 was listed")
    }

    @Test("created and renamed before the event is read (mkdir a; mv a b): watched and listed under the new name")
    func createdThenRenamed() {
        let disk = MemoryTree()
        let watch = disk.start()
        disk.mkdir("a")
        let created = disk.event("", IN_CREATE | IN_ISDIR, "a")
        disk.move("a", "b")
        disk.touch("b/y")
        #expect(watch.deliver(created) == ["created a/"], "its watch failed: nothing at a")
        #expect(watch.deliver(disk.move(from: ("", "a"), to: ("", "b"), directory: true)) == ["moved a -> b/", "created b/y"])
        #expect(disk.watches.count == 2 && disk.wd(of: "b") != nil)
    }

    @Test("an atomic write's temporary renamed into place: a known file was modified, a new one created")
    func atomicWrites() {
        let disk = MemoryTree()
        disk.touch("f")
        let watch = disk.start()
        #expect(watch.deliver(disk.event("", IN_CREATE, ".f.filecoord-1-2-3")).isEmpty)
        #expect(watch.deliver(disk.move(from: ("", ".f.filecoord-1-2-3"), to: ("", "f"))) == ["modified f"])
        #expect(watch.deliver(disk.move(from: ("", ".g.filecoord-1-2-4"), to: ("", "g"))) == ["created g"])
        #expect(watch.deliver(disk.event("", IN_CREATE, ".filecoord-sync-7")) == ["cookie .filecoord-sync-7"])
    }

    @Test("a lost queue: the rescan reports deletions deepest first, then creations, then owes a resync")
    func overflow() {
        let disk = MemoryTree()
        disk.mkdir("a")
        disk.touch("a/x")
        disk.touch("b")
        let watch = disk.start()
        disk.remove("a")
        disk.touch("c")
        #expect(watch.deliver(.overflow) == ["deleted a/x", "deleted a/", "created c", "lost kernelQueue"])
        #expect(disk.watches.count == 1, "a's watch removed")
    }

    @Test("a directory renamed while it is being scanned (built under a temporary name, then renamed): its whole subtree is watched and known under the new name",
          arguments: ["a/s1", "a"])
    func renamedWhileScanned(listedWhenRenamed: String) {
        let disk = MemoryTree()
        let watch = disk.start()
        disk.mkdir("a")
        disk.mkdir("a/s1")
        disk.mkdir("a/s2")
        disk.touch("a/s2/f")
        let created = disk.event("", IN_CREATE | IN_ISDIR, "a")
        var renamed = false
        disk.onList = { directory in
            guard !renamed, directory.string == MemoryTree.root + "/" + listedWhenRenamed else { return }
            renamed = true
            disk.move("a", "b")
        }
        _ = watch.deliver(created)
        disk.onList = nil
        let reported = watch.deliver(disk.move(from: ("", "a"), to: ("", "b"), directory: true))
        #expect(reported.first == "moved a -> b/", "\(reported)")
        #expect(disk.wd(of: "b/s2") != nil, "b/s2 is not watched")
        disk.touch("b/s2/g")
        #expect(watch.deliver(disk.event("b/s2", IN_CREATE, "g")) == ["created b/s2/g"])
    }

    @Test("a directory replaced while the queue was lost (rm -rf a; mkdir a): the rescan reports it replaced, and watches the new one")
    func replacedDuringOverflow() {
        let disk = MemoryTree()
        disk.mkdir("a")
        disk.touch("a/x")
        let watch = disk.start()
        disk.remove("a")
        disk.mkdir("a")
        disk.touch("a/y")
        #expect(watch.deliver(.overflow) == ["deleted a/x", "deleted a/", "created a/", "created a/y", "lost kernelQueue"])
        disk.touch("a/z")
        #expect(watch.deliver(disk.event("a", IN_CREATE, "z")) == ["created a/z"], "the new a is watched")
        #expect(disk.watches.count == 2, "the old a's watch is given back")
    }

    @Test("the watch limit: the directory met, and the headroom's latest watches, stay unwatched; none is added after")
    func watchLimit() {
        let disk = MemoryTree()
        disk.limit = 4
        let watch = disk.start(headroom: 2)
        for name in ["d1", "d2", "d3"] {
            disk.mkdir(name)
            #expect(watch.deliver(disk.event("", IN_CREATE | IN_ISDIR, name)) == ["created \(name)/"])
        }
        disk.mkdir("d4")
        #expect(watch.deliver(disk.event("", IN_CREATE | IN_ISDIR, "d4")) == ["unwatched d4 d3 d2", "created d4/"])
        #expect(disk.watches.count == 2, "the root and d1 keep theirs")
        disk.mkdir("d5")
        #expect(watch.deliver(disk.event("", IN_CREATE | IN_ISDIR, "d5")) == ["unwatched d5", "created d5/"])
        #expect(disk.watches.count == 2)
    }

    @Test("the root deleted: its deletion is reported, the watcher ends, and every watch is removed")
    func rootDeleted() {
        let disk = MemoryTree()
        disk.mkdir("a")
        let watch = disk.start()
        let event = disk.event("", IN_DELETE_SELF, "")
        #expect(watch.deliver(event) == ["deleted (root)/", "ended"])
        #expect(disk.watches.isEmpty && watch.translation.watchDescriptors.isEmpty)
    }

    @Test("a watched file follows its rename, and a rename over it (an editor's save) is a modification")
    func watchedFile() {
        let disk = MemoryTree()
        disk.touch("f")
        let watch = disk.start(file: "f")
        #expect(watch.deliver(disk.event("", IN_MODIFY, "other")).isEmpty, "only the file concerns it")
        #expect(watch.deliver(disk.move(from: ("", "f"), to: ("", "g"))) == ["moved f -> g"])
        #expect(watch.deliver(disk.move(from: ("", "g.swp"), to: ("", "g"))) == ["modified g"])
        #expect(watch.deliver(disk.event("", IN_DELETE, "g")) == ["deleted g"])
    }
}

/// A translation under test, with its outputs rendered as short lines.
struct Watch {
    let translation: WatchTranslation
    let disk: MemoryTree

    func deliver(_ delivery: InotifyDelivery) -> [String] {
        translation.handle(delivery, system: disk)
        return disk.takeOutputs().map(Self.line)
    }

    static func line(_ output: WatchOutput) -> String {
        switch output {
        case .event(let event):
            let name = event.relativePath.isEmpty ? "(root)" : event.relativePath.string
            let destination = event.relativeDestination.map { " -> \($0)" } ?? ""
            return "\(event.kind) \(name)\(destination)\(event.isDirectory ? "/" : "")"
        case .cookieSeen(let name): return "cookie \(name)"
        case .lost(let cause): return "lost \(cause)"
        case .unwatched(let paths): return "unwatched " + paths.map { MemoryTree.relative($0) }.joined(separator: " ")
        case .ended: return "ended"
        }
    }
}

/// A file tree in memory, as a ``WatchSystem``: inodes, watches by inode, a watch limit.
final class MemoryTree: WatchSystem {
    static let root = "/w"
    private(set) var items: [String: (isDirectory: Bool, inode: UInt64)] = [MemoryTree.root: (true, 1)]
    private(set) var watches: [Int32: UInt64] = [:]
    var limit = Int.max
    var watchHeadroom = 64
    private var outputs: [WatchOutput] = []
    private var nextInode: UInt64 = 2
    private var nextWD: Int32 = 1

    func start(headroom: Int = 64, file: String? = nil) -> Watch {
        let root = file.map { FilePath(Self.root + "/" + $0) } ?? FilePath(Self.root)
        watchHeadroom = headroom
        let translation = WatchTranslation(root: root, rootIsDirectory: file == nil, recursive: file == nil)
        let started = translation.start(system: self)
        #expect((try? started.get()) != nil)
        #expect(takeOutputs().isEmpty, "a start reports nothing")
        return Watch(translation: translation, disk: self)
    }

    private func absolute(_ relative: String) -> String { relative.isEmpty ? Self.root : Self.root + "/" + relative }
    static func relative(_ path: FilePath) -> String { String(path.string.dropFirst(root.count + 1)) }

    func mkdir(_ path: String) { items[absolute(path)] = (true, nextInode); nextInode += 1 }
    func touch(_ path: String) { items[absolute(path)] = (false, nextInode); nextInode += 1 }
    func remove(_ path: String) {
        let full = absolute(path)
        items = items.filter { $0.key != full && !$0.key.hasPrefix(full + "/") }
    }
    func move(_ source: String, _ destination: String) {
        let from = absolute(source), to = absolute(destination)
        for (path, item) in items where path == from || path.hasPrefix(from + "/") {
            items[path] = nil
            items[to + path.dropFirst(from.count)] = item
        }
    }

    func wd(of path: String) -> Int32? {
        guard let inode = items[absolute(path)]?.inode else { return nil }
        return watches.first { $0.value == inode }?.key
    }

    func event(_ directory: String, _ mask: Int32, _ name: String) -> InotifyDelivery {
        .event(InotifyEvent(wd: wd(of: directory) ?? -1, mask: UInt32(bitPattern: mask), cookie: 0, name: Array(name.utf8)))
    }

    func move(from: (String, String), to: (String, String), directory: Bool = false) -> InotifyDelivery {
        let isDirectory = directory ? UInt32(IN_ISDIR) : 0
        return .move(from: InotifyEvent(wd: wd(of: from.0) ?? -1, mask: UInt32(IN_MOVED_FROM) | isDirectory, cookie: 1, name: Array(from.1.utf8)),
                     to: InotifyEvent(wd: wd(of: to.0) ?? -1, mask: UInt32(IN_MOVED_TO) | isDirectory, cookie: 1, name: Array(to.1.utf8)))
    }

    // MARK: WatchSystem

    func addWatch(_ path: FilePath, followingLink: Bool) -> Result<Int32, FileCoordinationError> {
        guard let item = items[path.string], item.isDirectory else {
            return .failure(FileCoordinationError("inotify_add_watch", errno: .noSuchFileOrDirectory, path: path))
        }
        if let wd = watches.first(where: { $0.value == item.inode })?.key { return .success(wd) }
        guard watches.count < limit else {
            return .failure(FileCoordinationError(code: .watchLimitReached, path: path, operation: "inotify_add_watch",
                                                  errno: .noSpace, message: "the watch limit is reached"))
        }
        defer { nextWD += 1 }
        watches[nextWD] = item.inode
        return .success(nextWD)
    }

    func removeWatch(_ wd: Int32) { watches[wd] = nil }

    func list(_ directory: FilePath) -> [WatchEntry] {
        onList?(directory)
        let prefix = directory.string + "/"
        return items.filter { $0.key.hasPrefix(prefix) && !$0.key.dropFirst(prefix.count).contains("/") }
            .sorted { $0.key < $1.key }
            .map { WatchEntry(name: Array($0.key.dropFirst(prefix.count).utf8), isDirectory: $0.value.isDirectory, inode: $0.value.inode) }
    }

    func inode(_ path: FilePath) -> UInt64 { items[path.string]?.inode ?? 0 }

    func carryOut(_ output: WatchOutput) { outputs.append(output) }

    /// The outputs carried out so far and not yet taken, as lines.
    var pending: [String] { outputs.map(Watch.line) }
    /// Called at each listing (a test looks at what has gone out by then).
    var onList: ((FilePath) -> Void)?

    func takeOutputs() -> [WatchOutput] {
        defer { outputs = [] }
        return outputs
    }
}
