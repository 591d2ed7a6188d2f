import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The shared state behind one ``AsyncFileStream`` (and any chunk sequence made from
/// it): the descriptor, the engine, the position, and, for atomic writes, the pending
/// replacement.
final class StreamStorage: Sendable {
    let path: FilePath
    let fd: Int32
    let type: FileType
    let engine: FileIOEngine
    let appending: Bool
    let sync: Bool
    let replacement: AtomicReplacement?
    let channel: DispatchChannel?
    let lease = DescriptorLease()
    private let position = Locked<Int64>(0)
    /// Whether a write failed (or was cancelled): an atomic write is then never published.
    private let writeFailed = Atomic<Bool>(false)
    private let cachedPages = CachedPageReader()
    private static let pool = IOThreadPool.shared

    init(path: FilePath, file: OpenedFile, engine: FileIOEngine, appending: Bool = false, sync: Bool = true,
         replacement: AtomicReplacement? = nil) {
        self.path = path
        self.fd = file.fd
        self.type = file.type
        self.engine = engine
        self.appending = appending
        self.sync = sync
        self.replacement = replacement
        if engine == .dispatchIO {
            // An abandoned atomic write must not leave its visible temporary behind; a
            // committed one has been renamed away, so the unlink then finds nothing.
            var afterClose: (@Sendable () -> Void)?
            if let named = replacement?.namedTemporary {
                afterClose = { _ = named.withPlatformString { Syscall.unlink($0) } }
            }
            channel = DispatchChannel(fd: file.fd, random: false, path: path, afterClose: afterClose)
        } else {
            channel = nil
        }
    }

    private var closedError: FileCoordinationError {
        FileCoordinationError(.read, code: .closed, path: path, message: "the stream is closed")
    }

    /// Runs `body` while holding a lease on the descriptor.
    private func leased<T>(_ operation: FileCoordinationError.Operation, _ body: () async throws -> T) async throws -> T {
        guard lease.acquire() else {
            throw FileCoordinationError(operation, code: .closed, path: path, message: "the stream is closed")
        }
        defer { lease.release() }
        return try await body()
    }

    // MARK: Reading

    func read(upToCount count: Int) async throws -> Data {
        guard count >= 0 else {
            throw FileCoordinationError(.read, code: .invalidArgument, path: path, message: "cannot read a negative number of bytes (\(count))")
        }
        guard count > 0 else { return Data() }
        return try await leased(.read) {
            if let channel { return try await channel.read(offset: 0, length: count) }
            let offset = position.withLock { $0 }
            let data = try await readRegion(offset: offset, count: count)
            position.withLock { $0 = offset + Int64(data.count) }
            return data
        }
    }

    /// The thread-pool engine's read: pages already cached are copied inline with
    /// `preadv2(RWF_NOWAIT)`; anything else goes to the pool.
    private func readRegion(offset: Int64, count: Int) async throws -> Data {
        let fd = self.fd, path = self.path
        guard type == .regular else {
            // Devices have no page cache to probe: one read(2) on the pool.
            return try await Self.pool.run {
                guard let buffer = malloc(count) else { return .failure(FileOperations.tooLarge(path, limit: count)) }
                switch Syscall.read(fd, buffer, count) {
                case .success(let n): return .success(FileOperations.data(buffer, count: n))
                case .failure(let errno):
                    free(buffer)
                    return .failure(FileCoordinationError(.read, errno: errno, path: path))
                }
            }
        }
        if count <= 1 << 20, cachedPages.isAvailable, let buffer = malloc(count) {
            let cached: Int?
            do { cached = try cachedPages.read(fd, into: buffer, count: count, offset: offset, path: path) } catch {
                free(buffer)
                throw error
            }
            if let n = cached {
                let head = FileOperations.data(buffer, count: n)
                if n == count || n == 0 { return head }
                // Part was cached; the rest (or the end of file) is found on the pool.
                let tail = try await Self.pool.run { FileOperations.read(fd: fd, path: path, offset: offset + Int64(n), count: count - n) }
                return head + tail
            }
            free(buffer)
        }
        return try await Self.pool.run {
            // Never allocate more than the file can give: a huge count on a small file
            // reads the file, not the count.
            Syscall.fstat(fd).mapError(.fstat, path).flatMap { info in
                let available = max(0, Int64(info.st_size) - offset)
                if available == 0 {
                    return FileOperations.readUntilEnd(fd: fd, path: path, offset: offset,
                                                       initialCapacity: min(count, 64 * 1024), maximumSize: count)
                        .flatMapError { error in
                            // Reading "up to" count is not an error when more is there.
                            error.code == .fileTooLarge
                                ? FileOperations.read(fd: fd, path: path, offset: offset, count: count)
                                : .failure(error)
                        }
                }
                return FileOperations.read(fd: fd, path: path, offset: offset, count: Int(min(Int64(count), available)))
            }
        }
    }

    func readToEnd(maximumSize: Int) async throws -> Data {
        guard maximumSize >= 0 else {
            throw FileCoordinationError(.read, code: .invalidArgument, path: path, message: "the maximum size cannot be negative (\(maximumSize))")
        }
        return try await leased(.read) {
            if let channel {
                let limit = maximumSize == .max ? Int.max : maximumSize + 1
                let data = try await channel.read(offset: 0, length: limit)
                guard data.count <= maximumSize else { throw FileOperations.tooLarge(path, limit: maximumSize) }
                return data
            }
            let fd = self.fd, path = self.path, type = self.type
            let offset = position.withLock { $0 }
            let data = try await Self.pool.run { () -> Result<Data, FileCoordinationError> in
                guard type == .regular else {
                    return FileOperations.readUntilEnd(fd: fd, path: path, offset: nil, initialCapacity: 64 * 1024,
                                                       maximumSize: maximumSize)
                }
                return Syscall.fstat(fd).mapError(.fstat, path).flatMap { info in
                    let remaining = Int64(info.st_size) - offset
                    if remaining > Int64(maximumSize) { return .failure(FileOperations.tooLarge(path, limit: maximumSize)) }
                    if remaining > 0 { return FileOperations.read(fd: fd, path: path, offset: offset, count: Int(remaining)) }
                    return FileOperations.readUntilEnd(fd: fd, path: path, offset: offset, initialCapacity: 16 * 1024,
                                                       maximumSize: maximumSize)
                }
            }
            position.withLock { $0 = offset + Int64(data.count) }
            return data
        }
    }

    // MARK: Writing

    func write(_ bytes: some DataProtocol & Sendable) async throws {
        do {
            try await writeOnce(bytes)
        } catch {
            writeFailed.store(true, ordering: .relaxed)
            throw error
        }
    }

    private func writeOnce(_ bytes: some DataProtocol & Sendable) async throws {
        try await leased(.write) {
            if let channel {
                try await channel.write(offset: 0, bytes)
                return
            }
            let fd = self.fd, path = self.path
            let positional = type == .regular && !appending
            let offset = position.withLock { $0 }
            let written = try await Self.pool.run {
                FileOperations.writeAll(fd: fd, path: path, offset: positional ? offset : nil, bytes)
            }
            position.withLock { $0 = offset + Int64(written) }
        }
    }

    func synchronize() async throws {
        try await leased(.fsync) {
            if let channel { await channel.barrier() }
            let fd = self.fd, path = self.path
            try await Self.pool.run { FileOperations.fsync(fd: fd, path: path) }
        }
    }

    // MARK: Closing

    /// Closes the descriptor, committing an atomic write first; reports every failure.
    /// An atomic write one of whose writes failed is discarded instead: part of what the
    /// caller meant to write must not replace the whole of what was there.
    func close() async throws {
        let replacement = self.replacement, sync = self.sync, fd = self.fd, path = self.path
        if replacement != nil, writeFailed.load(ordering: .relaxed) {
            abandon()
            throw FileCoordinationError(.write, code: .io, path: path,
                                        message: "the atomic write is not published: an earlier write to it failed, and the file keeps its content")
        }
        if let channel {
            guard lease.close({}) else { return }
            if let replacement {
                await channel.barrier()
                let published = await Result { try await Self.pool.run { replacement.publish(sync: sync) } }
                let closeError = await channel.close(stop: false)
                try published.get()
                if let closeError { throw FileCoordinationError(.close, errno: closeError, path: path) }
                return
            }
            if let errno = await channel.close(stop: false) {
                throw FileCoordinationError(.close, errno: errno, path: path)
            }
            return
        }
        let result: Result<Void, FileCoordinationError>? = await withCheckedContinuation { continuation in
            let accepted = lease.close {
                Self.pool.submit {
                    continuation.resume(returning: replacement.map { $0.commit(sync: sync) }
                        ?? Syscall.close(fd).mapError(.close, path))
                }
            }
            if !accepted { continuation.resume(returning: nil) }
        }
        try result?.get()
    }

    /// Closes without reporting (from a `deinit`): an atomic write is discarded.
    func abandon() {
        if let channel {
            if lease.close({}) { channel.closeInBackground() }
            return
        }
        let replacement = self.replacement, fd = self.fd
        lease.close {
            Self.pool.submit {
                if let replacement { replacement.abort() } else { _ = Syscall.close(fd) }
            }
        }
    }
}

extension Result {
    /// Captures the outcome of an async throwing body.
        package init(catching body: () async throws(Failure) -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}
