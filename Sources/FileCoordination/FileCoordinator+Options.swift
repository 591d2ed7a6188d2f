import AsyncFileIO
import Foundation
import Synchronization

extension FileCoordinator {
    /// How a read is coordinated (Apple's `NSFileCoordinator.ReadingOptions`).
    public struct ReadingOptions: OptionSet, Sendable, Hashable {
        /// The option bits.
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }

        /// Read the item as it is on disk: presenters are not asked to save first.
        public static let withoutChanges = ReadingOptions(rawValue: 1 << 0)
        /// If the item is a symbolic link, coordinate (and give the accessor) its target.
        public static let resolvesSymbolicLink = ReadingOptions(rawValue: 1 << 1)
        /// Read only metadata that is immediately available. On a local file system all
        /// of it is; presenters are not asked to save.
        public static let immediatelyAvailableMetadataOnly = ReadingOptions(rawValue: 1 << 2)
        /// Give the accessor a snapshot to keep using: a copy of a file, or of a
        /// directory as one `.zip` archive. The read claim ends once the snapshot
        /// exists, so writers need not wait for the accessor; the snapshot is deleted
        /// when the accessor returns.
        public static let forUploading = ReadingOptions(rawValue: 1 << 3)
    }

    /// How a write is coordinated (Apple's `NSFileCoordinator.WritingOptions`).
    public struct WritingOptions: OptionSet, Sendable, Hashable {
        /// The option bits.
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }

        /// The item will be deleted: presenters accommodate the deletion instead of
        /// saving. On a directory, the claim covers everything inside it.
        public static let forDeleting = WritingOptions(rawValue: 1 << 0)
        /// The item will be moved (report the move with ``FileCoordinator/item(at:didMoveTo:)``).
        /// On a directory, the claim covers everything inside it.
        public static let forMoving = WritingOptions(rawValue: 1 << 1)
        /// The item's content will be merged with new content: presenters save first.
        public static let forMerging = WritingOptions(rawValue: 1 << 2)
        /// The item will be replaced wholesale: presenters are not asked to save. On a
        /// directory, the claim covers everything inside it.
        public static let forReplacing = WritingOptions(rawValue: 1 << 3)
        /// Only metadata that does not depend on the content changes (permissions,
        /// tags): presenters are not asked to save.
        public static let contentIndependentMetadataOnly = WritingOptions(rawValue: 1 << 4)
    }
}

/// What a coordinator does when a presenter does not answer in time.
///
/// Apple's coordinator waits forever for a presenter that never answers, so one hung
/// window can hang every writer. Here each presenter callback is bounded.
public struct PresenterTimeoutPolicy: Sendable, Hashable {
    /// What happens when the time is up.
    public enum Action: Sendable, Hashable {
        /// Carry on without the presenter's answer, and log a warning naming it.
        case proceed
        /// Fail the coordination with `FileCoordinationError.Code.timedOut`.
        case fail
    }

    /// How long one presenter callback may take.
    public var timeout: Duration
    /// What happens when it takes longer.
    public var action: Action

    /// A policy.
    public init(timeout: Duration, action: Action) {
        self.timeout = timeout
        self.action = action
    }

    /// The default: wait up to 30 seconds, then proceed with a warning.
    public static let `default` = PresenterTimeoutPolicy(timeout: .seconds(30), action: .proceed)
}

/// One item a coordinator is asked to read or write (Apple's `NSFileAccessIntent`), for
/// ``FileCoordinator/coordinate(with:queue:byAccessor:)-(_,DispatchQueue,_)``.
///
/// ``url`` follows the item: if it is moved by another coordination while this intent
/// waits, the accessor finds the new URL here.
public final class FileAccessIntent: Sendable {
    enum Kind: Sendable, Hashable {
        case reading(FileCoordinator.ReadingOptions)
        case writing(FileCoordinator.WritingOptions)
    }

    let kind: Kind
    private let current: Locked<URL>

    /// The item's URL: where it is now, after any coordinated move.
    public var url: URL { current.withLock { $0 } }

    init(url: URL, kind: Kind) {
        self.kind = kind
        current = Locked(url)
    }

    func update(_ url: URL) { current.withLock { $0 = url } }

    /// An intent to read the item at `url`.
    public static func readingIntent(with url: URL, options: FileCoordinator.ReadingOptions = []) -> FileAccessIntent {
        FileAccessIntent(url: url, kind: .reading(options))
    }

    /// An intent to write the item at `url`.
    public static func writingIntent(with url: URL, options: FileCoordinator.WritingOptions = []) -> FileAccessIntent {
        FileAccessIntent(url: url, kind: .writing(options))
    }
}
