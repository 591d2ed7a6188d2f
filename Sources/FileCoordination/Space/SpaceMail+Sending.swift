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

/// Messages to other processes, and the replies this process waits for.
extension SpaceMail {
    // MARK: Sending and waiting for replies

    enum SendError: Error { case gone }

    /// A message's write, given how many times it failed already: true once done
    /// (written, or given up), false to be run again after a pause.
    typealias OutgoingWrite = @Sendable (_ failures: Int) -> Bool

    /// Runs `job`, the write of a message to `target`, after every one posted before it
    /// for `target`, on an I/O thread: one job at a time writes a process's queue, so
    /// messages to it keep their order without the posting task waiting for each write,
    /// and messages posted together are written after one wake-up. With `inline` (the
    /// caller is on an I/O thread) and nothing queued, it runs right here.
    func post(to target: String, inline: Bool = false, _ job: @escaping OutgoingWrite) {
        let start = outboxes.withLock { boxes -> Bool in
            if boxes[target] != nil {
                boxes[target]?.post(job)
                return false
            }
            boxes[target] = Outbox(job)
            return true
        }
        guard start else { return }
        if inline { drain(target, onlyFirst: true) } else { submitToIOThread { [self] in drain(target) } }
    }

    /// Carries out `target`'s outbox (on an I/O thread) until it is empty, or until a
    /// write must be run again later. With `onlyFirst`, what was posted behind the first
    /// job is handed to an I/O thread: not this caller's to write.
    func drain(_ target: String, onlyFirst: Bool = false) {
        var first = true
        while true {
            if onlyFirst && !first {
                // What was posted meanwhile is not this caller's to write.
                let more = outboxes.withLock { boxes -> Bool in
                    guard boxes[target]?.isEmpty == false else {
                        boxes[target] = nil
                        return false
                    }
                    return true
                }
                if more { submitToIOThread { [self] in drain(target) } }
                return
            }
            first = false
            let next = outboxes.withLock { boxes -> OutboxOfMail.Next in
                let next = boxes[target]?.next() ?? .empty
                if case .empty = next { boxes[target] = nil }
                return next
            }
            switch next {
            case .empty: return
            case .resume(let continuation):
                // The coordination's messages are written: no more are expected.
                endExpectedIOWork()
                continuation.resume()
            case .write(let write, let failures):
                if write(failures) {
                    outboxes.withLock { $0[target]?.written() }
                    continue
                }
                let (pause, waiting) = outboxes.withLock { $0[target]?.failed() } ?? (0, [])
                for continuation in waiting {
                    endExpectedIOWork()
                    continuation.resume()
                }
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(pause)) { [self] in
                    submitToIOThread { [self] in drain(target) }
                }
                return
            }
        }
    }

    /// Whether jobs wait in `target`'s queue behind the one running.
    func hasQueued(for target: String) -> Bool {
        outboxes.withLock { $0[target]?.hasQueued == true }
    }

    /// Returns once every message posted so far (to any process) is written, or waits to
    /// be written again after a failure.
    func flush() async {
        for target in outboxes.withLock({ Array($0.keys) }) {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                let queued = outboxes.withLock { $0[target]?.wait(continuation) ?? false }
                if !queued { continuation.resume() }
            }
        }
    }

    /// Posts `message` to `target` without waiting for its write (``flush()`` waits for
    /// it). A write that fails is tried again (``writtenOrGivenUp(_:_:to:failures:)``): a
    /// lost `reacquire` would leave its presenter relinquished for as long as this process
    /// lives.
    package func tell(_ message: SpaceProtocol.Body, to target: String) {
        let write = prepare(message, to: target, id: nextID())
        post(to: target) { [self] failures in writtenOrGivenUp(write, message.kind, to: target, failures: failures) }
    }

    /// Runs `write`, of a message of `kind` that waits for no answer, after it failed
    /// `failures` times: true once it is done with (written, `target` gone, or given up),
    /// false to be run again, in order, after a pause. A write that fails (no space, no
    /// descriptor to spare) is given up after ``RetryPause/attempts``, or when `target` dies
    /// or this process leaves the space (each gives back what the other was owed).
    func writtenOrGivenUp(_ write: () throws -> Void, _ kind: String, to target: String, failures: Int) -> Bool {
        // Left the space: what the other process was owed was given back as this one left.
        guard !slots.isClosed else { return true }
        do {
            try write()
        } catch SendError.gone {
            slots.drop(target, dirFD: files.directoryFD)
        } catch {
            let tryAgain = failures + 1 < RetryPause.attempts && !slots.isClosed && isAlive(target)
            if failures == 0 || !tryAgain {
                let what = tryAgain ? "could not be written; trying again" : "could not be written; given up"
                FileCoordinator.logger.warning("a \(kind) message to another process \(what)",
                                               metadata: ["error": "\(error)", "attempts": "\(failures + 1)"])
            }
            return !tryAgain
        }
        return true
    }

    /// Writes `message` into `target`'s mailbox (on an I/O thread). Throws `.gone` when the
    /// mailbox no longer exists (the process left or died and was cleaned up).
    func send(_ message: SpaceProtocol.Body, to target: String, id: UInt64) async throws {
        let write = prepare(message, to: target, id: id)
        try await runOnIOThread(write)
    }

    /// The blocking write of one message (write, close), to run on an I/O thread. The file
    /// is one of this process's slots in `target`'s mailbox (see ``MessageSlots``), else,
    /// while every slot holds a message not read yet, a file created for this message.
    func prepare(_ body: SpaceProtocol.Body, to target: String, id: UInt64) -> @Sendable () throws -> Void {
        if LibraryLogger.logs(.debug) { FileCoordinator.logger.debug("message \(body.kind) #\(id) to \(target)") }
        var message = body.encoded()
        SpaceProtocol.Header(from: me, id: id, pid: files.pid).stamp(&message)
        let bytes = message.encoded()
        let (dirFD, files) = (files.directoryFD, files)
        return { [self] in
            // The path is for the error only: built when one happens.
            func failure(_ operation: FileCoordinationError.Operation, _ errno: Errno) -> FileCoordinationError {
                FileCoordinationError(operation, errno: errno, path: files.directory.appending(SpaceLayout.mailbox(target)))
            }
            let lease: MessageSlots.Lease
            if let slot = try slots.open(for: target, dirFD: dirFD) {
                lease = slot
            } else {
                switch Syscall.openat(dirFD, SpaceLayout.message(to: target, from: me, id: id), O_WRONLY | O_CREAT | O_EXCL | fc_O_NOFOLLOW) {
                case .success(let fd): lease = MessageSlots.Lease(fd: fd, target: target, generation: nil)
                case .failure(.noSuchFileOrDirectory): throw SendError.gone
                case .failure(let errno): throw failure(.open, errno)
                }
            }
            let error: FileCoordinationError?
            switch bytes.withUnsafeBytes({ Syscall.write(lease.fd, $0.baseAddress!, $0.count) }) {
            case .success(let count) where count == bytes.count: error = nil
            case .success: error = failure(.write, .noSpace) // a short write: the file system is full
            case .failure(let errno): error = failure(.write, errno)
            }
            let written = error == nil
            _ = Syscall.close(lease.fd)
            // The receiver's thread was just woken, maybe onto this CPU: let it run before
            // this thread's housekeeping (the next slot, the liveness check). Not while more
            // jobs wait in the same process's queue: after a write, the `reacquire` behind
            // the `did…`, then the coordination waiting for both to be written (its flush).
            // Yielding there made the receiver take one message at a time while this thread
            // and the waiting coordination stood by.
            if !hasQueued(for: target) { sched_yield() }
            slots.finished(lease, written: written, dirFD: dirFD)
            if let error { throw error }
            slots.makeSpare(for: target, dirFD: dirFD)
        }
    }

    package func nextID() -> UInt64 {
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
    /// Within `timeout` (when given), else it throws ``RemoteNoAnswer``.
    package func request(_ message: SpaceProtocol.Body, to target: String, timeout: Duration? = nil,
                         ending: CancelSignal? = nil) async throws -> SpaceProtocol.Body? {
        // The reply comes into this process's mailbox, watched or polled.
        if mailboxFD < 0 {
            do { _ = try await runOnIOThread { [self] in try openMailbox() } } catch let error as FileCoordinationError {
                throw OwnMailboxUnavailable(error: error)
            }
        }
        let watched = await startWatching()
        let id = nextID()
        return try await replies.request(id, to: target, timeout: timeout, ending: ending) {
            if !watched { pollForReply(id, from: target) }
            let write = prepare(message, to: target, id: id)
            post(to: target) { [self] _ in
                do {
                    try write()
                    // Died before it could read the request: its close already fired.
                    guard !isAlive(target) else { return true }
                    slots.drop(target, dirFD: files.directoryFD)
                    replies.resolve(id, with: .success(nil))
                    cleanUpHere(target) // on this I/O thread already: no task to hop to another
                } catch SendError.gone {
                    slots.drop(target, dirFD: files.directoryFD)
                    // No mailbox: it left or died. A presenter record it left behind (one
                    // registered while it was leaving) goes too, or every writer would ask it.
                    cleanUpHere(target)
                    replies.resolve(id, with: .success(nil))
                } catch {
                    // The coordination fails with it, naming the mailbox: nothing to write again.
                    replies.resolve(id, with: .failure(error))
                }
                return true
            }
        }
    }

    /// Without a watch on the mailbox (no inotify instance to be had): reads the mailbox
    /// after pauses growing to 50 ms until the reply to `id` is in, and ends the wait if
    /// `target` dies meanwhile.
    func pollForReply(_ id: UInt64, from target: String) {
        Task.detached { [self] in
            var pause: Duration = .milliseconds(1)
            while replies.isAwaited(id) {
                try? await Task.sleep(for: pause) // ok: the fallback when nothing can be watched
                pause = Swift.min(pause * 2, .milliseconds(50))
                _ = try? await runOnIOThread { [self] in
                    readWholeMailbox()
                    if !isAlive(target) { replies.resolve(id, with: .success(nil)) }
                }
            }
        }
    }

    /// A process's record was closed: if that process is gone, its pending requests end.
    func processEnded(_ event: InotifyEvent) {
        // An overflow reaches the mailbox's watch too, whose handler checks what the
        // deaths lost meant, after reading the mailbox again (``recheckAfterOverflow()``).
        // So does reading it again after a message was left unread: what a dead process
        // is owed is given back after the messages it sent.
        guard event.mask & UInt32(IN_Q_OVERFLOW) == 0, !waitsToReadAgain else { return }
        processEnded(String(decoding: event.name, as: UTF8.self))
    }

    /// After an inotify queue overflow the deaths among the events lost are unknown: every
    /// process this one waits for or owes something is checked. Run after the mailbox is
    /// read again, so that requests found only by that rescan are covered.
    func recheckAfterOverflow() {
        // A message left unread: the read that follows rechecks.
        guard !waitsToReadAgain else { return }
        for name in ProcessEnding.toRecheck(awaited: replies.targets, owed: server.owedProcesses) { processEnded(name) }
    }

    /// `name`'s record was closed or removed: if that process is gone, its pending
    /// requests end and what this process owes it is undone (``ProcessEnding``).
    func processEnded(_ name: String) {
        if slots.hasSpare(for: name) {
            // The spare is a descriptor open in that process's mailbox: kept, it would keep
            // the mailbox (deleted as the process left) alive until four other processes
            // had been written to, and watches of it would end only then.
            submitToIOThread { [self] in
                if !isAlive(name) { slots.drop(name, dirFD: files.directoryFD) }
            }
        }
        let outcome = ProcessEnding.decide(waiting: replies.awaiting(name), owes: server.owes(name)) { isAlive(name) }
        if outcome.givesBack { server.senderDied(name) }
        if outcome.cleansUp { slots.drop(name, dirFD: files.directoryFD) }
        for id in outcome.unanswered { replies.resolve(id, with: .success(nil)) }
        if outcome.cleansUp { Task { await cleanUp(name) } }
    }

    /// `process`'s record. Blocking.
    func readRecord(of process: String) throws -> SpaceProtocol.ProcessRecord {
        guard Self.isProcessName(process) else { throw SendError.gone }
        switch readMessage(dirFD: files.directoryFD, name: Array(SpaceLayout.record(process).utf8)) {
        case .success(let record): return try SpaceProtocol.ProcessRecord(decoding: record)
        case .failure: throw SendError.gone
        }
    }

    /// Whether `process` still holds the lock on its record. False only when that is
    /// known: no record (or a link where it should be), or its lock is free. A check that
    /// fails otherwise (no descriptor to spare, no memory) answers true: a live process
    /// taken for dead would be cleaned up after, its record, mailbox and presenters removed.
    func isAlive(_ process: String) -> Bool {
        guard Self.isProcessName(process) else { return false }
        let fd: Int32
        switch Syscall.openat(files.directoryFD, SpaceLayout.record(process), O_RDONLY | O_NONBLOCK | fc_O_NOFOLLOW) {
        case .success(let opened): fd = opened
        case .failure(.noSuchFileOrDirectory), .failure(.notDirectory), .failure(.tooManySymbolicLinkLevels): return false
        case .failure: return true
        }
        defer { _ = Syscall.close(fd) }
        guard case .success(let conflicting) = Syscall.conflictingLock(fd, fc_F_WRLCK, 0, 1) else { return true }
        return conflicting != fc_F_UNLCK
    }
}
