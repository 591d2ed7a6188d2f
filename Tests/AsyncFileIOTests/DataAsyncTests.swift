import Foundation
import SystemPackage
import Testing
@testable import AsyncFileIO
import TestSupport

/// A verdict on the root found at once, on the caller's thread (tests may block).
let settledVerdict: RootVerdict = {
    let verdict = RootVerdict { $0() }
    _ = verdict.localRoot()
    return verdict
}()

/// Whether `path` opens in one call (``CachedWholeFileReader/openOnRootMount(_:verdict:)``).
/// Tried a few times: while any mount is made (by a test running alongside), a lookup
/// from the cache fails as a file not cached does.
func opensInOneCall(_ path: FilePath) -> Bool {
    for _ in 0 ..< 20 {
        if case .opened(let fd, _) = path.withPlatformString({ CachedWholeFileReader.openOnRootMount($0, verdict: settledVerdict) }) {
            close(fd)
            return true
        }
    }
    return false
}

/// Reads `path` alone with `reader` until it is read on this thread, the way `way` when
/// one is given (a few tries, for the same reason); the bytes last read.
func readAlone(_ path: FilePath, with reader: CachedWholeFileReader, way: CachedWholeFileReader.Way? = nil) -> Data? {
    var data: Data?
    for _ in 0 ..< 20 {
        guard case .read(let read) = reader.readAlone(PlatformPath(path), maximumSize: 1 << 20) else { continue }
        data = read
        if way == nil || reader.lastWay == way { break }
    }
    return data
}

@Suite("Data async read and write")
struct DataAsyncTests {
    /// Reads each of `paths` with `Data(asyncContentsOf:)` in the caller's isolation and
    /// checks it against the I/O threads' read of it.
    static func readsAsAlone(_ paths: [FilePath], maximumSize: Int, isolation: isolated (any Actor)? = #isolation) async {
        for path in paths {
            let read: Result<Data, any Error>
            do { read = .success(try await Data(asyncContentsOf: path, maximumSize: maximumSize)) } catch { read = .failure(error) }
            expectReadsAsAlone(read, path, maximumSize: maximumSize)
        }
    }

    @Test("a small cached file is read on the caller's thread as the I/O threads read it, odd inputs included",
          .enabled(if: localDiskBase != nil, "no directory on a local disk's file system"))
    func readsCachedInline() async throws {
        let directory = TemporaryDirectory("inline", under: localDiskBase!)
        let elsewhere = TemporaryDirectory("inline-tmp")
        let files = try (0 ..< 20).map { try directory.make("f\($0)", pattern(1 + $0 * 450, seed: UInt64($0))) }
        // Through `..` and through a link to the directory, as well.
        try FileManager.default.createSymbolicLink(atPath: elsewhere.file("to-inline").string, withDestinationPath: directory.path.string)
        let roundabout = [directory.path.appending("..").appending(directory.path.lastComponent!).appending("f1"),
                          elsewhere.file("to-inline").appending("f2")]
        let paths = files + roundabout + (try oddInputs(in: directory, elsewhere: elsewhere, linkTo: files[3], overLimit: 9500, nextTo: files[5]))
        await Self.readsAsAlone(paths, maximumSize: 9000)
        await Self.readsAsAlone(paths, maximumSize: 9000, isolation: MainActor.shared)
        // On the root directory's mount, each opens in one call, `Data(asyncContentsOf:)`'s
        // own read on the main thread included.
        let oneCall = rootIsLocalDisk && onRootMount(directory.path)
        for path in [files[0], roundabout[0]] {
            #expect(opensInOneCall(path) == oneCall, "\(path)")
        }
        // (The reads above asked an I/O thread about the root; the answer is made here too,
        // so that it is in before the count.)
        try await runOnIOThread { RootVerdict.shared.settle() }
        let (data, opened) = try await Self.countingOneCallOpens { try await Data(asyncContentsOf: files[1]) }
        #expect(data == (try Data(contentsOf: URL(fileURLWithPath: files[1].string))))
        #expect(oneCall ? opened > 0 : opened == 0, "\(opened) of 20 reads opened in one call")
    }

    /// Runs `read` 20 times on the main actor (a concurrent mount may keep one from being
    /// read there), and counts the main thread's files opened in one call meanwhile.
    @MainActor
    static func countingOneCallOpens(_ read: @MainActor () async throws -> Data) async throws -> (Data, UInt64) {
        let before = CachedWholeFileReader.oneCallOpensOnThisThread
        var data = Data()
        for _ in 0 ..< 20 { data = try await read() }
        return (data, CachedWholeFileReader.oneCallOpensOnThisThread - before)
    }

    @Test("the root's file system is first asked for on an I/O thread; until then files open through their directories",
          .enabled(if: localDiskBase != nil, "no directory on a local disk's file system"))
    func rootVerdictFromWorker() async throws {
        let directory = TemporaryDirectory("verdict", under: localDiskBase!)
        let file = try directory.make("f", pattern(300))
        let submitted = Locked<[@Sendable () -> Void]>([])
        let reader = CachedWholeFileReader(verdict: RootVerdict { work in submitted.withLock { $0.append(work) } })
        for _ in 0 ..< 3 {
            #expect(readAlone(file, with: reader) == pattern(300))
            #expect(reader.lastWay == .directory)
        }
        let work = submitted.withLock { $0 }
        try #require(work.count == 1, "one question, asked once")
        try await runOnIOThread { work[0]() }
        let way: CachedWholeFileReader.Way = rootIsLocalDisk && onRootMount(directory.path) ? .oneCall : .directory
        #expect(readAlone(file, with: reader, way: way) == pattern(300))
        #expect(reader.lastWay == way)
    }

    @Test("a file on another mount than the root's is not opened in one call, even one mounted after reads",
          .enabled(if: localDiskBase != nil && canBindMount, "needs a local disk and the right to mount"))
    func readsSeeMounts() async throws {
        let base = TemporaryDirectory("mounts", under: localDiskBase!)
        for name in ["a", "b", "a/sub", "d"] {
            try FileManager.default.createDirectory(atPath: base.file(name).string, withIntermediateDirectories: false)
            try base.make("\(name)/f", Data("from \(name)".utf8))
        }
        let point = base.file("d")
        func read(_ name: String) async throws -> String {
            String(decoding: try await Data(asyncContentsOf: point.appending(name)), as: UTF8.self)
        }
        try await withPrivateMounts(in: base) { mounts in
            // The same disk, mounted again: another mount all the same, found so.
            let reader = CachedWholeFileReader(verdict: settledVerdict)
            #expect(readAlone(point.appending("f"), with: reader, way: .directory) == Data("from d".utf8))
            #expect(reader.lastWay == .directory)
            #expect(reader.foundOffRoot == rootIsLocalDisk)
            #expect(try await read("f") == "from d")
            #expect(!opensInOneCall(point.appending("f")))
            try await mounts.mount(["--bind", base.file("a").string, point.string])
            #expect(!opensInOneCall(point.appending("f")))
            #expect(try await read("f") == "from a")
            try await mounts.mount(["--bind", base.file("b").string, point.string])
            #expect(try await read("f") == "from b")
            try await mounts.unmountLast()
            #expect(try await read("f") == "from a")
            // An in-memory file system below it, whose files are never read inline.
            try await mounts.mount(["-t", "tmpfs", "-o", "size=1m", "tmpfs", point.appending("sub").string])
            try base.make("d/sub/f", Data("in memory".utf8))
            #expect(!opensInOneCall(point.appending("sub/f")))
            #expect(try await read("sub/f") == "in memory")
        }
    }

    @Test("a mount listed past the mount table's first page is judged by its file system: a loop device's ext4 after 40 others",
          .enabled(if: canBindMount && FileManager.default.fileExists(atPath: "/dev/loop0")
              && ["/sbin/mkfs.ext4", "/sbin/losetup"].allSatisfy(FileManager.default.isExecutableFile),
              "needs the right to mount, loop devices and mkfs.ext4"))
    func longMountTable() async throws {
        let base = TemporaryDirectory("long-table")
        let point = base.file("point")
        try FileManager.default.createDirectory(atPath: point.string, withIntermediateDirectories: false)
        _ = FileManager.default.createFile(atPath: base.file("ext.img").string, contents: nil)
        try FileHandle(forWritingTo: URL(fileURLWithPath: base.file("ext.img").string)).truncate(atOffset: 4 << 20)
        _ = try await runTool("/sbin/mkfs.ext4", ["-q", "-F", "-O", "^has_journal", base.file("ext.img").string])
        try await withPrivateMounts(in: base) { mounts in
            // Mounts enough to fill the table's first page (/proc hands it out a page per read).
            for index in 0 ..< 40 where mountTable().utf8.count < 8192 {
                let padding = base.file("padding-\(index)")
                try FileManager.default.createDirectory(atPath: padding.string, withIntermediateDirectories: false)
                try await mounts.mount(["--bind", padding.string, padding.string])
            }
            try #require(mountTable().utf8.count >= 8192, "the table holds two pages")
            let loop = try await runTool("/sbin/losetup", ["--find", "--show", base.file("ext.img").string])
            mounts.cleanups.append { _ = try? await runTool("/sbin/losetup", ["-d", loop]) }
            try await mounts.mount(["-t", "ext4", loop, point.string])
            try base.make("point/f", Data("on ext4".utf8))
            _ = try FileManager.default.attributesOfItem(atPath: point.appending("f").string)
            let reader = CachedWholeFileReader(verdict: settledVerdict)
            #expect(readAlone(point.appending("f"), with: reader, way: .directory) == Data("on ext4".utf8))
            #expect(reader.lastWay == .directory, "a local disk's file system: read on the caller's thread")
        }
    }

    @Test("a device mounted again with another file system is judged again: a loop device's ext4, then its squashfs",
          .enabled(if: canBindMount && uniqueMountIDs && FileManager.default.fileExists(atPath: "/dev/loop0")
              && ["/sbin/mkfs.ext4", "/usr/bin/mksquashfs", "/sbin/losetup"].allSatisfy(FileManager.default.isExecutableFile),
              "needs the right to mount, loop devices, mount IDs never reused (Linux 6.8), mkfs.ext4 and mksquashfs"))
    func remountedDevice() async throws {
        let base = TemporaryDirectory("remount")
        let point = base.file("point")
        try FileManager.default.createDirectory(atPath: point.string, withIntermediateDirectories: false)
        try FileManager.default.createDirectory(atPath: base.file("tree").string, withIntermediateDirectories: false)
        try base.make("tree/f", Data("squashed".utf8))
        _ = FileManager.default.createFile(atPath: base.file("ext.img").string, contents: nil)
        try FileHandle(forWritingTo: URL(fileURLWithPath: base.file("ext.img").string)).truncate(atOffset: 4 << 20)
        _ = try await runTool("/sbin/mkfs.ext4", ["-q", "-F", "-O", "^has_journal", base.file("ext.img").string])
        _ = try await runTool("/usr/bin/mksquashfs", [base.file("tree").string, base.file("squash.img").string, "-quiet", "-noappend", "-no-progress"])

        /// Reads `f` under the mount point with a reader of its own, after a `stat` of it
        /// (which brings its name into the lookup cache): the bytes, and how it was opened.
        func read(way: CachedWholeFileReader.Way? = nil) throws -> (Data?, CachedWholeFileReader.Way) {
            _ = try FileManager.default.attributesOfItem(atPath: point.appending("f").string)
            let reader = CachedWholeFileReader(verdict: settledVerdict)
            return (readAlone(point.appending("f"), with: reader, way: way), reader.lastWay)
        }
        try await withPrivateMounts(in: base) { mounts in
            let loop = try await runTool("/sbin/losetup", ["--find", "--show", base.file("ext.img").string])
            mounts.cleanups.append { _ = try? await runTool("/sbin/losetup", ["-d", loop]) }
            try await mounts.mount(["-t", "ext4", loop, point.string])
            try base.make("point/f", Data("on ext4".utf8))
            let onDisk = try read(way: .directory)
            #expect(onDisk.0 == Data("on ext4".utf8))
            #expect(onDisk.1 == .directory, "a local disk's file system: read on the caller's thread")
            try await mounts.unmountLast()

            // The same device (its number unchanged), now holding a squashfs image. (udev
            // may still hold the detached device open for a moment: it settles first.)
            _ = try await runTool("/sbin/losetup", ["-d", loop])
            if FileManager.default.isExecutableFile(atPath: "/bin/udevadm") { _ = try? await runTool("/bin/udevadm", ["settle"]) }
            _ = try await runTool("/sbin/losetup", [loop, base.file("squash.img").string])
            try await mounts.mount(["-t", "squashfs", "-o", "ro", loop, point.string])
            let squashed = try read()
            #expect(squashed.0 == nil)
            #expect(squashed.1 == .none, "not a local disk's file system: left to the I/O threads")
            #expect(try await Data(asyncContentsOf: point.appending("f")) == Data("squashed".utf8))
        }
    }

    @Test("a loop of cached reads on the main actor lets the actor's other jobs run",
          .enabled(if: localDiskBase != nil, "no directory on a local disk's file system"))
    @MainActor
    func cachedReadsYield() async throws {
        let directory = TemporaryDirectory("yield", under: localDiskBase!)
        let path = try directory.make("small", pattern(100))
        var ran = false
        Task { @MainActor in ran = true }
        var reads = 0
        while !ran && reads < 10_000 {
            _ = try await Data(asyncContentsOf: path)
            reads += 1
        }
        #expect(ran, "the main actor's other job waited for \(reads) reads")
    }

    @Test("atomic write replaces the content, keeps the mode and leaves nothing else", arguments: [FileIOEngine.threadPool, .dispatchIO])
    func atomicWrite(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("atomicwrite")
        let path = try directory.make("config", Data("v1".utf8))
        chmod(path.string, 0o640)
        let content = pattern(300_000)
        try await content.asyncWrite(to: path, engine: engine)
        #expect(try await Data(asyncContentsOf: path, engine: engine) == content)
        let attributes = try FileManager.default.attributesOfItem(atPath: path.string)
        #expect((attributes[.posixPermissions] as? Int) == 0o640)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path.string) == ["config"])
    }

    @Test("an atomic write goes through a symbolic link and refuses to replace a FIFO", arguments: [FileIOEngine.threadPool, .dispatchIO])
    func linksAndSpecialFiles(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("links")
        let real = directory.file("real")
        try await Data("old".utf8).asyncWrite(to: real)
        let link = directory.file("link")
        #expect(symlink("real", link.string) == 0)
        try await Data("new".utf8).asyncWrite(to: link, engine: engine)
        #expect(try await Data(asyncContentsOf: real) == Data("new".utf8))
        var info = stat()
        #expect(lstat(link.string, &info) == 0 && info.st_mode & S_IFMT == S_IFLNK)
        let fifo = directory.file("fifo")
        #expect(mkfifo(fifo.string, 0o600) == 0)
        let error = await #expect(throws: FileCoordinationError.self) { try await Data("x".utf8).asyncWrite(to: fifo, engine: engine) }
        #expect(error?.code == .unsupportedFileType)
        #expect(error?.path == fifo)
        #expect(lstat(fifo.string, &info) == 0 && info.st_mode & S_IFMT == S_IFIFO)
        // Without overwriting, a dangling link is something that exists: the file it names
        // is not created.
        let dangling = directory.file("dangling")
        #expect(symlink("elsewhere", dangling.string) == 0)
        let exists = await #expect(throws: FileCoordinationError.self) {
            try await Data("x".utf8).asyncWrite(to: dangling, options: [.atomic, .withoutOverwriting], engine: engine)
        }
        #expect(exists?.code == .fileExists)
        #expect(access(directory.file("elsewhere").string, F_OK) != 0)
    }

    @Test("an atomic write keeps the replaced file's owner, group and mode", .enabled(if: isRoot, "only root may give a file away"),
          arguments: [FileIOEngine.threadPool, .dispatchIO])
    func keepsOwner(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("owner")
        let file = directory.file("theirs")
        try await Data("old".utf8).asyncWrite(to: file)
        #expect(chown(file.string, 65534, 65534) == 0 && chmod(file.string, 0o640) == 0)
        try await Data("new".utf8).asyncWrite(to: file, engine: engine)
        var info = stat()
        #expect(stat(file.string, &info) == 0)
        #expect(info.st_uid == 65534 && info.st_gid == 65534)
        #expect(info.st_mode & 0o7777 == 0o640)
        #expect(try await Data(asyncContentsOf: file) == Data("new".utf8))
    }

    @Test("withoutOverwriting refuses an existing file and creates a new one")
    func withoutOverwriting() async throws {
        let directory = TemporaryDirectory("noover")
        let path = try directory.make("exists", Data("keep".utf8))
        for options: FileWriteOptions in [[.atomic, .withoutOverwriting], [.withoutOverwriting]] {
            let error = await #expect(throws: FileCoordinationError.self) {
                try await Data("clobber".utf8).asyncWrite(to: path, options: options)
            }
            #expect(error?.code == .fileExists)
        }
        #expect(try await Data(asyncContentsOf: path) == Data("keep".utf8))
        let fresh = directory.file("fresh")
        try await Data("new".utf8).asyncWrite(to: fresh, options: [.atomic, .withoutOverwriting])
        #expect(try await Data(asyncContentsOf: fresh) == Data("new".utf8))
    }

    @Test("non-atomic writes and appends")
    func nonAtomic() async throws {
        let directory = TemporaryDirectory("plain")
        let path = directory.file("log")
        try await Data("a".utf8).asyncWrite(to: path, options: [])
        try await Data("b".utf8).asyncWrite(to: path, options: [.append])
        try await Data("c".utf8).asyncWrite(to: path, options: [.append, .skipSync])
        #expect(try await Data(asyncContentsOf: path) == Data("abc".utf8))
        // A device has nothing to fsync (fsync fails with EINVAL there): still a success.
        try await Data("d".utf8).asyncWrite(to: FilePath("/dev/null"), options: [.append])
    }

    @Test("writing into a missing directory names the path and ENOENT")
    func missingDirectory() async throws {
        let directory = TemporaryDirectory("nodir")
        let path = directory.file("no/such/dir/file")
        let error = await #expect(throws: FileCoordinationError.self) { try await Data("x".utf8).asyncWrite(to: path) }
        #expect(error?.code == .notFound)
        #expect(error?.path == path)
    }

    @Test("empty files read as empty Data")
    func empty() async throws {
        let directory = TemporaryDirectory("empty")
        let path = try directory.make("e", Data())
        #expect(try await Data(asyncContentsOf: path).isEmpty)
        #expect(try await Data(asyncContentsOf: path, engine: .dispatchIO).isEmpty)
    }

    @Test("a file larger than maximumSize is fileTooLarge")
    func maximumSize() async throws {
        let directory = TemporaryDirectory("max")
        let path = try directory.make("f", pattern(5000))
        let error = await #expect(throws: FileCoordinationError.self) { try await Data(asyncContentsOf: path, maximumSize: 4999) }
        #expect(error?.code == .fileTooLarge)
        #expect(try await Data(asyncContentsOf: path, maximumSize: 5000).count == 5000)
    }

    @Test("a concurrent reader sees the old or the new content, never a mixture")
    func readerNeverSeesTornFile() async throws {
        let directory = TemporaryDirectory("torn")
        let old = Data(repeating: 0x61, count: 1 << 20)
        let new = Data(repeating: 0x62, count: 1 << 20)
        let path = directory.file("doc")
        try await old.asyncWrite(to: path)
        let reader = Task {
            var reads = 0
            while !Task.isCancelled {
                let data: Data
                do {
                    data = try await Data(asyncContentsOf: path)
                } catch is CancellationError {
                    break // cancelled mid-read: the test is over
                }
                #expect(data == old || data == new)
                reads += 1
            }
            return reads
        }
        for round in 0 ..< 40 {
            try await (round.isMultiple(of: 2) ? new : old).asyncWrite(to: path, options: [.atomic, .skipSync])
        }
        reader.cancel()
        #expect(try await reader.value > 0)
    }
}
