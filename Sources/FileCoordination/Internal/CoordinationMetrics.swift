import CoreMetrics

/// The counters and timers of coordination, reported through swift-metrics (names,
/// dimensions and units in `docs/design.md`, "Metrics and logging"). The library chooses
/// no backend: the application bootstraps one (`MetricsSystem.bootstrap`) before its first
/// coordination, since each metric is made once, with the factory of that moment.
///
/// One set per process (``standard``, the shared center's): a backend may unregister a
/// metric when its object goes, so none is made per coordination or per presenter. Tests
/// give a center a set of their own, made with a factory of their own.
package final class CoordinationMetrics: Sendable {
    /// The process's set, made on first use with `MetricsSystem.factory`.
    package static let standard = CoordinationMetrics()

    /// Claims granted, one per item of a coordination (a move counts its source and its
    /// destination), by access.
    let readClaimsGranted: Counter
    let writeClaimsGranted: Counter
    /// How long a coordination's claims waited, here and in other processes, from the
    /// moment they could not be granted at once; a claim granted at once records zero.
    let claimWait: Timer
    /// How long a presenter took to answer a callback (relinquish, save, a change...); one
    /// in another process answers only the request before an access. One that did not
    /// answer in time records nothing.
    let presenterAcknowledgement: Timer
    /// Callbacks a presenter did not answer within the coordinator's timeout.
    let presenterTimeouts: Counter

    package static let claimsGrantedLabel = "filecoord_claims_granted_total"
    package static let claimWaitLabel = "filecoord_claim_wait_seconds"
    package static let presenterAcknowledgementLabel = "filecoord_presenter_ack_seconds"
    package static let presenterTimeoutsLabel = "filecoord_presenter_timeouts_total"

    package init(factory: any MetricsFactory = MetricsSystem.factory) {
        readClaimsGranted = Counter(label: Self.claimsGrantedLabel, dimensions: [("access", "read")], factory: factory)
        writeClaimsGranted = Counter(label: Self.claimsGrantedLabel, dimensions: [("access", "write")], factory: factory)
        claimWait = Timer(label: Self.claimWaitLabel, dimensions: [], preferredDisplayUnit: .seconds, factory: factory)
        presenterAcknowledgement = Timer(label: Self.presenterAcknowledgementLabel, dimensions: [],
                                         preferredDisplayUnit: .seconds, factory: factory)
        presenterTimeouts = Counter(label: Self.presenterTimeoutsLabel, factory: factory)
    }

    /// `claims` granted after waiting `waited` (zero: at once).
    func granted(_ claims: [CoordinationRules.Claim], waited: Duration) {
        var (reads, writes) = (0, 0)
        for claim in claims {
            if claim.access == .writing { writes += 1 } else { reads += 1 }
        }
        if reads > 0 { readClaimsGranted.increment(by: reads) }
        if writes > 0 { writeClaimsGranted.increment(by: writes) }
        claimWait.recordNanoseconds(waited.nanoseconds)
    }
}

extension Duration {
    /// The duration in whole nanoseconds (saturating).
    package var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return whole.addingReportingOverflow(attoseconds / 1_000_000_000).partialValue
    }
}
