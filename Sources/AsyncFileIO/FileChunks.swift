import Foundation
import SystemPackage

/// The chunks of an ``AsyncFileStream``, read on demand. See ``AsyncFileStream/chunks(ofSize:)``.
public struct FileChunks: AsyncSequence, Sendable {
    public typealias Element = Data
    let storage: StreamStorage
    let chunkSize: Int

    /// An iterator reading one chunk per `next()`.
    public func makeAsyncIterator() -> Iterator {
        Iterator(storage: storage, chunkSize: chunkSize)
    }

    /// Reads one chunk per call to ``next()``.
    public struct Iterator: AsyncIteratorProtocol {
        let storage: StreamStorage
        let chunkSize: Int
        var finished = false

        /// The next chunk; nil at the end of the file.
        public mutating func next() async throws -> Data? {
            guard !finished else { return nil }
            let chunk = try await storage.read(upToCount: chunkSize)
            if chunk.isEmpty {
                finished = true
                return nil
            }
            return chunk
        }
    }
}
