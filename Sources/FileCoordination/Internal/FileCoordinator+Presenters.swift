@_spi(FileCoordinationInternal) import AsyncFileIO
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

    /// Asks every concerned presenter to relinquish (and save, or accommodate a
    /// deletion), all presenters at once, each one's steps in order. Returns their
    /// reacquirers; on any failure runs the ones collected and throws.
    func messageBefore(_ items: [CoordinationSession.Item]) async throws -> [(PresenterRegistry.Entry, FileReacquirer)] {
        let exclude = filePresenter.map(ObjectIdentifier.init)
        let prepared = PreparedBatch.current?.presenters ?? []
        let unanswered = UnansweredPresenters.current
        var known: FileCoordinationError?
        var planned = PresenterPlan()
        for item in items {
            let concerned = center.presenters(for: item.path, subtree: item.subtree, excluding: exclude)
            guard !concerned.isEmpty else { continue }
            planned.add(item.path, item.request, concerned: concerned) { entry in
                guard !prepared.contains(entry.id) else { return false }
                // Silent earlier in the same batch: not asked again.
                if let outcome = unanswered?.outcome(of: entry.id) {
                    if let error = outcome { known = known ?? error }
                    return false
                }
                return true
            }
        }
        if let known { throw known }
        guard !planned.isEmpty else { return [] }
        let plans = planned.steps
        let (policy, purpose, metrics) = (presenterTimeoutPolicy, purposeIdentifier, center.metrics)
        // One presenter (the common case) is asked from this task; several, all at once.
        let outcomes = plans.count == 1 ? [await Result { try await Self.run(plans[0], purpose: purpose, policy: policy, metrics: metrics) }]
            : await withTaskGroup(of: (Int, Result<FileReacquirer?, any Error>).self) { group in
            for (index, plan) in plans.enumerated() {
                group.addTask { (index, await Result { try await Self.run(plan, purpose: purpose, policy: policy, metrics: metrics) }) }
            }
            var outcomes = [Result<FileReacquirer?, any Error>?](repeating: nil, count: plans.count)
            for await (index, outcome) in group { outcomes[index] = outcome }
            return outcomes.map { $0! }
        }
        var reacquirers: [(PresenterRegistry.Entry, FileReacquirer)] = []
        var failure: (any Error)?
        for (index, outcome) in outcomes.enumerated() {
            switch outcome {
            case .success(let reacquirer?): reacquirers.append((plans[index].entry, reacquirer))
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

    private static func run(_ steps: PresenterPlan.Steps, purpose: String, policy: PresenterTimeoutPolicy,
                            metrics: CoordinationMetrics) async throws -> FileReacquirer? {
        try await steps.entry.endpoint.askBefore(steps, purpose: purpose,
                                                 call: PresenterCall(policy: policy, entry: steps.entry, metrics: metrics))
    }

    // MARK: Presenters after the access

    func deliver(_ messages: [PendingMessage]) async {
        guard !messages.isEmpty else { return }
        // The change has happened; a slow presenter only delays, never fails it.
        let lenient = PresenterTimeoutPolicy(timeout: presenterTimeoutPolicy.timeout, action: .proceed)
        let metrics = center.metrics
        // One message (the common case) is sent from this task; several, all at once.
        if messages.count == 1 {
            await Self.deliver(messages[0], policy: lenient, metrics: metrics)
            return
        }
        await withTaskGroup(of: Void.self) { group in
            for message in messages {
                group.addTask { await Self.deliver(message, policy: lenient, metrics: metrics) }
            }
        }
    }

    private static func deliver(_ message: PendingMessage, policy: PresenterTimeoutPolicy, metrics: CoordinationMetrics) async {
        let (entry, name, body): (PresenterRegistry.Entry, String, @Sendable () async -> Void)
        switch message {
        case .didChange(let e):
            (entry, name, body) = (e, "presentedItemDidChange()", { await e.presenter.presentedItemDidChange() })
        case .didMove(let e, let path):
            let url = path.fileURL
            (entry, name, body) = (e, "presentedItemDidMove(to:)", { await e.presenter.presentedItemDidMove(to: url) })
        case .subitemDidAppear(let e, let path):
            let url = path.fileURL
            (entry, name, body) = (e, "presentedSubitemDidAppear(at:)", { await e.presenter.presentedSubitemDidAppear(at: url) })
        case .subitemDidChange(let e, let path):
            let url = path.fileURL
            (entry, name, body) = (e, "presentedSubitemDidChange(at:)", { await e.presenter.presentedSubitemDidChange(at: url) })
        case .subitemDidMove(let e, let from, let to):
            let (old, new) = (from.fileURL, to.fileURL)
            (entry, name, body) = (e, "presentedSubitem(at:didMoveTo:)", { await e.presenter.presentedSubitem(at: old, didMoveTo: new) })
        }
        _ = try? await PresenterMessenger.bounded(policy, name, of: entry, metrics: metrics, body)
    }

    func runReacquirers(_ reacquirers: [(PresenterRegistry.Entry, FileReacquirer)]) async {
        guard !reacquirers.isEmpty else { return }
        let lenient = PresenterTimeoutPolicy(timeout: presenterTimeoutPolicy.timeout, action: .proceed)
        let metrics = center.metrics
        @Sendable func run(_ entry: PresenterRegistry.Entry, _ reacquirer: @escaping FileReacquirer) async {
            _ = try? await PresenterMessenger.bounded(lenient, "reacquirer", of: entry, metrics: metrics) { await reacquirer() }
        }
        // One (the common case) runs from this task; several, all at once.
        if reacquirers.count == 1 { return await run(reacquirers[0].0, reacquirers[0].1) }
        await withTaskGroup(of: Void.self) { group in
            for (entry, reacquirer) in reacquirers {
                group.addTask { await run(entry, reacquirer) }
            }
        }
    }
}
