import Foundation
import SystemPackage

/// `FileCoordinationError` as an `NSError` in `NSCocoaErrorDomain`, with the Cocoa code
/// closest to its ``FileCoordinationError/code``: `error as NSError` gives what Apple's
/// file APIs give for the same failure (`NSFileReadNoSuchFileError` for a missing file,
/// `NSUserCancelledError` for a cancelled coordination).
///
/// The conformance lives beside the type, not in `NSFileCoordination`: every caller that
/// bridges the error (the async API's users too) gets one mapping, and no module declares
/// a conformance of a type it does not own.
///
/// | code | Cocoa code |
/// | --- | --- |
/// | `notFound`, `notDirectory` | `NSFileReadNoSuchFileError` |
/// | `permissionDenied`, `insecureSpace` | `NSFileReadNoPermissionError` (`EROFS`: `NSFileWriteVolumeReadOnlyError`) |
/// | `fileExists` | `NSFileWriteFileExistsError` |
/// | `fileTooLarge` | `NSFileReadTooLargeError` |
/// | `noSpace` | `NSFileWriteOutOfSpaceError` |
/// | `notFileURL` | `NSFileReadUnsupportedSchemeError` |
/// | `malformedMessage` | `NSFileReadCorruptFileError` |
/// | `cancelled` | `NSUserCancelledError` |
/// | `timedOut`, `unreachable`, `claimLost` | `NSFileLockingError` |
/// | `presenterFailed` | the presenter's own code when its error is in `NSCocoaErrorDomain` |
/// | any other | `NSFileReadUnknownError` |
///
/// `userInfo` holds the ``FileCoordinationError/description`` line as the localized
/// description, the path (`NSFilePathErrorKey`), and the errno as an `NSPOSIXErrorDomain`
/// error, or else the ``FileCoordinationError/cause``, as `NSUnderlyingErrorKey`.
extension FileCoordinationError: CustomNSError {
    /// `NSCocoaErrorDomain`.
    public static var errorDomain: String { NSCocoaErrorDomain }

    /// The Cocoa code for ``code`` (the table above).
    public var errorCode: Int {
        switch code {
        case .notFound, .notDirectory: return NSFileReadNoSuchFileError
        case .permissionDenied, .insecureSpace:
            return errno == .readOnlyFileSystem ? NSFileWriteVolumeReadOnlyError : NSFileReadNoPermissionError
        case .fileExists: return NSFileWriteFileExistsError
        case .fileTooLarge: return NSFileReadTooLargeError
        case .noSpace: return NSFileWriteOutOfSpaceError
        case .notFileURL: return NSFileReadUnsupportedSchemeError
        case .malformedMessage: return NSFileReadCorruptFileError
        case .cancelled: return NSUserCancelledError
        case .timedOut, .unreachable, .claimLost: return NSFileLockingError
        case .presenterFailed:
            if let cause {
                let bridged = cause as NSError
                if bridged.domain == NSCocoaErrorDomain { return bridged.code }
            }
            return NSFileReadUnknownError
        default: return NSFileReadUnknownError
        }
    }

    /// The description line, the path and the underlying errno or cause.
    public var errorUserInfo: [String: Any] {
        var info: [String: Any] = [NSLocalizedDescriptionKey: description]
        if let path { info[NSFilePathErrorKey] = path.string }
        if let errno {
            info[NSUnderlyingErrorKey] = NSError(domain: NSPOSIXErrorDomain, code: Int(errno.rawValue))
        } else if let cause {
            info[NSUnderlyingErrorKey] = cause as NSError
        }
        return info
    }
}
