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

/// How a file is written by `Data.asyncWrite(to:options:)` and `openForWriting(options:)`.
public struct FileWriteOptions: OptionSet, Sendable, Hashable {
    /// The option bits.
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }

    /// Write into a temporary file beside the target and rename it into place when
    /// done: readers see the old content or the new, never a torn file, even if the
    /// writer is killed. The target's permission bits are kept.
    public static let atomic = FileWriteOptions(rawValue: 1 << 0)
    /// Fail with ``FileCoordinationError/Code/fileExists`` instead of replacing an existing file.
    public static let withoutOverwriting = FileWriteOptions(rawValue: 1 << 1)
    /// Append to the end of the existing file (`O_APPEND`); cannot be combined with ``atomic``.
    public static let append = FileWriteOptions(rawValue: 1 << 2)
    /// Skip the `fsync` calls that make a write durable across a power loss (an atomic
    /// write is still atomic with respect to other processes).
    public static let skipSync = FileWriteOptions(rawValue: 1 << 3)
}
