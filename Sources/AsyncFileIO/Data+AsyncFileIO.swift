import Dispatch
import Foundation
import SystemCalls
import SystemPackage

extension Data {
    /// Reads a whole file without blocking the Swift cooperative thread pool.
    ///
    /// A regular file is read in one allocation of its size, and that buffer becomes the
    /// `Data` without a copy. Devices and size-less pseudo-files (`/proc`) are read to
    /// their end.
    ///
    /// A file of up to 1 MiB that the kernel's caches hold (its name in the lookup cache,
    /// on a local disk's file system, its bytes in the page cache) is read on the calling
    /// thread, in the caller's isolation (no executor hop), with calls that wait for no
    /// device, server or daemon; any other goes to the library's I/O threads.
    ///
    /// - Parameters:
    ///   - maximumSize: the most bytes to accept; a larger file throws
    ///     ``FileCoordinationError/Code/fileTooLarge``.
    ///   - isolation: the caller's actor, where a cached file is read (the default).
    public init(asyncContentsOf path: FilePath, maximumSize: Int = .max, engine: FileIOEngine = .default,
                isolation: isolated (any Actor)? = #isolation) async throws {
        switch engine {
        case .threadPool:
            // As on the I/O threads, a cancelled task's read throws; a fault armed for a
            // test applies to the I/O threads' calls.
            try Task.checkCancellation()
            if !Faults.isArmed, case .read(let data) = CachedWholeFileReader()
                .readAlone(PlatformPath(path), maximumSize: Swift.min(maximumSize, CachedWholeFileReader.inlineLimit))
            {
                if CachedWholeFileReader.shouldYield() { await Task.yield() }
                self = data
                return
            }
            self = try await IOThreadPool.shared.run { FileOperations.readWholeFile(path, maximumSize: maximumSize) }
        case .dispatchIO:
            let stream = try await path.openForReading(engine: .dispatchIO)
            let data = try await stream.readToEnd(maximumSize: maximumSize)
            try await stream.close()
            self = data
        }
    }

    /// Reads the whole file at a `file:` URL. See ``Foundation/Data/init(asyncContentsOf:maximumSize:engine:isolation:)-(FilePath,_,_,_)``.
    public init(asyncContentsOf url: URL, maximumSize: Int = .max, engine: FileIOEngine = .default,
                isolation: isolated (any Actor)? = #isolation) async throws {
        try await self.init(asyncContentsOf: FilePath(fileURL: url), maximumSize: maximumSize, engine: engine, isolation: isolation)
    }

    /// Writes the data to a file without blocking the Swift cooperative thread pool.
    ///
    /// By default the write is atomic and durable: the bytes go to an unnamed temporary
    /// file in the same directory, are fsynced, renamed over `path`, and the directory
    /// is fsynced. A reader sees the old content or the new, never a torn file, even if
    /// the writer is killed; the target's permission bits are kept. The bytes are
    /// written from this `Data`'s own storage, with no intermediate copy.
    public func asyncWrite(to path: FilePath, options: FileWriteOptions = .atomic,
                           engine: FileIOEngine = .default) async throws {
        if engine == .dispatchIO {
            let stream = try await path.openForWriting(options: options, engine: .dispatchIO)
            try await stream.write(self)
            if !options.contains(.atomic) && !options.contains(.skipSync) { try await stream.synchronize() }
            try await stream.close()
            return
        }
        let bytes = self
        if options.contains(.atomic) && options.contains(.append) {
            throw FileCoordinationError(.open, code: .invalidArgument, path: path, message: "an atomic write replaces the file and cannot append to it")
        }
        try await IOThreadPool.shared.run { () -> Result<Void, FileCoordinationError> in
            let sync = !options.contains(.skipSync)
            if options.contains(.atomic) {
                return AtomicReplacement.begin(target: path, withoutOverwriting: options.contains(.withoutOverwriting))
                    .flatMap { replacement in
                        switch FileOperations.writeAll(fd: replacement.fd, path: path, offset: 0, bytes) {
                        case .success: return replacement.commit(sync: sync)
                        case .failure(let error):
                            replacement.abort()
                            return .failure(error)
                        }
                    }
            }
            let flags = O_CREAT | (options.contains(.append) ? O_APPEND : O_TRUNC)
                | (options.contains(.withoutOverwriting) ? O_EXCL : 0)
            return FileOperations.openForWriting(path, flags: flags).flatMap { file in
                var result = FileOperations.writeAll(fd: file.fd, path: path, offset: nil, bytes).map { _ in () }
                if sync, case .success = result { result = FileOperations.fsync(fd: file.fd, path: path) }
                let closed = Syscall.close(file.fd).mapError(.close, path)
                return result.flatMap { closed }
            }
        }
    }

    /// Writes the data to the file at a `file:` URL. See ``Foundation/Data/asyncWrite(to:options:engine:)-3t1hk``.
    public func asyncWrite(to url: URL, options: FileWriteOptions = .atomic, engine: FileIOEngine = .default) async throws {
        try await asyncWrite(to: FilePath(fileURL: url), options: options, engine: engine)
    }
}
