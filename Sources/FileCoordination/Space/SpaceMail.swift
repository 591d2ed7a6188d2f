@_spi(FileCoordinationInternal) import AsyncFileIO
import CFileCoordinationShims
@_spi(FileCoordinationInternal) import FileWatching
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The messaging half of a coordination space: this process's mailbox, the requests it
/// sends to other processes' presenters and the answers it waits for, the registry of
/// presenters (its own, and a cache of everyone else's), and the requests it serves for
/// its own presenters.
final class SpaceMail: Sendable {
    let files: SpaceFiles
    private var me: String { files.processName }

    private enum Reply {
        case waiting(target: String, UnsafeContinuation<SpaceMessage?, any Error>)
        case registered(target: String)
        case arrived(Result<SpaceMessage?, any Error>)
    }

    private struct State {
        var nextMessage: UInt64 = 1
        var replies: [UInt64: Reply] = [:]
        /// This process's presenters, by their number in the space.
        var local: [UInt64: (presenter: any FilePresenter, path: FilePath)] = [:]
        var localNumbers: [ObjectIdentifier: UInt64] = [:]
        var nextPresenter: UInt64 = 1
        /// Reacquirers (and echo suppressions) kept for the processes that asked.
        var kept: [String: (FileReacquirer?, (PresenterWatch, Int)?)] = [:]
        /// Relinquish requests handed to the serving task and not started yet (their
        /// kept keys). One whose asker gave up (its `reacquire` came first) or died is
        /// taken out, and then never served: it would cost the next writer its delay.
        var queued: Set<String> = []
        /// Other processes' presenters as last read, and the counter value they reflect.
        var remoteSequence: UInt64 = .max
        var remoteByName: [String: RemotePresenter] = [:]
        var remote = PresenterRegistry()
        /// Dead processes cleaned up and not yet reported by `status`.
        var cleanedUp: [Int32] = []
        /// Presenter records of live processes that could not be read: warned about once.
        var ignoredRecords: Set<String> = []
    }

    private let state = Locked(State())
    /// Held while a message file is read and acted on: by the watcher thread, or by a
    /// poll of the mailbox (a process that could not watch it, or a rescan as it starts to).
    private let receiving = Locked(())
    /// Starts the space's watches (``CoordinationSpace/startWatching()``) before a request
    /// whose reply must be heard; false when they cannot be had, and replies are polled.
    var startWatching: @Sendable () async -> Bool {
        get { watchingHook.withLock { $0 } }
        set { watchingHook.withLock { $0 = newValue } }
    }
    private let watchingHook = Locked<@Sendable () async -> Bool>({ false })
    /// Messages waiting to be written to each process, in the order they were posted. A
    /// process is listed while one I/O job writes its queue (see ``post(to:inline:_:)``).
    private let outboxes = Locked<[String: [@Sendable () -> Void]]>([:])
    private let deadlines = ReplyDeadlines()
    private let slots: MessageSlots
    private let incoming: AsyncStream<SpaceMessage>.Continuation
    private let incomingStream: AsyncStream<SpaceMessage>
    private let serving = ServingExecutor()

    init(files: SpaceFiles) {
        self.files = files
        slots = MessageSlots(me: files.processName)
        (incomingStream, incoming) = AsyncStream.makeStream(of: SpaceMessage.self)
    }

    /// Starts serving requests to this process's presenters, one at a time, in the order
    /// they arrived (so a presenter hears `didChange` and its reacquirer after the
    /// relinquish of the same write, and before the next writer's).
    ///
    /// The serving task runs on the library's threads (``ServingExecutor``): a request
    /// that finds it waiting is served on the watcher thread that read it, and the rest
    /// on the I/O threads. Between the presenter's callbacks (which run there unless
    /// isolated elsewhere) it writes each reply itself, with no hand-over to another
    /// thread on the way back to the asking process.
    func start() {
        let stream = incomingStream
        Task.detached(executorPreference: serving) { [self] in
            for await message in stream { await serve(message) }
        }
    }

    // MARK: Receiving (on the watcher thread)

    /// A file was closed in this process's mailbox: read it, act on it, then empty it (a
    /// slot, which its sender writes again: see ``MessageSlots``) or remove it. After a
    /// queue overflow (events lost), every file in the mailbox is read.
    func received(_ event: InotifyEvent) {
        if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
            readWholeMailbox()
            return
        }
        guard !event.name.isEmpty, event.mask & UInt32(IN_ISDIR) == 0 else { return }
        receiving.withLock { _ in receive(event.name, rescanning: false) }
    }

    /// Reads every message in the mailbox (after a queue overflow, as the mailbox starts to
    /// be watched, or on each poll of a process that cannot watch it). Blocking.
    func readWholeMailbox() {
        receiving.withLock { _ in
            for name in rescanOrder() { receive(name, rescanning: true) }
        }
    }

    /// Reads and acts on the message file `name`. A rescan leaves alone what may still be
    /// being written (empty, or without its end line): its own event comes later.
    private func receive(_ name: [UInt8], rescanning: Bool) {
        let fd = Self.openMessage(dirFD: files.mailboxFD, name: name)
        // Gone: a slot its sender retired (see ``MessageSlots``), or read by a rescan.
        guard fd >= 0 || errno != ENOENT else { return }
        let outcome = fd >= 0 ? Self.readMessage(fd) : .failure(.notAMessage)
        if rescanning, case .failure(let reason) = outcome, reason == .empty || reason == .truncated {
            if fd >= 0 { Glibc.close(fd) }
            return
        }
        // Whether the message was served right here (its reply, if any, is written).
        var servedHere = false
        // Done once the message is handed on: off the reply's path. A slot is emptied for
        // its sender to write again, unless the sender has left or was cleaned up after.
        defer {
            // The thread the message was handed to (or the task its reply resumes) may wait
            // for this CPU: let it run first. (Served here, it went to no other thread, and
            // a reply written here yielded already.)
            if case .success = outcome, !servedHere { sched_yield() }
            switch (MessageSlots.isSlot(name), outcome) {
            case (true, .failure(.empty)): break // a spare closed unused: removed by its sender, or after it dies
            // The record is tested again after emptying: a sender that removed it in
            // between may have passed this slot over as full while leaving (it removes
            // its record before its empty slots), so the slot is this receiver's to remove.
            case (true, .success(let message)) where hasRecord(message.string("from")) && Self.truncate(fd)
                && hasRecord(message.string("from")): break
            default: _ = Self.withCString(name) { unlinkat(files.mailboxFD, $0, 0) }
            }
            if fd >= 0 { Glibc.close(fd) }
        }
        var path: FilePath { files.mailboxPath.appending(String(decoding: name, as: UTF8.self)) } // for warnings
        let message: SpaceMessage
        switch outcome {
        case .success(let decoded): message = decoded
        case .failure(.empty): return
        case .failure(let reason): return Self.ignored(path, reason.rawValue)
        }
        PresenterMessenger.logger.debug("message \(message.kind) #\(message.number("id") ?? 0) from \(message.string("from") ?? "?")")
        switch message.kind {
        case "reply", "status-reply":
            guard let id = message.number("re") else { return Self.ignored(path, "a reply without `re`") }
            resolve(id, with: .success(message))
        case "status":
            Task.detached { [self] in await answerStatus(message) }
        case "reacquire":
            endSuppression(of: message)
            if let from = message.string("from"), let id = message.number("id") {
                // Its relinquish not started yet: the asker gave up on it.
                let key = Self.keptKey(message, from: from, id: id)
                _ = state.withLock { $0.queued.remove(key) }
            }
            servedHere = handOver(message)
        case "relinquish":
            if let from = message.string("from"), let id = message.number("id") {
                let key = Self.keptKey(message, from: from, id: id)
                _ = state.withLock { $0.queued.insert(key) }
            }
            servedHere = handOver(message)
        default:
            servedHere = handOver(message)
        }
    }

    /// The key under which a request's reacquirer and echo suppression are kept: the
    /// asking process and the request's number.
    private static func keptKey(_ message: SpaceMessage, from: String, id: UInt64) -> String {
        "\(from)/\(message.string("re") ?? "\(id)")"
    }

    /// A writer in another process sent `reacquire` after its write: the write's own
    /// inotify events came through this process's one inotify queue before this message,
    /// so the presenter's watch stops dropping them here, on the watcher thread, without
    /// the sync (a cookie file and its events) that ending it later would take. A
    /// suppression not kept yet (a reacquire sent on a timeout, while the relinquish is
    /// still running) is ended by ``serve(_:)`` as before.
    private func endSuppression(of message: SpaceMessage) {
        guard let from = message.string("from"), let id = message.number("id") else { return }
        let key = Self.keptKey(message, from: from, id: id)
        let suppression = state.withLock { state -> (PresenterWatch, Int)? in
            guard let kept = state.kept[key], let suppression = kept.1 else { return nil }
            state.kept[key] = (kept.0, nil)
            return suppression
        }
        if let (watch, token) = suppression { watch.endSuppressingOnWatcherThread(token) }
    }

    /// The one warning for a file in the space that is not a message of ours.
    static func ignored(_ path: FilePath, _ reason: String) {
        PresenterMessenger.logger.warning("ignored a file in the coordination space", metadata: ["path": "\(path)", "reason": "\(reason)"])
    }

    static func withCString<T>(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> T) -> T {
        (bytes + [0]).withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { body($0.baseAddress!) }
        }
    }

    /// Reads one small message file (`name` relative to `dirFD`) without following links
    /// or blocking on a FIFO.
    private func readMessage(dirFD: Int32, name: [UInt8]) -> Result<SpaceMessage, SpaceMessage.MalformedReason> {
        let fd = Self.openMessage(dirFD: dirFD, name: name)
        guard fd >= 0 else { return .failure(.notAMessage) }
        defer { Glibc.close(fd) }
        return Self.readMessage(fd)
    }

    /// The files in the mailbox in the order they were written, as far as can be told:
    /// by modification time, and a sender's own by the number it gave each message (a
    /// sender's slots are used in turn, so their names say nothing; and times can be
    /// equal). The directory's order is arbitrary: serving a writer's `reacquire` before
    /// its `relinquish` would leave the presenter without its item. Each file is read
    /// here and again when served; this runs only after events were lost.
    private func rescanOrder() -> [[UInt8]] {
        var found: [(name: [UInt8], time: Int64, from: String, id: UInt64)] = []
        for name in (try? Self.list(files.directoryFD, "mail/" + me)) ?? [] where !name.hasPrefix(".") {
            let bytes = Array(name.utf8)
            var time = Int64.max, from = "", id: UInt64 = 0
            let fd = Self.openMessage(dirFD: files.mailboxFD, name: bytes)
            if fd >= 0 {
                var info = stat()
                if fstat(fd, &info) == 0 { time = Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec) }
                if case .success(let message) = Self.readMessage(fd) {
                    from = message.string("from") ?? ""
                    id = message.number("id") ?? 0
                }
                Glibc.close(fd)
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
        while let next = queues.indices.filter({ positions[$0] < queues[$0].count }).min(by: { key($0) < key($1) }) {
            order.append(queues[next][positions[next]].name)
            positions[next] += 1
        }
        return order
    }

    /// Opens a message file for reading; -1 when it cannot be opened.
    private static func openMessage(dirFD: Int32, name: [UInt8]) -> Int32 {
        withCString(name) { fc_openat(dirFD, $0, O_RDONLY | O_NONBLOCK | fc_O_NOFOLLOW | O_CLOEXEC, 0) }
    }

    /// Reads the message file open at `fd`, checked to be a small regular file of ours.
    private static func readMessage(_ fd: Int32) -> Result<SpaceMessage, SpaceMessage.MalformedReason> {
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, info.st_uid == geteuid() else { return .failure(.notAMessage) }
        guard info.st_size <= SpaceMessage.maximumSize else { return .failure(.tooLarge) }
        guard info.st_size > 0 else { return .failure(.empty) }
        var buffer = [UInt8](repeating: 0, count: Int(info.st_size) + 1)
        let count = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard count >= 0 else { return .failure(.notAMessage) }
        return SpaceMessage.decode(buffer[..<count])
    }

    /// Hands a request to the serving task; returns whether it was served here, on the
    /// watcher thread (see ``ServingExecutor``): not for a presenter that says its
    /// callbacks may block, or that is not registered any more.
    private func handOver(_ message: SpaceMessage) -> Bool {
        // A presenter no longer registered may still have a reacquirer kept: not knowing
        // whether it blocks, it is not run here.
        let mayBlock = message.number("presenter").flatMap { number in
            state.withLock { $0.local[number]?.presenter }
        }?.presentedItemCallbacksMayBlock ?? true
        guard !mayBlock else {
            incoming.yield(message)
            return false
        }
        return serving.runHandedOver { incoming.yield(message) }
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

    private static func isHexDigit(_ byte: UInt8) -> Bool {
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
    /// moved it first.
    private func setAside(_ folder: String, _ name: String, reason: String) {
        let dirFD = files.directoryFD
        let hidden = ".foreign-" + name
        guard renameat(dirFD, "\(folder)/\(name)", dirFD, "\(folder)/\(hidden)") == 0 else { return }
        PresenterMessenger.logger.warning("set aside an entry of the coordination space that is not one of ours",
                                          metadata: ["path": "\(files.directory.appending(folder).appending(name))",
                                                     "now": "\(files.directory.appending(folder).appending(hidden))",
                                                     "reason": "\(reason)"])
    }

    /// Whether `process` still has its record in `procs/` (it has not left, and has not
    /// been cleaned up after). True for a message without a sender.
    private func hasRecord(_ process: String?) -> Bool {
        guard let process else { return true }
        guard Self.isProcessName(process) else { return false }
        var info = stat()
        return fstatat(files.directoryFD, "procs/" + process, &info, AT_SYMLINK_NOFOLLOW) == 0
    }

    /// Empties the file open (read-only) at `fd` through its `/proc/self/fd` link: a
    /// descriptor opened for writing would signal `IN_CLOSE_WRITE` when closed, which a
    /// slot's sender reserves for its messages. False when that fails (no `/proc`).
    private static func truncate(_ fd: Int32) -> Bool {
        Glibc.truncate("/proc/self/fd/\(fd)", 0) == 0
    }

    // MARK: Sending and waiting for replies

    enum SendError: Error { case gone }

    /// Runs `job`, the write of a message to `target`, after every one posted before it
    /// for `target`, on an I/O thread: one job at a time writes a process's queue, so
    /// messages to it keep their order without the posting task waiting for each write,
    /// and messages posted together are written after one wake-up. With `inline` (the
    /// caller is on an I/O thread) and nothing queued, it runs right here.
    private func post(to target: String, inline: Bool = false, _ job: @escaping @Sendable () -> Void) {
        let start = outboxes.withLock { boxes -> Bool in
            if boxes[target] != nil {
                boxes[target]?.append(job)
                return false
            }
            boxes[target] = inline ? [] : [job]
            return true
        }
        guard start else { return }
        if inline {
            job()
            // What was posted meanwhile is not this caller's to write.
            let more = outboxes.withLock { boxes -> Bool in
                guard boxes[target]?.isEmpty == false else {
                    boxes[target] = nil
                    return false
                }
                return true
            }
            guard more else { return }
        }
        submitToIOThread { [self] in drain(target) }
    }

    /// Runs `target`'s queued jobs until there are none (on an I/O thread).
    private func drain(_ target: String) {
        while let job = outboxes.withLock({ boxes -> (@Sendable () -> Void)? in
            guard let queue = boxes[target], let first = queue.first else {
                boxes[target] = nil
                return nil
            }
            boxes[target]?.removeFirst()
            return first
        }) {
            job()
        }
    }

    /// Returns once every message posted so far (to any process) is written.
    func flush() async {
        for target in outboxes.withLock({ Array($0.keys) }) {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                let queued = outboxes.withLock { boxes -> Bool in
                    guard boxes[target] != nil else { return false }
                    boxes[target]?.append { continuation.resume() }
                    return true
                }
                if !queued { continuation.resume() }
            }
        }
    }

    /// Posts `message` to `target` without waiting for its write (``flush()`` waits for
    /// it); a failure to write it is ignored, as for any `did…` message or `reacquire`.
    func tell(_ message: SpaceMessage, to target: String) {
        let write = prepare(message, to: target, id: nextID())
        post(to: target) { [self] in
            do {
                try write()
            } catch SendError.gone {
                slots.drop(target, dirFD: files.directoryFD)
            } catch {}
        }
    }

    /// Writes `message` into `target`'s mailbox (on an I/O thread). Throws `.gone` when the
    /// mailbox no longer exists (the process left or died and was cleaned up).
    func send(_ message: SpaceMessage, to target: String, id: UInt64) async throws {
        let write = prepare(message, to: target, id: id)
        try await runOnIOThread(write)
    }

    /// The blocking write of one message (write, close), to run on an I/O thread. The file
    /// is one of this process's slots in `target`'s mailbox (see ``MessageSlots``), else,
    /// while every slot holds a message not read yet, a file created for this message.
    private func prepare(_ message: SpaceMessage, to target: String, id: UInt64) -> @Sendable () throws -> Void {
        PresenterMessenger.logger.debug("message \(message.kind) #\(id) to \(target)")
        var message = message
        message.set("from", me)
        message.set("id", "\(id)")
        message.set("pid", "\(getpid())")
        let bytes = message.encoded()
        let (dirFD, files) = (files.directoryFD, files)
        return { [self] in
            // The path is for the error only: built when one happens.
            func failure(_ operation: String) -> FileCoordinationError {
                FileCoordinationError(operation, errno: Errno(rawValue: errno), path: files.directory.appending("mail").appending(target))
            }
            let lease: MessageSlots.Lease
            if let slot = try slots.open(for: target, dirFD: dirFD) {
                lease = slot
            } else {
                let fd = fc_openat(dirFD, "mail/\(target)/\(me)-\(id)", O_WRONLY | O_CREAT | O_EXCL | fc_O_NOFOLLOW | O_CLOEXEC, 0o600)
                if fd < 0 {
                    if errno == ENOENT { throw SendError.gone }
                    throw failure("open")
                }
                lease = MessageSlots.Lease(fd: fd, target: target, generation: nil)
            }
            let written = bytes.withUnsafeBytes { Glibc.write(lease.fd, $0.baseAddress, $0.count) } == bytes.count
            let error = written ? nil : failure("write")
            Glibc.close(lease.fd)
            // The receiver's thread was just woken, maybe onto this CPU: let it run before
            // this thread's housekeeping (the next slot, the liveness check).
            sched_yield()
            slots.finished(lease, written: written, dirFD: dirFD)
            if let error { throw error }
            slots.makeSpare(for: target, dirFD: dirFD)
        }
    }

    func nextID() -> UInt64 {
        state.withLock { state in
            defer { state.nextMessage += 1 }
            return state.nextMessage
        }
    }

    /// Sends a request and waits for its reply. Returns nil when the target process is
    /// dead (its liveness lock is free): it is cleaned up and skipped.
    ///
    /// The message is written on an I/O thread that this task does not wait for: the task
    /// parks once, until the reply (or the write's failure, or the target's death) arrives.
    ///
    /// Within ``RemoteDeadline/timeout`` (when set), else it throws ``RemoteNoAnswer``.
    func request(_ message: SpaceMessage, to target: String) async throws -> SpaceMessage? {
        let watched = await startWatching()
        let id = nextID()
        state.withLock { $0.replies[id] = .registered(target: target) }
        if !watched { pollForReply(id, from: target) }
        if let timeout = RemoteDeadline.timeout {
            deadlines.add(id, after: timeout) { [self] in resolve(id, with: .failure(RemoteNoAnswer())) }
        }
        defer { deadlines.remove(id) }
        let write = prepare(message, to: target, id: id)
        post(to: target) { [self] in
            do {
                try write()
                // Died before it could read the request: its close already fired.
                guard !isAlive(target) else { return }
                slots.drop(target, dirFD: files.directoryFD)
                resolve(id, with: .success(nil))
                cleanUpHere(target) // on this I/O thread already: no task to hop to another
            } catch SendError.gone {
                slots.drop(target, dirFD: files.directoryFD)
                // No mailbox: it left or died. A presenter record it left behind (one
                // registered while it was leaving) goes too, or every writer would ask it.
                cleanUpHere(target)
                resolve(id, with: .success(nil))
            } catch {
                resolve(id, with: .failure(error))
            }
        }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<SpaceMessage?, any Error>) in
                let ready: Result<SpaceMessage?, any Error>? = state.withLock { state in
                    switch state.replies[id] {
                    case .arrived(let outcome):
                        state.replies[id] = nil
                        return outcome
                    case .registered(let target):
                        state.replies[id] = .waiting(target: target, continuation)
                        return nil
                    case .waiting, .none:
                        // Withdrawn by cancellation before it could park.
                        return .failure(CancellationError())
                    }
                }
                if let ready { continuation.resume(with: ready) }
            }
        } onCancel: {
            // Parked: resumed here. Not parked yet: withdrawn, so parking fails at once.
            let waiting = state.withLock { state -> UnsafeContinuation<SpaceMessage?, any Error>? in
                guard case .waiting(_, let continuation) = state.replies.removeValue(forKey: id) else { return nil }
                return continuation
            }
            waiting?.resume(throwing: CancellationError())
        }
    }

    private func resolve(_ id: UInt64, with outcome: Result<SpaceMessage?, any Error>) {
        let continuation = state.withLock { state -> UnsafeContinuation<SpaceMessage?, any Error>? in
            switch state.replies[id] {
            case .waiting(_, let continuation):
                state.replies[id] = nil
                return continuation
            case .registered:
                state.replies[id] = .arrived(outcome)
                return nil
            default:
                return nil
            }
        }
        continuation?.resume(with: outcome)
    }

    /// Without a watch on the mailbox (no inotify instance to be had): reads the mailbox
    /// after pauses growing to 50 ms until the reply to `id` is in, and ends the wait if
    /// `target` dies meanwhile.
    private func pollForReply(_ id: UInt64, from target: String) {
        Task.detached { [self] in
            var pause: Duration = .milliseconds(1)
            while state.withLock({ state in
                switch state.replies[id] { case .registered?, .waiting?: true; default: false }
            }) {
                try? await Task.sleep(for: pause) // ok: the fallback when nothing can be watched
                pause = Swift.min(pause * 2, .milliseconds(50))
                _ = try? await runOnIOThread { [self] in
                    readWholeMailbox()
                    if !isAlive(target) { resolve(id, with: .success(nil)) }
                }
            }
        }
    }

    /// A process's record was closed: if that process is gone, its pending requests end.
    func processEnded(_ event: InotifyEvent) {
        let name = String(decoding: event.name, as: UTF8.self)
        if slots.hasSpare(for: name) {
            // The spare is a descriptor open in that process's mailbox: kept, it would keep
            // the mailbox (deleted as the process left) alive until four other processes
            // had been written to, and watches of it would end only then.
            submitToIOThread { [self] in
                if !isAlive(name) { slots.drop(name, dirFD: files.directoryFD) }
            }
        }
        let waiting = state.withLock { state in
            state.replies.compactMap { id, reply -> UInt64? in
                switch reply {
                case .waiting(let target, _), .registered(let target): target == name ? id : nil
                case .arrived: nil
                }
            }
        }
        forgetRequests(of: name)
        guard !waiting.isEmpty, !isAlive(name) else { return }
        slots.drop(name, dirFD: files.directoryFD)
        for id in waiting { resolve(id, with: .success(nil)) }
        Task { await cleanUp(name) }
    }

    /// What a dead process left with this process's presenters is undone: its queued
    /// relinquish requests are not served, and a message that the serving task takes
    /// after everything already handed to it ends the echo suppressions and runs the
    /// reacquirers kept for it (``serve(_:)``, `process-ended`). Otherwise a writer
    /// killed after a presenter relinquished would leave the presenter without its item
    /// and deaf to every later change of it.
    private func forgetRequests(of process: String) {
        let prefix = process + "/"
        let concerned = state.withLock { state in
            state.queued.contains { $0.hasPrefix(prefix) } || state.kept.keys.contains { $0.hasPrefix(prefix) }
        }
        guard concerned, !isAlive(process) else { return }
        state.withLock { state in state.queued = state.queued.filter { !$0.hasPrefix(prefix) } }
        var ended = SpaceMessage(kind: "process-ended")
        ended.set("from", process)
        ended.set("id", "0")
        incoming.yield(ended)
    }

    /// `process`'s record. Blocking.
    private func readRecord(of process: String) throws -> SpaceMessage {
        guard Self.isProcessName(process) else { throw SendError.gone }
        switch readMessage(dirFD: files.directoryFD, name: Array("procs/\(process)".utf8)) {
        case .success(let record): return record
        case .failure: throw SendError.gone
        }
    }

    /// Whether `process` still holds the lock on its record.
    func isAlive(_ process: String) -> Bool {
        guard Self.isProcessName(process) else { return false }
        let fd = fc_openat(files.directoryFD, "procs/" + process, O_RDONLY | O_NONBLOCK | fc_O_NOFOLLOW | O_CLOEXEC, 0)
        guard fd >= 0 else { return false }
        defer { Glibc.close(fd) }
        var conflicting: Int16 = fc_F_UNLCK
        guard fc_ofd_getlock(fd, fc_F_WRLCK, 0, 1, &conflicting) == 0 else { return false }
        return conflicting != fc_F_UNLCK
    }

    // MARK: Registering this process's presenters

    /// Publishes a presenter so that other processes find it.
    func register(_ presenter: any FilePresenter, at path: FilePath) async {
        let (number, replaced) = state.withLock { state -> (UInt64, UInt64?) in
            let existing = state.localNumbers[ObjectIdentifier(presenter)]
            if let existing { state.local[existing] = nil }
            defer { state.nextPresenter += 1 }
            state.local[state.nextPresenter] = (presenter, path)
            state.localNumbers[ObjectIdentifier(presenter)] = state.nextPresenter
            return (state.nextPresenter, existing)
        }
        var record = SpaceMessage(kind: "presenter")
        record.set("from", me)
        record.set("pid", "\(getpid())")
        record.set("presenter", "\(number)")
        record.set("path", path)
        let bytes = record.encoded()
        let (dirFD, name, files) = (files.directoryFD, "presenters/\(me)-\(number)", files)
        let previous = replaced.map { "presenters/\(me)-\($0)" }
        do {
            try await runOnIOThread {
                let temporary = "presenters/.\(self.me)-\(number).new"
                let fd = fc_openat(dirFD, temporary, O_WRONLY | O_CREAT | O_TRUNC | fc_O_NOFOLLOW | O_CLOEXEC, 0o600)
                guard fd >= 0 else { throw FileCoordinationError("open", errno: Errno(rawValue: errno), path: files.directory.appending(temporary)) }
                let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                Glibc.close(fd)
                guard written == bytes.count else { throw FileCoordinationError("write", errno: Errno(rawValue: errno), path: files.directory.appending(temporary)) }
                guard renameat(dirFD, temporary, dirFD, name) == 0 else {
                    throw FileCoordinationError("rename", errno: Errno(rawValue: errno), path: files.directory.appending(name))
                }
                if let previous { unlinkat(dirFD, previous, 0) }
                files.bumpSequence()
            }
        } catch {
            PresenterMessenger.logger.warning("cannot publish a presenter in the coordination space; other processes will not find it",
                                              metadata: ["path": "\(path)", "error": "\(error)"])
        }
    }

    /// Withdraws a presenter published by ``register(_:at:)``.
    func unregister(_ presenter: any FilePresenter) async {
        guard let number = state.withLock({ state -> UInt64? in
            guard let number = state.localNumbers.removeValue(forKey: ObjectIdentifier(presenter)) else { return nil }
            state.local[number] = nil
            return number
        }) else { return }
        let (dirFD, name, files) = (files.directoryFD, "presenters/\(me)-\(number)", files)
        _ = try? await runOnIOThread {
            unlinkat(dirFD, name, 0)
            files.bumpSequence()
        }
    }

    // MARK: Other processes' presenters

    /// Brings the cache of other processes' presenters up to date when the registry
    /// changed since it was read: one shared-memory load when nothing changed.
    /// Whether the cache of other processes' presenters is current (one shared-memory load).
    var isRemoteCurrent: Bool {
        let sequence = files.loadSequence()
        return state.withLock { $0.remoteSequence == sequence }
    }

    func refreshRemote() async {
        let sequence = files.loadSequence()
        guard state.withLock({ $0.remoteSequence != sequence }) else { return }
        let (dirFD, me) = (files.directoryFD, me)
        let known = state.withLock { Set($0.remoteByName.keys) }
        let ignored = state.withLock { $0.ignoredRecords }
        let scan: ([String], [String: SpaceMessage])? = try? await runOnIOThread {
            let names = try Self.list(dirFD, "presenters").filter { !$0.hasPrefix(".") && !$0.hasPrefix(me + "-") }
            var fresh: [String: SpaceMessage] = [:]
            for name in names where !known.contains(name) && !ignored.contains(name) {
                guard let owner = Self.processOfPresenter(name) else {
                    self.setAside("presenters", name, reason: "not a presenter record's name")
                    continue
                }
                let reason: String
                switch self.readMessage(dirFD: dirFD, name: Array("presenters/\(name)".utf8)) {
                case .success(let record) where record.kind == "presenter":
                    fresh[name] = record
                    continue
                case .success(let record): reason = "a \(record.kind), not a presenter"
                case .failure(let failure): reason = failure.rawValue
                }
                // Ours to remove once its process is gone; while it lives, said once here.
                if !self.isAlive(owner) {
                    unlinkat(dirFD, "presenters/" + name, 0)
                } else {
                    Self.ignored(self.files.directory.appending("presenters/\(name)"), reason)
                    self.state.withLock { _ = $0.ignoredRecords.insert(name) }
                }
            }
            return (names, fresh)
        }
        guard let (names, fresh) = scan else { return }
        state.withLock { state in
            let present = Set(names)
            for (name, proxy) in state.remoteByName where !present.contains(name) {
                state.remote.remove(ObjectIdentifier(proxy))
                state.remoteByName[name] = nil
            }
            // Refreshes run concurrently (every coordination that finds the cache stale
            // starts one): a name another refresh added meanwhile keeps its proxy. A
            // second proxy of one presenter would ask it once more per coordination.
            for (name, record) in fresh where state.remoteByName[name] == nil {
                guard let process = record.string("from"), let path = record.path("path"),
                      let number = record.number("presenter") else { continue }
                let proxy = RemotePresenter(mail: self, process: process, number: number, path: path,
                                            pid: Int32(record.string("pid") ?? "") ?? 0)
                state.remoteByName[name] = proxy
                state.remote.add(proxy, at: path)
            }
            state.remoteSequence = sequence
        }
    }

    var remoteCount: Int { state.withLock { $0.remote.count } }

    /// Moves the proxies of other processes' presenters at or inside `source`, until their
    /// processes publish the new paths; the moved, to be told `didMove`.
    func moveRemote(from source: FilePath, to destination: FilePath) -> [PresenterRegistry.Moved] {
        state.withLock { $0.remote.isEmpty ? [] : $0.remote.move(from: source, to: destination) }
    }

    func remoteConcernsAny(_ key: PathKey) -> Bool {
        state.withLock { $0.remote.concernsAny(key) }
    }

    func remotePresenters(for path: FilePath, subtree: Bool) -> PresenterRegistry.Concerned {
        state.withLock { $0.remote.concerned(by: path, subtree: subtree, excluding: nil) }
    }

    // MARK: Serving requests for this process's presenters

    private func serve(_ message: SpaceMessage) async {
        guard let from = message.string("from"), let id = message.number("id") else { return }
        let key = Self.keptKey(message, from: from, id: id)
        let presenter = message.number("presenter").flatMap { number in state.withLock { $0.local[number]?.presenter } }
        // Made only by the kinds that use it: parsing a URL is not free.
        var url: URL? { message.path("path")?.fileURL }
        let pid = Int32(message.string("pid") ?? "") ?? 0
        var reply = SpaceMessage(kind: "reply")
        reply.set("re", "\(id)")
        reply.set("result", "ok")
        func replying(_ body: () async throws -> Void) async {
            do { try await body() } catch {
                reply.set("result", "error")
                reply.set("text", Self.describe(error))
            }
            // Written here: this task runs on the library's threads (see `start()`).
            let write = prepare(reply, to: from, id: nextID())
            post(to: from, inline: true) { try? write() }
        }
        switch message.kind {
        case "relinquish":
            // Its asker gave up on it, or died, before it started: nobody waits for it.
            guard state.withLock({ $0.queued.remove(key) }) != nil else { return }
            await replying {
                guard let presenter, let url else { return }
                let writing = message.string("access") == "write"
                let request = FileAccessRequest(url: url, kind: writing ? .writing : .reading,
                                                purposeIdentifier: message.string("purpose") ?? from, processIdentifier: pid)
                let reacquirer = writing ? try await presenter.relinquishPresentedItem(toWriter: request)
                    : try await presenter.relinquishPresentedItem(toReader: request)
                var suppression: (PresenterWatch, Int)?
                if writing, let path = message.path("path"), let watch = CoordinationCenter.shared.watch(of: ObjectIdentifier(presenter)) {
                    suppression = (watch, watch.beginSuppressing(path))
                }
                state.withLock { $0.kept[key] = (reacquirer, suppression) }
                // The steps that follow a relinquish, when the request carries them.
                do {
                    switch message.string("then") {
                    case "save": try await presenter.savePresentedItemChanges()
                    case "accommodate-deletion": try await presenter.accommodatePresentedItemDeletion()
                    default: break
                    }
                    for index in 0... {
                        guard let subitem = message.path("subitem.\(index)") else { break }
                        try await presenter.accommodatePresentedSubitemDeletion(at: subitem.fileURL)
                    }
                } catch {
                    // It relinquished: it takes the item back before the failure is told.
                    let kept = state.withLock { $0.kept.removeValue(forKey: key) }
                    if let (watch, token) = kept?.1 { await watch.endSuppressing(token) }
                    if let reacquirer = kept?.0 { await reacquirer() }
                    throw error
                }
            }
        case "save":
            await replying { try await presenter?.savePresentedItemChanges() }
        case "accommodate-deletion":
            await replying { try await presenter?.accommodatePresentedItemDeletion() }
        case "accommodate-subitem-deletion":
            await replying { if let url { try await presenter?.accommodatePresentedSubitemDeletion(at: url) } }
        case "reacquire":
            let kept = state.withLock { $0.kept.removeValue(forKey: key) }
            // Usually ended on arrival (`endSuppression(of:)`). Otherwise ending it waits
            // for the watch to catch up (a sync through inotify); the next request need not
            // wait behind it.
            if let (watch, token) = kept?.1 { Task { await watch.endSuppressing(token) } }
            if let reacquirer = kept?.0 { await reacquirer() }
        case "process-ended":
            let prefix = from + "/"
            let kept = state.withLock { state in
                let keys = state.kept.keys.filter { $0.hasPrefix(prefix) }
                return keys.compactMap { state.kept.removeValue(forKey: $0) }
            }
            for (reacquirer, suppression) in kept {
                if let (watch, token) = suppression { await watch.endSuppressing(token) }
                if let reacquirer { await reacquirer() }
            }
        case "did-change":
            await presenter?.presentedItemDidChange()
        case "did-move":
            guard let presenter, let to = message.path("to") else { return }
            if let from = message.path("path") { await CoordinationCenter.shared.presenterMoved(presenter, from: from, to: to) }
            await presenter.presentedItemDidMove(to: to.fileURL)
        case "subitem-appear":
            if let url { await presenter?.presentedSubitemDidAppear(at: url) }
        case "subitem-change":
            if let url { await presenter?.presentedSubitemDidChange(at: url) }
        case "subitem-move":
            if let url, let to = message.path("to") { await presenter?.presentedSubitem(at: url, didMoveTo: to.fileURL) }
        default:
            PresenterMessenger.logger.warning("ignored a message of an unknown kind", metadata: ["kind": "\(message.kind)", "from": "\(from)"])
        }
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? FileCoordinationError { return error.message }
        if let error = error as? any LocalizedError, let text = error.errorDescription { return text }
        return String(describing: error)
    }

    // MARK: Status

    private func answerStatus(_ query: SpaceMessage) async {
        guard let from = query.string("from"), let id = query.number("id") else { return }
        // Built as a list and sorted once: a process may hold thousands of claims.
        var fields = [SpaceMessage.Field(key: "re", value: Array("\(id)".utf8))]
        let claims = CoordinationCenter.shared.statusClaims()
        fields += CoordinationSpace.claimFields(claims.held)
        for (index, claim) in claims.waiting.enumerated() {
            fields.append(.init(key: "waiting.\(index)", value: Array((claim.access == .writing ? "w " : "r ").utf8) + claim.path.platformBytes))
        }
        for (index, entry) in localEntries().enumerated() {
            fields.append(.init(key: "presenter.\(index)", value: entry.platformBytes))
        }
        let reply = SpaceMessage(kind: "status-reply", fields: fields)
        try? await send(reply, to: from, id: nextID())
    }

    private func localEntries() -> [FilePath] {
        state.withLock { $0.local.values.map(\.path) }
    }

    func status(localClaims: (held: [CoordinationRules.Claim], waiting: [CoordinationRules.Claim]),
                timeout: Duration) async throws -> CoordinationSpace.Status {
        var status = CoordinationSpace.Status()
        let pid = getpid()
        for claim in localClaims.held {
            status.claims.append(.init(path: claim.path, isWrite: claim.access == .writing, processIdentifier: pid))
        }
        for claim in localClaims.waiting {
            status.waiting.append(.init(path: claim.path, isWrite: claim.access == .writing, processIdentifier: pid))
        }
        for path in localEntries() { status.presenters.append(.init(path: path, processIdentifier: pid)) }
        let (dirFD, me) = (files.directoryFD, me)
        let processes: [String] = try await runOnIOThread {
            try Self.list(dirFD, "procs").filter { $0 != me && !$0.hasPrefix(".") }
        }
        /// `silent`: with the process's record, which lists the claims it has held for a while.
        enum Answer: Sendable { case dead, silent(SpaceMessage?), reply(SpaceMessage) }
        await withTaskGroup(of: (String, Answer).self) { group in
            for process in processes {
                group.addTask { [self] in
                    guard (try? await runOnIOThread { self.isAlive(process) }) == true else { return (process, .dead) }
                    // A process that does not read its mailbox is not asked: its record
                    // says what it holds (see ``CoordinationSpace/claimsChanged()``).
                    let record = try? await runOnIOThread({ try self.readRecord(of: process) })
                    if let record, record.string("listening") == "0" { return (process, .reply(record)) }
                    let answer: Answer? = try? await withThrowingTaskGroup(of: Answer.self) { race in
                        race.addTask { try await self.request(SpaceMessage(kind: "status"), to: process).map { .reply($0) } ?? .dead }
                        race.addTask { try await Task.sleep(for: timeout); return .silent(record) } // ok: a deadline
                        defer { race.cancelAll() }
                        return try await race.next()!
                    }
                    return (process, answer ?? .silent(record))
                }
            }
            func add(_ reply: SpaceMessage, of pid: Int32) {
                for field in reply.fields {
                    let (key, value) = (field.key, field.value)
                    if key.hasPrefix("claim.") || key.hasPrefix("waiting."), value.count > 2, value[2] == UInt8(ascii: "/") {
                        let claim = CoordinationSpace.Status.Claim(path: FilePath(platformBytes: value.dropFirst(2)),
                                                                   isWrite: value[0] == UInt8(ascii: "w"), processIdentifier: pid)
                        if key.hasPrefix("claim.") { status.claims.append(claim) } else { status.waiting.append(claim) }
                    } else if key.hasPrefix("presenter."), value.first == UInt8(ascii: "/") {
                        status.presenters.append(.init(path: FilePath(platformBytes: value), processIdentifier: pid))
                    }
                }
            }
            for await (process, answer) in group {
                let pid = Self.pid(of: process)
                switch answer {
                case .silent(let record):
                    // Stopped or busy: what it holds still stands in the kernel, and its
                    // presenters are still asked (their records say what they present).
                    status.unanswered.append(pid)
                    if let record { add(record, of: pid) }
                    for path in (try? await runOnIOThread { self.publishedPresenters(of: process) }) ?? [] {
                        status.presenters.append(.init(path: path, processIdentifier: pid))
                    }
                case .dead:
                    status.cleanedUp.append(pid)
                    await cleanUp(process)
                case .reply(let reply):
                    add(reply, of: pid)
                }
            }
        }
        status.claims.sort { ($0.path.string, $0.processIdentifier) < ($1.path.string, $1.processIdentifier) }
        status.waiting.sort { ($0.path.string, $0.processIdentifier) < ($1.path.string, $1.processIdentifier) }
        status.presenters.sort { ($0.path.string, $0.processIdentifier) < ($1.path.string, $1.processIdentifier) }
        status.unanswered.sort()
        status.cleanedUp += state.withLock { state in
            defer { state.cleanedUp.removeAll() }
            return state.cleanedUp
        }
        status.cleanedUp.sort()
        return status
    }

    /// The items of `process`'s presenters, from their records in `presenters/` (blocking).
    private func publishedPresenters(of process: String) -> [FilePath] {
        let names = (try? Self.list(files.directoryFD, "presenters")) ?? []
        return names.filter { Self.processOfPresenter($0) == process }.compactMap { name in
            guard case .success(let record) = readMessage(dirFD: files.directoryFD, name: Array("presenters/\(name)".utf8)),
                  record.kind == "presenter" else { return nil }
            return record.path("path")
        }
    }

    // MARK: Cleaning up

    /// The pid in a process name (`<pid>-<random>`).
    static func pid(of process: String) -> Int32 {
        Int32(process.split(separator: "-").first ?? "") ?? 0
    }

    static func list(_ dirFD: Int32, _ name: String) throws -> [String] {
        let fd = fc_openat(dirFD, name, O_RDONLY | fc_O_DIRECTORY | fc_O_NOFOLLOW | O_CLOEXEC, 0)
        guard fd >= 0, let dir = fdopendir(fd) else { throw FileCoordinationError("opendir", errno: Errno(rawValue: errno), path: FilePath(name)) }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = String(decoding: directoryEntryName(entry), as: UTF8.self)
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    /// Removes a dead process's record, mailbox, presenters and message slots (see
    /// ``MessageSlots``); returns whether it did (nothing is removed for a process that
    /// is alive). On an I/O thread, the liveness check included (it opens the record).
    @discardableResult
    func cleanUp(_ process: String) async -> Bool {
        (try? await runOnIOThread { [self] in cleanUpHere(process) }) ?? false
    }

    /// ``cleanUp(_:)`` on this thread (an I/O thread: it blocks).
    @discardableResult
    private func cleanUpHere(_ process: String) -> Bool {
        guard Self.isProcessName(process), process != me, !isAlive(process) else { return false }
        let dirFD = files.directoryFD
        slots.drop(process, dirFD: dirFD)
        var removedPresenters = false
        for name in (try? Self.list(dirFD, "presenters")) ?? [] where name.hasPrefix(process + "-") || name.hasPrefix(".\(process)-") {
            if unlinkat(dirFD, "presenters/" + name, 0) == 0 { removedPresenters = true }
        }
        Self.removeMailbox(dirFD, process)
        unlinkat(dirFD, "procs/" + process, 0)
        unlinkat(dirFD, "procs/." + process, 0)
        // Its slots in other processes' mailboxes (not registry entries).
        MessageSlots.removeEmptySlots(of: process, dirFD: dirFD)
        // Another process may have been first: the registry of presenters, which
        // others cache, changed only if this removed some.
        if removedPresenters { files.bumpSequence() }
        return true
    }

    /// Empties and removes `process`'s mailbox; true if it removed anything. Another
    /// process may create a message file (a slot) in it between the listing and the
    /// `rmdir`: the mailbox is then emptied again, a few times at most. Blocking.
    @discardableResult
    private static func removeMailbox(_ dirFD: Int32, _ process: String) -> Bool {
        var removed = false
        for _ in 0 ..< 4 {
            for name in (try? list(dirFD, "mail/" + process)) ?? [] {
                if unlinkat(dirFD, "mail/\(process)/\(name)", 0) == 0 { removed = true }
            }
            if unlinkat(dirFD, "mail/" + process, AT_REMOVEDIR) == 0 { return true }
            guard errno == ENOTEMPTY else { return removed }
        }
        return removed
    }

    /// How old a join's leftovers must be before they are removed: joining takes
    /// microseconds between creating the mailbox and renaming the record into place.
    static let abandonedJoinAge: Int = 60

    /// Cleans up after every dead process in the space (done when joining); they are
    /// reported by the next ``status(localClaims:timeout:)``. Also removes what a process
    /// that died while joining left: a mailbox with no record, or a record never renamed
    /// into place (`procs/.<process>`), once older than ``abandonedJoinAge`` seconds and
    /// its pid is gone.
    func cleanUpDeadProcesses() async throws {
        let (dirFD, me) = (files.directoryFD, me)
        let candidates = try await runOnIOThread { () throws -> [String] in
            var records = try Self.list(dirFD, "procs")
            var mailboxes = (try? Self.list(dirFD, "mail")) ?? []
            for (folder, names) in [("procs", records), ("mail", mailboxes)] {
                for name in names where !name.hasPrefix(".") && !Self.isProcessName(name) {
                    self.setAside(folder, name, reason: "not a process's name")
                }
            }
            records = records.filter { $0.hasPrefix(".") || Self.isProcessName($0) }
            mailboxes = mailboxes.filter(Self.isProcessName)
            let processes = records.filter { $0 != me && !$0.hasPrefix(".") }
            let named = Set(processes)
            let strays = mailboxes.filter { $0 != me && !named.contains($0) }
                + records.filter { $0.hasPrefix(".") }.map { String($0.dropFirst()) }.filter { $0 != me }
            return processes + Set(strays).filter { Self.abandonedJoin($0, dirFD: dirFD) }
        }
        for process in candidates {
            if await cleanUp(process) { state.withLock { $0.cleanedUp.append(Self.pid(of: process)) } }
        }
    }

    /// Whether `process` died while joining: its pid is gone, and its mailbox and hidden
    /// record (whichever exist) are older than ``abandonedJoinAge``. Blocking (`fstatat`).
    private static func abandonedJoin(_ process: String, dirFD: Int32) -> Bool {
        let pid = pid(of: process)
        guard isProcessName(process), pid > 0, kill(pid, 0) != 0, errno == ESRCH else { return false }
        let now = time(nil)
        for name in ["mail/" + process, "procs/." + process] {
            var info = stat()
            guard fstatat(dirFD, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else { continue }
            if now - info.st_mtim.tv_sec < abandonedJoinAge { return false }
        }
        return true
    }

    /// Removes this process's files; called when it leaves the space.
    func leave() async {
        await flush()
        incoming.finish()
        _ = try? await runOnIOThread { [self] in removeFilesNow() }
    }

    /// Removes this process's record, message slots, presenter records and mailbox, on
    /// the calling thread (it blocks).
    func removeFilesNow() {
        let (dirFD, files, me) = (files.directoryFD, files, me)
        let numbers = state.withLock { Array($0.local.keys) }
        // The record first: a receiver that reads one of this process's slots after
        // this removes it (see ``MessageSlots/removeAll(dirFD:)``).
        unlinkat(dirFD, "procs/" + me, 0)
        slots.removeAll(dirFD: dirFD)
        for number in numbers { unlinkat(dirFD, "presenters/\(me)-\(number)", 0) }
        Self.removeMailbox(dirFD, me)
        // Only the presenters are the registry that others cache: a process that
        // had none changes nothing for them.
        if !numbers.isEmpty { files.bumpSequence() }
    }
}

/// How long a request to another process's presenter may wait for its answer: set by
/// ``PresenterMessenger/bounded(_:_:of:late:_:)`` around the callback, which then runs in
/// the coordinating task itself (a remote callback is a request and a reply, so it cannot
/// hang the task past its deadline).
enum RemoteDeadline {
    @TaskLocal static var timeout: Duration?
}

/// A request to another process was not answered within ``RemoteDeadline/timeout``.
struct RemoteNoAnswer: Error {}

/// A presenter registered by another process, as this process sees it: each callback is
/// a request into that process's mailbox, answered through this process's mailbox.
final class RemotePresenter: FilePresenter, CustomStringConvertible {
    let mail: SpaceMail
    let process: String
    let number: UInt64
    let path: FilePath
    let pid: Int32

    init(mail: SpaceMail, process: String, number: UInt64, path: FilePath, pid: Int32) {
        self.mail = mail
        self.process = process
        self.number = number
        self.path = path
        self.pid = pid
    }

    var presentedItemURL: URL? { path.fileURL }
    var description: String { "the presenter of \(path) in process \(pid)" }

    private func message(_ kind: String, path: FilePath? = nil, to: FilePath? = nil) -> SpaceMessage {
        var message = SpaceMessage(kind: kind)
        message.set("presenter", "\(number)")
        message.set("path", path ?? self.path)
        if let to { message.set("to", to) }
        return message
    }

    /// Sends and waits; throws the presenter's own error text when it refused.
    private func ask(_ message: SpaceMessage) async throws -> Bool {
        guard let reply = try await mail.request(message, to: process) else { return false }
        if reply.string("result") == "error" {
            throw FileCoordinationError(code: .presenterFailed, path: path, operation: message.kind,
                                        message: "\(self) refused: \(reply.string("text") ?? "no reason given")")
        }
        return true
    }

    /// Posts a message that has no answer: the coordination waits for its write once, at
    /// its end (``SpaceMail/flush()``).
    private func tell(_ message: SpaceMessage) async {
        mail.tell(message, to: process)
    }

    /// What a presenter does after relinquishing, in the same request.
    enum FollowUp: String { case save, accommodateDeletion = "accommodate-deletion" }

    /// Relinquish, then the follow-up step and the subitem deletions, in one round trip.
    /// Returns nil when the presenter's process is gone.
    func relinquish(_ item: FilePath, kind: FileAccessRequest.Kind, purpose: String, then followUp: FollowUp? = nil,
                    subitemDeletions: [FilePath] = []) async throws -> FileReacquirer? {
        var message = message("relinquish", path: item)
        message.set("access", kind == .writing ? "write" : "read")
        if let followUp { message.set("then", followUp.rawValue) }
        for (index, subitem) in subitemDeletions.enumerated() { message.set("subitem.\(index)", subitem) }
        message.set("purpose", purpose)
        let id = mail.nextID()
        message.set("re", "\(id)")
        var reacquire = self.message("reacquire")
        reacquire.set("re", "\(id)")
        do {
            guard try await ask(message) else { return nil }
        } catch let error where error is CancellationError || error is RemoteNoAnswer {
            // Given up on (the presenter timeout, or the coordination was cancelled): the
            // presenter may still relinquish later, and must then get its item back.
            // Posted now, ahead of anything this process sends that presenter next.
            mail.tell(reacquire, to: process)
            throw error
        }
        let done = reacquire
        return { [self] in await tell(done) }
    }

    func relinquishPresentedItem(toReader request: FileAccessRequest) async throws -> FileReacquirer? {
        try await relinquish((try? FilePath(fileURL: request.url)) ?? path, kind: request.kind, purpose: request.purposeIdentifier)
    }

    func relinquishPresentedItem(toWriter request: FileAccessRequest) async throws -> FileReacquirer? {
        try await relinquish((try? FilePath(fileURL: request.url)) ?? path, kind: request.kind, purpose: request.purposeIdentifier)
    }

    func savePresentedItemChanges() async throws { _ = try await ask(message("save")) }
    func accommodatePresentedItemDeletion() async throws { _ = try await ask(message("accommodate-deletion")) }
    func accommodatePresentedSubitemDeletion(at url: URL) async throws {
        _ = try await ask(message("accommodate-subitem-deletion", path: try FilePath(fileURL: url)))
    }
    func presentedItemDidChange() async { await tell(message("did-change")) }
    func presentedItemDidMove(to url: URL) async {
        if let to = try? FilePath(fileURL: url) { await tell(message("did-move", to: to)) }
    }
    func presentedSubitemDidAppear(at url: URL) async {
        if let at = try? FilePath(fileURL: url) { await tell(message("subitem-appear", path: at)) }
    }
    func presentedSubitemDidChange(at url: URL) async {
        if let at = try? FilePath(fileURL: url) { await tell(message("subitem-change", path: at)) }
    }
    func presentedSubitem(at url: URL, didMoveTo newURL: URL) async {
        if let at = try? FilePath(fileURL: url), let to = try? FilePath(fileURL: newURL) {
            await tell(message("subitem-move", path: at, to: to))
        }
    }
}
