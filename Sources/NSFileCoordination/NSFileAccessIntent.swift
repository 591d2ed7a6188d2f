#if !canImport(Darwin)
import Foundation
internal import FileCoordination

/// One item to read or write in ``NSFileCoordinator/coordinate(with:queue:byAccessor:)``
/// (Apple's `NSFileAccessIntent`).
///
/// ``url`` follows the item: when another coordination moves it while this intent waits,
/// the accessor finds the new URL here. Read it inside the accessor.
public final class NSFileAccessIntent: NSObject, @unchecked Sendable {
    // Unchecked: the one stored property is immutable and Sendable; NSObject is not.
    let engine: FileAccessIntent

    private init(_ engine: FileAccessIntent) {
        self.engine = engine
    }

    /// The item's URL: where it is now, after any coordinated move.
    public var url: URL { engine.url }

    /// An intent to read the item at `url`.
    public class func readingIntent(with url: URL, options: NSFileCoordinator.ReadingOptions = []) -> NSFileAccessIntent {
        NSFileAccessIntent(.readingIntent(with: url, options: options.engine))
    }

    /// An intent to write the item at `url`.
    public class func writingIntent(with url: URL, options: NSFileCoordinator.WritingOptions = []) -> NSFileAccessIntent {
        NSFileAccessIntent(.writingIntent(with: url, options: options.engine))
    }
}
#endif
