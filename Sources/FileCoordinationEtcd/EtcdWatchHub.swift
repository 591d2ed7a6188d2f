import FileCoordination
import AsyncFileIO

/// Every watch of a process on one stream: one ``EtcdWatch`` over the whole space
/// (`<prefix>/`, every event), its events handed to routes by key prefix and event type on
/// the watch's thread. The gateway streams one watch per HTTP request and cannot take a
/// second one on a stream already answering (HTTP/1.1 is not full duplex in etcd's
/// gateway), so etcd's own multiplexing of watch ids on one stream cannot be had through
/// it; this multiplexes in the process instead.
///
/// The stream starts when the process joins, from the revision after its member key, and
/// follows the space for as long as the process is in it. A route added later hears every
/// event from then on: what it needs from before is read after it was added (so the read
/// comes after the stream's position, and nothing falls between them), and events of the
/// read's revision or earlier may come again, which every route takes without harm (a key
/// deleted twice, a message seen twice, a put of the value read). When no member serves
/// the stream for the client's retry limit, every route is told (``Route/failed``), routes
/// may not be added until the stream is back, and the stream keeps trying from where it
/// was. Routes stay: once back, the stream brings them what happened meanwhile, unless
/// etcd compacted past it; then each route that asked is told (``Route/missed``) before
/// the events that come after.
final class EtcdWatchHub: Sendable {
    /// Who gets which events.
    struct Route: Sendable {
        let prefix: [UInt8]
        let events: EtcdWatch.Events
        /// Called on the watch's thread with the events for the route, in order.
        let deliver: @Sendable ([EtcdJSON.WatchResponse.Event]) -> Void
        /// Called on the watch's thread when the stream goes down (events may be lost).
        let failed: @Sendable (EtcdFailure) -> Void
        /// Called on the watch's thread when the stream is back after etcd compacted
        /// events it had not brought, before any event that comes after them.
        let missed: (@Sendable () -> Void)?

        init(prefix: [UInt8], events: EtcdWatch.Events, deliver: @escaping @Sendable ([EtcdJSON.WatchResponse.Event]) -> Void,
             failed: @escaping @Sendable (EtcdFailure) -> Void, missed: (@Sendable () -> Void)? = nil) {
            (self.prefix, self.events, self.deliver, self.failed, self.missed) = (prefix, events, deliver, failed, missed)
        }
    }

    private struct State {
        var routes: [UInt64: Route] = [:]
        var nextRoute: UInt64 = 1
        var available = true
        var watch: EtcdWatch?
        var stopped = false
    }
    private let state = Locked(State())
    private let client: EtcdClient
    private let prefix: [UInt8]

    init(client: EtcdClient, prefix: [UInt8]) {
        self.client = client
        self.prefix = prefix
    }

    /// Starts the stream from `revision`.
    func start(from revision: Int64) {
        let watch = EtcdWatch(client: client, prefix: prefix, from: revision, events: .all) { [weak self] events in
            self?.route(events)
        } failed: { [weak self] failure in
            self?.wentDown(failure)
        } outage: { [weak self] failure in
            self?.wentDown(failure)
        } resumed: { [weak self] missed in
            self?.resumed(missed: missed)
        }
        let stopped = state.withLock { state in
            state.watch = watch
            return state.stopped
        }
        if stopped { watch.cancel() }
    }

    /// Whether the stream is up (no outage since it last resumed).
    var isAvailable: Bool { state.withLock { $0.available && !$0.stopped } }

    /// Adds a route; nil while the stream is down, or once stopped.
    func add(_ route: Route) -> UInt64? {
        state.withLock { state in
            guard state.available, !state.stopped else { return nil }
            defer { state.nextRoute += 1 }
            state.routes[state.nextRoute] = route
            return state.nextRoute
        }
    }

    /// Removes a route: no event reaches it after this returns, but for a batch being
    /// handed to it on the watch's thread at that moment.
    func remove(_ id: UInt64?) {
        guard let id else { return }
        state.withLock { _ = $0.routes.removeValue(forKey: id) }
    }

    /// Ends the stream (the process leaves the space).
    func stop() {
        let watch = state.withLock { state in
            state.stopped = true
            state.routes.removeAll()
            return state.watch
        }
        watch?.cancel()
    }

    private func route(_ events: [EtcdJSON.WatchResponse.Event]) {
        let routes = state.withLock { $0.routes.sorted { $0.key < $1.key }.map(\.value) }
        let keyed = events.map { (event: $0, key: $0.kv?.keyBytes ?? []) }
        for route in routes {
            let matching = keyed.filter { keyed in
                guard keyed.key.starts(with: route.prefix) else { return false }
                switch route.events {
                case .all: return true
                case .deletions: return keyed.event.type == "DELETE"
                case .puts: return keyed.event.type != "DELETE"
                }
            }
            if !matching.isEmpty { route.deliver(matching.map(\.event)) }
        }
    }

    private func resumed(missed: Bool) {
        let routes = state.withLock { state in
            state.available = true
            return state.routes.sorted { $0.key < $1.key }.map(\.value)
        }
        if missed { for route in routes { route.missed?() } }
    }

    private func wentDown(_ failure: EtcdFailure) {
        let routes = state.withLock { state in
            state.available = false
            return state.routes.sorted { $0.key < $1.key }.map(\.value)
        }
        for route in routes { route.failed(failure) }
    }
}
