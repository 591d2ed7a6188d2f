import Foundation
import Testing

/// Bad input on the command line: one clear usage error (exit 2), nothing done.
@Suite("filecoord usage errors")
struct UsageTests {
    let scratch = Scratch()

    @Test("negative durations and counts are usage errors naming the option, in either spelling (--opt -1, --opt=-1)",
          arguments: [
              (["present", "F", "--ack-delay"], "--ack-delay"), (["present", "F", "--settle"], "--settle"),
              (["write", "F", "--timeout"], "--timeout"), (["write", "F", "--presenter-timeout"], "--presenter-timeout"),
              (["exec", "--write", "F", "--timeout"], "--timeout"), (["read", "F", "--concurrency"], "--concurrency"),
              (["demo", "--files"], "--files"),
          ])
    func negativeValues(arguments: [String], option: String) async throws {
        let file = scratch.write("doc", "old")
        let given = arguments.map { $0 == "F" ? file : $0 }
        let tail = arguments.first == "exec" ? ["--", "true"] : []
        for spelling in [given + ["-1"] + tail, Array(given.dropLast()) + ["\(option)=-1"] + tail] {
            let result = try await filecoord(spelling + ["--space", scratch.path + "/space"], stdin: Data("new".utf8))
            #expect(result.status == 2, "\(spelling): \(result.errorText)")
            #expect(result.errorText.contains(option) && !result.errorText.contains("Missing value"), "\(spelling): \(result.errorText)")
            #expect(try String(contentsOfFile: file, encoding: .utf8) == "old")
        }
    }
}

/// `filecoord ARGS...` with the arguments as an array.
func filecoord(_ arguments: [String], stdin: Data? = nil) async throws -> ProcessResult {
    try await run(filecoordBinary, arguments, stdin: stdin)
}

extension UsageTests {
    @Test("present of a name that is not UTF-8 presents it (as read and write do); a loop of symbolic links is ELOOP, not ENOENT")
    func presentOddNames() async throws {
        let made = try await shell("cd '\(scratch.path)' && printf x > \"$(printf 'bad\\377name')\" && ln -s loop loop")
        #expect(made.status == 0, "\(made.errorText)")
        let presenter = try LineProcess(["-c", "exec \"$FILECOORD\" present --json --space '\(scratch.path)/space' \"$(printf '\(scratch.path)/bad\\377name')\""],
                                        executable: "/bin/sh", environment: ["FILECOORD": filecoordBinary])
        var lines = presenter.lines.makeAsyncIterator()
        let ready = await lines.next() ?? ""
        #expect(event(ready).event == "ready", "\(ready)")
        presenter.signal(SIGTERM)
        let ended = await presenter.wait()
        #expect(ended.status == SIGTERM && presenter.process.terminationReason == .uncaughtSignal, "\(ended.stderr)")

        let loop = try await filecoord(["present", scratch.path + "/loop", "--space", scratch.path + "/space"])
        #expect(loop.status == 1)
        #expect(loop.errorText.contains("ELOOP"), "\(loop.errorText)")
    }
}
