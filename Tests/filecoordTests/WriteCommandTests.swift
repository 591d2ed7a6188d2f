import Foundation
import Testing
import TestSupport

@Suite("filecoord write")
struct WriteCommandTests {
    @Test("replaces atomically, or appends")
    func writeAndAppend() async throws {
        let scratch = Scratch()
        let target = scratch.write("t", "old")
        #expect(try await filecoord("write", "--no-coordination", target, stdin: Data("new".utf8)).status == 0)
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "new")
        #expect(try await filecoord("write", "--no-coordination", "--append", target, stdin: Data("er".utf8)).status == 0)
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "newer")
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.path) == ["t"])
    }

    @Test("--append of more than the input kept in memory (8 MiB) to a file in a directory the user may not write: spooled elsewhere, appended whole",
          .enabled(if: getuid() == 0, "needs root to run as a dedicated unprivileged user"), .timeLimit(.minutes(1)))
    func appendBesideUnwritableDirectory() async throws {
        let uid = 64125
        let scratch = Scratch(in: "/tmp")
        #expect(chmod(scratch.path, 0o755) == 0)
        let directory = scratch.path + "/user"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        #expect(chown(directory, uid_t(uid), gid_t(uid)) == 0)
        let result = try await shell(asUser: uid, in: directory, """
            mkdir d && printf ab > d/f && chmod a-w d
            head -c 9000000 /dev/zero | "$FILECOORD" write --no-coordination --append d/f || echo "write failed: $?" >&2
            stat -c %s d/f; ls -A d
            """)
        #expect(result.errorText.isEmpty, "\(result.errorText)")
        #expect(result.outputText == "9000002\nf\n", "\(result.outputText)")
    }

    @Test("a writer killed mid-write leaves the old content and nothing else", arguments: [64 << 10, 1 << 20, 8 << 20])
    func killedWriter(bytesBeforeKill: Int) async throws {
        let scratch = Scratch()
        let target = scratch.write("doc", "old content")
        // The stdin pipe holds 64 KiB, so once this write returns the writer has taken
        // (and is writing) all but that much: the kill lands mid-write.
        let status = try await runAndKill(filecoordBinary, ["write", "--no-coordination", target],
                                          feeding: Data(repeating: 0x6E, count: bytesBeforeKill))
        #expect(status == SIGKILL)
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "old content")
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.path) == ["doc"], "no temporary left behind")
    }
}

/// Starts `executable`, writes `input` to its stdin, then kills it with SIGKILL while its
/// stdin is still open; returns the signal that ended it.
func runAndKill(_ executable: String, _ arguments: [String], feeding input: Data) async throws -> Int32 {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            do {
                let process = Process()
                process.executableURL = URL(fileURLWithPath: executable)
                process.arguments = arguments
                let stdin = Pipe()
                process.standardInput = stdin
                try process.run()
                stdin.fileHandleForWriting.write(input)
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
                try? stdin.fileHandleForWriting.close()
                continuation.resume(returning: process.terminationReason == .uncaughtSignal ? process.terminationStatus : -1)
            } catch {
                continuation.resume(throwing: error)
            }
        }
    }
}
