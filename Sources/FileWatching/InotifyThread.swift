import AsyncFileIO
import CFileCoordinationShims
import CInotifyTools
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// One inotify event as the watcher thread read it, detached from libinotifytools' buffer.
package struct InotifyEvent: Sendable, Equatable {
    /// The watch descriptor the event arrived on (-1 for a queue overflow).
    public var wd: Int32
    /// The `IN_*` bits.
    public var mask: UInt32
    /// Pairs the two halves of a rename (`IN_MOVED_FROM` / `IN_MOVED_TO`).
    public var cookie: UInt32
    /// The entry's name inside a watched directory (empty for the watched item itself).
    public var name: [UInt8]

    var isOverflow: Bool { mask & UInt32(IN_Q_OVERFLOW) != 0 }
}

/// What the watcher thread hands a client: one event, the two halves of a rename seen
/// together, or a queue overflow (events were lost).
enum InotifyDelivery {
    case event(InotifyEvent)
    case move(from: InotifyEvent, to: InotifyEvent)
    case overflow
}

/// An object that lives on the watcher thread: it receives the events of its watch
/// descriptors and may add or remove watches from inside ``handle(_:thread:)``.
protocol InotifyClient: AnyObject, Sendable {
    func handle(_ delivery: InotifyDelivery, thread: InotifyThread.OnThread)
}

/// The only thread in the process that calls libinotifytools.
///
/// libinotifytools keeps global, unlocked state, so every call into it (initialise,
/// add or remove a watch, read the next event) happens here. Other threads and tasks
/// send commands through a queue and ring a doorbell: an unnamed `O_TMPFILE` on tmpfs
/// that the thread itself watches, so the thread sleeps in `inotifytools_next_event`
/// with no timeout and wakes for either a file-system event or a command, never polling.
package final class InotifyThread: @unchecked Sendable {
    /// Started on first use; lives as long as the process.
    public static let shared = InotifyThread()

    public typealias Handler = @Sendable (InotifyEvent) -> Void

    private enum Command {
        case add(FilePath, UInt32, Handler, CheckedContinuation<Result<HandlerWatch, FileCoordinationError>, Never>)
        case remove(HandlerWatch, CheckedContinuation<Void, Never>)
        case count(CheckedContinuation<Int, Never>)
        case perform(@Sendable (OnThread) -> Void, @Sendable (FileCoordinationError) -> Void)
    }

    /// Watch operations valid only on the watcher thread (inside a client's `handle`, or
    /// a closure sent with ``perform(_:)``).
    struct OnThread {
        fileprivate let owner: InotifyThread

        /// Adds a watch whose events go to `client`.
        func addWatch(_ path: FilePath, mask: UInt32, client: any InotifyClient) -> Result<Int32, FileCoordinationError> {
            owner.addWatchOnThread(path, mask: mask, client: client)
        }

        /// Ends `client`'s interest in a watch; the watch itself goes when no client is
        /// left. A watch the kernel has already dropped (its directory deleted) is fine.
        func removeWatch(_ wd: Int32, client: any InotifyClient) {
            owner.removeClient(client, from: wd)
        }
    }

    /// Whether the kernel still holds a watch with this descriptor for this process.
    func isWatching(_ wd: Int32) async -> Bool {
        await withCheckedContinuation { continuation in
            perform { thread in continuation.resume(returning: thread.owner.kernelWatches().contains { $0 == wd }) } orFail: { _ in
                continuation.resume(returning: false)
            }
        }
    }

    /// Runs `body` on the watcher thread, where it may add and remove watches directly;
    /// `orFail` instead when the thread could not start inotify.
    func perform(_ body: @escaping @Sendable (OnThread) -> Void,
                 orFail: @escaping @Sendable (FileCoordinationError) -> Void = { _ in }) {
        if let startupError {
            orFail(startupError)
            return
        }
        send(.perform(body, orFail))
    }

    private struct Queue {
        var commands: [Command] = []
        /// Set when the thread could not start inotify: every command fails with it.
        var failure: FileCoordinationError?
    }
    private let queue = Locked(Queue())
    private let doorbell: Int32
    private let startupError: FileCoordinationError?

    /// The thread's own state: touched only on the thread. inotify gives the same
    /// descriptor to every watch of one inode, so several clients can share one.
    private var clients: [Int32: [any InotifyClient]] = [:]
    private var doorbellWatch: Int32 = -1
    /// libinotifytools' inotify instance. Watches are added and removed on it directly,
    /// so that the descriptor a caller gets is the one the kernel gave: libinotifytools
    /// records watches by name, never forgets a watch the kernel dropped (a deleted
    /// directory's), and never learns of a rename, so after `mv d e; mkdir d` its lookup
    /// by name answers with `e`'s descriptor for the new `d`. libinotifytools still reads
    /// and buffers every event.
    private var instance: Int32 = -1

    /// At most 15 bytes: the kernel truncates longer thread names.
    static let threadName = "filecoord-watch"

    private init() {
        var fd: Int32 = -1
        var lastError: Errno = .noSuchFileOrDirectory
        for directory in ["/dev/shm", ProcessInfoLite.temporaryDirectory, "/tmp"] {
            switch Syscall.openTemporary(inDirectory: directory, mode: 0o600) {
            case .success(let opened): fd = opened
            case .failure(let errno): lastError = errno
            }
            if fd >= 0 { break }
        }
        doorbell = fd
        startupError = fd < 0
            ? FileCoordinationError(.open, errno: lastError, path: FilePath("/dev/shm"))
            : nil
        guard startupError == nil else { return }
        let context = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        let created = pthread_create(&thread, &attributes, { raw in
            let owner = Unmanaged<InotifyThread>.fromOpaque(raw!).takeRetainedValue()
            fc_set_thread_name(InotifyThread.threadName)
            owner.run()
            return nil
        }, context)
        pthread_attr_destroy(&attributes)
        precondition(created == 0, "FileCoordination: cannot start the inotify thread (error \(created))")
    }

    // MARK: Requests from any thread

    /// A watch added with a handler: removing it ends that handler's events, and no other
    /// watcher's on the same inode (the kernel gives every watch of an inode one descriptor).
    package struct HandlerWatch: Sendable {
        /// The kernel's watch descriptor.
        package let wd: Int32
        fileprivate let client: ClosureClient
    }

    /// Adds a watch on `path` for the `IN_*` events in `mask`; `handler` runs on the
    /// watcher thread for each event and must return quickly.
    public func addWatch(_ path: FilePath, mask: UInt32, handler: @escaping Handler) async throws -> HandlerWatch {
        if let startupError { throw startupError }
        let result = await withCheckedContinuation { continuation in
            send(.add(path, mask, handler, continuation))
        }
        return try result.get()
    }

    /// Removes a watch added by ``addWatch(_:mask:handler:)``; its handler is not called again.
    public func removeWatch(_ watch: HandlerWatch) async {
        guard startupError == nil else { return }
        await withCheckedContinuation { continuation in
            send(.remove(watch, continuation))
        }
    }

    /// How many watches the kernel holds for this process's callers (the doorbell excluded).
    func watchCount() async -> Int {
        guard startupError == nil else { return 0 }
        return await withCheckedContinuation { continuation in
            send(.count(continuation))
        }
    }

    private func send(_ command: Command) {
        let failure: FileCoordinationError? = queue.withLock { queue in
            if let failure = queue.failure { return failure }
            queue.commands.append(command)
            return nil
        }
        if let failure {
            Self.fail(command, with: failure)
            return
        }
        // Rewriting one byte of a tmpfs file: no device, no journal; it cannot block.
        ringDoorbell()
    }

    private func ringDoorbell() {
        var byte: UInt8 = 1
        _ = Syscall.pwrite(doorbell, &byte, 1, 0)
    }

    private static func fail(_ command: Command, with error: FileCoordinationError) {
        switch command {
        case .add(_, _, _, let continuation): continuation.resume(returning: .failure(error))
        case .remove(_, let continuation): continuation.resume()
        case .count(let continuation): continuation.resume(returning: 0)
        case .perform(_, let orFail): orFail(error)
        }
    }

    // MARK: The thread

    private func run() {
        guard inotifytools_initialize() != 0 else {
            failAll(Errno(rawValue: inotifytools_error()))
            return
        }
        // inotifytools_watch_file answers 1 or 0; the descriptor is looked up by name.
        let doorbellPath = "/proc/self/fd/\(doorbell)"
        guard inotifytools_watch_file(doorbellPath, Int32(IN_MODIFY)) != 0 else {
            failAll(Errno(rawValue: inotifytools_error()))
            return
        }
        doorbellWatch = inotifytools_wd_from_filename(doorbellPath)
        guard doorbellWatch > 0 else {
            failAll(Errno(rawValue: inotifytools_error()))
            return
        }
        guard let instance = Self.findInstance(watching: doorbellWatch, of: doorbell) else {
            failAll(.noSuchFileOrDirectory)
            return
        }
        // libinotifytools waits with select(2), whose sets end at descriptor 1023: FD_SET
        // of a higher one aborts the process. The kernel gives the lowest free descriptor,
        // so a higher one means that every lower one is in use.
        guard instance < 1024 else {
            inotifytools_cleanup()
            failAll(FileCoordinationError(.inotifyInit, code: .tooManyOpenFiles, path: nil, errno: .tooManyOpenFiles,
                                          message: "the inotify instance got descriptor \(instance), and libinotifytools can wait "
                                              + "only on descriptors below 1024, all of which this process has open"))
            return
        }
        self.instance = instance
        // Commands sent before the doorbell was watched rang nothing: serve them now.
        drainCommands()
        var pending: InotifyEvent?
        while true {
            let event: InotifyEvent
            if let next = pending {
                event = next
                pending = nil
            } else {
                guard let raw = inotifytools_next_event(-1) else { continue }
                event = Self.copy(raw)
            }
            if event.wd == doorbellWatch {
                drainCommands()
                continue
            }
            if event.isOverflow {
                var seen = Set<ObjectIdentifier>()
                for client in clients.values.joined() where seen.insert(ObjectIdentifier(client)).inserted {
                    client.handle(.overflow, thread: OnThread(owner: self))
                }
                // The doorbell's events may be among those lost (a command sent while the
                // queue was full: its sender would wait for ever, a process told to end
                // among them).
                drainCommands()
                continue
            }
            if event.mask & UInt32(IN_MOVED_FROM) != 0 {
                // The kernel queues both halves of a rename in the same system call, so
                // the partner, if it is watched, is already waiting: the next event tells.
                if let raw = nextEventWithoutWaiting() {
                    let next = Self.copy(raw)
                    if next.mask & UInt32(IN_MOVED_TO) != 0 && next.cookie == event.cookie {
                        deliverMove(from: event, to: next)
                        continue
                    }
                    pending = next
                }
            }
            deliver(event)
        }
    }

    /// The next event, read without waiting for one to happen.
    ///
    /// `inotifytools_next_event(0)` is no peek: a timeout of 0 waits for ever, so a rename
    /// out of every watched directory (whose second half never comes) was held until some
    /// other event came. When the kernel's queue is empty, the doorbell is rung first: its
    /// event queues behind everything already there, so the read returns the event
    /// libinotifytools has buffered, or the next one queued, or at worst the doorbell's
    /// own (a ring with no command drains nothing).
    private func nextEventWithoutWaiting() -> UnsafeMutablePointer<inotify_event>? {
        let ready = (try? Syscall.poll(instance, Int16(POLLIN), milliseconds: { 0 }).get()) ?? false
        if !ready { ringDoorbell() }
        return inotifytools_next_event(-1)
    }

    private func deliver(_ event: InotifyEvent) {
        for client in clients[event.wd] ?? [] { client.handle(.event(event), thread: OnThread(owner: self)) }
        if event.mask & UInt32(IN_IGNORED) != 0 { clients[event.wd] = nil }
    }

    private func deliverMove(from: InotifyEvent, to: InotifyEvent) {
        let sources = clients[from.wd] ?? [], destinations = clients[to.wd] ?? []
        for client in sources {
            if destinations.contains(where: { $0 === client }) {
                client.handle(.move(from: from, to: to), thread: OnThread(owner: self))
            } else {
                client.handle(.event(from), thread: OnThread(owner: self))
            }
        }
        for client in destinations where !sources.contains(where: { $0 === client }) {
            client.handle(.event(to), thread: OnThread(owner: self))
        }
    }

    fileprivate func removeClient(_ client: any InotifyClient, from wd: Int32) {
        guard var list = clients[wd], let index = list.firstIndex(where: { $0 === client }) else { return }
        list.remove(at: index)
        if list.isEmpty {
            clients[wd] = nil
            // EINVAL for a watch the kernel has dropped already: nothing to remove.
            _ = Syscall.inotifyRemoveWatch(instance, wd)
        } else {
            clients[wd] = list
        }
    }

    fileprivate func addWatchOnThread(_ path: FilePath, mask: UInt32, client: any InotifyClient) -> Result<Int32, FileCoordinationError> {
        // A second watch of the same inode returns the same descriptor; IN_MASK_ADD keeps
        // the events the other clients asked for.
        let wd: Int32
        switch path.withPlatformString({ Syscall.inotifyAddWatch(instance, $0, mask | UInt32(IN_MASK_ADD)) }) {
        case .success(let added): wd = added
        case .failure(let errno): return .failure(Self.watchError(path, errno))
        }
        if !(clients[wd]?.contains(where: { $0 === client }) ?? false) { clients[wd, default: []].append(client) }
        return .success(wd)
    }

    /// The descriptors of the watches the kernel holds on the instance, the doorbell's
    /// excluded (from `/proc/self/fdinfo`: one `inotify wd:…` line per watch).
    func kernelWatches() -> [Int32] {
        Self.fdinfoWatches(instance).map(\.wd).filter { $0 != doorbellWatch }
    }

    private func drainCommands() {
        let pending = queue.withLock { queue in
            defer { queue.commands.removeAll() }
            return queue.commands
        }
        for command in pending {
            switch command {
            case .add(let path, let mask, let handler, let continuation):
                let client = ClosureClient(handler)
                continuation.resume(returning: addWatchOnThread(path, mask: mask, client: client).map { HandlerWatch(wd: $0, client: client) })
            case .remove(let watch, let continuation):
                removeClient(watch.client, from: watch.wd)
                continuation.resume()
            case .perform(let body, _):
                body(OnThread(owner: self))
            case .count(let continuation):
                continuation.resume(returning: kernelWatches().count)
            }
        }
    }

    /// Startup failed on the thread: fail what is queued and everything sent later, and
    /// let the thread end.
    private func failAll(_ errno: Errno) {
        var error = Self.watchError(FilePath("/proc/self/fd/\(doorbell)"), errno)
        // The instance itself could not be had: no file is to blame. (The EMFILE of
        // `inotify_init` is the per-user instance limit, or this process's descriptors.)
        if error.operation == "inotify_init" { error.path = nil }
        failAll(error)
    }

    private func failAll(_ error: FileCoordinationError) {
        let pending = queue.withLock { queue in
            queue.failure = error
            defer { queue.commands.removeAll() }
            return queue.commands
        }
        for command in pending { Self.fail(command, with: error) }
    }
}

/// Adapts a closure (the smoke-test API) to a client.
private final class ClosureClient: InotifyClient {
    let handler: InotifyThread.Handler
    init(_ handler: @escaping InotifyThread.Handler) { self.handler = handler }
    func handle(_ delivery: InotifyDelivery, thread: InotifyThread.OnThread) {
        switch delivery {
        case .event(let event): handler(event)
        case .move(let from, let to): handler(from); handler(to)
        case .overflow: handler(InotifyEvent(wd: -1, mask: UInt32(IN_Q_OVERFLOW), cookie: 0, name: []))
        }
    }
}
