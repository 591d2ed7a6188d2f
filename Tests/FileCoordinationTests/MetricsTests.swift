import CoreMetrics
import Foundation
import AsyncFileIO
import MetricsTestKit
import SystemPackage
import Testing
@testable import FileCoordination
import TestSupport

/// The center's counters and timers, each test with a factory of its own (a metric is
/// made with the factory of its moment, so a process-wide bootstrap would race the tests
/// that run first): what a test reads is its own coordinations' only.
@Suite("Metrics of claims and presenters")
struct MetricsTests {
    /// A private center counting into `metrics`, and a coordinator of it.
    private func center(_ metrics: TestMetrics) -> CoordinationCenter {
        CoordinationCenter(metrics: CoordinationMetrics(factory: metrics))
    }

    private func total(_ metrics: TestMetrics, _ label: String, _ dimensions: [(String, String)] = []) -> Int64 {
        metrics.counterTotal(label: label, dimensions: dimensions)
    }

    @Test("claims granted are counted by access, each coordination's wait is recorded; one that waited for another records that wait")
    func claims() async throws {
        let metrics = TestMetrics(), center = center(metrics), box = Sandbox()
        let (a, b) = (box.file("a", "1"), box.file("b", "2"))
        try await privateCoordinator(center).coordinate(readingItemAt: a) { _ in }
        try await privateCoordinator(center).coordinate(writingItemAt: b) { _ in }
        try await privateCoordinator(center).coordinate(readingItemAt: a, writingItemAt: b) { _, _ in }
        #expect(total(metrics, CoordinationMetrics.claimsGrantedLabel, [("access", "read")]) == 2)
        #expect(total(metrics, CoordinationMetrics.claimsGrantedLabel, [("access", "write")]) == 2)
        // One wait each; zero unless the claim files had to be opened first (the
        // process's first claims of a shard).
        let wait = try metrics.expectTimer(CoordinationMetrics.claimWaitLabel)
        #expect(wait.values.count == 3 && wait.values.allSatisfy { $0 >= 0 && $0 < 10_000_000_000 }, "\(wait.values)")

        // A writer that waits for a reader: its wait is recorded, at least as long as the
        // reader held the item after the writer came, at most from its start to its end.
        let readerIn = Gate(), releaseReader = Gate()
        let reader = Task {
            try await privateCoordinator(center).coordinate(readingItemAt: a) { _ in
                readerIn.open()
                await releaseReader.wait()
            }
        }
        await readerIn.wait()
        let before = ContinuousClock.now
        let writer = Task { try await privateCoordinator(center).coordinate(writingItemAt: a) { _ in } }
        await center.waitUntilWaiting(1)
        try await Task.sleep(for: .milliseconds(20)) // ok: the wait to measure is real time
        releaseReader.open()
        try await reader.value
        try await writer.value
        let waited = ContinuousClock.now - before
        #expect(wait.values.count == 5)
        let last = try #require(wait.lastValue)
        #expect(last >= 20_000_000 && last <= waited.nanoseconds, "\(last) ns")
        #expect(total(metrics, CoordinationMetrics.claimsGrantedLabel, [("access", "write")]) == 3)
        withExtendedLifetime(center) {}
    }

    @Test("a presenter that answers records its acknowledgement time; one that does not answer in time counts a timeout, proceeding or failing")
    func presenters() async throws {
        let metrics = TestMetrics(), center = center(metrics), box = Sandbox(), log = EventLog()
        let answering = box.file("answering", "1"), silent = box.file("silent", "2")
        let ready = Recorder("R", url: answering, log: log)
        let hung = Recorder("H", url: silent, log: log, behavior: .hangOnWriters)
        center.addPresenter(ready, at: FilePath(answering.path))
        center.addPresenter(hung, at: FilePath(silent.path))
        defer {
            center.removePresenterLocally(ready)
            center.removePresenterLocally(hung)
        }
        try await privateCoordinator(center).coordinate(writingItemAt: answering) { _ in }
        let acknowledged = try metrics.expectTimer(CoordinationMetrics.presenterAcknowledgementLabel)
        // relinquish, then (after the write) its reacquirer and didChange.
        #expect(acknowledged.values.count >= 2, "\(acknowledged.values)")
        #expect(total(metrics, CoordinationMetrics.presenterTimeoutsLabel) == 0)

        let answers = acknowledged.values.count
        for action in [PresenterTimeoutPolicy.Action.proceed, .fail] {
            let coordinator = privateCoordinator(center)
            coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .milliseconds(100), action: action))
            let outcome = await Result(catching: { try await coordinator.coordinate(writingItemAt: silent) { _ in } })
            if action == .fail {
                #expect(throws: FileCoordinationError.self) { try outcome.get() }
            } else {
                try outcome.get()
            }
        }
        #expect(total(metrics, CoordinationMetrics.presenterTimeoutsLabel) == 2)
        // The silent presenter's relinquish recorded no answer (a didChange after the
        // proceeding write may have).
        #expect(acknowledged.values.count <= answers + 1, "\(acknowledged.values)")
    }

    @Test("a center's default metrics come from swift-metrics' factory (a backend bootstrapped, or one bound to the task)")
    func defaultFactory() async throws {
        let metrics = TestMetrics()
        let counted = withMetricsFactory(metrics) { CoordinationMetrics() }
        let center = CoordinationCenter(metrics: counted), box = Sandbox()
        try await privateCoordinator(center).coordinate(writingItemAt: box.file("f", "1")) { _ in }
        #expect(total(metrics, CoordinationMetrics.claimsGrantedLabel, [("access", "write")]) == 1)
        withExtendedLifetime(center) {}
    }
}
