import CFileCoordinationShims
import Foundation
import Synchronization
import SystemCalls
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// A descriptor opened and validated by ``FileOperations``.
struct OpenedFile: Sendable {
    var fd: Int32
    var type: FileType
    /// `st_size` at open time (0 for devices and for pseudo-files such as `/proc`'s).
    var size: Int64
}

/// The blocking file operations behind every public API. All of them run on
/// ``IOThreadPool`` threads (or inside a pool job of the batch reader); none is ever
/// called from a task's own thread.
enum FileOperations {
    /// Opens `path` for reading and checks it is something that can be read to an end:
    /// a regular file or a character device. The open uses `O_NONBLOCK` so that a FIFO
    /// with no writer is reported instead of hanging the thread.
    static func openForReading(_ path: FilePath) -> Result<OpenedFile, FileCoordinationError> {
        openForReading(PlatformPath(path))
    }

    /// ``openForReading(_:)-(FilePath)`` for a path given as bytes (its `FilePath` is made
    /// only for an error). Not `followingLast`: a last component that is a symbolic link
    /// fails with `ELOOP` (``isLinkRefused(_:)``) instead of being followed.
    static func openForReading(_ path: PlatformPath, followingLast: Bool = true) -> Result<OpenedFile, FileCoordinationError> {
        let opened = path.withCString {
            Syscall.open($0, O_RDONLY | O_NONBLOCK | O_NOCTTY | (followingLast ? 0 : O_NOFOLLOW))
        }
        let fd: Int32
        switch opened {
        case .success(let descriptor): fd = descriptor
        case .failure(let errno): return .failure(FileCoordinationError(.open, errno: errno, path: path.filePath))
        }
        switch validate(fd: fd, path: path, forWriting: false) {
        case .success(let file): return .success(file)
        case .failure(let error):
            _ = Syscall.close(fd)
            return .failure(error)
        }
    }

    /// Opens `path` for writing (`flags` adds `O_CREAT`, `O_TRUNC`, `O_APPEND`, `O_EXCL`).
    static func openForWriting(_ path: FilePath, flags: Int32, mode: UInt32 = 0o666) -> Result<OpenedFile, FileCoordinationError> {
        let opened = path.withPlatformString {
            Syscall.open($0, O_WRONLY | O_NONBLOCK | O_NOCTTY | flags, mode)
        }
        let fd: Int32
        switch opened {
        case .success(let descriptor): fd = descriptor
        case .failure(.noSuchAddressOrDevice):
            // O_WRONLY|O_NONBLOCK on a FIFO without a reader.
            return .failure(unsupported(path, "is a FIFO"))
        case .failure(let errno): return .failure(FileCoordinationError(.open, errno: errno, path: path))
        }
        switch validate(fd: fd, path: PlatformPath(path), forWriting: true) {
        case .success(let file): return .success(file)
        case .failure(let error):
            _ = Syscall.close(fd)
            return .failure(error)
        }
    }

    private static func validate(fd: Int32, path platformPath: PlatformPath, forWriting: Bool) -> Result<OpenedFile, FileCoordinationError> {
        let info: stat
        switch Syscall.fstat(fd) {
        case .success(let value): info = value
        case .failure(let errno): return .failure(FileCoordinationError(.fstat, errno: errno, path: platformPath.filePath))
        }
        return validate(fd: fd, info: info, path: platformPath)
    }

    /// ``validate(fd:path:forWriting:)`` with the descriptor's `fstat` already made.
    private static func validate(fd: Int32, info: stat, path platformPath: PlatformPath) -> Result<OpenedFile, FileCoordinationError> {
        let type = FileType(mode: info.st_mode)
        if type == .regular { return .success(OpenedFile(fd: fd, type: type, size: Int64(info.st_size))) }
        let path = platformPath.filePath
        switch type {
        case .regular:
            break
        case .characterDevice:
            // Devices keep blocking semantics; only the open needed O_NONBLOCK.
            if case .failure(let errno) = Syscall.setNonBlocking(fd, false) {
                return .failure(FileCoordinationError(.fcntl, errno: errno, path: path))
            }
        case .directory:
            return .failure(FileCoordinationError(.open, code: .isDirectory, path: path, errno: .isDirectory,
                                                  message: "is a directory, not a file"))
        case .fifo:
            return .failure(unsupported(path, "is a FIFO"))
        case .socket:
            return .failure(unsupported(path, "is a socket"))
        case .blockDevice, .symbolicLink, .unknown:
            return .failure(unsupported(path, "is not a regular file"))
        }
        return .success(OpenedFile(fd: fd, type: type, size: Int64(info.st_size)))
    }

    private static func unsupported(_ path: FilePath, _ what: String) -> FileCoordinationError {
        FileCoordinationError(.open, code: .unsupportedFileType, path: path, message: "\(what); only regular files and character devices can be opened")
    }

    static func tooLarge(_ path: FilePath?, limit: Int) -> FileCoordinationError {
        FileCoordinationError(.read, code: .fileTooLarge, path: path, message: "the file is larger than the \(limit)-byte limit")
    }

    /// A file whose bytes no buffer of this process can hold.
    static func beyondMemory(_ path: FilePath?, _ size: Int) -> FileCoordinationError {
        FileCoordinationError(.read, code: .fileTooLarge, path: path, errno: .noMemory,
                              message: "no memory can be had for its \(size) bytes")
    }

    /// Wraps a `malloc`ed buffer as `Data` without copying; frees it when empty.
    static func data(_ buffer: UnsafeMutableRawPointer, count: Int) -> Data {
        guard count > 0 else {
            free(buffer)
            return Data()
        }
        return Data(bytesNoCopy: buffer, count: count, deallocator: .free)
    }

    /// Reads up to `count` bytes at `offset` (or, when `offset` is nil, at the
    /// descriptor's position), stopping early only at end of file.
    static func read(fd: Int32, path: FilePath?, offset: Int64?, count: Int) -> Result<Data, FileCoordinationError> {
        guard count > 0 else { return .success(Data()) }
        guard let buffer = BufferRecycler.allocate(count) else { return .failure(tooLarge(path, limit: count)) }
        return fill(buffer, fd: fd, path: path, offset: offset, count: count, from: 0)
    }

    /// Reads bytes `from..<count` of a buffer from ``BufferRecycler`` (allocated for
    /// `count`), at `offset + from` (or the descriptor's position), and wraps it as `Data`.
    private static func fill(_ buffer: UnsafeMutableRawPointer, fd: Int32, path: FilePath?, offset: Int64?, count: Int,
                             from start: Int) -> Result<Data, FileCoordinationError> {
        var got = start
        while got < count {
            let step = offset.map { Syscall.pread(fd, buffer + got, count - got, $0 + Int64(got)) }
                ?? Syscall.read(fd, buffer + got, count - got)
            switch step {
            case .success(0):
                break
            case .success(let n):
                got += n
                continue
            case .failure(let errno):
                BufferRecycler.release(buffer, count: count)
                return .failure(FileCoordinationError(.read, errno: errno, path: path))
            }
            break
        }
        guard got < count else { return .success(BufferRecycler.data(buffer, count: count)) }
        // The file ended early: keep the bytes, return the buffer.
        let data = Data(bytes: buffer, count: got)
        BufferRecycler.release(buffer, count: count)
        return .success(data)
    }

    /// Reads until end of file into a growing buffer, failing once more than
    /// `maximumSize` bytes arrive (so `/dev/zero` ends with an error, not an exhausted heap).
    static func readUntilEnd(fd: Int32, path: FilePath?, offset: Int64?, initialCapacity: Int,
                             maximumSize: Int) -> Result<Data, FileCoordinationError> {
        var capacity = max(4096, min(initialCapacity, maximumSize == .max ? initialCapacity : maximumSize + 1))
        guard var buffer = malloc(capacity) else { return .failure(tooLarge(path, limit: capacity)) }
        var got = 0
        while true {
            if got == capacity {
                let grown = capacity > Int.max / 2 ? Int.max : capacity * 2
                guard let bigger = realloc(buffer, grown) else {
                    free(buffer)
                    return .failure(tooLarge(path, limit: maximumSize))
                }
                buffer = bigger
                capacity = grown
            }
            let step = offset.map { Syscall.pread(fd, buffer + got, capacity - got, $0 + Int64(got)) }
                ?? Syscall.read(fd, buffer + got, capacity - got)
            switch step {
            case .success(0):
                return .success(data(buffer, count: got))
            case .success(let n):
                got += n
                if got > maximumSize {
                    free(buffer)
                    return .failure(tooLarge(path, limit: maximumSize))
                }
            case .failure(let errno):
                free(buffer)
                return .failure(FileCoordinationError(.read, errno: errno, path: path))
            }
        }
    }

    /// Reads an opened file from its start to its end. A regular file with a known size
    /// is read in one allocation of exactly that size (the size it had when opened);
    /// devices and size-less pseudo-files are read until end of file.
    static func readAll(_ file: OpenedFile, path: FilePath?, maximumSize: Int) -> Result<Data, FileCoordinationError> {
        if file.type == .regular && file.size > 0 {
            guard file.size <= Int64(maximumSize) else { return .failure(tooLarge(path, limit: maximumSize)) }
            return read(fd: file.fd, path: path, offset: nil, count: Int(file.size))
        }
        return readUntilEnd(fd: file.fd, path: path, offset: nil, initialCapacity: 16 * 1024, maximumSize: maximumSize)
    }

    /// What a read that probed the page cache learned (see
    /// ``readWholeFile(_:maximumSize:probingCache:probe:)``).
    enum CacheProbe {
        /// Not probed (not a regular file of known size, or not asked to).
        case notProbed
        /// Every byte came from the page cache.
        case cached
        /// Some had to come from the device.
        case waitedForDevice
        /// The file system does not support `RWF_NOWAIT` (tmpfs, for one).
        case unsupported
    }

    /// Whether an open made without following the last component failed because that
    /// component is a symbolic link (or the path has a loop of links, which the full
    /// coordination then reports).
    static func isLinkRefused(_ error: FileCoordinationError) -> Bool {
        error.operation == "open" && error.errno == .tooManySymbolicLinkLevels
    }

    /// ``readWholeFile(_:maximumSize:)-(PlatformPath,_)``; with `probingCache`, the first
    /// read copies only what the page cache holds (`RWF_NOWAIT`: the same one system call
    /// as a plain read when the file is cached), the rest is read as usual, and `probe`
    /// tells which happened. A batch uses it to learn that its reads wait for a disk, and
    /// only then runs more threads than cores; a slow read alone (a thread preempted on a
    /// busy machine) says nothing about that.
    static func readWholeFile(_ path: PlatformPath, maximumSize: Int, probingCache: Bool, followingLast: Bool = true,
                              probe: inout CacheProbe) -> Result<Data, FileCoordinationError> {
        openForReading(path, followingLast: followingLast).flatMap { file in
            var result: Result<Data, FileCoordinationError>
            if probingCache && file.type == .regular && file.size > 0 && file.size <= Int64(maximumSize) {
                result = readProbingCache(fd: file.fd, count: Int(file.size), probe: &probe)
            } else {
                result = readAll(file, path: nil, maximumSize: maximumSize)
            }
            if case .failure(let errno) = Syscall.close(file.fd), case .success = result {
                result = .failure(FileCoordinationError(.close, errno: errno, path: nil))
            }
            return result.mapError { error in
                var error = error
                error.path = path.filePath
                return error
            }
        }
    }

    private static func readProbingCache(fd: Int32, count: Int, probe: inout CacheProbe) -> Result<Data, FileCoordinationError> {
        guard let buffer = BufferRecycler.allocate(count) else { return .failure(tooLarge(nil, limit: count)) }
        var cached = 0
        switch Syscall.preadNoWait(fd, buffer, count, 0) {
        case .success(let n):
            cached = n
            // Part of it cached; none at all is the end of a file that shrank since `fstat`.
            probe = n > 0 && n < count ? .waitedForDevice : .cached
        case .failure(.resourceTemporarilyUnavailable):
            probe = .waitedForDevice
        case .failure(.notSupported), .failure(.invalidArgument):
            probe = .unsupported
        case .failure(let errno):
            BufferRecycler.release(buffer, count: count)
            return .failure(FileCoordinationError(.read, errno: errno, path: nil))
        }
        return fill(buffer, fd: fd, path: nil, offset: 0, count: count, from: cached)
    }

    /// open + read + close, reporting any step's failure against `path`.
    static func readWholeFile(_ path: FilePath, maximumSize: Int) -> Result<Data, FileCoordinationError> {
        readWholeFile(PlatformPath(path), maximumSize: maximumSize)
    }

    /// ``readWholeFile(_:maximumSize:)-(FilePath,_)`` for a path given as bytes: its
    /// `FilePath` is made only for an error.
    static func readWholeFile(_ path: PlatformPath, maximumSize: Int) -> Result<Data, FileCoordinationError> {
        var probe = CacheProbe.notProbed
        return readWholeFile(path, maximumSize: maximumSize, probingCache: false, probe: &probe)
    }

    /// Writes every byte of `bytes` at `offset` (or at the position when nil).
    static func writeAll(fd: Int32, path: FilePath?, offset: Int64?, _ bytes: some DataProtocol) -> Result<Int, FileCoordinationError> {
        var written = 0
        for region in bytes.regions {
            let result: Result<Void, FileCoordinationError> = region.withUnsafeBytes { raw in
                guard let base = raw.baseAddress else { return .success(()) }
                var done = 0
                while done < raw.count {
                    let step = offset.map { Syscall.pwrite(fd, base + done, raw.count - done, $0 + Int64(written + done)) }
                        ?? Syscall.write(fd, base + done, raw.count - done)
                    switch step {
                    case .success(let n): done += n
                    case .failure(let errno): return .failure(FileCoordinationError(.write, errno: errno, path: path))
                    }
                }
                return .success(())
            }
            if case .failure(let error) = result { return .failure(error) }
            written += region.count
        }
        return .success(written)
    }

    /// fsyncs `fd`; a device, pipe or socket, which has nothing to synchronise (`fsync`
    /// fails with `EINVAL` there: appending to `/dev/null` did), counts as done.
    static func fsync(fd: Int32, path: FilePath?) -> Result<Void, FileCoordinationError> {
        switch Syscall.fsync(fd) {
        case .success:
            return .success(())
        case .failure(.invalidArgument) where Syscall.fstat(fd).map({ FileType(mode: $0.st_mode) }) != .success(.regular):
            return .success(())
        case .failure(let errno):
            return .failure(FileCoordinationError(.fsync, errno: errno, path: path))
        }
    }

    /// fsyncs a directory so that a rename inside it is durable.
    static func syncDirectory(_ directory: FilePath) -> Result<Void, FileCoordinationError> {
        directory.withPlatformString { Syscall.open($0, O_RDONLY | fc_O_DIRECTORY) }
            .mapError(.open, directory)
            .flatMap { fd in
                let result = Syscall.fsync(fd).mapError(.fsync, directory)
                _ = Syscall.close(fd)
                return result
            }
    }
}

/// For the benchmark only: one blocking whole-file read on the calling thread.
@_spi(Benchmarks)
public func _readWholeFileBlocking(_ path: FilePath) -> Int {
    (try? FileOperations.readWholeFile(path, maximumSize: .max).get().count) ?? -1
}

/// For the benchmark only: the whole-file read, returning the data.
@_spi(Benchmarks)
public func _readWholeFileData(_ path: FilePath) -> Data? {
    try? FileOperations.readWholeFile(path, maximumSize: .max).get()
}

// MARK: - Reading into a reused buffer

/// A growable buffer owned by one worker thread and reused for every file it reads.
final class ReusableBuffer {
    private(set) var base: UnsafeMutableRawPointer
    private(set) var capacity: Int

    // `malloc`, not `UnsafeMutableRawPointer.allocate`, which traps where memory cannot be
    // had: a file's size is whatever its owner made it (a sparse file of terabytes).
    init(capacity: Int = 64 * 1024) {
        self.capacity = capacity
        base = malloc(capacity)!
    }

    deinit { free(base) }

    /// Makes room for `count` bytes (the content is not kept); false when that much
    /// memory cannot be had (the buffer is then as it was).
    func reserve(_ count: Int) -> Bool {
        guard count > capacity else { return true }
        let doubled = capacity.multipliedReportingOverflow(by: 2)
        let wanted = doubled.overflow ? count : max(count, doubled.partialValue)
        guard let bigger = malloc(wanted) else { return false }
        free(base)
        base = bigger
        capacity = wanted
        return true
    }

    /// Doubles the capacity, keeping the first `count` bytes; false when that much memory
    /// cannot be had (the buffer is then as it was).
    func grow(keeping count: Int) -> Bool {
        let (doubled, overflow) = capacity.multipliedReportingOverflow(by: 2)
        guard !overflow, let bigger = realloc(base, doubled) else { return false }
        base = bigger
        capacity = doubled
        return true
    }
}

extension FileOperations {
    /// open + read + close, into `buffer`: returns how many bytes it holds. A regular file
    /// is read up to its size at open time (as ``readAll(_:path:maximumSize:)`` does), other
    /// files to their end; any step's failure names `path`.
    ///
    /// Written as straight-line system calls: it runs once per file of a batch read in
    /// place, where the steps' own `Result` values and closures (as `readWholeFile` has
    /// them) measured a tenth of the batch's user time.
    static func readWholeFile(_ path: PlatformPath, maximumSize: Int, followingLast: Bool = true,
                              into buffer: ReusableBuffer) -> Result<Int, FileCoordinationError> {
        let fd: Int32
        switch path.withCString({ Syscall.open($0, O_RDONLY | O_NONBLOCK | O_NOCTTY | (followingLast ? 0 : O_NOFOLLOW)) }) {
        case .success(let descriptor): fd = descriptor
        case .failure(let errno): return .failure(FileCoordinationError(.open, errno: errno, path: path.filePath))
        }
        let result = readOpened(fd, path: path, maximumSize: maximumSize, into: buffer)
        if case .failure(let errno) = Syscall.close(fd), case .success = result {
            return .failure(FileCoordinationError(.close, errno: errno, path: path.filePath))
        }
        return result
    }

    private static func readOpened(_ fd: Int32, path: PlatformPath, maximumSize: Int,
                                   into buffer: ReusableBuffer) -> Result<Int, FileCoordinationError> {
        let info: stat
        switch Syscall.fstat(fd) {
        case .success(let value): info = value
        case .failure(let errno): return .failure(FileCoordinationError(.fstat, errno: errno, path: path.filePath))
        }
        // Anything but a regular file is checked (and a device made blocking) as every open does.
        let regular = FileType.isRegular(info.st_mode)
        if !regular, case .failure(let error) = validate(fd: fd, info: info, path: path) { return .failure(error) }
        let size = regular ? Int(info.st_size) : 0
        if size > maximumSize { return .failure(tooLarge(path.filePath, limit: maximumSize)) }
        let sized = size > 0
        guard buffer.reserve(sized ? size : 16 * 1024) else { return .failure(beyondMemory(path.filePath, size)) }
        var got = 0
        while !sized || got < size {
            if got == buffer.capacity, !buffer.grow(keeping: got) { return .failure(beyondMemory(path.filePath, got)) }
            // A regular file is read up to its size at open time, not what it grew to since.
            let wanted = sized ? size - got : buffer.capacity - got
            switch Syscall.read(fd, buffer.base + got, wanted) {
            case .success(0):
                return .success(got)
            case .success(let n):
                got += n
                if got > maximumSize { return .failure(tooLarge(path.filePath, limit: maximumSize)) }
            case .failure(let errno):
                return .failure(FileCoordinationError(.read, errno: errno, path: path.filePath))
            }
        }
        return .success(got)
    }
}
