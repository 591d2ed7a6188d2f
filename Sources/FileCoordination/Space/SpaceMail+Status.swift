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

/// `status` across the space, and cleaning up after processes that are gone.
extension SpaceMail {
    private typealias Visible = PIDNamespaces.Visible

    // MARK: Status

    func answerStatus(_ query: SpaceProtocol.Header) async {
        let claims = server.hooks.claims()
        let report = SpaceProtocol.StatusReport(re: query.id, claims: CoordinationSpace.claimLines(claims.held),
                                                waiting: claims.waiting.map { .init(isWrite: $0.access == .writing, path: $0.path) },
                                                presenters: localEntries())
        try? await send(.statusReply(report), to: query.from, id: nextID())
    }

    func localEntries() -> [FilePath] {
        server.presented.map(\.path)
    }

    /// `asking` false: no process is asked; each live one is listed from its record (and
    /// its published presenters), none as unanswered.
    func status(localClaims: (held: [CoordinationRules.Claim], waiting: [CoordinationRules.Claim]),
                timeout: Duration, asking: Bool = true) async throws -> CoordinationSpace.Status {
        var status = CoordinationSpace.Status()
        let pid = files.pid
        for claim in localClaims.held {
            status.claims.append(.init(path: claim.path, isWrite: claim.access == .writing, processIdentifier: pid))
        }
        for claim in localClaims.waiting {
            status.waiting.append(.init(path: claim.path, isWrite: claim.access == .writing, processIdentifier: pid))
        }
        for path in localEntries() { status.presenters.append(.init(path: path, processIdentifier: pid)) }
        let (dirFD, me) = (files.directoryFD, me)
        /// What one look at a process's record found: dead, or alive with its record (nil
        /// when it could not be read) and its pid as this process's namespace numbers it.
        struct Looked: Sendable {
            var process: String
            var alive: Bool
            var record: SpaceProtocol.ProcessRecord?
            var who: Visible
        }
        // Every record in one pass on one I/O thread (a hand-off per process made a
        // `status` among a thousand waiting processes cost a second of hand-offs).
        let looked: [Looked] = try await runOnIOThread {
            try Self.list(dirFD, SpaceLayout.records).filter { $0 != me && !$0.hasPrefix(".") }.map { process in
                let named = Visible(pid: Self.pid(of: process), isForeign: false)
                guard self.isAlive(process) else { return Looked(process: process, alive: false, who: named) }
                let record = try? self.readRecord(of: process)
                return Looked(process: process, alive: true, record: record,
                              who: record.map { PIDNamespaces.visible(named.pid, in: $0.pidNamespace) } ?? named)
            }
        }
        /// `silent`: with the process's record, which lists the claims it has held for a
        /// while; `recorded`: not asked, its record read instead.
        enum Answer: Sendable {
            case dead, silent(SpaceProtocol.ProcessRecord?), recorded(SpaceProtocol.ProcessRecord?), reply(SpaceProtocol.StatusReport)
        }
        /// The answer, and the process's pid as this process's namespace numbers it.
        await withTaskGroup(of: (String, Answer, PIDNamespaces.Visible).self) { group in
            for entry in looked {
                let (process, record, visible) = (entry.process, entry.record, entry.who)
                group.addTask { [self] in
                    guard entry.alive else { return (process, .dead, visible) }
                    // A process that does not read its mailbox is not asked: its record
                    // says what it holds and waits for (see ``CoordinationSpace/claimsChanged()``).
                    if let record, !record.listening {
                        return (process, .reply(.init(re: 0, claims: record.claims, waiting: record.waiting)), visible)
                    }
                    guard asking else { return (process, .recorded(record), visible) }
                    let answer: Answer? = try? await withThrowingTaskGroup(of: Answer.self) { race in
                        race.addTask {
                            switch try await self.request(.status, to: process) {
                            case .statusReply(let report)?: .reply(report)
                            case nil: .dead
                            default: .silent(record)
                            }
                        }
                        race.addTask { try await Task.sleep(for: timeout); return .silent(record) } // ok: a deadline
                        defer { race.cancelAll() }
                        return try await race.next()!
                    }
                    return (process, answer ?? .silent(record), visible)
                }
            }
            func add(_ report: SpaceProtocol.StatusReport, of who: Visible) {
                for line in report.claims {
                    status.claims.append(.init(path: line.path, isWrite: line.isWrite, processIdentifier: who.pid,
                                               isInAnotherPIDNamespace: who.isForeign))
                }
                for line in report.waiting {
                    status.waiting.append(.init(path: line.path, isWrite: line.isWrite, processIdentifier: who.pid,
                                                isInAnotherPIDNamespace: who.isForeign))
                }
                for path in report.presenters { addPresenter(path, of: who) }
            }
            func addPresenter(_ path: FilePath, of who: Visible) {
                status.presenters.append(.init(path: path, processIdentifier: who.pid, isInAnotherPIDNamespace: who.isForeign))
            }
            for await (process, answer, who) in group {
                switch answer {
                case .silent(let record), .recorded(let record):
                    // Stopped or busy (or not asked): what it holds still stands in the
                    // kernel, and its presenters are still asked (their records say what
                    // they present).
                    if case .silent = answer { status.unanswered.append(who.pid) }
                    if let record { add(.init(re: 0, claims: record.claims, waiting: record.waiting), of: who) }
                    for path in (try? await runOnIOThread { self.publishedPresenters(of: process) }) ?? [] {
                        addPresenter(path, of: who)
                    }
                case .dead:
                    // Reported once its files are gone (not for files it cannot remove).
                    if await cleanUp(process) { status.cleanedUp.append(who.pid) }
                case .reply(let reply):
                    add(reply, of: who)
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
        // A process cleaned up after by this process's join and found dead again here
        // (another process was removing its files meanwhile) is one process.
        status.cleanedUp = Set(status.cleanedUp).sorted()
        return status
    }

    /// The items of `process`'s presenters, from their records in `presenters/` (blocking).
    func publishedPresenters(of process: String) -> [FilePath] {
        let names = (try? Self.list(files.directoryFD, SpaceLayout.presenters)) ?? []
        return names.filter { Self.processOfPresenter($0) == process }.compactMap { name in
            guard case .success(let message) = readMessage(dirFD: files.directoryFD, name: Array(SpaceLayout.presenterRecord(named: name).utf8)) else { return nil }
            return try? SpaceProtocol.PresenterRecord(decoding: message).path
        }
    }

    // MARK: Cleaning up

    /// The pid in a process name (`<pid>-<random>`).
    static func pid(of process: String) -> Int32 {
        Int32(process.split(separator: "-").first ?? "") ?? 0
    }

    /// The names in the space's folder `name`.
    static func list(_ dirFD: Int32, _ name: String) throws -> [String] {
        try OwnedFiles.list(dirFD, name).mapError { FileCoordinationError(.opendir, errno: $0, path: FilePath(name)) }.get()
    }

    /// Removes a dead process's record, mailbox, presenters and message slots (see
    /// ``MessageSlots``); returns whether this call removed some of them and its record and
    /// mailbox are gone now: false for a process that left (it removed its own files), for
    /// one another process cleaned up after first, and for one that is alive (nothing is
    /// removed). On an I/O thread, the liveness check included (it opens the record).
    @discardableResult
    func cleanUp(_ process: String) async -> Bool {
        (try? await runOnIOThread { [self] in cleanUpHere(process) }) ?? false
    }

    /// ``cleanUp(_:)`` on this thread (an I/O thread: it blocks).
    @discardableResult
    func cleanUpHere(_ process: String) -> Bool {
        guard Self.isProcessName(process), process != me, !isAlive(process) else { return false }
        let dirFD = files.directoryFD
        // No record and no mailbox: it left (leaving removes the record, the process's
        // slots, then its mailbox) or was cleaned up after already, and no slot of it is
        // left to look for in every mailbox (with a thousand processes joining and
        // leaving, each join's look at records that had just gone listed every mailbox).
        let left = !exists(dirFD, SpaceLayout.record(process)) && !exists(dirFD, SpaceLayout.hiddenRecord(process)) && !exists(dirFD, SpaceLayout.mailbox(process))
        slots.drop(process, dirFD: dirFD)
        var removedPresenters = false
        for name in (try? Self.list(dirFD, SpaceLayout.presenters)) ?? [] where SpaceLayout.isPresenterRecord(name, of: process) {
            if case .success = Syscall.unlinkat(dirFD, SpaceLayout.presenterRecord(named: name)) { removedPresenters = true }
        }
        var removed = Self.removeMailbox(dirFD, process) || removedPresenters
        for record in [SpaceLayout.record(process), SpaceLayout.hiddenRecord(process)] {
            if case .success = Syscall.unlinkat(dirFD, record) { removed = true }
        }
        // Its slots in other processes' mailboxes (not registry entries).
        if !left { MessageSlots.removeEmptySlots(of: process, dirFD: dirFD) }
        // Another process may have been first: the registry of presenters, which
        // others cache, changed only if this removed some.
        if removedPresenters { files.bumpSequence() }
        // What could not be removed is not a record or a mailbox this library makes (a
        // directory for a record, a file for a mailbox, one that holds a directory): set
        // aside, or every later look would find it again.
        for (folder, what) in [(SpaceLayout.records, "a process's record"), (SpaceLayout.mailboxes, "a process's mailbox")] where exists(dirFD, "\(folder)/\(process)") {
            if setAside(folder, process, reason: "not \(what) (its type is not one this library makes)") { removed = true }
        }
        return removed && !exists(dirFD, SpaceLayout.record(process)) && !exists(dirFD, SpaceLayout.mailbox(process))
    }

    /// Whether the space has an entry at `name` (blocking).
    private func exists(_ dirFD: Int32, _ name: String) -> Bool {
        if case .failure(.noSuchFileOrDirectory) = Syscall.lstatat(dirFD, name) { return false }
        return true
    }

    /// Empties and removes `process`'s mailbox; true if it removed anything. Another
    /// process may create a message file (a slot) in it between the listing and the
    /// `rmdir`: the mailbox is then emptied again, a few times at most. Blocking.
    @discardableResult
    static func removeMailbox(_ dirFD: Int32, _ process: String) -> Bool {
        var removed = false
        // A file where the mailbox belongs (not one this library makes) goes as a file.
        if case .success(let info) = Syscall.lstatat(dirFD, SpaceLayout.mailbox(process)), info.st_mode & S_IFMT != S_IFDIR {
            if case .success = Syscall.unlinkat(dirFD, SpaceLayout.mailbox(process)) { return true }
            return false
        }
        for _ in 0 ..< 4 {
            for name in (try? list(dirFD, SpaceLayout.mailbox(process))) ?? [] {
                if case .success = Syscall.unlinkat(dirFD, SpaceLayout.mailboxEntry(process, name)) { removed = true }
            }
            switch Syscall.unlinkat(dirFD, SpaceLayout.mailbox(process), directory: true) {
            case .success: return true
            case .failure(.directoryNotEmpty): continue
            case .failure: return removed
            }
        }
        return removed
    }

    /// How old a join's leftovers must be before they are removed: joining takes
    /// microseconds between creating the mailbox and renaming the record into place.
    static let abandonedJoinAge: Int = 60

    /// How many other processes' records a joining process looks at for dead ones, chosen
    /// at random when there are more (`status` looks at all): with a thousand processes
    /// joining at once, each looking at every other's record made a million liveness
    /// checks.
    static let livenessChecksOnJoin = 32

    /// The processes that joining cleans up after (``cleanUp(_:)``): other processes whose
    /// record is no longer locked (among ``livenessChecksOnJoin`` records), and what a
    /// process that died while joining left, a mailbox with no record or a record never
    /// renamed into place (`procs/.<process>`), once older than ``abandonedJoinAge``
    /// seconds and its pid is gone. Names that are not a process's are set aside.
    /// Blocking: on an I/O thread.
    func deadProcessCandidates() throws -> [String] {
        let (dirFD, me) = (files.directoryFD, me)
        var records = try Self.list(dirFD, SpaceLayout.records)
        var mailboxes = (try? Self.list(dirFD, SpaceLayout.mailboxes)) ?? []
        for (folder, names) in [(SpaceLayout.records, records), (SpaceLayout.mailboxes, mailboxes)] {
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
        let looked = processes.count <= Self.livenessChecksOnJoin ? processes : Array(processes.shuffled().prefix(Self.livenessChecksOnJoin))
        return looked.filter { !isAlive($0) } + Set(strays).filter { Self.abandonedJoin($0, dirFD: dirFD) }
    }

    /// Cleans up after those of `candidates` (``deadProcessCandidates()``) that are
    /// dead; they are reported by the next ``status(localClaims:timeout:)``.
    func cleanUp(_ candidates: [String]) async {
        for process in candidates {
            if await cleanUp(process) { state.withLock { $0.cleanedUp.append(Self.pid(of: process)) } }
        }
    }

    /// Whether `process` died while joining: its pid is gone, and its mailbox and hidden
    /// record (whichever exist) are older than ``abandonedJoinAge``. Blocking (`fstatat`).
    static func abandonedJoin(_ process: String, dirFD: Int32) -> Bool {
        let pid = pid(of: process)
        guard isProcessName(process), pid > 0, case .failure(.noSuchProcess) = Syscall.kill(pid, 0) else { return false }
        let now = time(nil)
        for name in [SpaceLayout.mailbox(process), SpaceLayout.hiddenRecord(process)] {
            guard case .success(let info) = Syscall.lstatat(dirFD, name) else { continue }
            if now - info.st_mtim.tv_sec < abandonedJoinAge { return false }
        }
        return true
    }

    /// Removes this process's files; called when it leaves the space.
    func leave() async {
        await flush()
        server.finish()
        _ = try? await runOnIOThread { [self] in removeFilesNow() }
    }

    /// Removes this process's record, message slots, presenter records and mailbox, on
    /// the calling thread (it blocks).
    func removeFilesNow() {
        let (dirFD, files, me) = (files.directoryFD, files, me)
        let numbers = server.presented.map(\.number)
        // The record first: a receiver that reads one of this process's slots after
        // this removes it (see ``MessageSlots/removeAll(dirFD:)``).
        _ = Syscall.unlinkat(dirFD, SpaceLayout.record(me))
        slots.removeAll(dirFD: dirFD)
        for number in numbers { _ = Syscall.unlinkat(dirFD, SpaceLayout.presenterRecord(me, number)) }
        // A process that only claimed made none.
        if mailboxFD >= 0 { Self.removeMailbox(dirFD, me) }
        // Only the presenters are the registry that others cache: a process that
        // had none changes nothing for them.
        if !numbers.isEmpty { files.bumpSequence() }
    }
}
