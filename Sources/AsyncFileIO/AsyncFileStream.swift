import Foundation
import SystemPackage

/// A file opened for asynchronous sequential reading or writing.
///
/// The stream is `~Copyable`: exactly one owner uses it, the compiler rejects any use
/// after ``close()``, and a stream dropped without closing closes its descriptor in
/// `deinit` (an atomic write that was never closed, or one of whose writes failed, is
/// discarded, never half-published).
/// The `Mode` parameter, ``ReadMode`` or ``WriteMode``, decides which methods exist.
///
/// ```swift
/// let input = try await url.openForReading()
/// for try await chunk in input.chunks(ofSize: 1 << 20) {
///     consume(chunk)
/// }
/// try await input.close()
/// ```
///
/// No method blocks the Swift cooperative thread pool: opens, device reads and fsyncs run
/// on threads the library owns, or through `DispatchIO` with ``FileIOEngine/dispatchIO``.
public struct AsyncFileStream<Mode>: ~Copyable, Sendable {
    let storage: StreamStorage

    init(storage: StreamStorage) {
        self.storage = storage
    }

    /// The path the stream was opened with.
    public var path: FilePath { storage.path }

    /// The engine carrying out this stream's I/O.
    public var engine: FileIOEngine { storage.engine }

    /// Closes the file and reports what went wrong while doing so, which `deinit` cannot.
    ///
    /// For a stream opened with ``FileWriteOptions/atomic`` this is the commit: the data
    /// is flushed and renamed over the target; if it throws, the target is unchanged. When
    /// a write to it failed (or was cancelled), nothing is published and this throws.
    public consuming func close() async throws {
        try await storage.close()
    }

    deinit {
        storage.abandon()
    }
}

extension AsyncFileStream where Mode == ReadMode {
    /// Reads the next `count` bytes, or fewer at the end of the file (an empty `Data`
    /// once the end is reached). On a character device, returns what one read gives.
    public func read(upToCount count: Int) async throws -> Data {
        try await storage.read(upToCount: count)
    }

    /// Reads from the current position to the end of the file.
    ///
    /// - Parameter maximumSize: the most bytes to accept; more makes the read fail with
    ///   ``FileCoordinationError/Code/fileTooLarge`` (a bound for endless devices such
    ///   as `/dev/zero`).
    public func readToEnd(maximumSize: Int = .max) async throws -> Data {
        try await storage.readToEnd(maximumSize: maximumSize)
    }

    /// The rest of the file as an asynchronous sequence of chunks of at most `size` bytes.
    ///
    /// The sequence reads one chunk each time it is asked for one, so a slow consumer
    /// holds back the reading (back-pressure) and memory stays at one chunk. It reads
    /// through this stream and ends with an error if the stream is closed meanwhile.
    public func chunks(ofSize size: Int = 64 * 1024) -> FileChunks {
        FileChunks(storage: storage, chunkSize: max(1, size))
    }
}

extension AsyncFileStream where Mode == WriteMode {
    /// Writes all of `bytes` at the current position (the end, when appending).
    /// `Data` and `[UInt8]` are written from their own storage, without a copy.
    public func write(_ bytes: some DataProtocol & Sendable) async throws {
        try await storage.write(bytes)
    }

    /// Flushes written data to the device (`fsync`).
    public func synchronize() async throws {
        try await storage.synchronize()
    }
}

// MARK: - Opening

extension FilePath {
    /// Opens the file for reading.
    ///
    /// - Throws: ``FileCoordinationError``: ``FileCoordinationError/Code/notFound`` for a
    ///   missing file, ``FileCoordinationError/Code/isDirectory`` for a directory,
    ///   ``FileCoordinationError/Code/unsupportedFileType`` for a FIFO or socket (a
    ///   FIFO is refused at once, never waited on), or the errno of the failing call.
    public func openForReading(engine: FileIOEngine = .default) async throws -> AsyncFileStream<ReadMode> {
        let path = self
        let file = try await IOThreadPool.shared.run { FileOperations.openForReading(path) }
        return AsyncFileStream(storage: StreamStorage(path: path, file: file, engine: engine))
    }

    /// Opens the file for writing, creating it if needed.
    ///
    /// Without options the file is truncated and written in place. With
    /// ``FileWriteOptions/atomic`` the content goes to a temporary file and replaces the
    /// target when ``AsyncFileStream/close()`` succeeds; dropping the stream instead
    /// discards it. ``FileWriteOptions/append`` appends.
    public func openForWriting(options: FileWriteOptions = [], engine: FileIOEngine = .default) async throws
        -> AsyncFileStream<WriteMode>
    {
        let path = self
        if options.contains(.atomic) && options.contains(.append) {
            throw FileCoordinationError(.open, code: .invalidArgument, path: path, message: "an atomic write replaces the file and cannot append to it")
        }
        let sync = !options.contains(.skipSync)
        if options.contains(.atomic) {
            let replacement = try await IOThreadPool.shared.run {
                AtomicReplacement.begin(target: path, withoutOverwriting: options.contains(.withoutOverwriting))
            }
            let file = OpenedFile(fd: replacement.fd, type: .regular, size: 0)
            return AsyncFileStream(storage: StreamStorage(path: path, file: file, engine: engine, sync: sync,
                                                          replacement: replacement))
        }
        let flags = O_CREAT | (options.contains(.append) ? O_APPEND : O_TRUNC)
            | (options.contains(.withoutOverwriting) ? O_EXCL : 0)
        let file = try await IOThreadPool.shared.run { FileOperations.openForWriting(path, flags: flags) }
        return AsyncFileStream(storage: StreamStorage(path: path, file: file, engine: engine,
                                                      appending: options.contains(.append), sync: sync))
    }
}

extension URL {
    /// Opens the file at this `file:` URL for reading. See ``SystemPackage/FilePath/openForReading(engine:)``.
    public func openForReading(engine: FileIOEngine = .default) async throws -> AsyncFileStream<ReadMode> {
        try await FilePath(fileURL: self).openForReading(engine: engine)
    }

    /// Opens the file at this `file:` URL for writing. See ``SystemPackage/FilePath/openForWriting(options:engine:)``.
    public func openForWriting(options: FileWriteOptions = [], engine: FileIOEngine = .default) async throws
        -> AsyncFileStream<WriteMode>
    {
        try await FilePath(fileURL: self).openForWriting(options: options, engine: engine)
    }
}
