import Foundation
import Testing

/// What a script author expects of `exec`, `read` and `present` beyond their first use:
/// flock(1)'s `-o` and `-c`, inotifywait's output formats, several paths, and lines a
/// program can read.
@Suite("filecoord for script authors")
struct ScriptAuthorTests: CrossProcessFixture {
    let scratch = Scratch()

    @Test("exec -c runs `sh -c STRING`; with -o the command does not hold the claims once filecoord is gone, without it the command does",
          .timeLimit(.minutes(3)))
    func closeAndCommandString() async throws {
        let file = scratch.write("f", "0")
        let sum = try await filecoord("exec", "--space", space, "--write", file, "-c", "echo $((1 + 2))")
        #expect(sum.status == 0 && sum.outputText == "3\n", "\(sum.errorText)")
        let both = try await filecoord("exec", "--space", space, "--write", file, "-c", "true", "--", "true")
        #expect(both.status == 2 && both.errorText.contains("contradict"), "\(both.errorText)")
        // The claims of a wrapper killed while its command runs: without -o the command
        // holds them (its inherited descriptors), as flock(1)'s; with -o they end with it.
        for closing in [true, false] {
            let ready = scratch.path + "/ready-\(closing)"
            #expect(mkfifo(ready, 0o600) == 0)
            let wrapper = try Spawned([filecoordBinary, "exec", "--space", space, "--write", file] + (closing ? ["-o"] : [])
                + ["--", "sh", "-c", "echo $$ > '\(ready)'; exec sleep 61"]) // ok: the command holding (or not) the claim
            let command = try await pid(writtenTo: ready)
            kill(wrapper.pid, SIGKILL)
            _ = await wrapper.wait()
            let next = try await filecoord("exec", "--space", space, "-n", "--write", file, "--", "true")
            kill(command, SIGKILL)
            #expect(next.status == (closing ? 0 : 3), "-o \(closing): \(next.errorText)")
        }
    }
}
