import Foundation
import SystemPackage
import Testing
import TestSupport
@testable import AsyncFileIO

@Suite("AsyncFileStream")
struct AsyncFileStreamTests {
    static let engines: [FileIOEngine] = [.threadPool, .dispatchIO]

    @Test("write then read round-trips", arguments: engines, [0, 1, 4095, 65536, 3 * 1024 * 1024 + 17])
    func roundTrip(engine: FileIOEngine, size: Int) async throws {
        let directory = TemporaryDirectory("stream")
        let path = directory.file("data.bin")
        let content = pattern(size, seed: UInt64(size))

        let output = try await path.openForWriting(engine: engine)
        // Written in uneven pieces, to exercise the position bookkeeping.
        var offset = 0
        var piece = 1000
        while offset < content.count {
            let end = min(content.count, offset + piece)
            try await output.write(content[offset ..< end])
            offset = end
            piece = piece * 3 + 7
        }
        try await output.close()

        let input = try await path.openForReading(engine: engine)
        #expect(try await input.readToEnd() == content)
        #expect(try await input.read(upToCount: 10).isEmpty, "at the end, reads return nothing")
        try await input.close()

        let chunked = try await path.openForReading(engine: engine)
        var reassembled = Data()
        var chunks = 0
        for try await chunk in chunked.chunks(ofSize: 64 * 1024) {
            #expect(chunk.count <= 64 * 1024)
            reassembled += chunk
            chunks += 1
        }
        try await chunked.close()
        #expect(reassembled == content)
        #expect(chunks == (size + 65535) / 65536)
    }

    @Test("read(upToCount:) returns exactly the next bytes", arguments: engines)
    func sequentialReads(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("seq")
        let content = pattern(10_000)
        let path = try directory.make("f", content)
        let input = try await path.openForReading(engine: engine)
        #expect(try await input.read(upToCount: 3) == content[0 ..< 3])
        #expect(try await input.read(upToCount: 4000) == content[3 ..< 4003])
        #expect(try await input.read(upToCount: 1 << 30) == content[4003...], "a huge count reads the rest, not the count")
        #expect(try await input.read(upToCount: 1).isEmpty)
        try await input.close()
    }

    @Test("names with newlines, spaces and bytes that are not UTF-8")
    func oddNames() async throws {
        let directory = TemporaryDirectory("names")
        var bytes = Array(directory.path.string.utf8) + Array("/bad-\u{1}-".utf8) + [0xFF, 0xFE, 0x0A, 0x20] + Array("x.txt".utf8)
        bytes.append(0)
        let path = bytes.withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { FilePath(platformString: $0.baseAddress!) }
        }
        try await Data("odd".utf8).asyncWrite(to: path)
        #expect(try await Data(asyncContentsOf: path) == Data("odd".utf8))
        // Through a URL and back, the bytes survive.
        let viaURL = try FilePath(fileURL: path.fileURL)
        #expect(viaURL == path)
        #expect(try await Data(asyncContentsOf: path.fileURL) == Data("odd".utf8))
        // URLs made by Foundation (spaces escaped, directory slash) convert too.
        #expect(try FilePath(fileURL: URL(fileURLWithPath: "/tmp/a b/c")) == "/tmp/a b/c")
        #expect(try FilePath(fileURL: URL(fileURLWithPath: "/tmp/dir", isDirectory: true)) == "/tmp/dir")
        #expect(try FilePath(fileURL: URL(fileURLWithPath: "/", isDirectory: true)) == "/")
        // An escaped slash stays escaped, as Foundation opens it (a name holds no slash):
        // `a%2Fb` is the file of that name, not `b` inside `a`.
        let escapedSlash = try #require(URL(string: "file:///d/a%2Fb%2fc%41%00"))
        #expect(try FilePath(fileURL: escapedSlash) == FilePath(escapedSlash.path))
        #expect(try FilePath(fileURL: escapedSlash) == "/d/a%2Fb%2fcA%00")
        let newline = directory.file("line\nbreak")
        try await Data("nl".utf8).asyncWrite(to: newline)
        #expect(try await Data(asyncContentsOf: newline) == Data("nl".utf8))
    }

    @Test("an atomic write of a file whose name is as long as a name may be (255 bytes), new and replaced, with both engines",
          arguments: engines)
    func longestName(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("long-names")
        for name in [String(repeating: "n", count: 255), String(repeating: "é", count: 127) + "x"] {
            let path = directory.file(name)
            try await Data("first".utf8).asyncWrite(to: path, engine: engine)
            try await Data("second".utf8).asyncWrite(to: path, engine: engine)
            #expect(try await Data(asyncContentsOf: path) == Data("second".utf8))
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path.string).count == 2, "no temporary left behind")
    }

    @Test("a relative path's URL names the file under the current directory")
    func relativePathURL() async throws {
        let directory = TemporaryDirectory("relative")
        let file = directory.file("r.txt")
        try await Data("rel".utf8).asyncWrite(to: file)
        let current = FilePath(FileManager.default.currentDirectoryPath)
        let up = String(repeating: "../", count: current.components.count)
        let relative = FilePath(up + file.string.dropFirst())
        #expect(!relative.isAbsolute)
        let url = relative.fileURL
        // Not "file://../…", whose first component would be taken for a host.
        #expect(url.host(percentEncoded: true) ?? "" == "")
        #expect(url.path == current.string + "/" + relative.string)
        #expect(try FilePath(fileURL: url) == current.pushing(relative))
        #expect(try await Data(asyncContentsOf: url) == Data("rel".utf8))
    }

    @Test("a missing file is notFound, naming the path")
    func missing() async throws {
        let directory = TemporaryDirectory("missing")
        let path = directory.file("nope")
        let error = await #expect(throws: FileCoordinationError.self) { _ = try await path.openForReading() }
        #expect(error?.code == .notFound)
        #expect(error?.errno == .noSuchFileOrDirectory)
        #expect(error?.path == path)
        #expect(error?.description == "\(path): open failed: No such file or directory (ENOENT)")
    }

    @Test("a directory is refused with isDirectory")
    func directory() async throws {
        let directory = TemporaryDirectory("dir")
        let error = await #expect(throws: FileCoordinationError.self) { _ = try await directory.path.openForReading() }
        #expect(error?.code == .isDirectory)
        let writeError = await #expect(throws: FileCoordinationError.self) { _ = try await directory.path.openForWriting() }
        #expect(writeError?.code == .isDirectory)
    }

    @Test("a FIFO is refused at once, for reading and for writing, never waited on")
    func fifo() async throws {
        let directory = TemporaryDirectory("fifo")
        let path = directory.file("pipe")
        try makeFIFO(path)
        let error = await #expect(throws: FileCoordinationError.self) { _ = try await path.openForReading() }
        #expect(error?.code == .unsupportedFileType)
        #expect(error?.message.contains("FIFO") == true)
        let writeError = await #expect(throws: FileCoordinationError.self) { _ = try await path.openForWriting() }
        #expect(writeError?.code == .unsupportedFileType)
        let dataError = await #expect(throws: FileCoordinationError.self) { try await Data(asyncContentsOf: path) }
        #expect(dataError?.code == .unsupportedFileType)
    }

    @Test("a file without read permission is permissionDenied", .enabled(if: !isRoot, "root bypasses mode bits; the CLI tests cover this with setpriv"))
    func denied() async throws {
        let directory = TemporaryDirectory("denied")
        let path = try directory.make("secret", Data("s".utf8))
        chmod(path.string, 0)
        let error = await #expect(throws: FileCoordinationError.self) { _ = try await path.openForReading() }
        #expect(error?.code == .permissionDenied)
        #expect(error?.errno == .permissionDenied)
    }

    @Test("a URL that is not a file URL is notFileURL")
    func notFileURL() async throws {
        let error = await #expect(throws: FileCoordinationError.self) {
            _ = try await URL(string: "https://example.com/a")!.openForReading()
        }
        #expect(error?.code == .notFileURL)
    }

    @Test("/dev/zero reads a bounded count, and readToEnd fails at its bound", arguments: engines)
    func devZero(engine: FileIOEngine) async throws {
        let zero = try await FilePath("/dev/zero").openForReading(engine: engine)
        let block = try await zero.read(upToCount: 4096)
        #expect(block == Data(count: 4096))
        let error = await #expect(throws: FileCoordinationError.self) { try await zero.readToEnd(maximumSize: 1 << 20) }
        #expect(error?.code == .fileTooLarge)
        try await zero.close()
        let whole = await #expect(throws: FileCoordinationError.self) {
            try await Data(asyncContentsOf: FilePath("/dev/zero"), maximumSize: 100_000, engine: engine)
        }
        #expect(whole?.code == .fileTooLarge)
    }

    @Test("pseudo-files that report size 0 are read to their end")
    func procFile() async throws {
        let status = try await Data(asyncContentsOf: FilePath("/proc/self/status"))
        #expect(String(decoding: status, as: UTF8.self).contains("Pid:"))
        let stream = try await FilePath("/proc/self/status").openForReading()
        #expect(String(decoding: try await stream.readToEnd(), as: UTF8.self).contains("Pid:"))
        try await stream.close()
    }

    @Test("appending adds to the end", arguments: engines)
    func append(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("append")
        let path = try directory.make("log", Data("one\n".utf8))
        let output = try await path.openForWriting(options: .append, engine: engine)
        try await output.write(Data("two\n".utf8))
        try await output.write(Array("three\n".utf8))
        try await output.close()
        #expect(try await Data(asyncContentsOf: path) == Data("one\ntwo\nthree\n".utf8))
    }

    @Test("an atomic stream publishes on close and discards when dropped", arguments: engines)
    func atomicStream(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("atomic")
        let path = try directory.make("doc", Data("old".utf8))
        do {
            let output = try await path.openForWriting(options: .atomic, engine: engine)
            try await output.write(Data("new but abandoned".utf8))
            #expect(try await Data(asyncContentsOf: path) == Data("old".utf8), "nothing is visible before close")
            _ = consume output
        }
        #expect(try await Data(asyncContentsOf: path) == Data("old".utf8))
        let output = try await path.openForWriting(options: .atomic, engine: engine)
        try await output.write(Data("new".utf8))
        try await output.close()
        #expect(try await Data(asyncContentsOf: path) == Data("new".utf8))
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path.string) == ["doc"], "no temporary left behind")
        let both = await #expect(throws: FileCoordinationError.self) { _ = try await path.openForWriting(options: [.atomic, .append]) }
        #expect(both?.code == .invalidArgument)
    }

    @Test("an atomic stream whose write failed (its task cancelled) is not published by close, which throws; the target keeps its content")
    func atomicStreamAfterFailedWrite() async throws {
        let directory = TemporaryDirectory("atomic-failed")
        let path = try directory.make("doc", Data("old".utf8))
        // The thread-pool engine's close does not look at the task's cancellation, so
        // nothing but the failed write keeps it from publishing.
        let (failed, closed) = await Task { () -> (Bool, String?) in
            guard let output = try? await path.openForWriting(options: .atomic, engine: .threadPool),
                  (try? await output.write(Data("first half, ".utf8))) != nil
            else { return (false, "not opened") }
            withUnsafeCurrentTask { $0?.cancel() }
            let failed = (try? await output.write(Data("second half".utf8))) == nil
            do {
                try await output.close()
                return (failed, nil)
            } catch {
                return (failed, "\(error)")
            }
        }.value
        #expect(failed, "the write of a cancelled task did not throw")
        #expect(closed?.contains("earlier write") == true, "\(closed ?? "closed without an error")")
        #expect(try await Data(asyncContentsOf: path) == Data("old".utf8), "half a write was published")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path.string) == ["doc"], "no temporary left behind")
    }

    @Test("dropping an open stream closes its descriptor", arguments: engines)
    func deinitCloses(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("leak")
        let path = try directory.make("f", pattern(100))
        for _ in 0 ..< 20 {
            let stream = try await path.openForReading(engine: engine)
            _ = try await stream.read(upToCount: 10)
            // dropped here without close()
        }
        await waitUntil { openDescriptors(under: directory.path) == 0 }
        #expect(openDescriptors(under: directory.path) == 0)
    }

    @Test("a chunk sequence outliving its stream fails with closed instead of reading a reused descriptor")
    func chunksAfterClose() async throws {
        let directory = TemporaryDirectory("closed")
        let path = try directory.make("f", pattern(1000))
        let stream = try await path.openForReading()
        let chunks = stream.chunks(ofSize: 10)
        try await stream.close()
        var iterator = chunks.makeAsyncIterator()
        let error = await #expect(throws: FileCoordinationError.self) { _ = try await iterator.next() }
        #expect(error?.code == .closed)
    }
}

/// Waits for a condition that settles asynchronously (descriptors closed by a `deinit`
/// hand-off to the I/O threads). Polls with a bound: the event it waits for is a
/// close(2) on another thread, which has no notification to await.
func waitUntil(timeout: Duration = .seconds(5), _ condition: () -> Bool) async {
    let deadline = ContinuousClock.now + timeout
    while !condition() && ContinuousClock.now < deadline {
        await Task.yield()
        try? await Task.sleep(for: .milliseconds(1)) // ok: polling a condition with no event
    }
}
