import FileCoordination
import AsyncFileIO
import SystemPackage

/// Other processes' presenters: read once, then followed through a route of the
/// process's watch stream.
extension EtcdMail {
    var isCurrent: Bool { state.withLock { $0.current } }
    var remoteCount: Int { state.withLock { $0.remote.count } }
    func concernsAny(_ key: PathKey) -> Bool { state.withLock { $0.remote.concernsAny(key) } }
    func presenters(for path: FilePath, subtree: Bool) -> PresenterRegistry.Concerned {
        state.withLock { $0.remote.concerned(by: path, subtree: subtree, excluding: nil) }
    }
    func move(from source: FilePath, to destination: FilePath) -> [PresenterRegistry.Moved] {
        state.withLock { $0.remote.move(from: source, to: destination) }
    }

    /// Follows every presenter: the route first (its events held meanwhile), then one read
    /// of them all, then the events held: current from then on. The read comes after the
    /// stream's position when the route was added, so no change falls between them, and
    /// the events it already reflects, applied again in order, leave each key as it is.
    func refresh() async {
        // One refresh at a time; the others find the view current, or stale until it is.
        guard state.withLock({ state in
            guard !state.current, !state.refreshing else { return false }
            state.refreshing = true
            state.presenterEvents = []
            return true
        }) else { return }
        let route = hub.add(EtcdWatchHub.Route(prefix: presentersFolder, events: .all) { [weak self] events in
            self?.presentersChanged(events)
        } failed: { [weak self] failure in
            FileCoordinator.logger.error("the watch on the etcd space's presenters failed", metadata: ["error": "\(failure)"])
            self?.presentersLost()
        } missed: { [weak self] in
            // Changes were compacted away: the view is read again when next needed.
            self?.presentersLost()
        })
        state.withLock { $0.presenterRoute = route }
        let answer = route == nil ? nil : try? await client.call("/v3/kv/range", EtcdJSON.RangeRequest(key: presentersFolder, prefix: true),
                                                                 as: EtcdJSON.RangeResponse.self)
        let failed = state.withLock { state -> Bool in
            defer {
                state.presenterEvents = nil
                state.refreshing = false
            }
            // No read, or the stream went down meanwhile (the route is gone): not current.
            guard let answer, let route, state.presenterRoute == route else { return true }
            for kv in answer.kvs ?? [] { Self.add(kv, to: &state, mail: self) }
            for events in state.presenterEvents ?? [] { Self.apply(events, to: &state, mail: self) }
            state.current = true
            return false
        }
        if failed { presentersLost() }
    }

    /// On the stream's thread: presenters published, moved or gone.
    private func presentersChanged(_ events: [EtcdJSON.WatchResponse.Event]) {
        state.withLock { state in
            if state.presenterEvents != nil {
                state.presenterEvents!.append(events)
            } else {
                Self.apply(events, to: &state, mail: self)
            }
        }
    }

    /// The stream went down: the view is read whole again by the next coordination.
    private func presentersLost() {
        let route = state.withLock { state -> UInt64? in
            defer {
                state.current = false
                state.presenterRoute = nil
                state.remote = PresenterRegistry()
                state.proxies = [:]
            }
            return state.presenterRoute
        }
        hub.remove(route)
    }

    private static func apply(_ events: [EtcdJSON.WatchResponse.Event], to state: inout State, mail: EtcdMail) {
        for event in events {
            guard let kv = event.kv else { continue }
            if event.type == "DELETE" {
                if let proxy = state.proxies.removeValue(forKey: kv.keyBytes) {
                    state.remote.remove(ObjectIdentifier(proxy.presenter))
                }
            } else {
                add(kv, to: &state, mail: mail)
            }
        }
    }

    static func add(_ kv: EtcdJSON.KeyValue, to state: inout State, mail: EtcdMail) {
        let key = kv.keyBytes
        guard let member = mail.keys.memberName(of: key, under: mail.presentersFolder), member != mail.keys.memberName,
              let number = UInt64(String(decoding: key.split(separator: UInt8(ascii: "/")).last ?? [], as: UTF8.self), radix: 16),
              let record = try? EtcdJSON.decode(PresenterRecord.self, kv.valueBytes)
        else { return }
        let path = mail.names.local(EtcdJSON.bytes(record.path))
        if let known = state.proxies[key] {
            // Published again: where its item moved to, or the same.
            guard known.presenter.path != path else { return }
            state.remote.remove(ObjectIdentifier(known.presenter))
        }
        let proxy = RemotePresenter(mail: mail, process: member, number: number, path: path, pid: record.pid)
        state.proxies[key] = Proxy(presenter: proxy, member: member)
        state.remote.add(proxy, at: path, endpoint: proxy)
    }
}
