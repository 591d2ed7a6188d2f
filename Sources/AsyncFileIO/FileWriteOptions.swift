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
