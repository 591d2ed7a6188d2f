import AsyncFileIO
import FileCoordination
import Foundation
import Logging

/// Library log messages (a presenter that did not answer in time, a malformed file in the
/// space; at `debug`, claims, waits and messages) as one stderr line each, passed to the
/// library as its logger (``FileCoordinator/logger``). `--log-format text` (the default):
///
///     2025-01-31T09:15:02.123Z filecoord[4242]: warning: <message> (<details>)
///
/// with its details from `debug` on; `--log-format json`: one object per line, for
/// collectors (`{"time","level","pid","message","metadata"?}`).
enum Logs {
    /// How each line is written.
    enum Format: String, CaseIterable, Sendable {
        case text, json
    }

    /// From `--log-level`, else `$FILECOORD_LOG_LEVEL`, else `warning`; set while the
    /// arguments are parsed.
    static var level: Logger.Level {
        get { setting.withLock { $0.level } }
        set { setting.withLock { $0.level = newValue } }
    }

    /// From `--log-format`, else `$FILECOORD_LOG_FORMAT`, else `text`.
    static var format: Format {
        get { setting.withLock { $0.format } }
        set { setting.withLock { $0.format = newValue } }
    }

    private static let setting = Locked((level: Logger.Level.warning, format: Format.text))

    private static let once: Void = {
        let (level, format) = setting.withLock { $0 }
        FileCoordinator.logger = Logger(label: "filecoord") { _ in StderrLogHandler(logLevel: level, format: format) }
    }()

    /// Gives the library its logger, with the level and format parsed (once).
    static func bootstrap() { _ = once }

    /// Every level's name, from the quietest, as an error lists them.
    static var levelNames: String { Logger.Level.allCases.reversed().map(\.rawValue).joined(separator: ", ") }

    /// The level a `--log-level` or `FILECOORD_LOG_LEVEL` value names.
    static func level(named name: String) -> Logger.Level? {
        Logger.Level(rawValue: name.lowercased())
    }

    /// This process's id, as every line names it.
    static let pid = getpid()

    struct StderrLogHandler: LogHandler {
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level
        let format: Format

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let now = Date()
            let time = now.formatted(.iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
            let message = "\(event.message)"
            let all = metadata.merging(event.metadata ?? [:]) { $1 }
            switch format {
            case .json:
                let line = Line(time: time, level: event.level.rawValue, pid: Logs.pid, message: message,
                                metadata: all.isEmpty ? nil : all.mapValues { "\($0)" })
                Output.writeStandardError(JSONLines.line(line))
            case .text:
                // Each thing said once: details the message already gives are left out (all of
                // them from debug on).
                let details = all.filter { logLevel <= .debug || !message.contains("\($0.value)") }
                    .sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
                Output.line("\(time) filecoord[\(Logs.pid)]: ",
                            "\(event.level): \(Output.words(message))" + (details.isEmpty ? "" : " (\(details))"))
            }
        }
    }

    /// `--log-format json`: one line's object. Its schema is in docs/cli.md; fields are
    /// only ever added.
    struct Line: Encodable {
        /// ISO 8601, UTC, to the millisecond.
        var time: String
        var level: String
        var pid: Int32
        /// The library's own words (not the text format's rewording of its steps).
        var message: String
        /// The line's details, each value as text.
        var metadata: [String: String]?
    }
}
