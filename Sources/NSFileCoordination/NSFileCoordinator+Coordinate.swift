#if !canImport(Darwin)
import Foundation
internal import FileCoordination

extension NSFileCoordinator {
    // MARK: Blocking forms

    /// Reads the item at `url` under a coordinated read claim, **blocking the calling
    /// thread** until the claim is granted and the item's presenters have answered
    /// ``NSFilePresenter/relinquishPresentedItem(toReader:)`` and (unless `options`
    /// contains ``ReadingOptions/withoutChanges``) the save; then runs `reader` on this
    /// thread with the URL to use (another, if the item moved meanwhile).
    ///
    /// If the coordination fails (cancelled: `NSUserCancelledError`; a presenter's
    /// refusal: its error), `reader` is not run and the error is stored in `outError`.
    public func coordinate(readingItemAt url: URL, options: ReadingOptions = [], error outError: NSErrorPointer,
                           byAccessor reader: (URL) -> Void) {
        blocking(outError) {
            try engine.coordinateBlocking(readingItemAt: url, options: options.engine) { reader($0) }
        }
    }

    /// Writes the item at `url` under a coordinated write claim, **blocking the calling
    /// thread**: presenters first hear ``NSFilePresenter/relinquishPresentedItem(toWriter:)``,
    /// then the save (or, with ``WritingOptions/forDeleting``, the deletion to
    /// accommodate); after `writer` returns they hear what changed. Errors as in
    /// ``coordinate(readingItemAt:options:error:byAccessor:)``.
    public func coordinate(writingItemAt url: URL, options: WritingOptions = [], error outError: NSErrorPointer,
                           byAccessor writer: (URL) -> Void) {
        blocking(outError) {
            try engine.coordinateBlocking(writingItemAt: url, options: options.engine) { writer($0) }
        }
    }

    /// Reads one item and writes another in one coordination, **blocking the calling
    /// thread**. Both claims are granted together, so two such coordinations never
    /// deadlock.
    public func coordinate(readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [],
                           writingItemAt writingURL: URL, options writingOptions: WritingOptions = [],
                           error outError: NSErrorPointer, byAccessor readerWriter: (URL, URL) -> Void) {
        blocking(outError) {
            try engine.coordinateBlocking(readingItemAt: readingURL, options: readingOptions.engine,
                                          writingItemAt: writingURL, options: writingOptions.engine) { readerWriter($0, $1) }
        }
    }

    /// Writes two items in one coordination (a move, a swap), **blocking the calling
    /// thread**. Both claims are granted together, so two such coordinations never
    /// deadlock.
    public func coordinate(writingItemAt url1: URL, options options1: WritingOptions = [],
                           writingItemAt url2: URL, options options2: WritingOptions = [],
                           error outError: NSErrorPointer, byAccessor writer: (URL, URL) -> Void) {
        blocking(outError) {
            try engine.coordinateBlocking(writingItemAt: url1, options: options1.engine,
                                          writingItemAt: url2, options: options2.engine) { writer($0, $1) }
        }
    }

    /// One blocking coordination or batch: `NSUserCancelledError` once ``cancel()`` was
    /// called (`body` not run), the engine's error as Cocoa's, and this coordinator's
    /// presenter registered after it if it now names an item.
    private func blocking(_ outError: NSErrorPointer, _ body: () throws -> Void) {
        if let cancellation {
            outError?.pointee = cancellation
            return
        }
        do {
            try body()
        } catch {
            outError?.pointee = CocoaErrors.from(error)
        }
        placePresenter()
    }

    // MARK: Intents on a queue

    /// Coordinates every intent at once, then runs `accessor` on `queue`; returns at once.
    ///
    /// `accessor` gets nil, or the error that prevented the coordination (it then must
    /// not touch the items). Inside it, each intent's ``NSFileAccessIntent/url`` is where
    /// the item is now. The claims are held until `accessor` returns.
    public func coordinate(with intents: [NSFileAccessIntent], queue: OperationQueue,
                           byAccessor accessor: @escaping @Sendable ((any Error)?) -> Void) {
        if let cancellation {
            queue.addOperation { accessor(cancellation) }
            return
        }
        engine.coordinate(with: intents.map(\.engine), queue: queue) { [self] error in
            accessor(error.map(CocoaErrors.from))
            placePresenter()
        }
    }

    // MARK: Batches

    /// Prepares a batch of coordinated accesses, **blocking the calling thread**: the
    /// presenters of all the items are asked to relinquish (and save) once, up front; the
    /// coordinations made inside `batchAccessor` (on this thread) then do not ask them
    /// again. Their reacquirers run when `batchAccessor` calls its completion handler or
    /// returns, whichever comes first.
    public func prepare(forReadingItemsAt readingURLs: [URL], options readingOptions: ReadingOptions = [],
                        writingItemsAt writingURLs: [URL], options writingOptions: WritingOptions = [],
                        error outError: NSErrorPointer,
                        byAccessor batchAccessor: (@escaping @Sendable () -> Void) -> Void) {
        blocking(outError) {
            try engine.prepareBlocking(forReadingItemsAt: readingURLs, options: readingOptions.engine,
                                       writingItemsAt: writingURLs, options: writingOptions.engine) { batchAccessor($0) }
        }
    }
}
#endif
