import Foundation
import Testing
import TestSupport

/// `filecoord write` against what a shell's `cat >` would do with the same target.
@Suite("filecoord write: targets and input")
struct WriteTargetTests {
    let scratch = Scratch()
    var space: String { scratch.path + "/space" }

    func write(_ target: String, _ input: String, _ extra: String...) async throws -> ProcessResult {
        try await run(filecoordBinary, ["write", target, "--space", space] + extra, stdin: Data(input.utf8))
    }

    @Test("through a symbolic link the linked file is replaced, under its own claim, and the link stays; dangling links included",
          .timeLimit(.minutes(3)))
    func symbolicLinks() async throws {
        let real = scratch.write("real.txt", "old")
        let link = scratch.path + "/link.txt"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: "real.txt")
        // The claim names the file that changes: its presenter is asked, as for a write
        // that names it.
        let presenter = try LineProcess(["present", real, "--json", "--space", space])
        var lines = presenter.lines.makeAsyncIterator()
        #expect(await lines.next()?.contains(#""event":"ready""#) == true)
        let result = try await write(link, "new")
        #expect(result.status == 0, "\(result.errorText)")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: link) == "real.txt")
        #expect(try String(contentsOfFile: real, encoding: .utf8) == "new")
        var heard: [String] = []
        while heard.count < 4, let line = await lines.next() { heard.append(event(line).event) }
        #expect(heard == ["relinquishToWriter", "save", "didChange", "reacquire"])
        presenter.signal(SIGTERM)
        #expect(await presenter.wait().status == 0)
        let dangling = scratch.path + "/dangling"
        try FileManager.default.createSymbolicLink(atPath: dangling, withDestinationPath: "made-by-write")
        #expect(try await write(dangling, "created").status == 0)
        #expect(try String(contentsOfFile: scratch.path + "/made-by-write", encoding: .utf8) == "created")
    }

    @Test("a FIFO is not replaced by a regular file: exit 1, naming it")
    func fifo() async throws {
        let fifo = scratch.path + "/pipe"
        #expect(mkfifo(fifo, 0o600) == 0)
        let result = try await write(fifo, "x")
        #expect(result.status == 1)
        #expect(result.errorText.contains("\(fifo): open failed: is a FIFO"), "\(result.errorText)")
        var info = stat()
        #expect(lstat(fifo, &info) == 0 && info.st_mode & S_IFMT == S_IFIFO)
    }

    @Test("a file this user may not write is not replaced, although the directory would allow the rename",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") && getuid() == 0))
    func readOnlyFile() async throws {
        let open = scratch.path + "/open"
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: false)
        #expect(chmod(open, 0o777) == 0)
        let file = open + "/read-only"
        try writeFixture(Data("kept".utf8), toPath: file)
        #expect(chmod(file, 0o444) == 0)
        let result = try await shell("""
            printf new | setpriv --reuid=65534 --regid=65534 --clear-groups "$FILECOORD" write --no-coordination '\(file)'
            """)
        #expect(result.status == 1, "\(result.errorText)")
        #expect(result.errorText.contains("\(file): open failed: Permission denied (EACCES)"), "\(result.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "kept")
    }

    @Test("stdin that cannot be read (closed, a directory) fails the write and leaves the file as it was")
    func unreadableInput() async throws {
        let file = scratch.write("keep", "kept")
        for redirect in ["<&-", "< /"] {
            let result = try await shell("\"$FILECOORD\" write '\(file)' --space '\(space)' \(redirect)")
            #expect(result.status == 1, "\(redirect): \(result.errorText)")
            #expect(result.errorText.contains("stdin: read failed"), "\(redirect): \(result.errorText)")
            #expect(try String(contentsOfFile: file, encoding: .utf8) == "kept")
        }
    }

    @Test("--timeout inf waits forever (accepted); nan is a usage error")
    func infiniteTimeout() async throws {
        let file = scratch.write("doc", "old")
        #expect(try await write(file, "new", "--timeout", "inf", "--presenter-timeout", "1e300").status == 0)
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")
        #expect(try await write(file, "newer", "--timeout", "nan").status == 2)
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "new")
    }
}
