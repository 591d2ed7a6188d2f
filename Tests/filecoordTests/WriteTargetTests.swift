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
        #expect(await presenter.endsBy(SIGTERM))
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

extension WriteTargetTests {
    @Test("stdin larger than the memory the process may have is streamed, not held: 700 MB under ulimit -v 400 MB, replacing and appending",
          .timeLimit(.minutes(3)), arguments: [false, true])
    func hugeInputIsStreamed(append: Bool) async throws {
        let file = scratch.write("big", "head\n")
        let flag = append ? "--append" : ""
        let result = try await shell("ulimit -v 400000 && head -c 700000000 /dev/zero | \"$FILECOORD\" write --space '\(space)' \(flag) '\(file)'")
        #expect(result.status == 0, "\(result.errorText)")
        let size = try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int
        #expect(size == 700_000_000 + (append ? 5 : 0))
        try FileManager.default.removeItem(atPath: file)
    }

    @Test("a full disk fails the write with exit 1 naming ENOSPC, and leaves the target as it was (a failed append is cut back)", .enabled(if: getuid() == 0),
          arguments: [false, true])
    func fullDisk(append: Bool) async throws {
        let mount = scratch.path + "/small"
        try FileManager.default.createDirectory(atPath: mount, withIntermediateDirectories: true)
        let mounted = try await shell("mount -t tmpfs -o size=1m tmpfs '\(mount)'")
        try #require(mounted.status == 0, "\(mounted.errorText)")
        defer { _ = umount2(mount, Int32(MNT_DETACH)) }
        let file = mount + "/doc"
        try Data("old\n".utf8).write(to: URL(fileURLWithPath: file))
        let result = try await shell("head -c 3000000 /dev/zero | \"$FILECOORD\" write --space '\(space)' \(append ? "--append" : "") '\(file)'")
        #expect(result.status == 1)
        #expect(result.errorText.contains("ENOSPC") && result.errorText.split(separator: "\n").count == 1, "\(result.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "old\n")
    }
}
