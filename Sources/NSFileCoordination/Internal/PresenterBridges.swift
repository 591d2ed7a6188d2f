#if !canImport(Darwin)
import Foundation
internal import FileCoordination

/// The one ``PresenterBridge`` of each presenter object, and the registered presenters.
///
/// A bridge is found by the presenter's identity while it lives: registered (kept here,
/// with its presenter, until removed, as Apple's coordinator keeps a registered
/// presenter) or held by coordinators made for it (kept by them).
final class PresenterBridges: @unchecked Sendable {
    // Unchecked: `entries` and `order` are read and written under `lock` only.
    static let shared = PresenterBridges()

    private struct Entry {
        weak var bridge: PresenterBridge?
        /// While registered: the presenter and its bridge, kept.
        var registered: (presenter: any NSFilePresenter, bridge: PresenterBridge)?
        /// Registered while it presented nothing (`presentedItemURL` nil): not known to the
        /// engine until it names an item.
        var unplaced = false
    }

    private let lock = NSLock()
    private var entries: [ObjectIdentifier: Entry] = [:]
    /// The registered presenters, in the order they were added.
    private var order: [ObjectIdentifier] = []

    /// The bridge of `presenter`, made on first use.
    func bridge(for presenter: any NSFilePresenter) -> PresenterBridge {
        lock.withLock { bridgeLocked(for: presenter) }
    }

    private func bridgeLocked(for presenter: any NSFilePresenter) -> PresenterBridge {
        let id = ObjectIdentifier(presenter)
        // A bridge whose presenter is gone belonged to an earlier object at the same address.
        if let bridge = entries[id]?.bridge, bridge.presenter === presenter { return bridge }
        let bridge = PresenterBridge(presenter)
        if entries.count >= 64 && entries.count.nonzeroBitCount == 1 {
            // Now and then (at each power of two), forget the bridges nobody keeps.
            entries = entries.filter { $0.value.bridge != nil || $0.value.registered != nil }
        }
        entries[id] = Entry(bridge: bridge)
        return bridge
    }

    /// Registers `presenter`: its bridge, kept with it; nil if it already was.
    func register(_ presenter: any NSFilePresenter) -> PresenterBridge? {
        lock.withLock {
            let id = ObjectIdentifier(presenter)
            guard entries[id]?.registered == nil else { return nil }
            let bridge = bridgeLocked(for: presenter)
            entries[id]?.registered = (presenter, bridge)
            order.append(id)
            return bridge
        }
    }

    /// Registers `presenter`, noting whether it presents anything yet: its bridge, and
    /// whether the engine must know of it (false when it presents nothing yet, or was
    /// registered already and is not newly placed).
    func add(_ presenter: any NSFilePresenter) -> PresenterBridge? {
        if let bridge = register(presenter) {
            if presenter.presentedItemURL != nil { return bridge }
            lock.withLock { entries[ObjectIdentifier(presenter)]?.unplaced = true }
            return nil
        }
        return place(presenter)
    }

    /// A registered presenter that presented nothing and now names an item: its bridge,
    /// once (nil otherwise).
    func place(_ presenter: any NSFilePresenter) -> PresenterBridge? {
        guard presenter.presentedItemURL != nil else { return nil }
        return lock.withLock {
            let id = ObjectIdentifier(presenter)
            guard let entry = entries[id], entry.unplaced, let registered = entry.registered, registered.presenter === presenter
            else { return nil }
            entries[id]?.unplaced = false
            return registered.bridge
        }
    }

    /// Unregisters `presenter`: the bridge it was registered with, if it was.
    func unregister(_ presenter: any NSFilePresenter) -> PresenterBridge? {
        lock.withLock {
            let id = ObjectIdentifier(presenter)
            guard let registered = entries[id]?.registered, registered.presenter === presenter else { return nil }
            entries[id]?.registered = nil
            entries[id]?.unplaced = false
            order.removeAll { $0 == id }
            return registered.bridge
        }
    }

    /// The registered presenters, in the order they were added.
    var registered: [any NSFilePresenter] {
        lock.withLock { order.compactMap { entries[$0]?.registered?.presenter } }
    }
}
#endif
