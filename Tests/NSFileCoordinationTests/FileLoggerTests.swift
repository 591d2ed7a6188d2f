import Foundation
import NSFileCoordination
import Testing
import TestSupport

/// A file logger's write, as a logger written for Apple's systems makes it: a coordinated
/// write that merges, then an append at the file's end through a `FileHandle`. Without
/// coordination two processes can both seek to the same end and one line overwrites the
/// other.
func appendCoordinated(_ line: String, to logURL: URL) -> Bool {
    var success = false
    var coordinatorError: NSError?
    let coordinator = NSFileCoordinator(filePresenter: nil)
    coordinator.coordinate(writingItemAt: logURL, options: .forMerging, error: &coordinatorError) { url in
        do {
            if !FileManager.default.fileExists(atPath: url.path) {
                _ = FileManager.default.createFile(atPath: url.path, contents: nil)
            }
            let handle = try FileHandle(forWritingTo: url)
            try handle.seekToEnd()
            try handle.write(contentsOf: Data(line.utf8))
            try handle.close()
            success = true
        } catch {
            success = false
        }
    }
    return success && coordinatorError == nil
}

/// One logger process's line: its number, the line's, and a payload long enough that
/// lines written over each other would show.
func loggerLine(process: Int, line: Int) -> String {
    "p\(process) n\(line) " + String(repeating: "x", count: 2000) + "\n"
}

@Suite("A coordinated file logger across processes", .timeLimit(.minutes(3)))
struct FileLoggerTests {
    static let processes = 4

    @Test("four processes append 150 lines each to one log at once: every line arrives, whole")
    func severalProcessesAppend() async throws {
        let scratch = Scratch()
        let log = scratch.path + "/app.log"
        let binary = try #require(ProcessInfo.processInfo.arguments.first)
        let outcomes = try await withThrowingTaskGroup(of: (Int32, String).self) { group in
            for process in 0 ..< Self.processes {
                group.addTask {
                    try await runToEnd([binary, "--testing-library", "swift-testing", "--filter", "LoggerChild"],
                                       environment: [LoggerChild.fileVariable: log, LoggerChild.processVariable: "\(process)"],
                                       includeStandardError: true)
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        for (status, output) in outcomes {
            #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
        }
        let written = lines(of: log)
        #expect(written.count == Self.processes * LoggerChild.lines)
        let expected = Set((0 ..< Self.processes).flatMap { process in
            (0 ..< LoggerChild.lines).map { loggerLine(process: process, line: $0).dropLast() }.map(String.init)
        })
        #expect(Set(written) == expected, "lines lost or torn")
    }
}

/// One logger process of ``FileLoggerTests/severalProcessesAppend()``: this test binary
/// again, filtered to this suite, told its log and number in its environment.
@Suite struct LoggerChild {
    static let fileVariable = "NSFC_LOGGER_FILE"
    static let processVariable = "NSFC_LOGGER_PROCESS"
    static let lines = 150
    static var environment: [String: String] { ProcessInfo.processInfo.environment }

    @Test("a logger process", .enabled(if: environment[fileVariable] != nil))
    func child() async throws {
        let log = URL(fileURLWithPath: try #require(Self.environment[Self.fileVariable]))
        let process = try #require(Int(Self.environment[Self.processVariable] ?? ""))
        let failures = try await offThePool {
            (0 ..< Self.lines).filter { !appendCoordinated(loggerLine(process: process, line: $0), to: log) }.count
        }
        #expect(failures == 0)
    }
}
