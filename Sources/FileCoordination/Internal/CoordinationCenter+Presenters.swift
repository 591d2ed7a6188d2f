import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage

/// The registered presenters: their watches, publishing them in the coordination space,
/// finding those an access concerns, and following moves.
extension CoordinationCenter {
    /// Registers a presenter and starts watching its item; returns the watch, to await
    /// its start where the caller wants to.
    @discardableResult
    func addPresenterWatching(_ presenter: any FilePresenter, at path: FilePath) -> PresenterWatch {
        addPresenter(presenter, at: path)
        let watch = PresenterWatch(presenter: presenter, center: self)
        let previous = watches.withLock { $0.updateValue(watch, forKey: ObjectIdentifier(presenter)) }
        previous?.stop()
        return watch
    }

    /// Publishes a presenter in the coordination space, so other processes find it.
    func publish(_ presenter: any FilePresenter, at path: FilePath) async {
        do {
            guard let transport = try await space() else { return }
            // Still registered (not removed meanwhile)?
            guard state.withLock({ $0.presenters.contains(ObjectIdentifier(presenter)) }) else { return }
            guard await transport.publish(presenter, at: path) else {
                FileCoordinator.logger.warning("cannot watch the coordination space (the inotify instance or watch limit?); the presenter is known in this process only",
                                                  metadata: ["path": "\(path)", "space": "\(transport.address)"])
                return
            }
        } catch {
            FileCoordinator.logger.warning("cannot join the coordination space; the presenter is known in this process only",
                                              metadata: ["path": "\(path)", "error": "\(error)"])
        }
    }

    package func watch(of id: ObjectIdentifier) -> PresenterWatch? {
        watches.withLock { $0[id] }
    }

    func addPresenter(_ presenter: any FilePresenter, at path: FilePath) {
        state.withLock { state in
            state.presenters.add(presenter, at: path)
            // Stored under the lock, so concurrent adds and removes cannot reorder it.
            presenterCount.store(state.presenters.count, ordering: .releasing)
        }
    }

    func removePresenter(_ presenter: any FilePresenter) async {
        removePresenterLocally(presenter)
        await transport?.withdraw(presenter)
    }

    func removePresenterLocally(_ presenter: any FilePresenter) {
        watches.withLock { $0.removeValue(forKey: ObjectIdentifier(presenter)) }?.stop()
        state.withLock { state in
            state.presenters.remove(ObjectIdentifier(presenter))
            presenterCount.store(state.presenters.count, ordering: .releasing)
        }
    }

    var presenters: [any FilePresenter] {
        state.withLock { $0.presenters.all }
    }

    /// The presenters concerned by an access to `path`: of the item itself, of the
    /// directories containing it, and (for a subtree access) of the items inside it.
    func presenters(for path: FilePath, subtree: Bool, excluding excluded: ObjectIdentifier?) -> PresenterRegistry.Concerned {
        var concerned = state.withLock { $0.presenters.concerned(by: path, subtree: subtree, excluding: excluded) }
        if let transport, transport.otherPresenterCount > 0 {
            let remote = transport.otherPresenters(for: path, subtree: subtree)
            concerned.item += remote.item
            concerned.containers += remote.containers
            concerned.inside += remote.inside
        }
        return concerned
    }

    /// Records a move: waiting claims and intents, and registered presenters, follow the
    /// item. Returns the presenters to tell, with their old and new paths.
    func move(from source: FilePath, to destination: FilePath) -> [PresenterRegistry.Moved] {
        let (moved, intents) = state.withLock { state in
            (state.presenters.move(from: source, to: destination), state.requests.move(from: source, to: destination))
        }
        for (intent, path) in intents { intent.update(path.fileURL) }
        // Other processes' presenters are told too (their proxies' `didMove` is a message
        // on which their own process follows the item: see ``presenterMoved(_:from:to:)``).
        let transport = self.transport
        let remote = transport?.moveOtherPresenters(from: source, to: destination) ?? []
        if let transport {
            let local = moved.filter { $0.entry.endpoint.isRegisteredHere }
            if !local.isEmpty {
                Task { for item in local { _ = await transport.publish(item.entry.presenter, at: item.newPath) } }
            }
        }
        return moved + remote
    }

    /// Another process moved `presenter`'s item (or a directory containing it) in a
    /// coordination and told it: the registry follows, the item is watched at its new
    /// place, and other processes find it there. Its own watch did not report the rename:
    /// it was dropped as part of that coordinated write.
    func presenterMoved(_ presenter: any FilePresenter, from source: FilePath, to destination: FilePath) async {
        let id = ObjectIdentifier(presenter)
        let moved = state.withLock { state -> Bool in
            guard let current = state.presenters.path(of: id), current == source else { return false }
            state.presenters.add(presenter, at: destination)
            return true
        }
        guard moved else { return }
        await watch(of: id)?.start(at: destination)
        await publish(presenter, at: destination)
    }
}
