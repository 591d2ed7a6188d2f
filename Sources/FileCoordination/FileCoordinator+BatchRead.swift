import AsyncFileIO
import Foundation
import Synchronization
import SystemPackage

extension FileCoordinator {
    /// Reads many files in parallel, each under a coordinated read intent, and delivers
    /// each one's content or error in the order given.
    ///
    /// One `FileBatchReader` reads the files, and its workers claim groups of them
    /// while they read them, when nothing stands in the way. The files they cannot claim
    /// at once (a presenter is concerned, a conflicting claim is held, or the name is a
    /// symbolic link, whose target the claim must name) get the full
    /// coordination when the consumer reaches them, up to `window` at a time: one read
    /// claim covers them together, and their presenters are messaged once. (Snapshots,
    /// links to resolve and the DispatchIO engine take every file that way, in windows
    /// whose claim lasts until the consumer moves past them.) A file that fails is
    /// reported in its result; the others are still read. That includes a claim that
    /// waits past the claim timeout: the files of that window whose claims are free at
    /// that moment are claimed again together, once, and only the others fail. A
    /// presenter that times out under a failing policy, or refuses, fails the files of
    /// its window. Cancellation ends the batch.
    public func readFiles(
        at urls: [URL], options: ReadingOptions = [], batchOptions: BatchReadOptions = BatchReadOptions(),
        window: Int = 256
    ) -> CoordinatedFileReads {
        CoordinatedFileReads(coordinator: self, files: .urls(urls), options: options, batchOptions: batchOptions,
                             window: max(1, window))
    }

    /// ``readFiles(at:options:batchOptions:window:)-([URL],_,_,_)`` for file-system paths (a relative
    /// one is taken against the current directory). Read in place, the files go from
    /// path to claim to `open` without a URL in between.
    public func readFiles(
        at paths: [FilePath], options: ReadingOptions = [], batchOptions: BatchReadOptions = BatchReadOptions(),
        window: Int = 256
    ) -> CoordinatedFileReads {
        CoordinatedFileReads(coordinator: self, files: .paths(paths), options: options, batchOptions: batchOptions,
                             window: max(1, window))
    }
}

extension FileCoordinationError {
    /// The failure of a window's coordination as one of its files reports it: under that
    /// file's name (the message still names the presenter that failed).
    func naming(_ file: PlatformPath) -> FileCoordinationError {
        var named = self
        named.path = file.filePath
        return named
    }
}
