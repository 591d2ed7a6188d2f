import AsyncFileIO
import Foundation
import Logging
import Synchronization
import Testing
@testable import FileCoordination
import TestSupport

/// A log handler that keeps every line: "LEVEL MESSAGE", then its metadata's values.
private final class Captured: Sendable {
    let lines = Locked<[String]>([])

    func handler(level: Logger.Level) -> some LogHandler { Handler(captured: self, logLevel: level) }

    struct Handler: LogHandler {
        let captured: Captured
        var logLevel: Logger.Level
        var metadata: Logger.Metadata = [:]

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let values = (event.metadata ?? [:]).sorted { $0.key < $1.key }.map { " \($0.value)" }.joined()
            captured.lines.withLock { $0.append("\(event.level) \(event.message)" + values) }
        }
    }

    func containing(_ texts: String...) -> [String] {
        lines.withLock { $0.filter { line in texts.allSatisfy { line.contains($0) } } }
    }
}

/// ``FileCoordinator/logger`` is the process's: these tests set it one at a time, and put
/// the one before back; other tests' lines may reach the captured logger meanwhile, so
/// each looks for its own file's lines only.
@Suite("A logger passed in", .serialized)
struct LoggerTests {
    @Test("the library writes its lines to the logger a caller sets, at the level it was set with")
    func passedInLogger() async throws {
        let previous = FileCoordinator.logger
        defer { FileCoordinator.logger = previous }
        let box = Sandbox(), file = box.file("logged", "1")
        let captured = Captured()
        FileCoordinator.logger = Logger(label: "test") { _ in captured.handler(level: .trace) }
        try await privateCoordinator(CoordinationCenter()).coordinate(writingItemAt: file) { _ in }
        let granted = captured.containing("claim granted")
        #expect(granted.contains { $0.hasPrefix("trace ") && $0.hasSuffix("writing \(file.path)") }, "\(granted)")
        #expect(!captured.containing("claim released").isEmpty)

        // At warning, the claims' trace lines are not written (nor built).
        let quiet = Captured()
        FileCoordinator.logger = Logger(label: "test") { _ in quiet.handler(level: .warning) }
        try await privateCoordinator(CoordinationCenter()).coordinate(writingItemAt: file) { _ in }
        #expect(quiet.containing(file.path).isEmpty)
    }

    @Test("a presenter that does not answer in time is a warning on the logger passed in")
    func warningReachesLogger() async throws {
        let previous = FileCoordinator.logger
        defer { FileCoordinator.logger = previous }
        let captured = Captured()
        FileCoordinator.logger = Logger(label: "test") { _ in captured.handler(level: .warning) }
        let center = CoordinationCenter(), box = Sandbox(), log = EventLog()
        let file = box.file("silent", "1")
        let hung = Recorder("H", url: file, log: log, behavior: .hangOnWriters)
        center.addPresenter(hung, at: FilePath(file.path))
        defer { center.removePresenterLocally(hung) }
        let coordinator = privateCoordinator(center)
        coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .milliseconds(100), action: .proceed))
        try await coordinator.coordinate(writingItemAt: file) { _ in }
        let warnings = captured.containing("did not answer", file.path)
        #expect(warnings.count == 1 && warnings[0].hasPrefix("warning "), "\(warnings)")
    }
}
