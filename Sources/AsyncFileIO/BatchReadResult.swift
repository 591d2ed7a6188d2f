import Foundation
import SystemPackage

/// The outcome of reading one file of a ``FileBatchReader``.
public struct BatchReadResult: Sendable {
    /// The file's position in the list the batch was made from.
    public let index: Int
    /// The file's path, with the exact bytes it was given with (made when asked for: a
    /// batch given URLs reads without one).
    public var path: FilePath { platformPath.filePath }
    /// The file's path as the kernel took it.
    package let platformPath: PlatformPath
    /// The file's whole content, or why it could not be read.
    public let result: Result<Data, FileCoordinationError>

    /// The file's `file:` URL.
    public var url: URL { path.fileURL }

    /// The content, or the error that prevented reading it.
    public func get() throws(FileCoordinationError) -> Data { try result.get() }

    /// A result (for sequences that renumber or wrap batch results).
    public init(index: Int, path: FilePath, result: Result<Data, FileCoordinationError>) {
        self.init(index: index, platformPath: PlatformPath(path), result: result)
    }

    package init(index: Int, platformPath: PlatformPath, result: Result<Data, FileCoordinationError>) {
        self.index = index
        self.platformPath = platformPath
        self.result = result
    }
}
