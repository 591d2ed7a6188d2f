#if !canImport(Darwin)
import Foundation
internal import FileCoordination

extension NSFileCoordinator {
    /// How a read is coordinated: Apple's options, with Apple's raw values.
    public struct ReadingOptions: OptionSet, Sendable, Hashable {
        /// The option bits (`NSFileCoordinatorReadingOptions`).
        public let rawValue: UInt
        /// Options from their bits.
        public init(rawValue: UInt) { self.rawValue = rawValue }

        /// Presenters are not asked to save first: the item is read as it is on disk.
        public static let withoutChanges = ReadingOptions(rawValue: 1 << 0)
        /// If the item is a symbolic link, the accessor gets (and the claim covers) its target.
        public static let resolvesSymbolicLink = ReadingOptions(rawValue: 1 << 1)
        /// Only metadata that is immediately available is read; presenters are not asked to save.
        public static let immediatelyAvailableMetadataOnly = ReadingOptions(rawValue: 1 << 2)
        /// The accessor gets a snapshot to keep using (a copy of a file, a directory as
        /// one `.zip`); writers need not wait for the accessor.
        public static let forUploading = ReadingOptions(rawValue: 1 << 3)

        /// The engine's options with the same meaning.
        var engine: FileCoordinator.ReadingOptions {
            var options: FileCoordinator.ReadingOptions = []
            if contains(.withoutChanges) { options.insert(.withoutChanges) }
            if contains(.resolvesSymbolicLink) { options.insert(.resolvesSymbolicLink) }
            if contains(.immediatelyAvailableMetadataOnly) { options.insert(.immediatelyAvailableMetadataOnly) }
            if contains(.forUploading) { options.insert(.forUploading) }
            return options
        }
    }
}
#endif
