import Foundation
import Testing

/// `make install`: the binary, the manual page and the completions, as a user gets them.
@Suite("filecoord installed")
struct InstallTests {
    /// The repository: this file is `Tests/filecoordTests/InstallTests.swift` in it.
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
    /// `make test` makes it before the tests run (`make man CONFIG=debug`).
    static let manual = repository + "/.build/plugins/GenerateManual/outputs/filecoord/filecoord.1"

    @Test("installed into a prefix: the binary runs, man -l reads its page, bash completes file names and event names",
          .enabled(if: FileManager.default.fileExists(atPath: manual), "the manual page is made by make test"))
    func installIntoPrefix() async throws {
        let scratch = Scratch()
        let prefix = scratch.path + "/prefix"
        let installed = try await run("/usr/bin/env", ["make", "--no-print-directory", "-C", Self.repository, "install-files",
                                                       "CONFIG=debug", "PREFIX=\(prefix)"])
        #expect(installed.status == 0, "\(installed.errorText)")
        let version = try await run(prefix + "/bin/filecoord", ["--version"])
        #expect(version.status == 0 && version.outputText.hasPrefix("filecoord "), "\(version.errorText)")

        let page = try await run("/usr/bin/env", ["man", "-l", prefix + "/share/man/man1/filecoord.1"],
                                 environment: ["MANPAGER": "cat", "MANWIDTH": "100"])
        #expect(page.status == 0, "\(page.errorText)")
        for expected in ["FILECOORD(1)", "--conflict-exit-code", "--nonblock", "--once", "--log-level"] {
            #expect(page.outputText.contains(expected), "\(expected) in the manual page")
        }

        // `filecoord read d1/f<Tab>`, then `filecoord present x -e didC<Tab>`, as bash calls
        // a completion function: the command, the word under the cursor, the one before.
        try FileManager.default.createDirectory(atPath: scratch.path + "/d1", withIntermediateDirectories: true)
        _ = scratch.write("d1/file1", "")
        _ = scratch.write("d1/file2", "")
        let script = #"""
            source "$1"
            complete_line() { COMP_WORDS=("${@:3}"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMP_LINE="${COMP_WORDS[*]}"
                COMP_POINT=${#COMP_LINE}; COMPREPLY=(); _filecoord filecoord "$1" "$2"; printf '%s\n' "${COMPREPLY[@]}" | sort; }
            complete_line d1/f read filecoord read d1/f
            echo --
            complete_line didC -e filecoord present x -e didC
            """#
        let completed = try await run("/bin/bash", ["-c", "cd '\(scratch.path)' && " + script, "bash",
                                                    prefix + "/share/bash-completion/completions/filecoord"])
        #expect(completed.outputText == "d1/file1\nd1/file2\n--\ndidChange\n", "\(completed.outputText) \(completed.errorText)")
        for shell in ["zsh/site-functions/_filecoord", "fish/vendor_completions.d/filecoord.fish"] {
            let size = (try? FileManager.default.attributesOfItem(atPath: prefix + "/share/" + shell)[.size] as? Int) ?? 0
            #expect(size > 0, "\(shell)")
        }
    }
}
