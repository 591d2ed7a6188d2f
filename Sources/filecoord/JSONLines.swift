import AsyncFileIO
import FileCoordination
import Foundation

/// The objects `--json` prints, one per line, encoded by `JSONEncoder` (slashes not
/// escaped, so that grep and sed match paths). Their schema is in docs/cli.md; fields are
/// only ever added.
enum JSONLines {
    /// One line: the object and a newline.
    static func line(_ value: some Encodable) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes] // a stable order for eyes and diffs
        // Only strings, numbers and arrays of them: encoding cannot fail.
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        return Array(data) + [UInt8(ascii: "\n")]
    }

    /// A path as JSON holds it: its text, and when its bytes are not UTF-8 (a JSON string
    /// cannot hold them: they read as U+FFFD there) its exact bytes in base64 beside it.
    static func text(_ path: FilePath) -> (text: String, base64: String?) {
        let bytes = path.platformBytes
        if let text = String(validating: bytes, as: UTF8.self) { return (text, nil) }
        return (String(decoding: bytes, as: UTF8.self), Data(bytes).base64EncodedString())
    }

    /// `present --json`: `{"event","path","pathBase64"?,"to"?,"toBase64"?,"pid"?,"time","date"}`.
    struct Event: Encodable {
        var event: String
        var path: String
        var pathBase64: String?
        var to: String?
        var toBase64: String?
        var pid: Int32?
        /// Seconds since the epoch, to the microsecond.
        var time: Double
        /// The same instant in ISO 8601, UTC, to the millisecond.
        var date: String

        init(_ event: String, path: FilePath, to destination: FilePath?, pid: Int32?, at now: Date) {
            self.event = event
            (self.path, pathBase64) = JSONLines.text(path)
            if let destination { (to, toBase64) = JSONLines.text(destination) }
            self.pid = pid
            time = (now.timeIntervalSince1970 * 1e6).rounded() / 1e6
            date = now.formatted(.iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
        }
    }

    /// `read --json`, one per file before the summary: `{"path","pathBase64"?,"bytes"}`, or
    /// `{"path","pathBase64"?,"error","errno"?,"code"}` for a file that could not be read.
    struct ReadFile: Encodable {
        var path: String
        var pathBase64: String?
        var bytes: Int?
        /// The error's line, as stderr would give it (without the path).
        var error: String?
        /// Its errno's name (`ENOENT`), when the kernel gave one.
        var errno: String?
        /// Its ``FileCoordinationError/Code`` (`notFound`, `timedOut`, ...).
        var code: String?

        init(_ path: FilePath, bytes: Int) {
            (self.path, pathBase64) = JSONLines.text(path)
            self.bytes = bytes
        }

        init(_ path: FilePath, error failure: FileCoordinationError) {
            (self.path, pathBase64) = JSONLines.text(failure.path ?? path)
            error = "\(Output.words(failure.operation)) failed: \(Output.words(failure.message))"
            errno = failure.errno?.symbolicName ?? (failure.code == .timedOut ? "ETIMEDOUT" : nil)
            code = failure.code.description
        }
    }

    /// `read --json`, last: what was read, and how fast (`seconds` times the read phase only).
    struct ReadSummary: Encodable {
        var files: Int
        var bytes: Int
        var failed: Int
        var seconds: Double
        var filesPerSecond: Double
        var mibPerSecond: Double

        init(files: Int, bytes: Int, failed: Int, seconds: Double, filesPerSecond: Double, mibPerSecond: Double) {
            (self.files, self.bytes, self.failed) = (files, bytes, failed)
            self.seconds = (seconds * 1e6).rounded() / 1e6
            self.filesPerSecond = (filesPerSecond * 10).rounded() / 10
            self.mibPerSecond = (mibPerSecond * 10).rounded() / 10
        }
    }

    /// `status --json`: a stable schema (docs/cli.md), whose ``version`` changes only if a
    /// field changes meaning or goes; fields may be added within a version.
    struct Status: Encodable {
        /// The schema's version.
        static let schemaVersion = 1

        struct Claim: Encodable {
            var path: String
            var pathBase64: String?
            var access: String
            var pid: Int32
            /// The holder's host, in an etcd space.
            var host: String?
            /// True when `pid` is another PID namespace's (absent otherwise).
            var otherPidNamespace: Bool?
        }
        struct Presenter: Encodable {
            var path: String
            var pathBase64: String?
            var pid: Int32
            /// The registering process's host, in an etcd space.
            var host: String?
            /// True when `pid` is another PID namespace's (absent otherwise).
            var otherPidNamespace: Bool?
        }
        var claims: [Claim]
        var waiting: [Claim]
        var presenters: [Presenter]
        var unanswered: [Int32]
        var cleanedUp: [Int32]
        var version = Status.schemaVersion
    }
}
