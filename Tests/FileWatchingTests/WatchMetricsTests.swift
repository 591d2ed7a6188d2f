import Foundation
import MetricsTestKit
import SystemPackage
import Testing
@testable import FileWatching

/// A watcher's overflows and resyncs, counted into a factory of the test's own.
@Suite("Watch metrics")
struct WatchMetricsTests {
    private func total(_ metrics: TestMetrics, _ label: String, _ dimension: (String, String)) -> Int64 {
        metrics.counterTotal(label: label, dimensions: [dimension])
    }

    @Test("a buffer that overflows counts one overflow, and the resync its consumer takes counts one resync")
    func bufferOverflow() async throws {
        let dir = WatchedDirectory(), metrics = TestMetrics()
        let watcher = try await FileWatcher(watching: dir.path, bufferLimit: 5, reportingExisting: false,
                                            metrics: WatchMetrics(factory: metrics))
        for index in 0 ..< 20 { touch(dir.at("burst\(index)")) }
        try await watcher.sync()
        #expect(total(metrics, WatchMetrics.overflowsLabel, ("queue", "buffer")) == 1, "one overflow, however many events it dropped")
        #expect(total(metrics, WatchMetrics.resyncsLabel, ("cause", "buffer")) == 0, "not taken yet")
        let events = try await watcher.settle()
        #expect(events.last?.kind == .resync)
        #expect(total(metrics, WatchMetrics.resyncsLabel, ("cause", "buffer")) == 1)
        // The next overflow counts again.
        for index in 0 ..< 20 { touch(dir.at("again\(index)")) }
        try await watcher.sync()
        #expect(try await watcher.settle().last?.kind == .resync)
        #expect(total(metrics, WatchMetrics.overflowsLabel, ("queue", "buffer")) == 2)
        #expect(total(metrics, WatchMetrics.resyncsLabel, ("cause", "buffer")) == 2)
        #expect(total(metrics, WatchMetrics.overflowsLabel, ("queue", "kernel")) == 0)
        watcher.cancel()
    }

    @Test("a kernel queue overflow, as the watcher thread hands it to a watcher, counts a kernel overflow and a kernel_queue resync")
    func kernelOverflow() async throws {
        let dir = WatchedDirectory(), metrics = TestMetrics()
        let watcher = try await FileWatcher(watching: dir.path, reportingExisting: false, metrics: WatchMetrics(factory: metrics))
        let tree = watcher.tree
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            InotifyThread.shared.perform { thread in
                tree.handle(.overflow, thread: thread)
                continuation.resume()
            } orFail: { _ in continuation.resume() }
        }
        #expect(total(metrics, WatchMetrics.overflowsLabel, ("queue", "kernel")) == 1)
        let events = try await watcher.settle()
        #expect(events.map(\.resync?.cause) == [.kernelQueue])
        #expect(total(metrics, WatchMetrics.resyncsLabel, ("cause", "kernel_queue")) == 1)
        watcher.cancel()
    }
}
