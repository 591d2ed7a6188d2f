import Foundation
import SystemPackage
import Testing
import TestSupport
@testable import AsyncFileIO

@Suite("RandomAccessFile")
struct RandomAccessFileTests {
    @Test("concurrent range reads return exactly their bytes", arguments: [FileIOEngine.threadPool, .dispatchIO])
    func concurrentRanges(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("ranges")
        let content = pattern(2 << 20, seed: 9)
        let path = try directory.make("big", content)
        let file = try await RandomAccessFile(path: path, engine: engine)
        #expect(file.size == Int64(content.count))
        try await withThrowingTaskGroup(of: Void.self) { group in
            for task in 0 ..< 32 {
                group.addTask {
                    var generator = SystemRandomNumberGenerator()
                    for _ in 0 ..< 50 {
                        let start = Int.random(in: 0 ..< content.count, using: &generator)
                        let length = Int.random(in: 0 ... 70_000, using: &generator)
                        let range = start ..< min(content.count, start + length)
                        let data = try await file.read(byteRange: range)
                        #expect(data == content[range], "task \(task) range \(range)")
                    }
                }
            }
            try await group.waitForAll()
        }
        try await file.close()
    }

    @Test("a range reaching far past the end (2 ..< Int64.max) returns the bytes up to the end, on either engine", arguments: [FileIOEngine.threadPool, .dispatchIO])
    func rangeToTheEndOfInt64(engine: FileIOEngine) async throws {
        let directory = TemporaryDirectory("far")
        let content = pattern(10)
        let file = try await RandomAccessFile(path: try directory.make("f", content), engine: engine)
        #expect(try await file.read(byteRange: 2 ..< Int64.max) == content[2...])
        try await file.close()
    }

    @Test("a file that grew by far more than 64 KiB since it was opened: a range past its first size returns what it holds now")
    func grownSinceOpened() async throws {
        let directory = TemporaryDirectory("grown")
        let path = try directory.make("f", pattern(100))
        let file = try await RandomAccessFile(path: path)
        let grown = pattern(3 << 20, seed: 5)
        try writeFixture(grown, toPath: path.string)
        let tail = try await file.read(byteRange: 1 << 20 ..< Int64.max)
        // Compared here: a failing expectation would print both megabytes.
        let same = tail == grown[(1 << 20)...]
        #expect(same, "\(tail.count) bytes read, \(grown.count - (1 << 20)) expected")
        try await file.close()
    }

    @Test("ranges past the end are short or empty; negative ones are refused")
    func bounds() async throws {
        let directory = TemporaryDirectory("bounds")
        let path = try directory.make("f", pattern(100))
        let file = try await RandomAccessFile(path: path)
        #expect(try await file.read(byteRange: 90 ..< 200).count == 10)
        #expect(try await file.read(byteRange: 500 ..< 600).isEmpty)
        #expect(try await file.read(byteRange: 10 ..< 10).isEmpty)
        let error = await #expect(throws: FileCoordinationError.self) {
            try await file.read(byteRange: Int64(-5) ..< 5)
        }
        #expect(error?.code == .invalidArgument)
        try await file.close()
        let closed = await #expect(throws: FileCoordinationError.self) { try await file.read(byteRange: 0 ..< 5) }
        #expect(closed?.code == .closed)
    }

    @Test("offsets beyond 4 GiB in a multi-GB (sparse) file")
    func beyondFourGiB() async throws {
        let directory = TemporaryDirectory("sparse")
        let path = directory.file("huge")
        let size: Int64 = 6 << 30
        let marker = Data("marker at 5 GiB".utf8)
        let fd = open(path.string, O_CREAT | O_WRONLY, 0o600)
        #expect(fd >= 0)
        #expect(ftruncate(fd, off_t(size)) == 0)
        let offset: Int64 = 5 << 30
        _ = marker.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
        close(fd)

        let file = try await RandomAccessFile(path: path)
        #expect(file.size == size)
        #expect(try await file.read(byteRange: offset ..< offset + Int64(marker.count)) == marker)
        #expect(try await file.read(byteRange: size - 8 ..< size) == Data(count: 8))
        #expect(try await file.read(byteRange: Int64(3) << 30 ..< (Int64(3) << 30) + 4096) == Data(count: 4096))
        try await file.close()
    }

    @Test("reads still running when close() is called finish first; no descriptor leaks")
    func closeWhileReading() async throws {
        let directory = TemporaryDirectory("closing")
        let content = pattern(1 << 20)
        let path = try directory.make("f", content)
        let file = try await RandomAccessFile(path: path)
        let readers = (0 ..< 8).map { index in
            Task { try? await file.read(byteRange: index * 1000 ..< index * 1000 + 65536) }
        }
        try await file.close()
        for reader in readers {
            if let data = await reader.value {
                #expect(data.count == 65536)
            }
        }
        #expect(openDescriptors(under: directory.path) == 0)
    }
}
