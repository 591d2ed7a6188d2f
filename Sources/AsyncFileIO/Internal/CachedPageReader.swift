import Synchronization
import SystemCalls
import SystemPackage

/// The inline fast path of every read: copies what the page cache already holds with
/// `preadv2(RWF_NOWAIT)`, which never waits for a device, so it may run on the caller's
/// thread. Remembers a file system that does not support the flag and stops trying.
final class CachedPageReader: Sendable {
    private let unsupported = Atomic<Bool>(false)

    /// False once the file system turned out not to support inline reads.
    var isAvailable: Bool { !unsupported.load(ordering: .relaxed) }

    /// Reads up to `count` bytes at `offset` into `buffer` without blocking. Returns how
    /// many were read (0 at the end of file, fewer than `count` when only part is
    /// cached), or nil when nothing could be read inline: the caller must read on the
    /// I/O threads instead.
    func read(_ fd: Int32, into buffer: UnsafeMutableRawPointer, count: Int, offset: Int64,
              path: FilePath) throws(FileCoordinationError) -> Int? {
        guard !unsupported.load(ordering: .relaxed) else { return nil }
        switch Syscall.preadNoWait(fd, buffer, count, offset) {
        case .success(let n):
            return n
        case .failure(.resourceTemporarilyUnavailable):
            return nil
        case .failure(.notSupported), .failure(.invalidArgument):
            unsupported.store(true, ordering: .relaxed)
            return nil
        case .failure(let errno):
            throw FileCoordinationError(.read, errno: errno, path: path)
        }
    }
}
