@_spi(FileCoordinationInternal) @testable import AsyncFileIO
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
