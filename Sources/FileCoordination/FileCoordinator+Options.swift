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
