import Foundation
import SystemPackage

extension FilePath {
    /// The path of a `file:` URL, with the exact bytes of its name (percent-escaped
    /// bytes that are not UTF-8 are kept as they are).
    ///
    /// - Throws: ``FileCoordinationError`` with code ``FileCoordinationError/Code/notFileURL``
    ///   for any other URL.
    public init(fileURL url: URL) throws(FileCoordinationError) {
        guard url.isFileURL else {
            throw FileCoordinationError(code: .notFileURL, path: nil, operation: "open",
                                        message: "\(url.absoluteString) is not a file URL")
        }
        let path = url.withUnsafeFileSystemRepresentation { $0.map { FilePath(platformString: $0) } }
        guard let path, !path.isEmpty else {
            throw FileCoordinationError(code: .notFileURL, path: nil, operation: "open",
                                        message: "\(url.absoluteString) has no file-system path")
        }
        self = path
    }

    /// A `file:` URL for this path that round-trips its exact bytes.
    public var fileURL: URL {
        withPlatformString { URL(fileURLWithFileSystemRepresentation: $0, isDirectory: false, relativeTo: nil) }
    }
}
