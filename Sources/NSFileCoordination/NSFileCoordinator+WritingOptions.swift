#if !canImport(Darwin)
import Foundation
internal import FileCoordination

extension NSFileCoordinator {
    /// How a write is coordinated: Apple's options, with Apple's raw values.
    public struct WritingOptions: OptionSet, Sendable, Hashable {
        /// The option bits (`NSFileCoordinatorWritingOptions`).
        public let rawValue: UInt
        /// Options from their bits.
        public init(rawValue: UInt) { self.rawValue = rawValue }

        /// The item will be deleted: presenters accommodate the deletion instead of saving.
        /// On a directory, the claim covers everything inside it.
        public static let forDeleting = WritingOptions(rawValue: 1 << 0)
        /// The item will be moved; report it with ``NSFileCoordinator/item(at:didMoveTo:)``.
        /// On a directory, the claim covers everything inside it.
        public static let forMoving = WritingOptions(rawValue: 1 << 1)
        /// The item's content will be merged with new content: presenters save first.
        public static let forMerging = WritingOptions(rawValue: 1 << 2)
        /// The item will be replaced whole: presenters are not asked to save. On a
        /// directory, the claim covers everything inside it.
        public static let forReplacing = WritingOptions(rawValue: 1 << 3)
        /// Only metadata that does not depend on the content changes: presenters are not
        /// asked to save.
        public static let contentIndependentMetadataOnly = WritingOptions(rawValue: 1 << 4)

        /// The engine's options with the same meaning.
        var engine: FileCoordinator.WritingOptions {
            var options: FileCoordinator.WritingOptions = []
            if contains(.forDeleting) { options.insert(.forDeleting) }
            if contains(.forMoving) { options.insert(.forMoving) }
            if contains(.forMerging) { options.insert(.forMerging) }
            if contains(.forReplacing) { options.insert(.forReplacing) }
            if contains(.contentIndependentMetadataOnly) { options.insert(.contentIndependentMetadataOnly) }
            return options
        }
    }
}
#endif
