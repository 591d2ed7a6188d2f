#if !canImport(Darwin)
import Foundation
internal import FileCoordination

/// The `NSError` Apple's coordinator reports for what the engine threw.
enum CocoaErrors {
    /// A presenter's refusal is the presenter's own error, as Apple reports it; a
    /// cancellation is `NSUserCancelledError`; the engine's other errors bridge through
    /// `FileCoordinationError`'s `CustomNSError` conformance (`NSCocoaErrorDomain`, the
    /// Cocoa code for its code, the path and errno in `userInfo`).
    static func from(_ error: any Error) -> NSError {
        switch error {
        case let error as FileCoordinationError:
            if error.code == .presenterFailed, let cause = error.cause { return cause as NSError }
            return error as NSError
        case is CancellationError:
            return NSError(domain: NSCocoaErrorDomain, code: NSUserCancelledError)
        default:
            return error as NSError
        }
    }
}
#endif
