import AsyncFileIO
import Logging
import Synchronization

extension FileCoordinator {
    /// Where the library writes its diagnostics, in this process: a presenter that did
    /// not answer in time, a file of the coordination space that is not one of its own,
    /// a lost etcd lease (warnings and errors); each claim that waits and each message
    /// between processes (`debug`); each claim granted at once and each release
    /// (`trace`). The etcd space (`FileCoordinationEtcd`) writes to the same logger.
    ///
    /// By default a `Logger` labelled `FileCoordination`, made on first use by swift-log's
    /// `LoggingSystem`. Set your own once, at start, before the first coordination:
    ///
    /// ```swift
    /// var logger = Logger(label: "com.example.app.files")
    /// logger.logLevel = .debug
    /// FileCoordinator.logger = logger
    /// ```
    ///
    /// Setting it is safe from any thread at any time; lines written from then on go to
    /// the new logger. Its level is read when it is set: the library builds no line below
    /// that level (the claims' `trace` lines cost nothing otherwise), so set the logger
    /// again to change the level.
    public static var logger: Logger {
        get { LibraryLogger.current }
        set { LibraryLogger.set(newValue) }
    }
}

/// The logger of ``FileCoordinator/logger``, and its level readable without a lock: a
/// claim asks whether `trace` is on with one atomic load.
package enum LibraryLogger {
    /// nil until first read or set: the default is made then, after any
    /// `LoggingSystem.bootstrap` the application made at start.
    private static let logger = Locked<Logger?>(nil)
    /// The logger's level (``Logger/Level`` in its order, from `trace` = 0); `unknown`
    /// until the logger is made.
    private static let level = Atomic<Int>(unknown)
    private static let unknown = -1

    /// The logger in use.
    package static var current: Logger {
        logger.withLock { logger in
            if let logger { return logger }
            let made = Logger(label: "FileCoordination")
            logger = made
            level.store(rank(made.logLevel), ordering: .releasing)
            return made
        }
    }

    static func set(_ new: Logger) {
        logger.withLock { logger in
            logger = new
            level.store(rank(new.logLevel), ordering: .releasing)
        }
    }

    /// Whether a line at `wanted` would be written (without taking the lock once the
    /// logger is made).
    package static func logs(_ wanted: Logger.Level) -> Bool {
        var known = level.load(ordering: .acquiring)
        if known == unknown { known = rank(current.logLevel) }
        return rank(wanted) >= known
    }

    private static func rank(_ level: Logger.Level) -> Int {
        Logger.Level.allCases.firstIndex(of: level) ?? 0
    }
}
