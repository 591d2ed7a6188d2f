import AsyncFileIO
import CFileCoordinationShims
import FileWatching
import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The messaging half of a coordination space: this process's mailbox, the requests it
/// sends to other processes' presenters and the answers it waits for, the registry of
/// presenters (its own, and a cache of everyone else's), and the requests it serves for
/// its own presenters.
package final class SpaceMail: Sendable {
    let files: SpaceFiles
    var me: String { files.processName }

    struct State {
        var nextMessage: UInt64 = 1
        /// Other processes' presenters as last read, and the counter value they reflect.
        var remoteSequence: UInt64 = .max
        var remoteByName: [String: RemotePresenter] = [:]
        var remote = PresenterRegistry()
        /// Dead processes cleaned up and not yet reported by `status`.
        var cleanedUp: [Int32] = []
        /// Presenter records of live processes that could not be read: warned about once.
        var ignoredRecords: Set<String> = []
    }

    let state = Locked(State())
    /// Held while a message file is read and acted on: by the watcher thread, or by a
    /// poll of the mailbox (a process that could not watch it, or a rescan as it starts to).
    /// Counts the failed reads of the mailbox since a message was left unread.
    let receiving = Locked(Rereading())
    /// Starts the space's watches (``CoordinationSpace/startWatching()``) before a request
    /// whose reply must be heard; false when they cannot be had, and replies are polled.
    let startWatching = WatchingHook()
    /// Messages waiting to be written to each process, in the order they were posted. A
    /// process is listed while one I/O job writes its queue (see ``post(to:inline:_:)``),
    /// or while a message that could not be written waits to be written again.
    let outboxes = Locked<[String: OutboxOfMail]>([:])
    typealias OutboxOfMail = Outbox<OutgoingWrite, UnsafeContinuation<Void, Never>>
    /// The requests sent whose replies are awaited.
    let replies = AwaitedReplies()
    let slots: MessageSlots
    /// This process's presenters, and the requests of other processes it serves for them.
    let server: PresenterServer
    /// This process's mailbox, once made (-1 before): made when the process first
    /// listens or asks another process something (``openMailbox()``).
    private let mailbox = Locked<Int32>(-1)

    init(files: SpaceFiles, hooks: SpaceHooks) {
        self.files = files
        server = PresenterServer(hooks: hooks)
        slots = MessageSlots(me: files.processName)
    }

    deinit {
        let fd = mailboxFD
        if fd >= 0 { _ = Syscall.close(fd) }
    }

    /// This process's mailbox: made and opened the first time (a blocking call, for an I/O
    /// thread), then its descriptor. A process that only claims never needs it.
    @discardableResult
    func openMailbox() throws(FileCoordinationError) -> Int32 {
        try mailbox.withLock { (fd: inout sending Int32) throws(FileCoordinationError) -> Int32 in
            if fd < 0 { fd = try files.makeMailbox() }
            return fd
        }
    }

    /// The mailbox's descriptor, -1 while the process has none.
    var mailboxFD: Int32 { mailbox.withLock { $0 } }

    /// Starts serving requests to this process's presenters (``PresenterServer``). A
    /// request that finds the serving task waiting is served on the watcher thread that
    /// read it, and the rest on the I/O threads; each reply is written there, with no
    /// hand-over to another thread on the way back to the asking process.
    func start() {
        server.start { [weak self] body, target in
            guard let self else { return }
            let write = prepare(body, to: target, id: nextID())
            post(to: target, inline: true) { [self] failures in writtenOrGivenUp(write, body.kind, to: target, failures: failures) }
        }
    }

    // MARK: Receiving (on the watcher thread)

    /// A file was closed in this process's mailbox: read it, act on it, then empty it (a
    /// slot, which its sender writes again: see ``MessageSlots``) or remove it. After a
    /// queue overflow (events lost), every file in the mailbox is read.
    func received(_ event: InotifyEvent) {
        if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
            readWholeMailbox()
            // A process whose request the rescan just found may have died among the
            // events lost.
            recheckAfterOverflow()
            return
        }
        guard !event.name.isEmpty, event.mask & UInt32(IN_ISDIR) == 0 else { return }
        receiving.withLock { rereading in
            // A message left unread: the whole mailbox is read again, in order, after a pause.
            guard rereading.failures == 0 else { return }
            if receive(event.name, rescanning: false) { readAgainLater(&rereading) }
        }
    }

    /// Reads every message in the mailbox (after a queue overflow, as the mailbox starts to
    /// be watched, or on each poll of a process that cannot watch it). Blocking.
    func readWholeMailbox() {
        guard mailboxFD >= 0 else { return } // none made: nothing can have come
        let caughtUp = receiving.withLock { rereading -> Bool in
            let waited = rereading.failures > 0
            if readInOrder(lastTry: false) {
                rereading.failures = 0
                return waited
            }
            if !waited { readAgainLater(&rereading) }
            return false
        }
        // Read after a message was left unread: the processes that ended meanwhile.
        if caughtUp { recheckAfterOverflow() }
    }

    /// Reads the mailbox's messages in the order they were written (``rescanOrder()``);
    /// false when it could not be listed, or a message could not be read (the rest wait
    /// behind it). With `lastTry`, a message that cannot be read is removed with a warning.
    func readInOrder(lastTry: Bool) -> Bool {
        guard let order = rescanOrder() else { return false }
        for name in order where receive(name, rescanning: true, lastTry: lastTry) { return false }
        return true
    }

    /// Reads and acts on the message file `name`. A rescan leaves alone what may still be
    /// being written (empty, or without its end line): its own event comes later. Returns
    /// true when the file was left unread because opening or reading it failed (no
    /// descriptor to spare, no memory, an I/O error): a message lost there could leave a
    /// presenter relinquished, or a writer waiting for its timeout. Unless `lastTry`.
    @discardableResult
    func receive(_ name: [UInt8], rescanning: Bool, lastTry: Bool = false) -> Bool {
        let mailboxFD = mailboxFD
        guard mailboxFD >= 0 else { return false }
        let opened = Self.openMessage(dirFD: mailboxFD, name: name)
        var path: FilePath { files.mailboxPath.appending(String(decoding: name, as: UTF8.self)) } // for warnings
        switch opened {
        // Gone: a slot its sender retired (see ``MessageSlots``), or read by a rescan.
        case .failure(.noSuchFileOrDirectory): return false
        case .failure(let errno) where !lastTry && Self.mayPass(errno):
            Self.unread(path, FileCoordinationError(.open, errno: errno, path: path).description)
            return true
        default: break
        }
        let fd = (try? opened.get()) ?? -1
        var failure: Errno?
        let outcome = fd >= 0 ? readMessage(fd, failure: &failure) : .failure(.notAMessage)
        if case .failure(let reason) = outcome, rescanning && (reason == .empty || reason == .truncated) || !lastTry && reason == .unreadable {
            if fd >= 0 { _ = Syscall.close(fd) }
            guard reason == .unreadable else { return false }
            Self.unread(path, FileCoordinationError(.read, errno: failure ?? .ioError, path: path).description)
            return true
        }
        // A slot read on an earlier message's event (a rescan read that one) while its
        // sender writes the next into it, past a page (the size grows page by page): left
        // to its own close, unless its sender is gone.
        let midWrite: Bool
        if case .failure(.truncated) = outcome, MessageSlots.isSlot(name), let sender = MessageSlots.sender(ofSlot: name) {
            midWrite = isAlive(sender)
        } else {
            midWrite = false
        }
        // Whether the message was served right here (its reply, if any, is written).
        var servedHere = false
        // Done once the message is handed on: off the reply's path. A slot is emptied for
        // its sender to write again, unless the sender has left or was cleaned up after.
        defer {
            // The thread the message was handed to (or the task its reply resumes) may wait
            // for this CPU: let it run first. (Served here, it went to no other thread, and
            // a reply written here yielded already, unless more was queued behind it.)
            if case .success = outcome, !servedHere { sched_yield() }
            switch (MessageSlots.isSlot(name), outcome) {
            case (true, .failure(.empty)): break // a spare closed unused: removed by its sender, or after it dies
            case (true, .failure(.truncated)) where midWrite: break
            // The record is tested before emptying (a slot of a sender without one is unlinked
            // full: a sender still writing while it leaves would otherwise write it again,
            // and lose that message when it is unlinked) and again after: a sender that
            // removed it in between may have passed this slot over as full while leaving (it
            // removes its record before its empty slots), so the slot is this receiver's to
            // remove.
            case (true, .success(let message)) where hasRecord(message.string(SpaceProtocol.fromKey)) && Self.truncate(fd)
                && hasRecord(message.string(SpaceProtocol.fromKey)): break
            default: _ = Self.withCString(name) { Syscall.unlinkat(mailboxFD, $0) }
            }
            // Closed right after the truncation, not kept: on ext4 the next release of a file
            // truncated to zero allocates its delayed blocks and starts their writeback
            // (`auto_da_alloc`). Here that release finds the slot empty; were it the
            // sender's close after its next message, every message would start a writeback.
            if fd >= 0 { _ = Syscall.close(fd) }
        }
        let message: SpaceProtocol.Message
        switch outcome {
        case .success(let decoded):
            do {
                message = try SpaceProtocol.Message(decoding: decoded)
            } catch {
                Self.ignored(path, error.text)
                return false
            }
        case .failure(.empty): return false
        case .failure(.truncated) where midWrite: return false
        case .failure(let reason):
            Self.ignored(path, reason.rawValue)
            return false
        }
        let header = message.header
        // The name a reply goes to, in `mail/`: one of another shape (`../x`) would have it
        // written outside the space. (The file is then removed above: no record has it.)
        guard Self.isProcessName(header.from) else {
            Self.ignored(path, "its sender's name is not a process's name")
            return false
        }
        if LibraryLogger.logs(.debug) { FileCoordinator.logger.debug("message \(message.body.kind) #\(header.id) from \(header.from)") }
        switch message.body {
        case .reply(let reply):
            // The coordination that asked goes on to its accessor, then posts its `did…`
            // messages and `reacquire` for an I/O thread to write: one stays awake for them
            // (after a short accessor they come soon after this reply), until its flush.
            expectIOWork(withinMicroseconds: 100)
            replies.resolve(reply.re, from: header.from, with: .success(message.body))
        case .statusReply(let report):
            replies.resolve(report.re, from: header.from, with: .success(message.body))
        case .status:
            Task.detached { [self] in await answerStatus(header) }
        case .presenter(let request):
            // A relinquish from a process that is not in the space (gone before it was
            // read, or never in it) would be kept for a `reacquire` or a death that never
            // comes: the presenter relinquished for good. (What a process that left sent
            // before it left, its `did…` and `reacquire`, is still served.)
            if case .relinquish = request.call, !hasRecord(header.from) {
                Self.ignored(path, "its sender \(header.from) is not in the space")
                return false
            }
            servedHere = server.received(message, onWatcherThread: true)
        }
        return false
    }

    /// The one warning for a file in the space that is not a message of ours.
    static func ignored(_ path: FilePath, _ reason: String) {
        FileCoordinator.logger.warning("ignored a file in the coordination space", metadata: ["path": "\(path)", "reason": "\(reason)"])
    }

    static func withCString<T>(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> T) -> T {
        (bytes + [0]).withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { body($0.baseAddress!) }
        }
    }

    /// Reads one small message file (`name` relative to `dirFD`) without following links
    /// or blocking on a FIFO. ``SpaceMessage/MalformedReason/unreadable`` when opening or
    /// reading it failed in a way that may pass (``mayPass(_:)``).
    func readMessage(dirFD: Int32, name: [UInt8]) -> Result<SpaceMessage, SpaceMessage.MalformedReason> {
        let fd: Int32
        switch Self.openMessage(dirFD: dirFD, name: name) {
        case .success(let opened): fd = opened
        case .failure(let errno): return .failure(Self.mayPass(errno) ? .unreadable : .notAMessage)
        }
        defer { _ = Syscall.close(fd) }
        return readMessage(fd)
    }

    /// The files in the mailbox in the order they were written, as far as can be told:
    /// by modification time, and a sender's own by the number it gave each message (a
    /// sender's slots are used in turn, so their names say nothing; and times can be
    /// equal). The directory's order is arbitrary: serving a writer's `reacquire` before
    /// its `relinquish` would leave the presenter without its item. Each file is read
    /// here and again when served; this runs only after events were lost, or a message
    /// could not be read. Nil when the mailbox cannot be listed.
    func rescanOrder() -> [[UInt8]]? {
        var found: [(name: [UInt8], time: Int64, from: String, id: UInt64)] = []
        guard let names = try? Self.list(files.directoryFD, SpaceLayout.mailbox(me)) else { return nil }
        for name in names where !name.hasPrefix(".") {
            let bytes = Array(name.utf8)
            var time = Int64.max, from = "", id: UInt64 = 0
            if case .success(let fd) = Self.openMessage(dirFD: mailboxFD, name: bytes) {
                if case .success(let info) = Syscall.fstat(fd) { time = Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec) }
                if case .success(let decoded) = readMessage(fd), let message = try? SpaceProtocol.Message(decoding: decoded) {
                    (from, id) = (message.header.from, message.header.id)
                }
                _ = Syscall.close(fd)
            }
            found.append((bytes, time, from, id))
        }
        // Each sender's files by number, then merged by the time of each one's next file
        // (a sender's order wins over times that disagree with it); on equal times,
        // files that could not be read (still being written, or not messages) last.
        let queues = Dictionary(grouping: found, by: \.from).map { from, group in
            from.isEmpty ? group.sorted { $0.time < $1.time } : group.sorted { $0.id < $1.id }
        }
        var positions = [Int](repeating: 0, count: queues.count)
        var order: [[UInt8]] = []
        order.reserveCapacity(found.count)
        func key(_ queue: Int) -> (Int64, Int, String) {
            let head = queues[queue][positions[queue]]
            return (head.time, head.from.isEmpty ? 1 : 0, head.from)
        }
        // The queues by their heads' keys, in a binary heap: a mailbox flooded by many
        // senders (an overflow's rescan, on the watcher thread) merges in N log S steps.
        var heap = Array(queues.indices)
        func siftDown(_ start: Int) {
            var parent = start
            while true {
                let left = 2 * parent + 1, right = left + 1
                var least = parent
                if left < heap.count, key(heap[left]) < key(heap[least]) { least = left }
                if right < heap.count, key(heap[right]) < key(heap[least]) { least = right }
                guard least != parent else { return }
                heap.swapAt(parent, least)
                parent = least
            }
        }
        for index in stride(from: heap.count / 2 - 1, through: 0, by: -1) { siftDown(index) }
        while let next = heap.first {
            order.append(queues[next][positions[next]].name)
            positions[next] += 1
            if positions[next] == queues[next].count {
                heap.swapAt(0, heap.count - 1)
                heap.removeLast()
            }
            siftDown(0)
        }
        return order
    }

    /// Opens a message file for reading, without following a link or blocking on a FIFO,
    /// and without updating its access time: a read after each write would otherwise
    /// dirty the slot's inode again (on a `relatime` mount). Only the file's owner may ask
    /// that (`EPERM` otherwise), and a file of another user is no message of ours anyway;
    /// it is opened plainly, for ``readMessage(_:)`` to reject.
    static func openMessage(dirFD: Int32, name: [UInt8]) -> Result<Int32, Errno> {
        withCString(name) { name in
            let opened = Syscall.openat(dirFD, name, O_RDONLY | O_NONBLOCK | fc_O_NOFOLLOW | fc_O_NOATIME)
            guard case .failure(.notPermitted) = opened else { return opened }
            return Syscall.openat(dirFD, name, O_RDONLY | O_NONBLOCK | fc_O_NOFOLLOW)
        }
    }

    /// Reads the message file open at `fd`, checked to be a small regular file of ours.
    func readMessage(_ fd: Int32) -> Result<SpaceMessage, SpaceMessage.MalformedReason> {
        var failure: Errno?
        return readMessage(fd, failure: &failure)
    }

    /// ``readMessage(_:)``, which gives the errno of the `fstat` or `read` that failed
    /// (``SpaceMessage/MalformedReason/unreadable``) in `failure`.
    func readMessage(_ fd: Int32, failure: inout Errno?) -> Result<SpaceMessage, SpaceMessage.MalformedReason> {
        let info: stat
        switch OwnedFiles.check(fd, kind: .regularFile, privateOnly: false, owner: files.owner) {
        case .success(let checked): info = checked
        case .failure(.system(let errno)):
            failure = errno
            return .failure(.unreadable)
        case .failure: return .failure(.notAMessage)
        }
        guard info.st_size <= SpaceMessage.maximumSize else { return .failure(.tooLarge) }
        guard info.st_size > 0 else { return .failure(.empty) }
        var buffer = [UInt8](repeating: 0, count: Int(info.st_size) + 1)
        switch buffer.withUnsafeMutableBytes({ Syscall.read(fd, $0.baseAddress!, $0.count) }) {
        case .success(let count): return SpaceMessage.decode(buffer[..<count])
        case .failure(let errno):
            failure = errno
            return .failure(.unreadable)
        }
    }

    /// Whether `name` can name a process in the space: not empty, and no `/`. Tested on
    /// the bytes: with Foundation imported, `String.contains(_:)` goes through `NSString`
    /// (it was 2% of a remote write's CPU time in a profile).
    static func isProcessName(_ name: String) -> Bool {
        // `<pid>-<hex>`, as `CoordinationSpace.join` names a process.
        let bytes = Array(name.utf8)
        guard let dash = bytes.firstIndex(of: UInt8(ascii: "-")), dash > 0, dash < bytes.count - 1 else { return false }
        return bytes[..<dash].allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
            && bytes[(dash + 1)...].allSatisfy { isHexDigit($0) }
    }

    static func isHexDigit(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f"))
    }

    /// The process of a presenter record's name (`<process>-<number>`), or nil when the
    /// name is not one this library makes.
    static func processOfPresenter(_ name: String) -> String? {
        guard let dash = name.utf8.lastIndex(of: UInt8(ascii: "-")) else { return nil }
        let process = String(name[..<dash]), number = name[name.index(after: dash)...]
        guard isProcessName(process), !number.isEmpty, number.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        return process
    }

    /// Moves an entry of the space that is not one of ours (a directory, another
    /// program's or version's file) out of the way, under a hidden name that listings
    /// skip, and says so once: left in place, every process would warn about it on every
    /// command, for ever. Blocking (`renameat`); nothing is said if another process
    /// moved it first. Returns whether this call moved it.
    @discardableResult
    func setAside(_ folder: String, _ name: String, reason: String) -> Bool {
        let dirFD = files.directoryFD
        let hidden = SpaceLayout.foreignPrefix + name
        guard case .success = Syscall.renameat(dirFD, "\(folder)/\(name)", "\(folder)/\(hidden)") else { return false }
        FileCoordinator.logger.warning("set aside an entry of the coordination space that is not one of ours",
                                          metadata: ["path": "\(files.directory.appending(folder).appending(name))",
                                                     "now": "\(files.directory.appending(folder).appending(hidden))",
                                                     "reason": "\(reason)"])
        return true
    }

    /// Whether `process` still has its record in `procs/` (it has not left, and has not
    /// been cleaned up after). True for a message without a sender.
    func hasRecord(_ process: String?) -> Bool {
        guard let process else { return true }
        guard Self.isProcessName(process) else { return false }
        if case .success = Syscall.lstatat(files.directoryFD, SpaceLayout.record(process)) { return true }
        return false
    }

    /// Empties the file open (read-only) at `fd` through its `/proc/self/fd` link: a
    /// descriptor opened for writing would signal `IN_CLOSE_WRITE` when closed, which a
    /// slot's sender reserves for its messages. False when that fails (no `/proc`).
    static func truncate(_ fd: Int32) -> Bool {
        if case .success = Syscall.truncate("/proc/self/fd/\(fd)", 0) { return true }
        return false
    }
}
