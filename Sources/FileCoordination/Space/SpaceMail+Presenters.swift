@_spi(FileCoordinationInternal) import AsyncFileIO
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

    func serve(_ message: SpaceMessage) async {
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
}
