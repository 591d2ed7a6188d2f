import CoreMetrics

/// The etcd space's metrics, through swift-metrics (names and dimensions in
/// `docs/design.md`, "Metrics and logging"): the time of each call to etcd, by call, and
/// the leases lost. One set per process (``standard``): a space joined again reuses it, as
/// a backend may unregister a metric when its object goes. Tests give a space a set made
/// with a factory of their own.
package final class EtcdMetrics: Sendable {
    /// The process's set, made on first use with `MetricsSystem.factory`.
    package static let standard = EtcdMetrics()

    package static let callLabel = "filecoord_etcd_call_seconds"
    package static let lostLeasesLabel = "filecoord_etcd_leases_lost_total"
    /// The calls the client makes, as the `call` dimension names them (the API's path
    /// after `/v3/`); any other is `other`.
    package static let calls = ["kv/range", "kv/put", "kv/txn", "kv/deleterange", "lease/grant", "lease/keepalive",
                                "lease/revoke", "auth/authenticate"]

    private let timers: [String: Timer]
    private let otherCalls: Timer
    /// This process's lease was lost: its claims stopped holding.
    let lostLeases: Counter

    package init(factory: any MetricsFactory = MetricsSystem.factory) {
        var timers: [String: Timer] = [:]
        for call in Self.calls {
            timers["/v3/" + call] = Timer(label: Self.callLabel, dimensions: [("call", call)], preferredDisplayUnit: .seconds,
                                          factory: factory)
        }
        self.timers = timers
        otherCalls = Timer(label: Self.callLabel, dimensions: [("call", "other")], preferredDisplayUnit: .seconds, factory: factory)
        lostLeases = Counter(label: Self.lostLeasesLabel, factory: factory)
    }

    /// A call to `path` (`/v3/kv/txn`) took `duration`, answered or not (failing over
    /// among the members included).
    func record(_ path: String, _ duration: Duration) {
        (timers[path] ?? otherCalls).recordNanoseconds(duration.nanoseconds)
    }
}
