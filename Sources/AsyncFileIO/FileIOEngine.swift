/// The machinery that carries out file I/O for ``AsyncFileStream``, ``RandomAccessFile``,
/// `Data(asyncContentsOf:)` and ``FileBatchReader``.
///
/// Both engines keep every blocking system call off the Swift cooperative thread pool.
/// They differ in throughput on Linux, where libdispatch serves regular files through
/// one queue per device with one operation in flight at a time: see
/// `docs/performance.md` for the numbers behind the default.
public enum FileIOEngine: Sendable, Hashable, CustomStringConvertible {
    /// Threads owned by the library call `open`, `pread` and `fsync` directly, many
    /// files at once. Reads of pages already in the page cache are served inline with
    /// `preadv2(RWF_NOWAIT)`, which never waits for a device. The default.
    case threadPool
    /// libdispatch's `DispatchIO` channels, as in the article this project grew from.
    /// Opens and fsyncs still run on the library's threads.
    case dispatchIO

    /// The engine chosen by measurement (`make bench`): ``threadPool``.
    public static let `default`: FileIOEngine = .threadPool

    /// The engine's name, as the `--engine` option spells it.
    public var description: String {
        switch self {
        case .threadPool: "threadPool"
        case .dispatchIO: "dispatchIO"
        }
    }
}
