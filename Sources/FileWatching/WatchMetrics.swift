import CoreMetrics

/// The counters of watching, reported through swift-metrics (names and dimensions in
/// `docs/design.md`, "Metrics and logging"). Made once per process (``standard``); a
/// backend may unregister a metric when its object goes, so none is made per watcher.
/// Tests give a watcher a set made with a factory of their own.
package final class WatchMetrics: Sendable {
    /// The process's set, made on first use with `MetricsSystem.factory`.
    package static let standard = WatchMetrics()

    /// A watcher lost events because the kernel's inotify queue overflowed (each watcher
    /// of the process counts the overflow once).
    let kernelOverflows: Counter
    /// A watcher's buffer filled up and began to drop events (once until its resync is
    /// taken).
    let bufferOverflows: Counter
    /// Resyncs delivered to a watcher's consumer, by cause.
    let kernelResyncs: Counter
    let bufferResyncs: Counter
    let unmountResyncs: Counter

    package static let overflowsLabel = "filecoord_watch_overflows_total"
    package static let resyncsLabel = "filecoord_watch_resyncs_total"

    package init(factory: any MetricsFactory = MetricsSystem.factory) {
        kernelOverflows = Counter(label: Self.overflowsLabel, dimensions: [("queue", "kernel")], factory: factory)
        bufferOverflows = Counter(label: Self.overflowsLabel, dimensions: [("queue", "buffer")], factory: factory)
        kernelResyncs = Counter(label: Self.resyncsLabel, dimensions: [("cause", "kernel_queue")], factory: factory)
        bufferResyncs = Counter(label: Self.resyncsLabel, dimensions: [("cause", "buffer")], factory: factory)
        unmountResyncs = Counter(label: Self.resyncsLabel, dimensions: [("cause", "unmounted")], factory: factory)
    }

    /// A resync handed to the consumer.
    func resyncDelivered(_ cause: FileEvent.Resync.Cause) {
        switch cause {
        case .kernelQueue: kernelResyncs.increment()
        case .buffer: bufferResyncs.increment()
        case .unmounted: unmountResyncs.increment()
        }
    }
}
