@_spi(FileCoordinationInternal) import AsyncFileIO
import SystemCalls
import CFileCoordinationShims
@_spi(FileCoordinationInternal) import FileWatching
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The registry: this process's presenters, a cache of other processes' ones, and the
/// requests this process serves for its own.
extension SpaceMail {
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
        let record = SpaceProtocol.PresenterRecord(from: me, pid: files.pid, presenter: number, path: path)
        let bytes = record.encoded().encoded()
        let (dirFD, name, files) = (files.directoryFD, "presenters/\(me)-\(number)", files)
        let previous = replaced.map { "presenters/\(me)-\($0)" }
        do {
            try await runOnIOThread {
                let temporary = "presenters/.\(self.me)-\(number).new"
                let fd = try Syscall.openat(dirFD, temporary, O_WRONLY | O_CREAT | O_TRUNC | fc_O_NOFOLLOW)
                    .mapError("open", files.directory.appending(temporary)).get()
                let written = bytes.withUnsafeBytes { Syscall.write(fd, $0.baseAddress!, $0.count) }
                _ = Syscall.close(fd)
                switch written {
                case .success(let count) where count == bytes.count: break
                case .success: throw FileCoordinationError("write", errno: .noSpace, path: files.directory.appending(temporary))
                case .failure(let errno): throw FileCoordinationError("write", errno: errno, path: files.directory.appending(temporary))
                }
                try Syscall.renameat(dirFD, temporary, name).mapError("rename", files.directory.appending(name)).get()
                if let previous { _ = Syscall.unlinkat(dirFD, previous) }
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
            _ = Syscall.unlinkat(dirFD, name)
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
        let scan: ([String], [String: SpaceProtocol.PresenterRecord])? = try? await runOnIOThread {
            let names = try Self.list(dirFD, "presenters").filter { !$0.hasPrefix(".") && !$0.hasPrefix(me + "-") }
            var fresh: [String: SpaceProtocol.PresenterRecord] = [:]
            for name in names where !known.contains(name) && !ignored.contains(name) {
                guard let owner = Self.processOfPresenter(name) else {
                    self.setAside("presenters", name, reason: "not a presenter record's name")
                    continue
                }
                let reason: String
                switch self.readMessage(dirFD: dirFD, name: Array("presenters/\(name)".utf8)) {
                case .success(let message):
                    do throws(SpaceProtocol.Invalid) {
                        fresh[name] = try SpaceProtocol.PresenterRecord(decoding: message)
                        continue
                    } catch .unknownKind(let kind) {
                        reason = "a \(kind), not a presenter"
                    } catch {
                        reason = error.text
                    }
                case .failure(let failure): reason = failure.rawValue
                }
                // Ours to remove once its process is gone; while it lives, said once here.
                if !self.isAlive(owner) {
                    _ = Syscall.unlinkat(dirFD, "presenters/" + name)
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
                let proxy = RemotePresenter(mail: self, process: record.from, number: record.presenter, path: record.path,
                                            pid: record.pid)
                state.remoteByName[name] = proxy
                state.remote.add(proxy, at: record.path, endpoint: proxy)
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

    func serve(_ message: SpaceProtocol.Message) async {
        guard case .presenter(let request) = message.body else { return }
        let from = message.header.from
        let presenter = state.withLock { $0.local[request.presenter]?.presenter }
        // Made only by the calls that use it: parsing a URL is not free.
        var url: URL { request.path.fileURL }
        func replying(_ body: () async throws -> Void) async {
            var reply = SpaceProtocol.Reply(re: message.header.id)
            do { try await body() } catch { reply.failure = Self.describe(error) }
            // Written here: this task runs on the library's threads (see `start()`).
            let write = prepare(.reply(reply), to: from, id: nextID())
            post(to: from, inline: true) { try? write() }
        }
        switch request.call {
        case .relinquish(let relinquish):
            let key = ServingLedger<KeptRelinquish>.Key(process: from, request: relinquish.re)
            // Its asker gave up on it, or died, before it started: nobody waits for it.
            guard state.withLock({ $0.ledger.startRelinquish(key) }) else { return }
            await replying {
                guard let presenter else { return state.withLock { $0.ledger.relinquishFailed(key) } }
                let writing = relinquish.access == .write
                let fileRequest = FileAccessRequest(url: url, kind: writing ? .writing : .reading,
                                                    purposeIdentifier: relinquish.purpose, processIdentifier: message.header.pid)
                let reacquirer: FileReacquirer?
                do {
                    reacquirer = writing ? try await presenter.relinquishPresentedItem(toWriter: fileRequest)
                        : try await presenter.relinquishPresentedItem(toReader: fileRequest)
                } catch {
                    state.withLock { $0.ledger.relinquishFailed(key) }
                    throw error
                }
                var kept = KeptRelinquish(reacquirer: reacquirer)
                if writing, let watch = CoordinationCenter.shared.watch(of: ObjectIdentifier(presenter)) {
                    kept.suppression = (watch, watch.beginSuppressing(request.path))
                }
                // Its asker died while the presenter relinquished: nobody will reacquire.
                if let orphan = state.withLock({ $0.ledger.relinquished(key, keeping: kept) }) { return await undo(orphan) }
                // The steps that follow a relinquish, when the request carries them.
                do {
                    switch relinquish.then {
                    case .save: try await presenter.savePresentedItemChanges()
                    case .accommodateDeletion: try await presenter.accommodatePresentedItemDeletion()
                    case nil: break
                    }
                    for subitem in relinquish.subitemDeletions {
                        try await presenter.accommodatePresentedSubitemDeletion(at: subitem.fileURL)
                    }
                } catch {
                    // It relinquished: it takes the item back before the failure is told.
                    if let kept = state.withLock({ $0.ledger.reacquire(key) }) { await undo(kept) }
                    throw error
                }
            }
        case .reacquire(let re):
            let key = ServingLedger<KeptRelinquish>.Key(process: from, request: re)
            guard let kept = state.withLock({ $0.ledger.reacquire(key) }) else { return }
            // Usually ended on arrival (`endSuppression(of:)`). Otherwise ending it waits
            // for the watch to catch up (a sync through inotify); the next request need not
            // wait behind it.
            if let (watch, token) = kept.suppression { Task { await watch.endSuppressing(token) } }
            await kept.reacquirer?()
        case .save, .accommodateDeletion, .accommodateSubitemDeletion, .didChange, .didMove, .subitemDidAppear,
             .subitemDidChange, .subitemDidMove:
            await request.deliver(to: presenter, replying: replying)
        }
    }

    /// A dead process's relinquishes are undone (queued behind what was already handed
    /// to the serving task: see ``ServingLedger/senderDied(_:)``).
    func giveBack(_ process: String) async {
        for kept in state.withLock({ $0.ledger.senderGoneServed(process) }) { await undo(kept) }
    }

    /// Ends a kept relinquish: the echo suppression, then the presenter's reacquirer.
    func undo(_ kept: KeptRelinquish) async {
        if let (watch, token) = kept.suppression { await watch.endSuppressing(token) }
        await kept.reacquirer?()
    }

    package static func describe(_ error: any Error) -> String {
        if let error = error as? FileCoordinationError { return error.message }
        if let error = error as? any LocalizedError, let text = error.errorDescription { return text }
        return String(describing: error)
    }
}

extension SpaceProtocol.PresenterMessage {
    /// Delivers a call that no ledger keeps (every call but a relinquish and a reacquire)
    /// to `presenter` (nil: it was unregistered); a request's answer goes through
    /// `replying`. For the mailbox of either space.
    package func deliver(to presenter: (any FilePresenter)?, replying: (() async throws -> Void) async -> Void) async {
        var url: URL { path.fileURL }
        switch call {
        case .save:
            await replying { try await presenter?.savePresentedItemChanges() }
        case .accommodateDeletion:
            await replying { try await presenter?.accommodatePresentedItemDeletion() }
        case .accommodateSubitemDeletion:
            await replying { try await presenter?.accommodatePresentedSubitemDeletion(at: url) }
        case .didChange:
            await presenter?.presentedItemDidChange()
        case .didMove(let to):
            guard let presenter else { return }
            await CoordinationCenter.shared.presenterMoved(presenter, from: path, to: to)
            await presenter.presentedItemDidMove(to: to.fileURL)
        case .subitemDidAppear:
            await presenter?.presentedSubitemDidAppear(at: url)
        case .subitemDidChange:
            await presenter?.presentedSubitemDidChange(at: url)
        case .subitemDidMove(let to):
            await presenter?.presentedSubitem(at: url, didMoveTo: to.fileURL)
        case .relinquish, .reacquire:
            break
        }
    }
}
