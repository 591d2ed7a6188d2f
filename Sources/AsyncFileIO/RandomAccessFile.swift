import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A file opened for reading byte ranges at any offset, from many tasks at once.
///
/// Built for large files (several GB): each ``read(byteRange:)`` reads just that range
/// with `pread`, independently of every other, and returns it in the calling task.
/// Ranges whose pages are already in the page cache are copied inline with
/// `preadv2(RWF_NOWAIT)`, which cannot block; the rest is read on the library's I/O
/// threads. No main-queue or callback defaults: results arrive where you `await` them.
///
/// ```swift
/// let file = try await RandomAccessFile(url: bigFile)
/// async let header = file.read(byteRange: 0..<4096)
/// async let footer = file.read(byteRange: file.size - 4096..<file.size)
/// let parts = try await (header, footer)
/// try await file.close()
/// ```
public final class RandomAccessFile: Sendable {
    /// The path the file was opened with.
    public let path: FilePath
    /// The file's size in bytes when it was opened.
    public let size: Int64
    /// The engine carrying out the reads.
    public let engine: FileIOEngine

    private let fd: Int32
    private let regular: Bool
    private let lease = DescriptorLease()
    private let channel: DispatchChannel?
    private let cachedPages = CachedPageReader()

    /// Opens the file at `path` for range reads.
    public init(path: FilePath, engine: FileIOEngine = .default) async throws {
        let file = try await IOThreadPool.shared.run { FileOperations.openForReading(path) }
        self.path = path
        self.size = file.size
        self.engine = engine
        self.fd = file.fd
        self.regular = file.type == .regular
        channel = engine == .dispatchIO ? DispatchChannel(fd: file.fd, random: true, path: path) : nil
    }

    /// Opens the file at the `file:` URL `url` for range reads.
    public convenience init(url: URL, engine: FileIOEngine = .default) async throws {
        try await self.init(path: FilePath(fileURL: url), engine: engine)
    }

    deinit {
        if let channel {
            if lease.close({}) { channel.closeInBackground() }
        } else {
            let fd = self.fd
            lease.close { IOThreadPool.shared.submit { _ = Syscall.close(fd) } }
        }
    }

    /// Reads the bytes in `byteRange`. A range reaching past the end of the file returns
    /// the bytes up to the end; one starting past it returns empty `Data`.
    public func read(byteRange: Range<Int64>) async throws -> Data {
        guard byteRange.lowerBound >= 0 else {
            throw FileCoordinationError(.read, code: .invalidArgument, path: path, message: "the range \(byteRange) starts before the beginning of the file")
        }
        guard byteRange.count <= Int.max, !byteRange.isEmpty else { return Data() }
        guard lease.acquire() else {
            throw FileCoordinationError(.read, code: .closed, path: path, message: "the file is closed")
        }
        defer { lease.release() }
        let offset = byteRange.lowerBound
        let count = Int(byteRange.count)
        if let channel { return try await channel.read(offset: offset, length: count) }
        if regular, count <= 1 << 20, cachedPages.isAvailable, let buffer = malloc(count) {
            let cached: Int?
            do { cached = try cachedPages.read(fd, into: buffer, count: count, offset: offset, path: path) } catch {
                free(buffer)
                throw error
            }
            if let n = cached {
                let head = FileOperations.data(buffer, count: n)
                if n == count || n == 0 { return head }
                return head + (try await readOnPool(offset: offset + Int64(n), count: count - n))
            }
            free(buffer)
        }
        return try await readOnPool(offset: offset, count: count)
    }

    /// Reads the bytes in `byteRange` (the `Int` form of ``read(byteRange:)-5yk4r``).
    public func read(byteRange: Range<Int>) async throws -> Data {
        try await read(byteRange: Int64(byteRange.lowerBound) ..< Int64(byteRange.upperBound))
    }

    /// Reads the bytes at `offset` into `buffer`, as many as fit, and returns how many
    /// were read (fewer only at the end of the file). No allocation: for tight loops of
    /// small reads into memory the caller owns. The buffer must stay valid until the
    /// call returns.
    public func read(fromOffset offset: Int64, into buffer: UnsafeMutableRawBufferPointer) async throws -> Int {
        guard offset >= 0 else {
            throw FileCoordinationError(.read, code: .invalidArgument, path: path, message: "the offset \(offset) is before the beginning of the file")
        }
        guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
        guard lease.acquire() else {
            throw FileCoordinationError(.read, code: .closed, path: path, message: "the file is closed")
        }
        defer { lease.release() }
        let count = buffer.count
        if let channel {
            let data = try await channel.read(offset: offset, length: count)
            data.copyBytes(to: buffer)
            return data.count
        }
        var done = 0
        if regular, let n = try cachedPages.read(fd, into: base, count: count, offset: offset, path: path) {
            if n == count || n == 0 { return n }
            done = n
        }
        // The rest may wait for the device: read it on the I/O threads, into the
        // caller's memory (the address crosses threads as an integer; the caller's
        // buffer outlives this call by contract).
        let fd = self.fd, path = self.path
        let address = UInt(bitPattern: base) + UInt(done)
        let remaining = count - done
        let start = offset + Int64(done)
        let more = try await IOThreadPool.shared.run { () -> Result<Int, FileCoordinationError> in
            let target = UnsafeMutableRawPointer(bitPattern: address)!
            var got = 0
            while got < remaining {
                switch Syscall.pread(fd, target + got, remaining - got, start + Int64(got)) {
                case .success(0): return .success(got)
                case .success(let n): got += n
                case .failure(let errno): return .failure(FileCoordinationError(.read, errno: errno, path: path))
                }
            }
            return .success(got)
        }
        return done + more
    }

    private func readOnPool(offset: Int64, count: Int) async throws -> Data {
        let fd = self.fd, path = self.path
        let size = self.size
        return try await IOThreadPool.shared.run { () -> Result<Data, FileCoordinationError> in
            // No more than the file held when opened, and 64 KiB for growth since: a range
            // reaching far past the end (`2 ..< Int64.max`) allocates no more than that. A
            // file that grew past it is read on, in steps that double.
            let growth = 64 * 1024
            var wanted = Int(min(Int64(count), max(0, size - offset) + Int64(growth)))
            var data: Data
            switch FileOperations.read(fd: fd, path: path, offset: offset, count: wanted) {
            case .success(let read): data = read
            case .failure(let error): return .failure(error)
            }
            while data.count == wanted, wanted < count {
                let step = min(count - wanted, max(wanted, growth))
                switch FileOperations.read(fd: fd, path: path, offset: offset + Int64(wanted), count: step) {
                case .success(let more):
                    data.append(more)
                    wanted += step
                    if more.count < step { return .success(data) }
                case .failure(let error): return .failure(error)
                }
            }
            return .success(data)
        }
    }

    /// Closes the file, reporting any error; reads still running finish first.
    /// Later reads fail with ``FileCoordinationError/Code/closed``.
    public func close() async throws {
        let path = self.path
        if let channel {
            guard lease.close({}) else { return }
            if let errno = await channel.close(stop: false) {
                throw FileCoordinationError(.close, errno: errno, path: path)
            }
            return
        }
        let fd = self.fd
        let result: Result<Void, FileCoordinationError>? = await withCheckedContinuation { continuation in
            let accepted = lease.close {
                IOThreadPool.shared.submit { continuation.resume(returning: Syscall.close(fd).mapError(.close, path)) }
            }
            if !accepted { continuation.resume(returning: nil) }
        }
        try result?.get()
    }
}
