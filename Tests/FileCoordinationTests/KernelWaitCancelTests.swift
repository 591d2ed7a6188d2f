import Foundation
import Synchronization
import Testing
@testable import FileCoordination

/// ``FileCoordinator/cancel()`` reaches a coordination in every step of its wait, also
/// between its grant in this process and its wait for another process's lock.
@Suite("cancel before the wait for another process")
struct KernelWaitCancelTests {
    @Test("a cancel() between the grant in this process and the wait for another process's lock ends that wait")
    func cancelBeforeKernelWait() async throws {
        let transport = HeldElsewhere()
        let coordinator = privateCoordinator(CoordinationCenter(transport: transport))
        // The cancel lands in the window: after the grant, while the transport is first asked.
        transport.onTakeNow.withLock { $0 = { coordinator.cancel() } }
        let box = Sandbox()
        let error = await #expect(throws: FileCoordinationError.self) {
            try await coordinator.coordinate(writingItemAt: box.file("f")) { _ in }
        }
        #expect(error?.code == .cancelled, "\(String(describing: error))")
        #expect(transport.released.load(ordering: .relaxed) == 1, "the request's claims were given back")
    }
}

/// A transport whose other processes always hold what is asked: a wait lasts until it is
/// cancelled (or, as a bound on a failing test, 10 s).
final class HeldElsewhere: CoordinationTransport {
    let onTakeNow = Mutex<(@Sendable () -> Void)?>(nil)
    let released = Atomic<Int>(0)
    private let waits = Mutex<(cancelled: Set<UInt64>, waiting: [UInt64: CheckedContinuation<Void, any Error>])>(([], [:]))
    struct WaitedTooLong: Error {}

    var address: String { "held-elsewhere" }

    func takeClaimsNow(_ claims: [CoordinationRules.Claim], for id: UInt64) -> Bool {
        onTakeNow.withLock { $0 }?()
        return false
    }

    func takeClaims(_ claims: [CoordinationRules.Claim], for id: UInt64, whenWaiting: @escaping @Sendable () -> Void) async throws {
        whenWaiting()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await withTaskCancellationHandler {
                    try await withCheckedThrowingContinuation { continuation in
                        let cancelled = self.waits.withLock { waits in
                            if waits.cancelled.remove(id) != nil { return true }
                            waits.waiting[id] = continuation
                            return false
                        }
                        if cancelled { continuation.resume(throwing: FileCoordinationError.coordinatorCancelled()) }
                    }
                } onCancel: {
                    // The bound ran out: this wait ends too.
                    self.waits.withLock { $0.waiting.removeValue(forKey: id) }?.resume(throwing: CancellationError())
                }
            }
            group.addTask {
                try await Task.sleep(for: .seconds(10)) // ok: bounds a failing test, never an event
                throw WaitedTooLong()
            }
            defer { group.cancelAll() }
            try await group.next()
        }
    }

    func cancelWaiting(for id: UInt64) {
        let waiting = waits.withLock { waits -> CheckedContinuation<Void, any Error>? in
            if let continuation = waits.waiting.removeValue(forKey: id) { return continuation }
            waits.cancelled.insert(id)
            return nil
        }
        waiting?.resume(throwing: FileCoordinationError.coordinatorCancelled())
    }

    func releaseClaims(of id: UInt64) { released.add(1, ordering: .relaxed) }
    func batchCanTake(_ claims: [CoordinationRules.Claim]) -> Bool { false }
    func takeClaimsForBatch(_ claims: [CoordinationRules.Claim], for id: UInt64, opening: Bool) -> Bool { false }
    var takesClaimsForBatch: Bool { false }
    func prepareForBatch() async throws -> Bool { true }
    func readsFitting(_ paths: some Collection<[UInt8]>) -> Int? { nil }
    var otherPresentersAreCurrent: Bool { true }
    func refreshOtherPresenters() async {}
    var otherPresenterCount: Int { 0 }
    func otherPresentersConcern(_ key: PathKey) -> Bool { false }
    func otherPresenters(for path: FilePath, subtree: Bool) -> PresenterRegistry.Concerned { .init() }
    func moveOtherPresenters(from source: FilePath, to destination: FilePath) -> [PresenterRegistry.Moved] { [] }
    func publish(_ presenter: any FilePresenter, at path: FilePath) async -> Bool { true }
    func withdraw(_ presenter: any FilePresenter) async {}
    func messagesWritten() async {}
    func leave() async {}
}
