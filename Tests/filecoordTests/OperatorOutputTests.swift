import Foundation
import Testing
import TestSupport

/// The diagnostic lines of `text` in the text format (`TIME filecoord[PID]: LEVEL: ...`):
/// each one's time, pid and the rest; lines in another form are left out.
func logLines(_ text: String) -> [(time: String, pid: Int32, text: String)] {
    text.split(separator: "\n").compactMap { line in
        guard let match = line.wholeMatch(of: #/(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) filecoord\[(\d+)\]: (.*)/#),
              let pid = Int32(match.2) else { return nil }
        return (String(match.1), pid, String(match.3))
    }
}

/// What operators read: the diagnostic lines (time and pid; JSON for collectors) and
/// `status --json`'s versioned schema.
@Suite("Operators' output: log lines and status --json")
struct OperatorOutputTests {
    let scratch = Scratch()
    var space: String { scratch.path + "/space" }

    /// The time of a log line, as a date.
    private func date(_ text: String) -> Date? {
        try? Date(text, strategy: .iso8601.year().month().day().time(includingFractionalSeconds: true).timeZone(separator: .omitted))
    }

    @Test("each diagnostic line carries the time and filecoord[PID], the process's own pid")
    func textLines() async throws {
        let file = scratch.write("f", "x")
        let before = Date()
        let result = try await shell("echo $$; exec \"$FILECOORD\" exec --space '\(space)' --log-level trace --write '\(file)' -- true")
        let after = Date()
        #expect(result.status == 0, "\(result.errorText)")
        let pid = try #require(Int32(result.outputText.trimmingCharacters(in: .whitespacesAndNewlines)))
        let errorLines = result.errorText.split(separator: "\n")
        let lines = logLines(result.errorText)
        #expect(!lines.isEmpty && lines.count == errorLines.count, "every stderr line is a log line: \(result.errorText)")
        for line in lines {
            #expect(line.pid == pid)
            let time = try #require(date(line.time), "\(line.time)")
            #expect(time >= before.addingTimeInterval(-1) && time <= after.addingTimeInterval(1), "\(line.time)")
        }
        #expect(lines.contains { $0.text == "trace: claim granted #1: writing \(file)" }, "\(result.errorText)")
    }

    @Test("--log-format json (or FILECOORD_LOG_FORMAT=json): one object per line with time, level, pid, message and metadata; a format that does not exist is a usage error")
    func jsonLines() async throws {
        let file = scratch.write("f", "x")
        #expect(try await filecoord("status", "--space", space).status == 0)
        // A file in the space that is not one of ours: a warning with details.
        _ = FileManager.default.createFile(atPath: space + "/presenters/foreign", contents: Data("hello\n".utf8))
        let result = try await shell("echo $$; exec \"$FILECOORD\" exec --space '\(space)' --log-level trace --log-format json --write '\(file)' -- true")
        #expect(result.status == 0, "\(result.errorText)")
        let pid = try #require(Int(result.outputText.trimmingCharacters(in: .whitespacesAndNewlines)))
        var objects: [[String: Any]] = []
        for line in result.errorText.split(separator: "\n") {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "\(line)")
            objects.append(object)
            #expect(object["pid"] as? Int == pid)
            #expect(date(object["time"] as? String ?? "") != nil, "\(line)")
            #expect(Set(object.keys).isSubset(of: ["time", "level", "pid", "message", "metadata"]), "\(line)")
            if let metadata = object["metadata"] { #expect(metadata is [String: String], "\(line)") }
        }
        #expect(objects.contains { $0["level"] as? String == "trace" && $0["message"] as? String == "claim granted #1: writing \(file)" },
                "\(result.errorText)")
        let warning = objects.first { $0["level"] as? String == "warning" }
        let details = try #require(warning?["metadata"] as? [String: String], "\(result.errorText)")
        #expect(details.values.contains { $0.contains("foreign") }, "\(details)")

        let environment = try await run(filecoordBinary, ["exec", "--space", space, "--log-level", "trace", "--write", file, "--", "true"],
                                        environment: ["FILECOORD_LOG_FORMAT": "json"])
        #expect(environment.status == 0 && environment.errorText.hasPrefix("{\""), "\(environment.errorText)")
        let wrong = try await filecoord("exec", "--space", space, "--log-format", "xml", "--write", file, "--", "true")
        #expect(wrong.status == 2 && wrong.errorText.contains("--log-format: no format named 'xml'"), "\(wrong.errorText)")
    }

    @Test("status --json carries the schema's version, and every field the schema names")
    func statusVersion() async throws {
        let file = scratch.write("f", "x")
        let holder = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo held; exec sleep 300"])
        defer { holder.signal(SIGTERM) }
        var lines = holder.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        let status = try await filecoord("status", "--space", space, "--json")
        #expect(status.status == 0, "\(status.errorText)")
        let object = try #require(try JSONSerialization.jsonObject(with: status.stdout) as? [String: Any])
        #expect(object["version"] as? Int == 1)
        #expect(Set(object.keys) == ["version", "claims", "waiting", "presenters", "unanswered", "cleanedUp"])
        let claims = try #require(object["claims"] as? [[String: Any]])
        #expect(claims.contains { $0["path"] as? String == file && $0["access"] as? String == "write" && $0["pid"] as? Int == Int(holder.pid) },
                "\(claims)")
    }
}
