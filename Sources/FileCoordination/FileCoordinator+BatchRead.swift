@_spi(FileCoordinationInternal) import AsyncFileIO
import Foundation
import SystemPackage

extension FileCoordinator {
    /// Reads many files in parallel, each under a coordinated read intent, and delivers
    /// each one's content or error in the order given.
    ///
    /// Files are taken in windows: one read claim covers a window's files together, its
    /// presenters are messaged once, the window is read through ``FileBatchReader``, and
    /// the claim is released as soon as the consumer moves past the window. A writer
    /// waits for at most one window. A file that fails is reported in its result; the
    /// others are still read.
    public func readFiles(
        at urls: [URL], options: ReadingOptions = [], batchOptions: BatchReadOptions = BatchReadOptions(),
        window: Int = 256
    ) -> CoordinatedFileReads {
        CoordinatedFileReads(coordinator: self, urls: urls, options: options, batchOptions: batchOptions,
                             window: max(1, window))
    }
}

/// The results of ``FileCoordinator/readFiles(at:options:batchOptions:window:)``.
public struct CoordinatedFileReads: AsyncSequence, Sendable {
    public typealias Element = BatchReadResult

    let coordinator: FileCoordinator
    let urls: [URL]
    let options: FileCoordinator.ReadingOptions
    let batchOptions: BatchReadOptions
    let window: Int

    /// Reads the files in place, window by window under the same claims as the sequence:
    /// each file's bytes go to `body` on the I/O thread that read them, as
    /// ``FileBatchReader/forEachFile(perWorker:_:)`` does (indices are positions in the
    /// whole list). Returns the workers' values of every window, to combine. A window's
    /// claim is released as soon as its files are done.
    public func forEachFile<Partial: Sendable>(
        perWorker initial: Partial, _ body: @escaping @Sendable (inout Partial, BatchFileContents) -> Void
    ) async throws -> [Partial] {
        var partials: [Partial] = []
        var start = 0
        while start < urls.count {
            let slice = Array(urls[start ..< Swift.min(urls.count, start + window)])
            let base = start
            start += slice.count
            let coordinated = slice.enumerated().filter { $0.element.isFileURL }
            let session = try await coordinator.begin(coordinated.map { ItemRequest.reading($0.element, options) })
            var current = slice
            for (position, url) in zip(coordinated.map { $0.offset }, session.urls) { current[position] = url }
            do {
                partials += try await FileBatchReader(urls: current, options: batchOptions).forEachFile(perWorker: initial) { partial, file in
                    body(&partial, BatchFileContents(index: base + file.index, path: file.path, bytes: file.bytes))
                }
            } catch {
                await coordinator.finish(session, accessorSucceeded: true)
                throw error
            }
            await coordinator.finish(session, accessorSucceeded: true)
        }
        return partials
    }

    /// ``forEachFile(perWorker:_:)`` without values of its own.
    public func forEachFile(_ body: @escaping @Sendable (BatchFileContents) -> Void) async throws {
        _ = try await forEachFile(perWorker: ()) { _, file in body(file) }
    }

    /// An iterator; the first window's claim is taken by its first `next()`.
    public func makeAsyncIterator() -> Iterator {
        Iterator(owner: self)
    }

    /// Takes a window's claim when the consumer reaches it, gives it back when it moves on.
    public final class Iterator: AsyncIteratorProtocol {
        private let owner: CoordinatedFileReads
        private var next = 0
        private var base = 0
        private var session: CoordinationSession?
        private var inner: FileBatchReader.Iterator?

        init(owner: CoordinatedFileReads) {
            self.owner = owner
        }

        deinit {
            // Abandoned mid-window: the claim must still go.
            if let session { Task { [owner] in await owner.coordinator.finish(session, accessorSucceeded: true) } }
        }

        /// The next file's result, in the order given; nil at the end.
        public func next() async throws -> BatchReadResult? {
            while true {
                if let inner {
                    do {
                        if let result = try await inner.next() {
                            return BatchReadResult(index: base + result.index, path: result.path, result: result.result)
                        }
                    } catch {
                        await endWindow()
                        throw error
                    }
                }
                await endWindow()
                guard next < owner.urls.count else { return nil }
                try await beginWindow()
            }
        }

        private func beginWindow() async throws {
            let slice = Array(owner.urls[next ..< Swift.min(owner.urls.count, next + owner.window)])
            base = next
            next += slice.count
            // URLs that are not file URLs take no claim; the batch reports them.
            let coordinated = slice.enumerated().filter { $0.element.isFileURL }
            let options = owner.options
            let session = try await owner.coordinator.begin(coordinated.map { ItemRequest.reading($0.element, options) })
            var current = slice
            for (position, url) in zip(coordinated.map { $0.offset }, session.urls) { current[position] = url }
            self.session = session
            inner = FileBatchReader(urls: current, options: owner.batchOptions).makeAsyncIterator()
        }

        private func endWindow() async {
            inner = nil
            if let session {
                self.session = nil
                await owner.coordinator.finish(session, accessorSucceeded: true)
            }
        }
    }
}
