import Foundation

/// How a ``FileBatchReader`` reads.
public struct BatchReadOptions: Sendable {
    /// The order results are delivered in.
    public enum Order: Sendable, Hashable {
        /// The order of the input list.
        case given
        /// As each file finishes, whatever its position.
        case completion
    }

    /// How many files are read at the same time (at most one descriptor each).
    public var concurrency: Int
    /// The order results are delivered in.
    public var order: Order
    /// Files larger than this fail with ``FileCoordinationError/Code/fileTooLarge``.
    public var maximumFileSize: Int
    /// Reading pauses while this many bytes of results wait for the consumer
    /// (back-pressure); at least one file is always let through.
    public var maximumBufferedBytes: Int
    /// The engine that reads the files.
    public var engine: FileIOEngine

    /// Options with the given values; the defaults suit many small files on a local disk.
    public init(concurrency: Int = 16, order: Order = .given, maximumFileSize: Int = .max,
                maximumBufferedBytes: Int = 256 << 20, engine: FileIOEngine = .default) {
        self.concurrency = concurrency
        self.order = order
        self.maximumFileSize = maximumFileSize
        self.maximumBufferedBytes = max(1, maximumBufferedBytes)
        self.engine = engine
    }
}
