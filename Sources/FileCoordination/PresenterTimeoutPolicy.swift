/// What a coordinator does when a presenter does not answer in time.
///
/// Apple's coordinator waits forever for a presenter that never answers, so one hung
/// window can hang every writer. Here each presenter callback is bounded.
public struct PresenterTimeoutPolicy: Sendable, Hashable {
    /// What happens when the time is up.
    public enum Action: Sendable, Hashable {
        /// Carry on without the presenter's answer, and log a warning naming it.
        case proceed
        /// Fail the coordination with `FileCoordinationError.Code.timedOut`.
        case fail
    }

    /// How long one presenter callback may take.
    public var timeout: Duration
    /// What happens when it takes longer.
    public var action: Action

    /// A policy.
    public init(timeout: Duration, action: Action) {
        self.timeout = timeout
        self.action = action
    }

    /// The default: wait up to 30 seconds, then proceed with a warning.
    public static let `default` = PresenterTimeoutPolicy(timeout: .seconds(30), action: .proceed)
}
