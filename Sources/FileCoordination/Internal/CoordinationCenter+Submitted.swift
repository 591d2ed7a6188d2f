extension CoordinationCenter {
    /// While request `id` asks presenters, it stands aside for their coordinators'
    /// `purposes` (``CoordinationRules/yield(_:to:)``); empty `purposes` end it.
    func yield(_ id: RequestID, to purposes: Set<String>) {
        for waiter in state.withLock({ $0.requests.yield(id, to: purposes) }) { waiter.resume() }
    }

    /// A request submitted by ``submit(_:purpose:coordinator:intents:since:)``.
    enum Submitted {
        /// Granted, and its kernel claims (if any) taken: nothing to wait for.
        case held(RequestID)
        /// Still to wait for: ``complete(_:)`` finishes it.
        case pending(Pending)
    }

    /// A submitted request that waits, in this process or for another's kernel claim.
    struct Pending {
        let id: RequestID
        let claims: [CoordinationRules.Claim]
        let coordinator: FileCoordinator
        let granted: Bool
        /// The coordinator's cancellations when its coordination began.
        let cancellations: Int
        /// When it was found to wait (the claim-wait timer's start).
        let since: ContinuousClock.Instant
    }
}
