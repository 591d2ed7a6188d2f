@_spi(FileCoordinationInternal) import AsyncFileIO
import CInotifyTools
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A change seen in a watched file or directory tree.
public struct FileEvent: Sendable, Hashable, CustomStringConvertible {
    /// What happened.
    public enum Kind: Sendable, Hashable {
        /// The item appeared (created, or moved in from outside the watched tree).
        case created
        /// The item's content changed (consecutive modifications are reported once).
        case modified
        /// The item's metadata changed (permissions, owner, timestamps, link count).
        case attributesChanged
        /// The item was renamed within the watched tree: from ``FileEvent/path`` to
        /// ``FileEvent/destination``. The two halves of the rename arrive as one event.
        case moved
        /// The item disappeared (deleted, or moved out of the watched tree).
        case deleted
        /// Events were lost (the kernel queue or this watcher's buffer overflowed). The
        /// watcher rescanned its tree, reporting what it found different as created or
        /// deleted, and the consumer should re-read whatever it derives from the tree.
        case resync
    }

    /// What happened.
    public var kind: Kind
    /// The item (for ``Kind/moved``, where it was).
    public var path: FilePath
    /// For ``Kind/moved``: where it is now.
    public var destination: FilePath?
    /// Whether the item is a directory.
    public var isDirectory: Bool

    /// An event.
    public init(_ kind: Kind, _ path: FilePath, destination: FilePath? = nil, isDirectory: Bool = false) {
        self.kind = kind
        self.path = path
        self.destination = destination
        self.isDirectory = isDirectory
    }

    /// `KIND PATH[ -> DESTINATION][ (directory)]`.
    public var description: String {
        let directory = isDirectory ? " (directory)" : ""
        if let destination { return "\(kind) \(path) -> \(destination)\(directory)" }
        return "\(kind) \(path)\(directory)"
    }
}

/// Watches a file, or a directory and (optionally) everything inside it, and delivers what
/// changes as an asynchronous sequence of ``FileEvent``s, whoever made the change.
///
/// ```swift
/// let watcher = try await FileWatcher(watching: "/srv/site", recursive: true)
/// for try await event in watcher {
///     print(event)          // created /srv/site/new.html, moved /a -> /b, ...
/// }
/// ```
///
/// - Recursive watching has no blind spot: a directory that appears is watched first and
///   listed second, so files created inside it before its watch existed are reported
///   too (`mkdir -p a/b/c && touch a/b/c/f` never loses `f`).
/// - A rename inside the tree is one ``FileEvent/Kind/moved`` event; a subtree moved out
///   is reported deleted and is no longer watched under its old path.
/// - ``sync()`` returns once every event caused before it is in the sequence, so a test
///   can change files, sync, and assert, without sleeping.
/// - Back-pressure: events wait in a buffer of ``bufferLimit`` entries. A consumer that
///   falls further behind loses events and then receives ``FileEvent/Kind/resync``.
/// - All inotify work happens on the library's single watcher thread. ``cancel()`` (or
///   ending the iteration) removes every watch.
///
/// One consumer iterates a watcher; ``sync()`` and ``cancel()`` may be called from any task.
public final class FileWatcher: AsyncSequence, Sendable {
    public typealias Element = FileEvent

    /// The watched file or directory.
    public let root: FilePath
    /// Events the buffer holds before it overflows into a ``FileEvent/Kind/resync``.
    public let bufferLimit: Int

    let tree: WatchTree
    private let syncCounter = Atomic<Int>(0)

    /// Starts watching `path`. For a directory, `recursive` extends the watch to
    /// everything inside it, present and future; for a file, events concern that file.
    ///
    /// - Throws: ``FileCoordinationError`` naming the path: ``FileCoordinationError/Code/notFound``,
    ///   or ``FileCoordinationError/Code/watchLimitReached`` naming the kernel limit to raise.
    ///
    /// - Parameter settle: coalescing, off by default. With an interval, an event is held
    ///   that long, and the same event repeated meanwhile (a burst of writes to one file,
    ///   say) is delivered once, in the order of first occurrence.
    public init(watching path: FilePath, recursive: Bool = true, bufferLimit: Int = 65536,
                settle: Duration? = nil) async throws {
        root = path.lexicallyNormalized()
        self.bufferLimit = Swift.max(1, bufferLimit)
        let isDirectory = try await runOnIOThread { () throws -> Bool in
            var info = stat()
            guard path.withPlatformString({ stat($0, &info) }) == 0 else {
                throw FileCoordinationError("stat", errno: Errno(rawValue: errno), path: path)
            }
            return info.st_mode & S_IFMT == S_IFDIR
        }
        tree = WatchTree(root: root, rootIsDirectory: isDirectory, recursive: recursive && isDirectory,
                         bufferLimit: self.bufferLimit, settle: settle)
        try await tree.start()
    }

    deinit {
        tree.stop()
    }

    /// Returns once every event caused before the call has been put into this sequence.
    ///
    /// It creates a hidden cookie file (`.filecoord-sync-…`) in the watched directory (or
    /// the watched file's directory) and waits for its own creation to come through the
    /// same inotify queue, after everything before it; the cookie's events are not
    /// reported, and the file is removed.
    public func sync() async throws {
        let name = ".filecoord-sync-\(getpid())-\(syncCounter.add(1, ordering: .relaxed).newValue)"
        let cookie = tree.syncDirectory.appending(name)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            tree.expectCookie(name, continuation)
            Task {
                do {
                    try await runOnIOThread { () throws in
                        let fd = cookie.withPlatformString { open($0, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600) }
                        guard fd >= 0 else { throw FileCoordinationError("open", errno: Errno(rawValue: errno), path: cookie) }
                        close(fd)
                    }
                } catch {
                    tree.failCookie(name, error)
                }
            }
        }
        _ = try? await runOnIOThread { _ = cookie.withPlatformString { unlink($0) } }
    }

    /// The next event with its sequence number (for the coordination module's presenter
    /// watching, which drops the events of writes it has already reported).
    @_spi(FileCoordinationInternal)
    public func nextSequenced() async throws -> (FileEvent, UInt64)? {
        guard let event = try await tree.next() else { return nil }
        return (event, tree.lastSequence)
    }

    /// Syncs, then returns the sequence number up to which every event caused before the
    /// call has been buffered.
    @_spi(FileCoordinationInternal)
    public func syncMark() async throws -> UInt64 {
        try await sync()
        return tree.appendedCount
    }

    /// The sequence number up to which events read from inotify so far are buffered,
    /// without a sync. On the watcher thread, while it handles an event, this covers every
    /// event of this watcher that the kernel queued before that one: the process has one
    /// inotify queue, read in order.
    @_spi(FileCoordinationInternal)
    public var bufferedMark: UInt64 { tree.appendedCount }

    /// Stops watching: the watches are removed and the sequence ends.
    public func cancel() {
        tree.stop()
    }

    /// The number of inotify watches this watcher holds (one per watched directory).
    public func watchCount() async -> Int {
        await tree.watchCount()
    }

    /// The iterator of the watcher's one consumer.
    public func makeAsyncIterator() -> Iterator {
        Iterator(tree: tree)
    }

    /// Delivers events; a watcher has one consumer.
    public struct Iterator: AsyncIteratorProtocol {
        let tree: WatchTree

        /// The next event; nil once the watcher is cancelled or its root is gone.
        /// Throws `CancellationError` if the consuming task is cancelled.
        public mutating func next() async throws -> FileEvent? {
            try await tree.next()
        }
    }
}

/// The watcher's state. Event handling runs on the watcher thread (as an
/// ``InotifyClient``); the consumer takes events from the buffer.
final class WatchTree: InotifyClient, @unchecked Sendable {
    let root: FilePath
    let rootIsDirectory: Bool
    let recursive: Bool
    let bufferLimit: Int
    let settle: Duration?
    /// Coalesced events waiting for the consumer (consumer-owned: one consumer).
    private nonisolated(unsafe) var settled: [(FileEvent, UInt64)] = []
    /// Where sync cookies go: the root directory, or the watched file's directory.
    let syncDirectory: FilePath
    /// The root's bytes, for the per-event prefix test.
    private let rootBytes: [UInt8]

    static let cookiePrefix: [UInt8] = Array(".filecoord-sync-".utf8)
    static let temporaryMarker: [UInt8] = Array(".filecoord-".utf8)

    /// Transient names that are not entries: sync cookies, the temporaries atomic writes
    /// rename into place (`.NAME.filecoord-PID-N-R`), and unnamed `O_TMPFILE`s being
    /// written (`#INODE`). Watchers never report them.
    static func isInternal(_ name: [UInt8]) -> Bool {
        // An unnamed O_TMPFILE being written shows up as `#<inode number>`: not an entry.
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
    static let mask = UInt32(IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO
        | IN_DELETE_SELF | IN_MOVE_SELF) | UInt32(IN_DONT_FOLLOW) | UInt32(IN_EXCL_UNLINK)

    // MARK: Shared with the consumer (under the lock)

    private struct Buffer {
        var events: [FileEvent] = []
        /// The sequence number of each buffered event (events appended so far, counting up).
        var sequences: [UInt64] = []
        var appended: UInt64 = 0
        var head = 0
        var lost = false
        var finished = false
        var waiter: CheckedContinuation<Void, Never>?
        var cookies: [String: CheckedContinuation<Void, any Error>] = [:]

        var count: Int { events.count - head }
    }
    private let buffer = Mutex(Buffer())

    // MARK: Owned by the watcher thread

    private var watches: [Int32: FilePath] = [:]
    /// The watched file's current name (a file watcher follows renames within its directory).
    private var currentRoot: FilePath
    private var known: Set<[UInt8]> = []
    private var directories: Set<[UInt8]> = []
    private var stopped = false

    init(root: FilePath, rootIsDirectory: Bool, recursive: Bool, bufferLimit: Int, settle: Duration? = nil) {
        self.root = root
        self.settle = settle
        self.rootIsDirectory = rootIsDirectory
        self.recursive = recursive
        self.bufferLimit = bufferLimit
        syncDirectory = rootIsDirectory ? root : root.removingLastComponent()
        currentRoot = root
        rootBytes = root.platformBytes
    }

    /// Adds the first watches and learns the tree, on the watcher thread.
    func start() async throws {
        let result: Result<Void, FileCoordinationError> = await withCheckedContinuation { continuation in
            InotifyThread.shared.perform { thread in
                let directory = self.syncDirectory
                switch thread.addWatch(directory, mask: Self.mask, client: self) {
                case .failure(let error):
                    continuation.resume(returning: .failure(error))
                case .success(let wd):
                    self.watches[wd] = directory
                    if self.rootIsDirectory { self.scan(directory, report: false, thread: thread) } else {
                        if Self.exists(self.root) { self.known.insert(self.root.platformBytes) }
                    }
                    continuation.resume(returning: .success(()))
                }
            }
        }
        try result.get()
    }

    func stop() {
        let (waiter, cookies) = buffer.withLock { buffer -> (CheckedContinuation<Void, Never>?, [CheckedContinuation<Void, any Error>]) in
            guard !buffer.finished else { return (nil, []) }
            buffer.finished = true
            defer { buffer.waiter = nil; buffer.cookies.removeAll() }
            return (buffer.waiter, Array(buffer.cookies.values))
        }
        waiter?.resume()
        // A sync can no longer complete: its cookie will not be seen.
        for cookie in cookies { cookie.resume(throwing: CancellationError()) }
        InotifyThread.shared.perform { thread in
            self.stopped = true
            for (wd, directory) in self.watches {
                // A directory already gone (a tree deleted right after its watcher was
                // cancelled) may have had its watch dropped by the kernel.
                let gone = directory.withPlatformString { access($0, F_OK) } != 0
                thread.removeWatch(wd, client: self, mayBeGone: gone)
            }
            self.watches.removeAll()
        }
    }

    /// The watch descriptors held (tests).
    func watchDescriptors() async -> [Int32] {
        await withCheckedContinuation { continuation in
            InotifyThread.shared.perform { _ in continuation.resume(returning: Array(self.watches.keys)) }
        }
    }

    func watchCount() async -> Int {
        await withCheckedContinuation { continuation in
            InotifyThread.shared.perform { _ in continuation.resume(returning: self.watches.count) }
        }
    }

    // MARK: Consumer side

    /// The sequence number of the event `next()` returned last (one consumer).
    private(set) nonisolated(unsafe) var lastSequence: UInt64 = 0

    /// How many events have been put into the buffer so far: after `sync()`, every
    /// event caused before it has a sequence number up to this.
    var appendedCount: UInt64 { buffer.withLock { $0.appended } }

    func next() async throws -> FileEvent? {
        guard let settle else { return try await nextBuffered() }
        if !settled.isEmpty {
            let (event, sequence) = settled.removeFirst()
            lastSequence = sequence
            return event
        }
        guard let first = try await nextBuffered() else { return nil }
        var batch = [(first, lastSequence)]
        try await Task.sleep(for: settle) // the settle interval is the point: real time
        while let more = takeBuffered() { batch.append(more) }
        // One of each event, where it first happened, numbered as its last copy (as in
        // `emit`: a suppression covering the first copy must not swallow a later one).
        var position: [FileEvent: Int] = [:]
        settled = []
        for (event, sequence) in batch {
            if let index = position[event] {
                settled[index].1 = sequence
            } else {
                position[event] = settled.count
                settled.append((event, sequence))
            }
        }
        let (event, sequence) = settled.removeFirst()
        lastSequence = sequence
        return event
    }

    /// One buffered event with its sequence number, without waiting.
    private func takeBuffered() -> (FileEvent, UInt64)? {
        buffer.withLock { buffer in
            guard buffer.count > 0 else { return nil }
            let result = (buffer.events[buffer.head], buffer.sequences[buffer.head])
            buffer.head += 1
            if buffer.head == buffer.events.count {
                buffer.events.removeAll(keepingCapacity: true)
                buffer.sequences.removeAll(keepingCapacity: true)
                buffer.head = 0
            }
            return result
        }
    }

    private func nextBuffered() async throws -> FileEvent? {
        while true {
            try Task.checkCancellation()
            let event: FileEvent?? = buffer.withLock { buffer in
                if buffer.count > 0 {
                    let event = buffer.events[buffer.head]
                    lastSequence = buffer.sequences[buffer.head]
                    buffer.head += 1
                    if buffer.head == buffer.events.count {
                        buffer.events.removeAll(keepingCapacity: true)
                        buffer.sequences.removeAll(keepingCapacity: true)
                        buffer.head = 0
                    }
                    return .some(event)
                }
                if buffer.lost {
                    buffer.lost = false
                    return .some(FileEvent(.resync, root, isDirectory: rootIsDirectory))
                }
                return buffer.finished ? .some(nil) : .none
            }
            if let event { return event }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let ready = buffer.withLock { buffer in
                        if buffer.count > 0 || buffer.lost || buffer.finished || Task.isCancelled { return true }
                        buffer.waiter = continuation
                        return false
                    }
                    if ready { continuation.resume() }
                }
            } onCancel: {
                let waiter = buffer.withLock { buffer in
                    defer { buffer.waiter = nil }
                    return buffer.waiter
                }
                waiter?.resume()
            }
        }
    }

    /// Takes every buffered event without waiting (tests: after `sync()`, what is buffered
    /// is everything that happened).
    func drain() -> [FileEvent] {
        buffer.withLock { buffer in
            var events = Array(buffer.events[buffer.head...])
            buffer.events.removeAll(keepingCapacity: true)
            buffer.sequences.removeAll(keepingCapacity: true)
            buffer.head = 0
            if buffer.lost {
                buffer.lost = false
                events.append(FileEvent(.resync, root, isDirectory: rootIsDirectory))
            }
            return events
        }
    }

    func expectCookie(_ name: String, _ continuation: CheckedContinuation<Void, any Error>) {
        let stopped = buffer.withLock { buffer in
            if buffer.finished { return true }
            buffer.cookies[name] = continuation
            return false
        }
        if stopped { continuation.resume(throwing: CancellationError()) }
    }

    func failCookie(_ name: String, _ error: any Error) {
        let continuation = buffer.withLock { $0.cookies.removeValue(forKey: name) }
        continuation?.resume(throwing: error)
    }

    // MARK: Watcher thread: events

    private func emit(_ event: FileEvent) {
        let waiter: CheckedContinuation<Void, Never>? = buffer.withLock { buffer in
            guard !buffer.finished else { return nil }
            // Consecutive modifications of one item are one event, numbered as the later
            // one: it reports a change that may come after a sync point (a suppression
            // that covers the earlier one must not swallow it).
            if event.kind == .modified, buffer.count > 0, buffer.events.last == event {
                buffer.appended += 1
                buffer.sequences[buffer.sequences.count - 1] = buffer.appended
                return nil
            }
            if buffer.count >= bufferLimit {
                buffer.lost = true
            } else {
                buffer.appended += 1
                buffer.events.append(event)
                buffer.sequences.append(buffer.appended)
            }
            defer { buffer.waiter = nil }
            return buffer.waiter
        }
        waiter?.resume()
    }

    func handle(_ delivery: InotifyDelivery, thread: InotifyThread.OnThread) {
        guard !stopped else { return }
        switch delivery {
        case .overflow:
            rescan(thread: thread)
        case .move(let from, let to):
            guard let fromDirectory = watches[from.wd], let toDirectory = watches[to.wd] else { return }
            let source = Self.child(fromDirectory, from.name)
            let destination = Self.child(toDirectory, to.name)
            let isDirectory = from.mask & UInt32(IN_ISDIR) != 0
            if Self.isInternal(from.name) {
                // An atomic write renaming its temporary into place: the destination
                // appeared, or changed.
                guard concerns(destination) else { return }
                if known.insert(destination.platformBytes).inserted {
                    emit(FileEvent(.created, destination, isDirectory: isDirectory))
                } else {
                    emit(FileEvent(.modified, destination, isDirectory: isDirectory))
                }
                return
            }
            let (sourceInside, destinationInside) = (concerns(source), concerns(destination))
            if sourceInside && destinationInside {
                renameKnown(from: source, to: destination, isDirectory: isDirectory)
                emit(FileEvent(.moved, source, destination: destination, isDirectory: isDirectory))
            } else if !rootIsDirectory && destinationInside {
                // The watched file was replaced by a rename (an editor's save): it changed.
                known.insert(destination.platformBytes)
                emit(FileEvent(.modified, destination))
            } else if !rootIsDirectory && sourceInside {
                // The watched file itself was renamed: it lives on under the new name, and
                // within its directory the watcher follows it there.
                known.remove(source.platformBytes)
                if destination.removingLastComponent() == syncDirectory {
                    currentRoot = destination
                    known.insert(destination.platformBytes)
                }
                emit(FileEvent(.moved, source, destination: destination))
            } else if sourceInside {
                forget(source, isDirectory: isDirectory, thread: thread)
                emit(FileEvent(.deleted, source, isDirectory: isDirectory))
            } else if destinationInside {
                appeared(destination, isDirectory: isDirectory, thread: thread)
            }
        case .event(let event):
            handle(event, thread: thread)
        }
    }

    private func handle(_ event: InotifyEvent, thread: InotifyThread.OnThread) {
        let mask = event.mask
        guard let directory = watches[event.wd] else { return }
        if mask & UInt32(IN_IGNORED) != 0 {
            watches[event.wd] = nil
            return
        }
        if mask & UInt32(IN_DELETE_SELF | IN_MOVE_SELF) != 0 {
            if directory == syncDirectory && (rootIsDirectory || directory == root) {
                emit(FileEvent(.deleted, directory, isDirectory: true))
                stop()
            }
            return
        }
        guard !event.name.isEmpty else { return }
        if event.name.starts(with: Self.cookiePrefix), directory == syncDirectory {
            if mask & UInt32(IN_CREATE) != 0 {
                let name = String(decoding: event.name, as: UTF8.self)
                let continuation = buffer.withLock { $0.cookies.removeValue(forKey: name) }
                continuation?.resume()
            }
            return
        }
        if Self.isInternal(event.name) { return }
        let path = Self.child(directory, event.name)
        guard concerns(path) else { return }
        let isDirectory = mask & UInt32(IN_ISDIR) != 0
        if mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0 {
            appeared(path, isDirectory: isDirectory, thread: thread)
        } else if mask & UInt32(IN_DELETE | IN_MOVED_FROM) != 0 {
            forget(path, isDirectory: isDirectory, thread: thread)
            emit(FileEvent(.deleted, path, isDirectory: isDirectory))
        } else if mask & UInt32(IN_MODIFY) != 0 {
            emit(FileEvent(.modified, path, isDirectory: isDirectory))
        } else if mask & UInt32(IN_ATTRIB) != 0 {
            emit(FileEvent(.attributesChanged, path, isDirectory: isDirectory))
        }
    }

    /// Whether `path` is something this watcher reports on.
    private func concerns(_ path: FilePath) -> Bool {
        // Bytes, not `FilePath.starts(with:)`: this runs for every event, and the
        // component-wise comparison cost more than the rest of the event's handling.
        guard rootIsDirectory else { return path == currentRoot }
        return path.withPlatformString { inner in
            let count = strlen(inner)
            return rootBytes.withUnsafeBytes { outer in
                count > outer.count && memcmp(inner, outer.baseAddress!, outer.count) == 0
                    && (outer.last == UInt8(ascii: "/") || inner[outer.count] == CChar(UInt8(ascii: "/")))
            }
        }
    }

    /// A new item: report it; a new directory is watched first, then listed, so that what
    /// was created inside it before the watch existed is reported too.
    private func appeared(_ path: FilePath, isDirectory: Bool, thread: InotifyThread.OnThread) {
        if known.insert(path.platformBytes).inserted {
            emit(FileEvent(.created, path, isDirectory: isDirectory))
        }
        if isDirectory && recursive { watchAndScan(path, thread: thread) }
    }

    private func watchAndScan(_ directory: FilePath, thread: InotifyThread.OnThread) {
        directories.insert(directory.platformBytes)
        if case .success(let wd) = thread.addWatch(directory, mask: Self.mask, client: self) {
            watches[wd] = directory
        }
        scan(directory, report: true, thread: thread)
    }

    /// Lists a directory (recursively when watching recursively), learning its entries
    /// and reporting those not known yet.
    private func scan(_ directory: FilePath, report: Bool, thread: InotifyThread.OnThread) {
        for (name, isDirectory) in Self.list(directory) {
            let path = Self.child(directory, name)
            if Self.isInternal(name) { continue }
            if known.insert(path.platformBytes).inserted, report {
                emit(FileEvent(.created, path, isDirectory: isDirectory))
            }
            if isDirectory && recursive {
                directories.insert(path.platformBytes)
                if case .success(let wd) = thread.addWatch(path, mask: Self.mask, client: self) { watches[wd] = path }
                scan(path, report: report, thread: thread)
            }
        }
    }

    /// An item left the tree: forget it and, for a directory, stop watching inside it.
    private func forget(_ path: FilePath, isDirectory: Bool, thread: InotifyThread.OnThread) {
        let prefix = path.platformBytes
        known = known.filter { !FilePath.isAtOrInside($0, prefix) }
        guard isDirectory else { return }
        directories = directories.filter { !FilePath.isAtOrInside($0, prefix) }
        for (wd, watched) in watches where FilePath.isAtOrInside(watched.platformBytes, prefix) {
            thread.removeWatch(wd, client: self, mayBeGone: true)
            watches[wd] = nil
        }
    }

    /// A rename inside the tree: what was known under the old name is known under the new.
    private func renameKnown(from source: FilePath, to destination: FilePath, isDirectory: Bool) {
        let (old, new) = (source.platformBytes, destination.platformBytes)
        func rebase(_ bytes: [UInt8]) -> [UInt8] { FilePath.isAtOrInside(bytes, old) ? new + bytes[old.count...] : bytes }
        known = Set(known.map(rebase))
        if isDirectory {
            directories = Set(directories.map(rebase))
            for (wd, watched) in watches {
                let rebased = rebase(watched.platformBytes)
                watches[wd] = FilePath(platformBytes: rebased)
            }
        }
    }

    /// After an overflow: compare the tree with what is known, report the difference,
    /// then a resync.
    private func rescan(thread: InotifyThread.OnThread) {
        let before = known
        known.removeAll()
        if rootIsDirectory {
            scan(root, report: false, thread: thread)
        } else if Self.exists(root) {
            known.insert(root.platformBytes)
        }
        for added in known.subtracting(before).sorted(by: { $0.count < $1.count }) {
            emit(FileEvent(.created, FilePath(platformBytes: added), isDirectory: directories.contains(added)))
        }
        for removed in before.subtracting(known).sorted(by: { $0.count > $1.count }) {
            emit(FileEvent(.deleted, FilePath(platformBytes: removed)))
        }
        buffer.withLock { $0.lost = true }
        emit(FileEvent(.resync, root, isDirectory: rootIsDirectory))
        buffer.withLock { $0.lost = false }
    }

    // MARK: Helpers (watcher thread; blocking calls are fine on this thread)

    /// The entry `name` (one component, as inotify or readdir gave it) of `directory`,
    /// built from bytes in one step.
    static func child(_ directory: FilePath, _ name: [UInt8]) -> FilePath {
        directory.withPlatformString { base in
            let length = strlen(base)
            let slash = length > 0 && base[length - 1] == CChar(UInt8(ascii: "/")) ? 0 : 1
            return withUnsafeTemporaryAllocation(of: CChar.self, capacity: length + slash + name.count + 1) { buffer in
                let start = buffer.baseAddress!
                memcpy(start, base, length)
                if slash == 1 { start[length] = CChar(UInt8(ascii: "/")) }
                name.withUnsafeBytes { if let bytes = $0.baseAddress { memcpy(start + length + slash, bytes, name.count) } }
                start[length + slash + name.count] = 0
                return FilePath(platformString: start)
            }
        }
    }

    static func exists(_ path: FilePath) -> Bool {
        var info = stat()
        return path.withPlatformString { lstat($0, &info) } == 0
    }

    /// The entries of a directory with whether each is a directory (not following links).
    static func list(_ directory: FilePath) -> [([UInt8], Bool)] {
        guard let handle = directory.withPlatformString({ opendir($0) }) else { return [] }
        defer { closedir(handle) }
        var entries: [([UInt8], Bool)] = []
        while let entry = readdir(handle) {
            let name: [UInt8] = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                Array(raw.prefix { $0 != 0 })
            }
            if name == [0x2E] || name == [0x2E, 0x2E] { continue }
            var isDirectory = entry.pointee.d_type == UInt8(DT_DIR)
            if entry.pointee.d_type == UInt8(DT_UNKNOWN) {
                var info = stat()
                let full = child(directory, name)
                isDirectory = full.withPlatformString { lstat($0, &info) } == 0 && info.st_mode & S_IFMT == S_IFDIR
            }
            entries.append((name, isDirectory))
        }
        return entries
    }
}
