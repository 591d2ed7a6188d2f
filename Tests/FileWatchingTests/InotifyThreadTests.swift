import CInotifyTools
import Foundation
import SystemPackage
import Testing
@testable import FileWatching

@Suite("The inotify watcher thread")
struct InotifyThreadTests {
    struct Seen: Sendable {
        var name: [UInt8]
        var mask: UInt32
        var thread: String
    }

    @Test("an event arrives on the dedicated watcher thread, and removing the watch releases it")
    func eventArrivesOnWatcherThread() async throws {
        let directory = FilePath(NSTemporaryDirectory()).appending("filecoord-inotify-\(getpid())-\(UInt32.random(in: 0 ... .max))")
        try FileManager.default.createDirectory(atPath: directory.string, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory.string) }

        let watcher = InotifyThread.shared
        let events = AsyncStream.makeStream(of: Seen.self)
        let watch = try await watcher.addWatch(directory, mask: UInt32(IN_CREATE | IN_CLOSE_WRITE)) { event in
            events.continuation.yield(Seen(name: event.name, mask: event.mask, thread: threadName()))
        }
        #expect(await watcher.isWatching(watch.wd))

        let fd = open(directory.appending("hello").string, O_CREAT | O_WRONLY, 0o600)
        #expect(fd >= 0)
        close(fd)
        var iterator = events.stream.makeAsyncIterator()
        let first = try #require(await iterator.next())
        #expect(first.name == Array("hello".utf8))
        #expect(first.mask & UInt32(IN_CREATE) != 0)
        #expect(first.thread == InotifyThread.threadName, "events are read on the watcher thread, not the cooperative pool")

        await watcher.removeWatch(watch)
        // Other tests add and remove watches meanwhile: check this one, not the total.
        #expect(await !watcher.isWatching(watch.wd))
    }

    @Test("watching a missing path names it and ENOENT")
    func missingPath() async throws {
        let missing = FilePath("/nonexistent-\(UInt32.random(in: 0 ... .max))")
        await #expect(throws: Error.self) {
            _ = try await InotifyThread.shared.addWatch(missing, mask: UInt32(IN_MODIFY)) { _ in }
        }
        do {
            _ = try await InotifyThread.shared.addWatch(missing, mask: UInt32(IN_MODIFY)) { _ in }
        } catch let error as FileCoordinationError {
            #expect(error.code == .notFound)
            #expect(error.path == missing)
        }
    }
}

import AsyncFileIO
import CFileCoordinationShims

func threadName() -> String {
    var buffer = [CChar](repeating: 0, count: 32)
    _ = fc_get_thread_name(&buffer, buffer.count)
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
