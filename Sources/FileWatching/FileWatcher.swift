import AsyncFileIO
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

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
///   too (`mkdir -p a/b/c && touch a/b/c/f` never loses `f`), and each item once.
/// - A rename inside the tree is one ``FileEvent/Kind/moved`` event; a subtree moved out
///   is reported deleted and is no longer watched. A name reused later (a directory
///   deleted, or renamed away, and made again) is watched anew.
/// - For tests: ``sync(timeout:)`` returns once every event caused before it is in the
///   sequence, ``settle(timeout:)`` returns exactly those events, and
///   ``first(timeout:where:)`` waits for one, failing with what it saw.
/// - Back-pressure: events wait in a buffer of ``bufferLimit`` entries. A consumer that
///   falls further behind loses events and then receives ``FileEvent/Kind/resync``.
/// - All inotify work happens on the library's single watcher thread. ``cancel()``,
///   cancelling the task that iterates, or the end of ``withFileWatcher(watching:recursive:filter:isolation:_:)``
///   removes every watch. Ending an iteration with `break` does not: the watcher can be
///   iterated again, and is stopped by ``cancel()`` or when it is released.
/// - Any number of tasks may iterate at once; each event goes to one of them.
///
/// A symbolic link to a directory given as the root is followed (the directory is
/// watched; events are reported under the path given). Links inside the tree are reported as entries, not
/// followed. A directory reached twice (through a bind mount) is watched once. Hard
/// links are one file: a change through one name is reported under the name the kernel
/// gives, which is the one in a watched directory.
public final class FileWatcher: AsyncSequence, Sendable {
    public typealias Element = FileEvent

    /// The watched file or directory, as given.
    public let root: FilePath
    /// Events the buffer holds before it overflows into a ``FileEvent/Kind/resync``.
    public let bufferLimit: Int
    /// The events delivered.
    public let filter: FileEventFilter
    /// How long ``sync(timeout:)`` waits by default.
    public static let defaultSyncTimeout = Duration.seconds(30)

    let tree: WatchTree
    /// The watched directory (a watched file's directory) when watching began: a sync
    /// checks that the path still leads there.
    private let syncDirectoryIdentity: DirectoryIdentity
    private let settleInterval: Duration?
    private static let syncCounter = Atomic<Int>(0)
    /// Coalesced events taken from the buffer and not yet delivered (with a settle interval).
    private let held = Locked<[(FileEvent, UInt64)]>([])
    private let lastSequence = Atomic<UInt64>(0)

    /// Starts watching `path`. For a directory, `recursive` extends the watch to
    /// everything inside it, present and future; for a file, events concern that file.
    ///
    /// - Throws: ``FileCoordinationError`` naming the path: ``FileCoordinationError/Code/notFound``,
    ///   or ``FileCoordinationError/Code/watchLimitReached`` naming the kernel limit to raise.
    ///
    /// - Parameter settle: coalescing, off by default. With an interval, an event is held
    ///   that long, and the same event repeated meanwhile (a burst of writes to one file,
    ///   say) is delivered once, in the order of first occurrence.
    /// - Parameter filter: which events are delivered (all by default).
    public convenience init(watching path: FilePath, recursive: Bool = true, bufferLimit: Int = 65536,
                            settle: Duration? = nil, filter: FileEventFilter = .all) async throws {
        try await self.init(watching: path, recursive: recursive, bufferLimit: bufferLimit, settle: settle, filter: filter,
                            reportingExisting: false)
    }

    /// ``init(watching:recursive:bufferLimit:settle:filter:)`` that, with
    /// `reportingExisting`, reports what is there when watching begins as created: the
    /// root itself first, then (for a directory) every entry the first listing finds. For
    /// an item that has just appeared, whose contents nobody has heard of yet. `metrics`:
    /// where its overflows and resyncs are counted (tests give a set of their own).
    package init(watching path: FilePath, recursive: Bool = true, bufferLimit: Int = 65536,
                 settle: Duration? = nil, filter: FileEventFilter = .all, reportingExisting: Bool,
                 metrics: WatchMetrics = .standard) async throws {
        root = path.normalizedKeepingParents()
        self.bufferLimit = Swift.max(1, bufferLimit)
        self.filter = filter
        settleInterval = settle
        let (isDirectory, directory) = try await runOnIOThread { () throws -> (Bool, DirectoryIdentity) in
            // stat, not lstat: a link to a directory is watched as that directory.
            var info = try path.withPlatformString { Syscall.stat(path: $0) }.mapError(.stat, path).get()
            let isDirectory = info.st_mode & S_IFMT == S_IFDIR
            if !isDirectory {
                let parent = path.removingLastComponent()
                info = try parent.withPlatformString { Syscall.stat(path: $0) }.mapError(.stat, parent).get()
            }
            return (isDirectory, DirectoryIdentity(device: UInt64(info.st_dev), inode: UInt64(info.st_ino)))
        }
        syncDirectoryIdentity = directory
        tree = WatchTree(root: root, rootIsDirectory: isDirectory, recursive: recursive && isDirectory,
                         bufferLimit: self.bufferLimit, filter: filter, metrics: metrics)
        try await tree.start(reportingExisting: reportingExisting)
    }

    deinit {
        tree.stop()
    }

    // MARK: Waiting for events

    /// Returns once every event caused before the call has been put into this sequence.
    ///
    /// It creates a hidden marker file (`.filecoord-sync-…`) in the watched directory (or
    /// the watched file's directory) and waits for its own creation to come through the
    /// same inotify queue, after everything before it; the marker's events are not
    /// reported, and the file is removed. A directory this process cannot write (a
    /// read-only tree) cannot be synced: the call fails with the `open` error.
    ///
    /// - Throws: ``FileCoordinationError/Code/timedOut`` after `timeout`;
    ///   ``FileCoordinationError/Code/cancelled`` once the watcher has stopped.
    public func sync(timeout: Duration = FileWatcher.defaultSyncTimeout) async throws {
        // Unique in the process: watchers of one directory (presenters of two files in
        // it) must not take each other's markers.
        let name = ".filecoord-sync-\(getpid())-\(Self.syncCounter.add(1, ordering: .relaxed).newValue)"
        let marker = tree.syncDirectory.appending(name)
        let buffer = tree.buffer
        let timer = Locked<Task<Void, Never>?>(nil)
        defer { timer.withLock { $0?.cancel() } }
        let root = root
        do {
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    guard buffer.expectCookie(name, continuation) else {
                        continuation.resume(throwing: stoppedError(.sync))
                        return
                    }
                    // Started once the marker is registered, so that it cannot fire before.
                    // Both tasks on the library's I/O threads: a sync is awaited by
                    // coordinations that the blocking forms run, whose callers may hold
                    // every thread of the cooperative pool.
                    timer.withLock {
                        $0 = Task(executorPreference: ioThreadTaskExecutor) {
                            try? await Task.sleep(for: timeout) // the caller's time limit
                            guard !Task.isCancelled else { return }
                            buffer.failCookie(name, FileCoordinationError(.sync, 
                                code: .timedOut, path: root, errno: .timedOut,
                                message: "its marker's event did not arrive within \(timeout)"))
                        }
                    }
                    if Task.isCancelled { buffer.failCookie(name, CancellationError()) }
                    Task(executorPreference: ioThreadTaskExecutor) { [self] in
                        do {
                            try writeMarker(name)
                        } catch {
                            buffer.failCookie(name, error)
                            // The directory was replaced: nothing more can be seen.
                            if (error as? FileCoordinationError)?.operation == "sync" { cancel() }
                        }
                    }
                }
            } onCancel: {
                buffer.failCookie(name, CancellationError())
            }
        } catch {
            await removeMarker(marker)
            throw error
        }
        await removeMarker(marker)
    }

    /// Removes a marker whose sync failed (a timeout, a cancellation), if it was made.
    private func removeMarker(_ marker: FilePath) async {
        _ = try? await runOnIOThread { _ = marker.withPlatformString { Syscall.unlink($0) } }
    }

    /// Creates the sync marker `name` in the watched directory, after checking that the
    /// path still leads to the directory being watched. A directory deleted and made
    /// again, or a bind mount unmounted, sends no event to the watch of the old one: the
    /// marker's event would never come, so the watcher stops and says why.
    private func writeMarker(_ name: String) throws {
        let directory = tree.syncDirectory
        let dirfd = try directory.withPlatformString { Syscall.open($0, O_RDONLY | O_DIRECTORY) }.mapError(.open, directory).get()
        defer { _ = Syscall.close(dirfd) }
        let info = try Syscall.fstat(dirfd).mapError(.fstat, directory).get()
        guard DirectoryIdentity(device: UInt64(info.st_dev), inode: UInt64(info.st_ino)) == syncDirectoryIdentity else {
            throw FileCoordinationError(.sync, 
                code: .notFound, path: directory, message: "the watched directory was replaced (deleted and made again, or unmounted); "
                    + "its changes can no longer be seen, and the watcher has stopped")
        }
        let fd = try Syscall.openat(dirfd, name, O_CREAT | O_EXCL | O_WRONLY, 0o600).mapError(.open, directory.appending(name)).get()
        _ = Syscall.close(fd)
    }

    /// Syncs, then takes every event buffered: exactly what happened up to the call, in
    /// order (a ``FileEvent/Kind/resync`` last if events were lost). With a settle
    /// interval, events are not coalesced here.
    public func settle(timeout: Duration = FileWatcher.defaultSyncTimeout) async throws -> [FileEvent] {
        try await sync(timeout: timeout)
        let earlier = held.withLock { held in
            defer { held.removeAll() }
            return held.map(\.0)
        }
        return earlier + tree.buffer.drain()
    }

    /// The next event, waiting at most `timeout`; nil once the watcher has stopped.
    ///
    /// - Throws: ``FileCoordinationError/Code/timedOut`` when nothing came in time.
    public func next(timeout: Duration) async throws -> FileEvent? {
        switch try await nextEvent(deadline: .now + timeout) {
        case .event(let event, _): return event
        case .finished: return nil
        case .timedOut: throw FileCoordinationError(.waitForAnEvent, 
            code: .timedOut, path: root, errno: .timedOut,
            message: "no event within \(timeout)")
        }
    }

    /// Waits for the first event that satisfies `predicate`, at most `timeout`, and
    /// returns it; the events before it are consumed.
    ///
    /// ```swift
    /// touch(dir.appending("a.txt"))
    /// let event = try await watcher.first(timeout: .seconds(5)) { $0.relativePath == "a.txt" }
    /// ```
    ///
    /// - Throws: ``FileCoordinationError/Code/timedOut`` (or ``FileCoordinationError/Code/cancelled``
    ///   when the watcher stops first) whose message lists every event seen meanwhile.
    public func first(timeout: Duration, where predicate: (FileEvent) throws -> Bool) async throws -> FileEvent {
        let deadline = ContinuousClock.now + timeout
        var seen: [FileEvent] = []
        func failure(_ code: FileCoordinationError.Code, _ why: String) -> FileCoordinationError {
            let list = seen.isEmpty ? "none" : "\(seen.count): " + seen.map { "\($0.kind) \($0.relativePath)" }.joined(separator: ", ")
            return FileCoordinationError(.waitForAnEvent, code: code, path: root, errno: code == .timedOut ? .timedOut : nil,
                                         message: "\(why); events seen: \(list)")
        }
        while true {
            switch try await nextEvent(deadline: deadline) {
            case .event(let event, _):
                if try predicate(event) { return event }
                seen.append(event)
            case .finished: throw failure(.cancelled, "the watcher stopped before a matching event")
            case .timedOut: throw failure(.timedOut, "no matching event within \(timeout)")
            }
        }
    }

    enum Next {
        case event(FileEvent, UInt64)
        case finished
        case timedOut
    }

    func nextEvent(deadline: ContinuousClock.Instant?) async throws -> Next {
        let buffer = tree.buffer
        guard let settleInterval else { return record(try await buffer.next(deadline: deadline)) }
        if let first = held.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) { return record(.some(first)) }
        guard let taken = try await buffer.next(deadline: deadline) else { return .timedOut }
        guard let first = taken else { return .finished }
        var batch = [first]
        do {
            try await Task.sleep(for: settleInterval) // the settle interval is the point: real time
        } catch {
            // Cancelled: the event taken goes first to the next consumer, not lost.
            held.withLock { $0.insert(first, at: 0) }
            throw error
        }
        while let more = buffer.take(), let event = more { batch.append(event) }
        // One of each event, where it first happened, numbered as its last copy (as in
        // the buffer: a suppression covering the first copy must not swallow a later one).
        var position: [FileEvent: Int] = [:]
        var settled: [(FileEvent, UInt64)] = []
        for (event, sequence) in batch {
            if let index = position[event] {
                settled[index].1 = sequence
            } else {
                position[event] = settled.count
                settled.append((event, sequence))
            }
        }
        let next = settled.removeFirst()
        held.withLock { $0 += settled }
        return record(.some(next))
    }

    private func record(_ taken: (FileEvent, UInt64)??) -> Next {
        guard let taken else { return .timedOut }
        guard let (event, sequence) = taken else { return .finished }
        lastSequence.store(sequence, ordering: .relaxed)
        return .event(event, sequence)
    }

    private func stoppedError(_ operation: FileCoordinationError.Operation) -> FileCoordinationError {
        FileCoordinationError(operation, code: .cancelled, path: root,
                              message: "the watcher has stopped (cancelled, or its root is gone)")
    }

    // MARK: Coordination internals

    /// The next event with its sequence number (for the coordination module's presenter
    /// watching, which drops the events of writes it has already reported).
        package func nextSequenced() async throws -> (FileEvent, UInt64)? {
        guard case .event(let event, let sequence) = try await nextEvent(deadline: nil) else { return nil }
        return (event, sequence)
    }

    /// Syncs, then returns the sequence number up to which every event caused before the
    /// call has been buffered.
        package func syncMark() async throws -> UInt64 {
        try await sync()
        return tree.buffer.appendedCount
    }

    /// The sequence number up to which events read from inotify so far are buffered,
    /// without a sync. On the watcher thread, while it handles an event, this covers every
    /// event of this watcher that the kernel queued before that one: the process has one
    /// inotify queue, read in order.
        package var bufferedMark: UInt64 { tree.buffer.appendedCount }

    // MARK: Lifetime

    /// Stops watching: the watches are removed, and the sequence ends once what is
    /// buffered has been taken.
    public func cancel() {
        tree.stop()
    }

    /// Directories of the tree that are not watched because the user's inotify watch
    /// limit (`fs.inotify.max_user_watches`) was reached: changes inside them are not
    /// reported. Empty while coverage is whole. When the limit is met, a share of the
    /// watches (1% of the limit, at least 64) is given back for the user's other processes.
    public var unwatchedDirectories: [FilePath] { tree.unwatched }

    /// The number of inotify watches this watcher holds (one per watched directory).
    public func watchCount() async -> Int {
        await tree.watchCount()
    }

    /// The number of inotify watches the kernel holds for this process's watchers and
    /// presenters (read from the kernel, so a watch the library lost track of counts):
    /// for tests that assert that nothing leaks.
    public static func processWatchCount() async -> Int {
        await InotifyThread.shared.watchCount()
    }

    /// An iterator; any number may be used at once, each event going to one of them.
    public func makeAsyncIterator() -> Iterator {
        Iterator(watcher: self)
    }

    /// Delivers events.
    public struct Iterator: AsyncIteratorProtocol {
        let watcher: FileWatcher

        /// The next event; nil once the watcher is cancelled or its root is gone.
        /// Throws `CancellationError` if the consuming task is cancelled, and then stops
        /// the watcher: its watches are removed.
        public mutating func next() async throws -> FileEvent? {
            do {
                guard case .event(let event, _) = try await watcher.nextEvent(deadline: nil) else { return nil }
                return event
            } catch let error as CancellationError {
                watcher.cancel()
                throw error
            }
        }
    }
}

/// A directory's identity: its device and inode numbers.
struct DirectoryIdentity: Equatable, Sendable {
    var device: UInt64
    var inode: UInt64
}

/// Runs `body` with a watcher of `path`, and cancels the watcher when `body` returns or
/// throws: its watches never outlive the scope.
///
/// ```swift
/// try await withFileWatcher(watching: directory) { watcher in
///     try Data("x".utf8).write(to: url)
///     #expect(try await watcher.settle().map(\.relativePath) == ["x.txt"])
/// }
/// ```
public func withFileWatcher<Result>(
    watching path: FilePath, recursive: Bool = true, filter: FileEventFilter = .all,
    isolation: isolated (any Actor)? = #isolation,
    _ body: (FileWatcher) async throws -> Result
) async throws -> Result {
    let watcher = try await FileWatcher(watching: path, recursive: recursive, filter: filter)
    defer { watcher.cancel() }
    return try await body(watcher)
}
