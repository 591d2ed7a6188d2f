import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The presenters of a coordination: asked before the access (``PresenterPlan``), told
/// after it.
extension FileCoordinator {
    // MARK: Presenters before the access

    /// Asks the presenters of `items` (the batch's, for ``prepare(forReadingItemsAt:options:writingItemsAt:options:isolation:byAccessor:)``),
    /// with no claims: their reacquirers; on any failure runs the ones collected and throws.
    func messageBefore(_ items: [CoordinationMachine.Item]) async throws -> [(PresenterRegistry.Entry, FileReacquirer)] {
        let exclude = filePresenter.map(ObjectIdentifier.init)
        let concerned = items.map { center.presenters(for: $0.path, subtree: $0.subtree, excluding: exclude) }
        let steps = try CoordinationMachine.plan(items, concerned: concerned, silent: UnansweredPresenters.current?.outcomes ?? [:],
                                                 prepared: PreparedBatch.current?.presenters ?? []).get()
        var reacquirers: [(PresenterRegistry.Entry, FileReacquirer)] = []
        var failure: (any Error)?
        for (steps, outcome) in zip(steps, await ask(steps)) {
            switch outcome {
            case .success(let reacquirer?): reacquirers.append((steps.entry, reacquirer))
            case .success(nil): break
            case .failure(let error): failure = failure ?? error
            }
        }
        if let failure {
            await runReacquirers(reacquirers)
            throw failure
        }
        return reacquirers
    }

    /// Asks each presenter its steps (relinquish, then save or accommodate a deletion),
    /// all presenters at once, each one's steps in order: their answers, in order.
    /// `ending`: fired when the coordinator is cancelled, which ends the asking.
    func ask(_ plans: [PresenterPlan.Steps], ending: CancelSignal? = nil) async -> [Result<FileReacquirer?, any Error>] {
        guard !plans.isEmpty else { return [] }
        let (policy, purpose, metrics) = (presenterTimeoutPolicy, purposeIdentifier, center.metrics)
        @Sendable func run(_ steps: PresenterPlan.Steps) async throws -> FileReacquirer? {
            try await steps.entry.endpoint.askBefore(steps, purpose: purpose,
                                                     call: PresenterCall(policy: policy, entry: steps.entry, metrics: metrics, ending: ending))
        }
        // One presenter (the common case) is asked from this task; several, all at once.
        if plans.count == 1 { return [await Result { try await run(plans[0]) }] }
        return await withTaskGroup(of: (Int, Result<FileReacquirer?, any Error>).self) { group in
            for (index, plan) in plans.enumerated() {
                group.addTask { (index, await Result { try await run(plan) }) }
            }
            var outcomes = [Result<FileReacquirer?, any Error>?](repeating: nil, count: plans.count)
            for await (index, outcome) in group { outcomes[index] = outcome }
            return outcomes.map { $0! }
        }
    }

    // MARK: Presenters after the access

    func deliver(_ messages: [PendingMessage]) async {
        // The change has happened; a slow presenter only delays, never fails it.
        let lenient = PresenterTimeoutPolicy(timeout: presenterTimeoutPolicy.timeout, action: .proceed)
        let metrics = center.metrics
        await Self.afterAccess(messages, entry: \.entry) { message in
            await message.entry.endpoint.tell(message, call: PresenterCall(policy: lenient, entry: message.entry, metrics: metrics))
        }
    }

    func runReacquirers(_ reacquirers: [(PresenterRegistry.Entry, FileReacquirer)]) async {
        let lenient = PresenterTimeoutPolicy(timeout: presenterTimeoutPolicy.timeout, action: .proceed)
        let metrics = center.metrics
        await Self.afterAccess(reacquirers, entry: \.0) { pair in
            await pair.0.endpoint.giveBack(pair.1, call: PresenterCall(policy: lenient, entry: pair.0, metrics: metrics))
        }
    }

    /// Runs `body` for each of `items`: for other processes' presenters (a message posted)
    /// from this task, in order; for this process's, from this task when there is one
    /// (the common case), else all at once.
    private static func afterAccess<Item: Sendable>(
        _ items: [Item], entry: (Item) -> PresenterRegistry.Entry, _ body: @escaping @Sendable (Item) async -> Void
    ) async {
        var calls: [Item] = []
        for item in items {
            if entry(item).endpoint.tellsAtOnce { await body(item) } else { calls.append(item) }
        }
        if calls.count <= 1 {
            if let call = calls.first { await body(call) }
            return
        }
        await withTaskGroup(of: Void.self) { group in
            for call in calls { group.addTask { await body(call) } }
        }
    }
}
