import AsyncFileIO
import SystemCalls
import CFileCoordinationShims
import FileWatching
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
        // Requests for this process's presenters are served from its first presenter on:
        // a process that presents nothing starts no serving task.
        start()
        // A new number each time: other processes read a record once per name.
        let (number, replaced) = server.add(presenter, at: path, renumbering: true)
        let record = SpaceProtocol.PresenterRecord(from: me, pid: files.pid, presenter: number, path: path)
        let bytes = record.encoded().encoded()
        let (dirFD, name, files) = (files.directoryFD, SpaceLayout.presenterRecord(me, number), files)
        let previous = replaced.map { SpaceLayout.presenterRecord(me, $0) }
        do {
            try await runOnIOThread {
                let temporary = SpaceLayout.newPresenterRecord(self.me, number)
                let fd = try Syscall.openat(dirFD, temporary, O_WRONLY | O_CREAT | O_TRUNC | fc_O_NOFOLLOW)
                    .mapError(.open, files.directory.appending(temporary)).get()
                let written = bytes.withUnsafeBytes { Syscall.write(fd, $0.baseAddress!, $0.count) }
                _ = Syscall.close(fd)
                switch written {
                case .success(let count) where count == bytes.count: break
                case .success: throw FileCoordinationError(.write, errno: .noSpace, path: files.directory.appending(temporary))
                case .failure(let errno): throw FileCoordinationError(.write, errno: errno, path: files.directory.appending(temporary))
                }
                try Syscall.renameat(dirFD, temporary, name).mapError(.rename, files.directory.appending(name)).get()
                if let previous { _ = Syscall.unlinkat(dirFD, previous) }
                files.bumpSequence()
            }
        } catch {
            FileCoordinator.logger.warning("cannot publish a presenter in the coordination space; other processes will not find it",
                                              metadata: ["path": "\(path)", "error": "\(error)"])
        }
    }

    /// Withdraws a presenter published by ``register(_:at:)``.
    func unregister(_ presenter: any FilePresenter) async {
        guard let number = server.remove(presenter) else { return }
        let (dirFD, name, files) = (files.directoryFD, SpaceLayout.presenterRecord(me, number), files)
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
        let scan: ([String], [String: SpaceProtocol.PresenterRecord], Bool)? = try? await runOnIOThread {
            let names = try Self.list(dirFD, SpaceLayout.presenters).filter { !$0.hasPrefix(".") && !$0.hasPrefix(me + "-") }
            var fresh: [String: SpaceProtocol.PresenterRecord] = [:]
            // A record that could not be read this time (no descriptor to spare): read
            // again by the next coordination, the cache not marked current.
            var complete = true
            for name in names where !known.contains(name) && !ignored.contains(name) {
                guard let owner = Self.processOfPresenter(name) else {
                    self.setAside(SpaceLayout.presenters, name, reason: "not a presenter record's name")
                    continue
                }
                let reason: String
                switch self.readMessage(dirFD: dirFD, name: Array(SpaceLayout.presenterRecord(named: name).utf8)) {
                case .success(let message):
                    do throws(SpaceProtocol.Invalid) {
                        let record = try SpaceProtocol.PresenterRecord(decoding: message)
                        // Its process is the one its name gives: messages to the presenter
                        // go to that process's mailbox, a name used as a path.
                        guard record.from == owner else {
                            reason = "its process is not the one its name gives"
                            break
                        }
                        fresh[name] = record
                        continue
                    } catch .unknownKind(let kind) {
                        reason = "a \(kind), not a presenter"
                    } catch {
                        reason = error.text
                    }
                case .failure(.unreadable):
                    complete = false
                    continue
                case .failure(let failure): reason = failure.rawValue
                }
                // Ours to remove once its process is gone; while it lives, said once here.
                if !self.isAlive(owner) {
                    _ = Syscall.unlinkat(dirFD, SpaceLayout.presenterRecord(named: name))
                } else {
                    Self.ignored(self.files.directory.appending(SpaceLayout.presenterRecord(named: name)), reason)
                    self.state.withLock { _ = $0.ignoredRecords.insert(name) }
                }
            }
            return (names, fresh, complete)
        }
        guard let (names, fresh, complete) = scan else { return }
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
            if complete { state.remoteSequence = sequence }
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
}
