import Foundation
import Testing
import TestSupport

@Suite("filecoord read")
struct ReadCommandTests {
    @Test("--cat writes the files byte-identically, in the order given")
    func cat() async throws {
        let scratch = Scratch()
        let a = scratch.write("a", "first\n")
        let empty = scratch.write("empty", "")
        let b = scratch.write("b with space", "second\n")
        let result = try await filecoord("read", "--no-coordination", "--cat", b, empty, a)
        #expect(result.status == 0)
        #expect(result.outputText == "second\nfirst\n")
    }

    @Test("a file over 16 MiB is read in chunks once the batch reaches it: --cat stays byte-identical, --json counts it",
          arguments: [false, true])
    func largeFiles(coordinated: Bool) async throws {
        let scratch = Scratch()
        let small = scratch.write("small", "before\n")
        // 20 MiB + 3 bytes, each 4 KiB page starting with its number, so that a chunk out
        // of place shows.
        let large = scratch.path + "/large"
        var pattern = Data(count: 20 * 1_048_576 + 3)
        pattern.withUnsafeMutableBytes { raw in
            for page in stride(from: 0, to: raw.count - 8, by: 4096) { raw.storeBytes(of: UInt64(page / 4096 + 1), toByteOffset: page, as: UInt64.self) }
        }
        try writeFixture(pattern, toPath: large)
        let after = scratch.write("after", "after\n")
        let mode = coordinated ? ["--space", scratch.path + "/space"] : ["--no-coordination"]
        let cat = try await run(filecoordBinary, ["read", "--cat"] + mode + [small, large, after, large])
        #expect(cat.status == 0, "\(cat.errorText)")
        #expect(cat.stdout == Data("before\n".utf8) + pattern + Data("after\n".utf8) + pattern)
        let summary = try await run(filecoordBinary, ["read", "--json"] + mode + [large, small, "\(scratch.path)/missing", large])
        #expect(summary.status == 1)
        let object = try #require(summary.jsonLines.last)
        #expect(object["files"] as? Int == 3)
        #expect(object["bytes"] as? Int == 2 * pattern.count + 7)
        #expect(object["failed"] as? Int == 1)
    }

    @Test("--cat of /dev/zero into `head` ends when head does, as cat's does", .timeLimit(.minutes(3)))
    func endlessDevice() async throws {
        let result = try await shell(#""$FILECOORD" read --no-coordination --cat /dev/zero | head -c 50000000 | wc -c"#)
        #expect(result.outputText.trimmingCharacters(in: .whitespacesAndNewlines) == "50000000", "\(result.errorText)")
    }

    @Test("names that are not UTF-8, from argv and from a NUL-separated list on stdin")
    func rawNames() async throws {
        let scratch = Scratch()
        // \377 is not UTF-8; the newline is legal in a Linux file name.
        let script = """
            cd '\(scratch.path)' && printf 'raw' > "$(printf 'bad-\\377-name')" && printf 'nl' > "$(printf 'line\\nbreak')" && \
            "$FILECOORD" read --no-coordination --cat "$(printf 'bad-\\377-name')" && \
            printf 'bad-\\377-name\\0line\\nbreak\\0' | "$FILECOORD" read --no-coordination --cat --from-list - -z
            """
        let result = try await shell(script)
        #expect(result.status == 0, "\(result.errorText)")
        #expect(result.outputText == "rawrawnl")
        // Two names that differ only in bytes that are not UTF-8 decode to the same text:
        // each argument still names its own file (coordinated, so their URLs are made too).
        let two = try await shell("""
            cd '\(scratch.path)' && printf 'FF' > "$(printf 'u\\377')" && printf 'FE' > "$(printf 'u\\376')" && \
            "$FILECOORD" read --space '\(scratch.path)/space' --cat "$(printf 'u\\377')" "$(printf 'u\\376')"
            """)
        #expect(two.status == 0, "\(two.errorText)")
        #expect(two.outputText == "FFFE")
        // An `--x=VALUE` argument of exec's command keeps its bytes whole.
        let passed = try await shell("""
            cd '\(scratch.path)' && "$FILECOORD" exec --space '\(scratch.path)/space' --read "$(printf 'u\\377')" -- \
            printf '%s' "--x=$(printf 'u\\377')"
            """)
        #expect(passed.status == 0, "\(passed.errorText)")
        #expect(passed.stdout == Data("--x=u".utf8) + Data([0xFF]))
    }

    @Test("--json summarises on stdout; a list file gives one path a line")
    func json() async throws {
        let scratch = Scratch()
        let paths = (0 ..< 20).map { scratch.write("f\($0)", String(repeating: "x", count: $0)) }
        let list = scratch.write("list", paths.joined(separator: "\n") + "\n")
        let result = try await filecoord("read", "--no-coordination", "--json", "--from-list", list, "--concurrency", "3")
        #expect(result.status == 0)
        let lines = result.jsonLines
        let object = try #require(lines.last)
        #expect(object["files"] as? Int == 20)
        // A line per file first, in the order given, with its size.
        #expect(lines.dropLast().map { $0["path"] as? String ?? "" } == paths)
        #expect(lines.dropLast().map { $0["bytes"] as? Int ?? -1 } == Array(0 ..< 20))
        #expect(object["bytes"] as? Int == (0 ..< 20).reduce(0, +))
        #expect(object["failed"] as? Int == 0)
        for key in ["seconds", "filesPerSecond", "mibPerSecond"] { #expect(object[key] is Double || object[key] is Int, "\(key)") }
    }

    @Test("a failing file is reported in the contract's format and skipped; exit status 1")
    func failure() async throws {
        let scratch = Scratch()
        let good = scratch.write("good", "ok")
        let missing = "\(scratch.path)/missing"
        let result = try await filecoord("read", "--no-coordination", "--json", good, missing, scratch.path, good)
        #expect(result.status == 1)
        let errors = result.errorText.split(separator: "\n").map(String.init)
        #expect(errors.contains("filecoord: \(missing): open failed: No such file or directory (ENOENT)"))
        #expect(errors.contains("filecoord: \(scratch.path): open failed: is a directory, not a file (EISDIR)"))
        let lines = result.jsonLines
        let object = try #require(lines.last)
        #expect(object["files"] as? Int == 2)
        #expect(object["failed"] as? Int == 2)
        // Each failing file's line names its error and errno.
        #expect(lines.count == 5 && lines[1]["path"] as? String == missing && lines[1]["errno"] as? String == "ENOENT"
                    && lines[1]["code"] as? String == "notFound" && lines[2]["errno"] as? String == "EISDIR", "\(result.outputText)")
        // A name with a newline, a backslash or a byte that is not UTF-8 still makes one
        // line, escaped as `ls -b` escapes it.
        let awkward = try await shell(#"cd '\#(scratch.path)' && "$FILECOORD" read --no-coordination "$(printf 'a\nb\\c\377')""#)
        #expect(awkward.status == 1)
        #expect(awkward.errorText.split(separator: "\n").first.map(String.init)
                == #"filecoord: a\nb\\c\377: open failed: No such file or directory (ENOENT)"#)
    }

    @Test("usage errors exit 2", arguments: [[], ["read"], ["read", "--bogus"], ["read", "--concurrency", "0", "x"], ["nonsense"], ["read", "x", "--space", ""]])
    func usage(arguments: [String]) async throws {
        let result = try await run(filecoordBinary, arguments)
        #expect(result.status == 2, "\(arguments): \(result.errorText)")
        // One line, as every error.
        #expect(result.errorText.hasPrefix("filecoord: ") && result.errorText.filter { $0 == "\n" }.count == 1, "\(result.errorText)")
    }

    @Test("on a terminal, the progress bar is drawn, but not into --cat's output on the same terminal",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/script")))
    func progressOnTerminal() async throws {
        let scratch = Scratch()
        let file = scratch.write("f", "contents\n")
        // `script` runs the command with stdout and stderr on one pseudo-terminal.
        let plain = try await shell("script -qc \"'$FILECOORD' read --no-coordination '\(file)'\" /dev/null")
        #expect(plain.outputText.contains("] 1/1"), "\(plain.outputText)")
        let cat = try await shell("script -qc \"'$FILECOORD' read --no-coordination --cat '\(file)'\" /dev/null")
        #expect(cat.status == 0)
        #expect(cat.outputText == "contents\r\n", "\(cat.outputText)")
    }

    @Test("10,000 files under ulimit -n 64")
    func manyFilesFewDescriptors() async throws {
        let scratch = Scratch()
        let script = """
            cd '\(scratch.path)' && mkdir d && i=0 && while [ $i -lt 10000 ]; do printf "$i" > d/$i; i=$((i+1)); done && \
            ls -d "$PWD"/d/* > list && ulimit -n 64 && "$FILECOORD" read --no-coordination --json --from-list list
            """
        let result = try await shell(script)
        #expect(result.status == 0, "\(result.errorText)")
        let object = try #require(result.jsonLines.last)
        #expect(object["files"] as? Int == 10_000)
        #expect(object["failed"] as? Int == 0)
    }

    @Test("two descriptors to spare (ulimit -n 8): every file is read, none fails")
    func descriptorExhaustion() async throws {
        let scratch = Scratch()
        // Under `ulimit -n 8` the process has two descriptors to spare: it reads one file
        // at a time, and leaves the other to libdispatch (see `Read.descriptorHeadroom`).
        let script = """
            cd '\(scratch.path)' && i=0 && while [ $i -lt 500 ]; do printf "$i" > f$i; i=$((i+1)); done && \\
            ls -d "$PWD"/f* > list && ulimit -n 8 && "$FILECOORD" read --no-coordination --json --concurrency 16 --from-list list
            """
        let result = try await shell(script)
        #expect(result.status == 0, "\(result.errorText)")
        let object = try #require(result.jsonLines.last)
        #expect(object["files"] as? Int == 500)
        #expect(object["failed"] as? Int == 0)
    }

    @Test("with descriptors nearly exhausted (ulimit -n 7) read never crashes: every run exits 0, or 1 naming EMFILE")
    func almostNoDescriptors() async throws {
        let scratch = Scratch()
        // With an async main most runs here crashed under the test suite's load (SIGILL in
        // libdispatch): it handed the main thread to dispatch_main, which needs an
        // eventfd as the thread leaves, while the batch's workers took every descriptor.
        let script = """
            cd '\(scratch.path)' && i=0 && while [ $i -lt 40 ]; do printf "$i" > f$i; i=$((i+1)); done && \\
            ls -d "$PWD"/f* > list && i=0 && while [ $i -lt 40 ]; do \\
              ( for fd in $(ls /proc/$BASHPID/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done; \\
                ulimit -n 7 && exec "$FILECOORD" read --no-coordination --json --concurrency 16 --from-list list ) > out 2> err; \\
              echo "$? $(grep -c . err) $(grep -c EMFILE err) $(head -c 300 err | tr '\\n' ' ')"; i=$((i+1)); done
            """
        // bash: its subshell closes every descriptor above 2 first (a process the suite
        // started in parallel can leave one inherited, and the limit counts it).
        let result = try await run("/bin/bash", ["-c", script], environment: ["FILECOORD": filecoordBinary])
        // Per run: its status, its lines of errors, and how many of them name EMFILE (one
        // line per file that failed).
        let lines = String(decoding: result.stdout, as: UTF8.self).split(whereSeparator: \.isNewline)
        #expect(lines.count == 40, "\(result.errorText)")
        for line in lines {
            // The status and the two counts; the first of the errors after them, to tell.
            let run = line.split(separator: " ").prefix(3).compactMap { Int($0) }
            #expect(run == [0, 0, 0] || (run.count == 3 && run[0] == 1 && run[1] > 0 && run[1] == run[2]), "\(line)")
        }
    }

    @Test("with fewer than 5 descriptors free (ulimit -n 4) it says so and exits 1 instead of crashing")
    func tooFewDescriptors() async throws {
        let scratch = Scratch()
        let file = scratch.write("f", "x")
        let result = try await shell("( ulimit -n 4 && exec \"$FILECOORD\" read --no-coordination '\(file)' ) 2> '\(scratch.path)/err'; echo $?")
        #expect(result.outputText == "1\n", "\(result.outputText)")
        let errors = try String(contentsOfFile: scratch.path + "/err", encoding: .utf8)
        #expect(errors == "filecoord: too few file descriptors: the limit is 4 (ulimit -n) and 3 are open; filecoord needs 5 free (EMFILE)\n")
    }

    @Test("coordinated reads under ulimit -n 64 (3,000 files) and -n 40: claim shards make room for the files",
          .timeLimit(.minutes(3)))
    func coordinatedFewDescriptors() async throws {
        let scratch = Scratch()
        // Every claim shard open would take 64 descriptors: the process keeps fewer (16
        // at -n 64, 8 at -n 40), closing those it holds nothing in, and claims windows
        // of files that fit in them.
        let script = """
            cd '\(scratch.path)' && mkdir d && i=0 && while [ $i -lt 3000 ]; do printf "$i" > d/$i; i=$((i+1)); done && \\
            ls -d "$PWD"/d/* > list && head -300 list > short && \\
            ( ulimit -n 64 && "$FILECOORD" read --space '\(scratch.path)/space' --json --from-list list ) && \\
            ( ulimit -n 40 && "$FILECOORD" read --space '\(scratch.path)/space' --json --from-list short )
            """
        let result = try await shell(script)
        #expect(result.status == 0, "\(result.errorText)")
        // Each read's summary follows its lines per file.
        let summaries = result.jsonLines.filter { $0["files"] != nil }
        try #require(summaries.count == 2, "\(result.errorText)")
        for (object, files) in zip(summaries, [3_000, 300]) {
            #expect(object["files"] as? Int == files)
            #expect(object["failed"] as? Int == 0)
        }
        #expect(result.jsonLines.count == 3_302)
    }

    @Test("an unreadable file is EACCES for an unprivileged user",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") && getuid() == 0))
    func denied() async throws {
        let scratch = Scratch()
        let secret = scratch.write("secret", "s")
        let open = scratch.write("open", "o")
        chmod(secret, 0)
        chmod(open, 0o644)
        chmod(scratch.path, 0o755)
        let result = try await shell("setpriv --reuid=65534 --regid=65534 --clear-groups \"$FILECOORD\" read --no-coordination --cat '\(secret)' '\(open)'")
        #expect(result.status == 1)
        #expect(result.errorText.contains("filecoord: \(secret): open failed: Permission denied (EACCES)"))
        #expect(result.outputText == "o")
    }
}

extension ReadCommandTests {
    @Test("--from-list reads a FIFO and /dev/stdin as streams")
    func listFromPipe() async throws {
        let scratch = Scratch()
        let result = try await shell("""
            cd '\(scratch.path)' && printf a > a && printf b > b && mkfifo list && \
            { printf '%s\\n' "$PWD/a" "$PWD/b" > list & } && "$FILECOORD" read --no-coordination --cat --from-list list && \
            printf '%s\\n' "$PWD/b" "$PWD/a" | "$FILECOORD" read --no-coordination --cat --from-list /dev/stdin
            """)
        #expect(result.status == 0, "\(result.errorText)")
        #expect(result.outputText == "abba")
    }
}

extension ReadCommandTests {
    @Test("a coordinated batch under ulimit -n 20 (a process's own descriptors take most of them) reads every file, a few at a time, in both modes")
    func coordinatedBatchUnderTinyLimit() async throws {
        let scratch = Scratch()
        let result = try await shell("""
            cd '\(scratch.path)' && for i in $(seq 1 60); do printf "$i," > f$i; done && ls -d "$PWD"/f* > list && \
            ( ulimit -n 20 && "$FILECOORD" read --space "$PWD/space" --json --from-list list ) > summary && \
            ( ulimit -n 20 && exec "$FILECOORD" read --space "$PWD/space" --cat --from-list list )
            """)
        #expect(result.status == 0, "\(result.errorText)")
        #expect(result.errorText.isEmpty, "\(result.errorText)")
        let expected = (try String(contentsOfFile: scratch.path + "/list", encoding: .utf8)).split(separator: "\n")
            .map { String($0.split(separator: "f").last!) + "," }.joined()
        #expect(result.outputText == expected)
        let summary = try String(contentsOfFile: scratch.path + "/summary", encoding: .utf8)
        #expect(summary.contains(#""files":60"#) && summary.contains(#""failed":0"#), "\(summary)")
    }
}
