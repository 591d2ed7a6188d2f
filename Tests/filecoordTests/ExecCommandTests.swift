import Foundation
import Testing

/// `filecoord exec` against what `flock(1)` gives the command it runs.
@Suite("filecoord exec")
struct ExecCommandTests {
    let scratch = Scratch()
    var space: String { scratch.path + "/space" }

    @Test("the command inherits the caller's descriptors (3<file) and its ignored signals (nohup)")
    func inheritance() async throws {
        let file = scratch.write("f", "through fd 3")
        let redirected = try await shell("\"$FILECOORD\" exec --space '\(space)' --read '\(file)' -- sh -c 'cat <&3' 3<'\(file)'")
        #expect(redirected.status == 0, "\(redirected.errorText)")
        #expect(redirected.outputText == "through fd 3")
        // SIGHUP ignored by the caller, as `nohup` does: still ignored in the command.
        let ignored = try await shell("trap '' HUP; \"$FILECOORD\" exec --space '\(space)' --read '\(file)' -- grep SigIgn /proc/self/status")
        #expect(ignored.status == 0, "\(ignored.errorText)")
        let mask = UInt64(ignored.outputText.split(separator: "\t").last?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "", radix: 16) ?? 0
        #expect(mask & 1 == 1, "SIGHUP is not ignored in the command: \(ignored.outputText)")
    }

    @Test("names that are not UTF-8 keep their bytes, in both spellings (--write P, --write=P): the same name is the same item, names that differ only in such bytes are two")
    func rawNames() async throws {
        let script = #"""
            cd '\#(scratch.path)' && A="$(printf 'uÿ')" && B="$(printf 'uþ')" && printf x > "$A" && printf y > "$B" &&             "$FILECOORD" exec --space '\#(space)' --write "$A" -- sh -c '
                "$FILECOORD" exec --space "$3" -n --write "$1" -- true; echo "same $?"
                "$FILECOORD" exec --space "$3" -n --write="$1" -- true; echo "same= $?"
                "$FILECOORD" exec --space "$3" -n --write "$2" -- true; echo "other $?"' sh "$A" "$B" '\#(space)'
            """#
        let result = try await shell(script)
        #expect(result.status == 0, "\(result.errorText)")
        #expect(result.outputText == "same 3\nsame= 3\nother 0\n", "\(result.errorText)")
    }

    @Test("SIGTERM sent to filecoord goes to the command, and filecoord holds the claim until the command exits with its status",
          .timeLimit(.minutes(3)),
          // Also when filecoord starts with the signals blocked, as a process started from a
          // Swift task does (it inherits the libdispatch worker's mask).
          arguments: [[], [SIGINT, SIGTERM, SIGHUP, SIGQUIT]])
    func forwardsSignals(blocked: [Int32]) async throws {
        let file = scratch.write("f", "x")
        // On SIGTERM the command tries the same claim from another process: it must still
        // be held (exit 3 at the inner --timeout).
        let inner = "'\(filecoordBinary)' exec --space '\(space)' --write '\(file)' --timeout 0.2 -- true"
        let runner = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c",
                                      "trap '\(inner.replacingOccurrences(of: "'", with: "'\\''")); echo got-term $?; exit 7' TERM; echo ready; i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"],
                                     blocked: blocked)
        runner.signal(SIGTERM) { $0 == "ready" }
        var lines = runner.lines.makeAsyncIterator()
        #expect(await lines.next() == "ready")
        #expect(await lines.next() == "got-term 3")
        let ended = await runner.wait()
        #expect(ended.status == 7, "filecoord must wait for the command and exit with its status: \(ended.stderr)")
    }

    @Test("a command that dies by a terminating signal (here passed on from filecoord) leaves filecoord dying by it too, as if the shell had run the command itself",
          .timeLimit(.minutes(1)), arguments: [SIGINT, SIGTERM, SIGHUP, SIGQUIT])
    func diesByCommandsSignal(number: Int32) async throws {
        let file = scratch.write("f-\(number)", "x")
        let runner = try LineProcess(["exec", "--space", space, "--write", file, "--", "sh", "-c", "echo ready; exec sleep 30"])
        runner.signal(number) { $0 == "ready" }
        #expect(await runner.endsBy(number), "filecoord exited instead of dying by signal \(number)")
        // A command that handles the signal and exits is the other case: its status (above).
    }

    @Test("a command that cannot be started exits 127 (not found) or 126 (not executable), naming it")
    func launchFailures() async throws {
        let file = scratch.write("f", "x")
        let missing = try await filecoord("exec", "--space", space, "--read", file, "--", "no-such-command-\(getpid())")
        #expect(missing.status == 127)
        #expect(missing.errorText.contains("no-such-command-\(getpid()): exec failed: No such file or directory (ENOENT)"), "\(missing.errorText)")
        let notExecutable = try await filecoord("exec", "--space", space, "--read", file, "--", file)
        #expect(notExecutable.status == 126)
    }

    @Test("a command that only claims makes no mailbox: while it runs, the space holds its record and no mailbox")
    func claimOnlyMakesNoMailbox() async throws {
        let file = scratch.write("f", "x")
        let listed = try await shell("\"$FILECOORD\" exec --space '\(space)' --write '\(file)' -- sh -c 'ls \"$0/procs\"; echo --; ls -A \"$0/mail\"' '\(space)'")
        #expect(listed.status == 0, "\(listed.errorText)")
        let parts = listed.outputText.components(separatedBy: "--\n")
        #expect(parts.count == 2 && !parts[0].isEmpty && parts[1].isEmpty, "records, then mailboxes: \(listed.outputText)")
    }
}
