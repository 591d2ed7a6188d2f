@testable import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage
import TestSupport
import Testing

@Suite("FileCoordinationError")
struct FileCoordinationErrorTests {
    @Test("errno values map to codes", arguments: [
        (Errno.noSuchFileOrDirectory, FileCoordinationError.Code.notFound),
        (.permissionDenied, .permissionDenied),
        (.notPermitted, .permissionDenied),
        (.isDirectory, .isDirectory),
        (.notDirectory, .notDirectory),
        (.fileExists, .fileExists),
        (.tooManyOpenFiles, .tooManyOpenFiles),
        (.tooManyOpenFilesInSystem, .tooManyOpenFiles),
        (.noSpace, .noSpace),
        (.ioError, .io),
    ])
    func mapping(errno: Errno, code: FileCoordinationError.Code) {
        #expect(FileCoordinationError.Code(errno) == code)
        let error = FileCoordinationError("open", errno: errno, path: "/x")
        #expect(error.code == code)
        #expect(error.description.hasPrefix("/x: open failed: "))
        #expect(error.description.hasSuffix("(\(errno.symbolicName))"))
    }

    @Test("errno symbolic names")
    func names() {
        #expect(Errno.noSuchFileOrDirectory.symbolicName == "ENOENT")
        #expect(Errno.tooManyOpenFiles.symbolicName == "EMFILE")
        #expect(Errno(rawValue: 9999).symbolicName == "errno 9999")
    }
}

@Suite("FileCoordinationError as NSError")
struct FileCoordinationErrorCocoaTests {
    @Test("each code bridges to NSCocoaErrorDomain with Cocoa's code", arguments: [
        (FileCoordinationError.Code.notFound, NSFileReadNoSuchFileError),
        (.notDirectory, NSFileReadNoSuchFileError),
        (.permissionDenied, NSFileReadNoPermissionError),
        (.fileExists, NSFileWriteFileExistsError),
        (.fileTooLarge, NSFileReadTooLargeError),
        (.noSpace, NSFileWriteOutOfSpaceError),
        (.notFileURL, NSFileReadUnsupportedSchemeError),
        (.malformedMessage, NSFileReadCorruptFileError),
        (.cancelled, NSUserCancelledError),
        (.timedOut, NSFileLockingError),
        (.claimLost, NSFileLockingError),
        (.io, NSFileReadUnknownError),
    ])
    func codes(code: FileCoordinationError.Code, cocoa: Int) {
        let error = FileCoordinationError(code: code, path: "/data/a", operation: "coordinate", message: "m") as NSError
        #expect(error.domain == NSCocoaErrorDomain)
        #expect(error.code == cocoa)
        #expect(error.userInfo[NSFilePathErrorKey] as? String == "/data/a")
        #expect(error.localizedDescription == "/data/a: coordinate failed: m")
    }

    @Test("an errno is the underlying POSIX error; EROFS is a read-only volume")
    func underlyingErrno() {
        let missing = FileCoordinationError("open", errno: .noSuchFileOrDirectory, path: "/x") as NSError
        #expect(missing.code == NSFileReadNoSuchFileError)
        let underlying = missing.userInfo[NSUnderlyingErrorKey] as? NSError
        #expect(underlying?.domain == NSPOSIXErrorDomain)
        #expect(underlying?.code == Int(ENOENT))
        let readOnly = FileCoordinationError("open", errno: .readOnlyFileSystem, path: "/x") as NSError
        #expect(readOnly.code == NSFileWriteVolumeReadOnlyError)
    }

    @Test("a presenter's Cocoa error gives its code; its error is the underlying one")
    func presenterCause() {
        let refusal = NSError(domain: NSCocoaErrorDomain, code: NSFileWriteNoPermissionError)
        let failed = FileCoordinationError(code: .presenterFailed, path: "/x", operation: "savePresentedItemChanges",
                                           message: "refused", cause: refusal) as NSError
        #expect(failed.code == NSFileWriteNoPermissionError)
        #expect((failed.userInfo[NSUnderlyingErrorKey] as? NSError)?.code == NSFileWriteNoPermissionError)
        let other = FileCoordinationError(code: .presenterFailed, path: "/x", operation: "save", message: "no",
                                          cause: Refusal()) as NSError
        #expect(other.code == NSFileReadUnknownError)
    }

    struct Refusal: Error {}
}
