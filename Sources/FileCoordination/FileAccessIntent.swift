import AsyncFileIO
import Foundation
import Synchronization

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
