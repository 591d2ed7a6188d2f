import Foundation
import Synchronization
import SystemCalls
import SystemPackage
import Testing
import AsyncFileIO
@testable import FileCoordination
import TestSupport

/// A coordinator with a private center, so counts of waiting claims are this test's own.
func privateCoordinator(_ center: CoordinationCenter, purpose: String? = nil) -> FileCoordinator {
    FileCoordinator(filePresenter: nil, purposeIdentifier: purpose, center: center)
}

/// A batch file's content as text, or its error's code.
func outcome(_ result: Result<some Collection<UInt8>, FileCoordinationError>) -> String {
    switch result {
    case .success(let bytes): String(decoding: bytes, as: UTF8.self)
    case .failure(let error): "\(error.code)"
    }
}

@Suite("FileCoordinator behaviour")
struct CoordinatorBehaviorTests {
    @Test("a writer waits for the reader; the reader's accessor ends before the writer's starts")
    func exclusion() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("shared.txt")
        let log = EventLog()
        let readerIn = Gate(), releaseReader = Gate()
        let reader = Task {
            try await privateCoordinator(center).coordinate(readingItemAt: file) { _ in
                log.append("read begins")
                readerIn.open()
                await releaseReader.wait()
                log.append("read ends")
            }
        }
        await readerIn.wait()
        let writer = Task {
            try await privateCoordinator(center).coordinate(writingItemAt: file) { _ in log.append("write") }
        }
        await center.waitUntilWaiting(1)
        #expect(log.all == ["read begins"], "the writer has not run")
        releaseReader.open()
        try await reader.value
        try await writer.value
        #expect(log.all == ["read begins", "read ends", "write"])
        #expect(center.counts == (0, 0))
    }

    @Test("coordinators made without a purpose each have a purpose of their own, also when made from many tasks at once")
    func defaultPurposesAreUnique() async {
        let purposes = await withTaskGroup(of: [String].self) { group in
            for _ in 0 ..< 8 {
                group.addTask { (0 ..< 1_000).map { _ in FileCoordinator().purposeIdentifier } }
            }
            return await group.reduce([]) { $0 + $1 }
        }
        #expect(Set(purposes).count == 8_000)
    }

    @Test("a file replaced by a symbolic link right after coordinations of it: the next coordination through its name claims the link's target",
          .serialized, arguments: [false, true])
    func fileBecomesLink(directoryMadeAgain: Bool) async throws {
        let center = CoordinationCenter(), box = Sandbox()
        // Several names, each read while its target is held, replaced by a link and
        // written at once: the last resolution is the one a coordination of the same
        // name reuses. Read once, twice, three times, then until the name is checked in
        // its directory as resolved (a resolution reused often; tests running meanwhile
        // may resolve other items, hence "until"). `directoryMadeAgain`: the item's
        // directory is removed and made again, with the link in it.
        for index in 0 ..< 5 {
            let target = box.file("target\(index)"), item = box.file("folder\(index)/item")
            let holderIn = Gate(), releaseHolder = Gate()
            let holder = Task {
                try await privateCoordinator(center).coordinate(writingItemAt: target) { _ in
                    holderIn.open()
                    await releaseHolder.wait()
                }
            }
            await holderIn.wait()
            let lexical = try FileCoordinator.normalizedPath(item)
            var reads = 0
            repeat {
                try await privateCoordinator(center).coordinate(readingItemAt: item) { _ in }
                reads += 1
            } while index < 3 ? reads <= index : !CanonicalPaths.isProbing(lexical) && reads < 1000
            try FileManager.default.removeItem(at: item)
            if directoryMadeAgain {
                try FileManager.default.removeItem(at: item.deletingLastPathComponent())
                try FileManager.default.createDirectory(at: item.deletingLastPathComponent(), withIntermediateDirectories: false)
            }
            try FileManager.default.createSymbolicLink(at: item, withDestinationURL: target)
            // A try-lock (no waiting): through the link, the target's writer is in the way.
            let writer = privateCoordinator(center)
            writer.setClaimTimeout(.zero)
            await #expect(throws: FileCoordinationError.self, "the write through the link did not meet its target's writer") {
                try await writer.coordinate(writingItemAt: item) { _ in }
            }
            releaseHolder.open()
            try await holder.value
            try await writer.coordinate(writingItemAt: item) { _ in }
        }
    }

    @Test("files of a batch's group in several directories, one reached through a link, resolve as each does alone")
    func groupResolvesEachDirectory() throws {
        let box = Sandbox()
        for name in ["dir/a", "dir/b", "dir2/a", "dir2/b"] { box.file(name) }
        // `dlnk` has the length of `dir2`: a group must compare directories, not lengths.
        try FileManager.default.createSymbolicLink(atPath: box.url.path + "/dlnk", withDestinationPath: "dir")
        let names = ["dir/a", "dir2/a", "dlnk/a", "dlnk/b", "dir2/b", "dir/b", "dlnk/missing", "dir2/a"]
        var memo = CanonicalPaths.DirectoryMemo()
        for name in names {
            let path = FileCoordinator.normalizedBytes(PlatformPath(FilePath(box.url.path + "/" + name)))
            let alone = String(decoding: CanonicalPaths.canonicalNow(path, followingLast: false), as: UTF8.self)
            #expect(String(decoding: CanonicalPaths.canonicalNameNow(path, memo: &memo), as: UTF8.self) == alone, "\(name)")
            #expect(alone.hasSuffix("/" + name.replacingOccurrences(of: "dlnk/", with: "dir/")), "\(name)")
        }
        // Two items in `/` in a row: the directory remembered is `/` itself (no bytes).
        for name in ["/filecoord-none-\(getpid())-a", "/filecoord-none-\(getpid())-b"] {
            #expect(CanonicalPaths.canonicalNameNow(Array(name.utf8), memo: &memo) == Array(name.utf8))
        }
    }

    @Test("a name resolves without a system call only where its directory's resolution is known, and then as it does with one")
    func nameResolvesFromWhatIsKnown() throws {
        let box = Sandbox()
        for name in ["dir/a", "dir/b", "other/a"] { box.file(name) }
        try FileManager.default.createSymbolicLink(atPath: box.url.path + "/dlnk", withDestinationPath: "dir")
        func bytes(_ name: String) -> [UInt8] { FileCoordinator.normalizedBytes(PlatformPath(FilePath(box.url.path + "/" + name))) }
        // Nothing looked up in this sandbox yet: not known, and no memo kept.
        var memo = CanonicalPaths.DirectoryMemo()
        #expect(CanonicalPaths.canonicalNameIfKnown(bytes("dlnk/a"), memo: &memo) == nil)
        #expect(CanonicalPaths.canonicalNameIfKnown(bytes("dlnk/b"), memo: &memo) == nil)
        // Looked up once (as a worker does), then known, through the link too.
        var workers = CanonicalPaths.DirectoryMemo()
        let resolved = CanonicalPaths.canonicalNameNow(bytes("dlnk/a"), memo: &workers)
        #expect(String(decoding: resolved, as: UTF8.self).hasSuffix("/dir/a"))
        #expect(CanonicalPaths.canonicalNameIfKnown(bytes("dlnk/a"), memo: &memo) == resolved)
        #expect(CanonicalPaths.canonicalNameIfKnown(bytes("dlnk/b"), memo: &memo)
            == CanonicalPaths.canonicalNow(bytes("dlnk/b"), followingLast: false))
        #expect(CanonicalPaths.canonicalNameIfKnown(bytes("other/a"), memo: &memo) == nil)
    }

    @Test("`..` after a linked directory leads where the kernel goes (the parent of the link's target), in every resolution, also through a link's target, under a directory not made yet and through a link to one; `.` and extra separators go")
    func parentStepsResolveAsTheKernelDoes() async throws {
        let cases = [("sublink/../f", "/real/f"), ("sublink/./../f", "/real/f"), ("sublink//..//f", "/real/f"),
                     ("sublink/..", "/real"), ("sublink/../sub/./g", "/real/sub/g"), ("./real/../f", "/f"),
                     ("missing/../f", "/f"), ("missing/..", ""),
                     // A link to a directory not made yet: where the kernel will go once it is.
                     ("dangling/f", "/made/later/f"), ("dangling/../f", "/made/f"), ("dangling/g/h", "/made/later/g/h")]
        // Each form of resolution in a sandbox of its own, so that each resolves the
        // directories itself (they share one cache).
        for form in ["async", "now", "name"] {
            let box = Sandbox()
            box.file("real/sub/g")
            box.file("real/f")
            box.file("f")
            try FileManager.default.createSymbolicLink(atPath: box.url.path + "/sublink", withDestinationPath: "real/sub")
            try FileManager.default.createSymbolicLink(atPath: box.url.path + "/dangling", withDestinationPath: "made/later")
            // A link into itself, and two into each other: no answer, but an end.
            try FileManager.default.createSymbolicLink(atPath: box.url.path + "/inward", withDestinationPath: "inward/sub")
            try FileManager.default.createSymbolicLink(atPath: box.url.path + "/ping", withDestinationPath: "pong/x")
            try FileManager.default.createSymbolicLink(atPath: box.url.path + "/pong", withDestinationPath: "ping/y")
            let base = try await offThePool { CanonicalPaths.canonicalNow(FilePath(box.url.path), followingLast: true).string }
            #expect(FileManager.default.contents(atPath: box.url.path + "/sublink/../f") == FileManager.default.contents(atPath: box.url.path + "/real/f"))
            for (name, expected) in cases {
                let given = FilePath(box.url.path + "/" + name)
                let resolved: String
                switch form {
                case "async": resolved = await CanonicalPaths.canonical(FileCoordinator.normalized(given), followingLast: false).string
                case "now": resolved = try await offThePool { CanonicalPaths.canonicalNow(FileCoordinator.normalized(given), followingLast: true).string }
                default:
                    resolved = try await offThePool {
                        var memo = CanonicalPaths.DirectoryMemo()
                        return String(decoding: CanonicalPaths.canonicalNameNow(FileCoordinator.normalizedBytes(PlatformPath(given)), memo: &memo), as: UTF8.self)
                    }
                }
                #expect(resolved == base + expected, "\(form): \(name)")
            }
            for name in ["inward/f", "ping/f", "inward/../f"] {
                _ = await CanonicalPaths.canonical(FileCoordinator.normalized(FilePath(box.url.path + "/" + name)), followingLast: true)
            }
            // A link whose target goes through the linked directory and up.
            try FileManager.default.createSymbolicLink(atPath: box.url.path + "/up", withDestinationPath: "sublink/../f")
            let up = FileCoordinator.normalized(FilePath(box.url.path + "/up"))
            #expect(await CanonicalPaths.canonical(up, followingLast: true).string == base + "/real/f", "\(form): a link through `..`")
        }
        #expect(FilePath("/a/./b//c/../d/").normalizedKeepingParents() == FilePath("/a/b/c/../d"))
        #expect(FilePath("/../../a/..").normalizedKeepingParents() == FilePath("/a/.."))
        #expect(FilePath("./../a/.").normalizedKeepingParents() == FilePath("../a"))
        #expect(CanonicalPaths.canonicalNow(FilePath("/.."), followingLast: true) == FilePath("/"))
    }

    @Test("the coordinated batch's gate, asked without blocking: not known before its directory is looked up, refused while a writer holds a file of the group, admitted when free, and its claim holds off a writer until it leaves")
    func claimGateWithoutBlocking() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let files = (0 ..< 4).map { box.file("group/f\($0)") }
        let group = files.enumerated().map { (index: $0.offset, path: PlatformPath(FilePath($0.element.path))) }
        // As the batch makes it: the space joined (when the process coordinates across
        // processes) and every claim shard open.
        try await center.prepareSpace()
        let everyShard = try await center.transport?.prepareForBatch() ?? true
        let gate = ClaimGate(center: center, purpose: "test", openingShards: !everyShard,
                             admitsWithoutBlocking: everyShard && center.transport?.takesClaimsForBatch != false)
        try #require(gate.admitsWithoutBlocking)
        // A new directory: nothing remembered, so no answer without a `realpath`.
        guard case .notKnownYet = gate.enterWithoutBlocking(group) else { Issue.record("answered before the directory was looked up"); return }
        // A worker's question looks it up.
        let workers = try #require(try await offThePool { gate.enter(group) })
        gate.leave(workers)
        // The directory's resolution is trusted for a second, and a busy machine may take
        // longer between two steps: looked up again right before each question.
        func askWithoutBlocking() async throws -> GateAdmission {
            try await offThePool {
                var memo = CanonicalPaths.DirectoryMemo()
                _ = CanonicalPaths.canonicalNameNow(FileCoordinator.normalizedBytes(group[0].path), memo: &memo)
                return gate.enterWithoutBlocking(group)
            }
        }
        // A writer inside file 2: the group is refused.
        let writing = Gate(), done = Gate()
        let writer = Task {
            try await privateCoordinator(center).coordinate(writingItemAt: files[2]) { _ in
                writing.open()
                await done.wait()
            }
        }
        await writing.wait()
        let held = try await askWithoutBlocking()
        guard case .refused = held else { Issue.record("\(held) while a writer held file 2"); return }
        done.open()
        try await writer.value
        // Free: admitted, and a writer of file 0 waits until the group leaves.
        let answer = try await askWithoutBlocking()
        guard case .admitted(let token) = answer else { Issue.record("a free group not admitted: \(answer)"); return }
        let left = Locked(false)
        let second = Task {
            try await privateCoordinator(center).coordinate(writingItemAt: files[0]) { _ in
                #expect(left.withLock { $0 }, "a writer got in while the group was admitted")
            }
        }
        // The writer is queued behind the group's claim before it leaves.
        await center.waitUntilWaiting(1)
        left.withLock { $0 = true }
        gate.leave(token)
        try await second.value
        // Not for a gate that may not claim without blocking (etcd, few descriptors).
        let closed = ClaimGate(center: center, purpose: "test", openingShards: false, admitsWithoutBlocking: false)
        guard case .refused = closed.enterWithoutBlocking(group) else { Issue.record("a gate that may not claim without blocking admitted"); return }
    }

    @Test("64 concurrent readers of one item are all inside at once")
    func readersShare() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("popular.txt")
        let inside = Locked(0)
        let (allIn, allInContinuation) = AsyncStream.makeStream(of: Void.self)
        let everyoneArrived = Gate()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0 ..< 64 {
                group.addTask {
                    try await privateCoordinator(center).coordinate(readingItemAt: file) { _ in
                        if inside.withLock({ $0 += 1; return $0 }) == 64 { allInContinuation.yield() }
                        // Each reader stays until all 64 hold the claim at the same time:
                        // serialized readers would never get here (the time limit fails it).
                        await everyoneArrived.wait()
                    }
                }
            }
            for await _ in allIn { break }
            everyoneArrived.open()
            try await group.waitForAll()
        }
        #expect(inside.withLock { $0 } == 64)
    }

    @Test("cancelling a task waiting for its claim ends it with CancellationError; its accessor never runs")
    func cancelWhileWaiting() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("c.txt")
        let holderIn = Gate(), releaseHolder = Gate()
        let ran = Locked(false)
        let holder = Task {
            try await privateCoordinator(center).coordinate(writingItemAt: file) { _ in holderIn.open(); await releaseHolder.wait() }
        }
        await holderIn.wait()
        let waiter = Task {
            try await privateCoordinator(center).coordinate(readingItemAt: file) { _ in ran.withLock { $0 = true } }
        }
        await center.waitUntilWaiting(1)
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        #expect(center.counts.waiting == 0)
        releaseHolder.open()
        try await holder.value
        #expect(!ran.withLock { $0 })
        #expect(center.counts == (0, 0))
    }

    @Test("a task cancelled before it coordinates never takes the claim")
    func cancelledBefore() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("c.txt")
        let go = Gate()
        let ran = Locked(false)
        let task = Task {
            await go.wait()
            try await privateCoordinator(center).coordinate(writingItemAt: file) { _ in ran.withLock { $0 = true } }
        }
        task.cancel()
        go.open()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(!ran.withLock { $0 })
        #expect(center.counts == (0, 0))
    }

    @Test("cancel() ends the coordinator's waiting coordinations with .cancelled")
    func coordinatorCancel() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("c.txt")
        let holderIn = Gate(), releaseHolder = Gate()
        let holder = Task {
            try await privateCoordinator(center).coordinate(writingItemAt: file) { _ in holderIn.open(); await releaseHolder.wait() }
        }
        await holderIn.wait()
        let coordinator = privateCoordinator(center)
        let waiter = Task { try await coordinator.coordinate(writingItemAt: file) { _ in } }
        await center.waitUntilWaiting(1)
        coordinator.cancel()
        let error = await #expect(throws: FileCoordinationError.self) { try await waiter.value }
        #expect(error?.code == .cancelled)
        releaseHolder.open()
        try await holder.value
    }

    @Test("cancel() while a coordination resolves its item's directory, new to the process, ends it with .cancelled before its accessor, also when the item is held (at once, not when it is let go)",
          .timeLimit(.minutes(1)), arguments: [false, true], [false, true])
    func cancelWhileResolving(pair: Bool, held: Bool) async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let folder = box.directory("unseen-\(pair)-\(held)")
        let file = folder.appendingPathComponent("c.txt")
        let holderIn = Gate(), releaseHolder = Gate()
        let holder = Task {
            guard held else { return }
            // A subtree claim (deleting the directory): it covers the item whatever it is.
            try await privateCoordinator(center).coordinate(writingItemAt: box.url, options: .forDeleting) { _ in
                holderIn.open()
                await releaseHolder.wait()
            }
        }
        if held { await holderIn.wait() }
        defer { releaseHolder.open() }
        let hold = Faults.hold(.realpath, whereNameContains: "unseen-\(pair)-\(held)")
        defer { hold.letGo() }
        let coordinator = privateCoordinator(center)
        let ran = Mutex(false)
        let coordination = Task {
            if pair {
                try await coordinator.coordinate(readingItemAt: box.url, writingItemAt: file) { _, _ in ran.withLock { $0 = true } }
            } else {
                try await coordinator.coordinate(writingItemAt: file) { _ in ran.withLock { $0 = true } }
            }
        }
        let reached = try await offThePool { hold.waitUntilReached(seconds: 30) }
        #expect(reached, "the resolution never reached realpath(3)")
        coordinator.cancel()
        hold.letGo()
        let error = await #expect(throws: FileCoordinationError.self) { try await coordination.value }
        #expect(error?.code == .cancelled)
        #expect(!ran.withLock { $0 })
        releaseHolder.open()
        try await holder.value
        #expect(center.counts == (0, 0))
    }

    @Test("a coordination waiting for an item that moves gets the new URL")
    func urlFollowsMove() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let folder = box.directory("before")
        box.file("before/note.txt", "hello")
        let after = box.url.appendingPathComponent("after")
        let moverIn = Gate(), moveNow = Gate()
        let mover = privateCoordinator(center)
        let moving = Task {
            try await mover.coordinate(writingItemAt: folder, options: .forMoving) { url in
                moverIn.open()
                await moveNow.wait()
                try FileManager.default.moveItem(at: url, to: after)
                await mover.item(at: url, didMoveTo: after)
            }
        }
        await moverIn.wait()
        let reading = Task {
            try await privateCoordinator(center).coordinate(readingItemAt: folder.appendingPathComponent("note.txt")) { url in
                (url.path, try String(contentsOf: url, encoding: .utf8))
            }
        }
        await center.waitUntilWaiting(1)
        moveNow.open()
        try await moving.value
        let (path, text) = try await reading.value
        #expect(path == after.appendingPathComponent("note.txt").path)
        #expect(text == "hello")
    }

    @Test("coordinators with the same purpose never block each other")
    func samePurpose() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("p.txt")
        try await privateCoordinator(center, purpose: "editor").coordinate(writingItemAt: file) { _ in
            // A second writer with the same purpose goes straight in (a deadlock otherwise).
            try await privateCoordinator(center, purpose: "editor").coordinate(writingItemAt: file) { _ in }
        }
    }

    @Test("a coordinator nesting a write in its own read of the item while another's writer waits for that read: the nested write goes in, then the waiting writer",
          .timeLimit(.minutes(1)))
    func nestedPassesWaitingWriter() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("p.txt")
        let log = EventLog()
        let coordinator = privateCoordinator(center)
        let readerIn = Gate(), nestNow = Gate()
        let outer = Task {
            try await coordinator.coordinate(readingItemAt: file) { _ in
                readerIn.open()
                await nestNow.wait()
                try await coordinator.coordinate(writingItemAt: file) { _ in log.append("nested write") }
                log.append("outer done")
            }
        }
        await readerIn.wait()
        let other = Task { try await privateCoordinator(center).coordinate(writingItemAt: file) { _ in log.append("other write") } }
        await center.waitUntilWaiting(1)
        nestNow.open()
        #expect(await log.waitFor("other write", within: .seconds(20)), "deadlock: \(log.all)")
        try await outer.value
        try await other.value
        #expect(log.all == ["nested write", "outer done", "other write"])
    }

    @Test("deleting a directory waits for a read inside it")
    func directoryDeleteWaitsForInside() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let folder = box.directory("tree")
        let inner = box.file("tree/deep/file.txt")
        let log = EventLog()
        let readerIn = Gate(), releaseReader = Gate()
        let reader = Task {
            try await privateCoordinator(center).coordinate(readingItemAt: inner) { _ in
                readerIn.open()
                await releaseReader.wait()
                log.append("read done")
            }
        }
        await readerIn.wait()
        let deleter = Task {
            try await privateCoordinator(center).coordinate(writingItemAt: folder, options: .forDeleting) { url in
                log.append("delete")
                try FileManager.default.removeItem(at: url)
            }
        }
        await center.waitUntilWaiting(1)
        // Meanwhile reading the directory's sibling is unaffected.
        try await privateCoordinator(center).coordinate(readingItemAt: box.file("sibling.txt")) { _ in log.append("sibling") }
        releaseReader.open()
        try await reader.value
        try await deleter.value
        #expect(log.all == ["sibling", "read done", "delete"])
    }

    @Test("the blocking variant works from a plain thread and waits for a conflicting writer")
    func blocking() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("b.txt", "before")
        let writerIn = Gate(), releaseWriter = Gate()
        let writer = Task {
            try await privateCoordinator(center).coordinate(writingItemAt: file) { url in
                writerIn.open()
                await releaseWriter.wait()
                try writeFixture(Data("after".utf8), toPath: url.path)
            }
        }
        await writerIn.wait()
        let reading = Task {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<String, any Error>) in
                Thread.detachNewThread {
                    do {
                        var read = ""
                        try privateCoordinator(center).coordinateBlocking(readingItemAt: file) { url in
                            read = try String(contentsOf: url, encoding: .utf8)
                        }
                        continuation.resume(returning: read)
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
            }
        }
        // The blocked thread's claim is queued behind the writer; now let the writer finish.
        await center.waitUntilWaiting(1)
        releaseWriter.open()
        try await writer.value
        #expect(try await reading.value == "after", "the reader ran after the writer released")
    }

    @Test("intents on a queue: the accessor runs on that queue with the intents' URLs")
    func intentsOnQueue() async throws {
        let box = Sandbox()
        let a = box.file("a.txt", "A"), b = box.url.appendingPathComponent("b.txt")
        let queue = DispatchQueue(label: "test.intents")
        let read = FileAccessIntent.readingIntent(with: a)
        let write = FileAccessIntent.writingIntent(with: b)
        let error: (any Error)? = await withCheckedContinuation { continuation in
            FileCoordinator().coordinate(with: [read, write], queue: queue) { error in
                dispatchPrecondition(condition: .onQueue(queue))
                if error == nil {
                    try? writeFixture(Data(contentsOf: read.url), toPath: write.url.path)
                }
                continuation.resume(returning: error)
            }
        }
        #expect(error == nil)
        #expect(try String(contentsOf: b, encoding: .utf8) == "A")
    }

    @Test("forUploading: a file snapshot and a directory as a zip; writers need not wait for the accessor")
    func forUploading() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("report.txt", "contents")
        box.file("folder/one.txt", "1")
        box.file("folder/sub/two.txt", "22")
        let folder = box.url.appendingPathComponent("folder")
        let snapshotPath = try await privateCoordinator(center).coordinate(readingItemAt: file, options: .forUploading) { url in
            #expect(try String(contentsOf: url, encoding: .utf8) == "contents")
            // The claim is gone already: a writer of the original proceeds at once.
            try await privateCoordinator(center).coordinate(writingItemAt: file) { original in
                try writeFixture(Data("changed".utf8), toPath: original.path)
            }
            #expect(try String(contentsOf: url, encoding: .utf8) == "contents", "the snapshot is unaffected")
            return url.path
        }
        #expect(!snapshotPath.isEmpty)
        let names = try await privateCoordinator(center).coordinate(readingItemAt: folder, options: .forUploading) { url in
            #expect(url.pathExtension == "zip")
            let check = try await runToEnd(["python3", "-c", "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; print(' '.join(sorted(z.namelist())))", url.path])
            #expect(check.status == 0)
            return check.output
        }
        #expect(names.trimmingCharacters(in: .whitespacesAndNewlines) == "one.txt sub/ sub/two.txt")
    }

    @Test("coordinated batch read: results in order, bad files alone, and a writer gets in between windows",
          arguments: [false, true])
    func batchRead(presentedDirectory: Bool) async throws {
        let center = CoordinationCenter(), box = Sandbox(), log = EventLog()
        var urls = (0 ..< 300).map { box.file("f\($0)", "\($0)") }
        urls.insert(box.url.appendingPathComponent("missing"), at: 150)
        let coordinator = privateCoordinator(center)
        // A presenter of the directory concerns every file: the workers skip them all, and
        // they are claimed, and the presenter asked, a window at a time.
        let presenter = Recorder("P", url: box.url, log: log)
        if presentedDirectory { center.addPresenter(presenter, at: FilePath(box.url.path)) }
        defer { if presentedDirectory { center.removePresenterLocally(presenter) } }
        var index = 0
        var failures = 0
        for try await result in coordinator.readFiles(at: urls, window: 64) {
            #expect(result.index == index)
            switch result.result {
            case .success(let data): #expect(String(decoding: data, as: UTF8.self) == urls[index].lastPathComponent.dropFirst().description)
            case .failure(let error): #expect(error.code == .notFound); failures += 1
            }
            if index == 100 {
                // Between windows a writer of a file already read is not blocked for long.
                try await privateCoordinator(center).coordinate(writingItemAt: urls[0]) { _ in }
            }
            index += 1
        }
        #expect(index == urls.count)
        #expect(failures == 1)
        #expect(center.counts == (0, 0))
        // Asked once per window of up to 64 files, not once per file.
        let asked = log.all.filter { $0 == "P:relinquishToReader" }.count
        #expect(presentedDirectory ? (5 ... 60).contains(asked) : asked == 0, "\(asked) requests")
    }

    @Test("coordinated batch sequence with no presenters: workers and consumer claim as they read; a file a writer holds waits for it alone",
          .timeLimit(.minutes(3)))
    func batchSequenceClaimsOnWorkers() async throws {
        // On a local disk, where the consumer reads cached files itself.
        let box = Sandbox(under: localDiskBase ?? NSTemporaryDirectory())
        let urls = (0 ..< 300).map { box.file("f\($0)", "\($0)") }
        // Held past the first groups: the consumer's first claims, made before any result
        // is ready, lie before it (one with it would be refused, and the consumer would
        // stop reading).
        let held = 100
        var consumerRead = false
        // Whether the consumer reads depends on how soon the worker beside it delivers:
        // a few batches make it certain to run.
        for _ in 0 ..< 5 where !consumerRead {
            box.file("f\(held)", "\(held)")
            let center = CoordinationCenter()
            let writerInside = Gate(), release = Gate()
            let writer = Task {
                try await privateCoordinator(center).coordinate(writingItemAt: urls[held]) { url in
                    writerInside.open()
                    await release.wait()
                    try await Data("written".utf8).asyncWrite(to: url)
                }
            }
            await writerInside.wait()
            // The files before the held one are delivered while the writer still holds it (a
            // window's claim would have held them back, and this would never end): only then
            // does the writer let go. The held file is read after its write, through a claim
            // of its own.
            var seen: [String] = []
            let files = privateCoordinator(center).readFiles(at: urls, window: 64).makeAsyncIterator()
            while let result = try await files.next() {
                #expect(result.index == seen.count)
                seen.append(String(decoding: try result.result.get(), as: UTF8.self))
                if seen.count == held { release.open() }
            }
            try await writer.value
            #expect(seen.count == urls.count)
            #expect(seen[held] == "written")
            for index in seen.indices where index != held { #expect(seen[index] == "\(index)") }
            #expect(center.counts == (0, 0))
            consumerRead = files.filesReadByConsumer > 0
        }
        if localDiskBase != nil { #expect(consumerRead, "the consumer read no file itself") }
    }

    @Test("coordinated batch sequence from small files to large ones under a small buffer limit: every file once, in order",
          .timeLimit(.minutes(3)))
    func batchSequenceSizeJump() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        // Small files first (the workers claim groups of 32), then 1 MiB ones: a group that
        // crosses the 2 MiB limit leaves the rest of its files to the consumer.
        var expected: [Int] = []
        var urls: [URL] = []
        for index in 0 ..< 160 {
            let size = index < 100 ? 10 : 1 << 20
            expected.append(size)
            urls.append(box.url.appendingPathComponent("f\(index)"))
            try writeFixture(Data(repeating: UInt8(index % 251), count: size), toPath: urls[index].path)
        }
        let options = BatchReadOptions(concurrency: 4, maximumBufferedBytes: 2 << 20)
        var index = 0
        for try await result in privateCoordinator(center).readFiles(at: urls, batchOptions: options, window: 16) {
            #expect(result.index == index)
            let data = try result.result.get()
            #expect(data.count == expected[index] && data.allSatisfy { $0 == UInt8(index % 251) }, "file \(index)")
            index += 1
        }
        #expect(index == urls.count)
        #expect(center.counts == (0, 0))
    }

    /// Reads `urls` with claims that wait at most 300 ms, in place or through the
    /// sequence, while a writer holds `held` and `presenter` is registered: each file's
    /// text, or its error's code.
    func readWhileHeld(_ urls: [URL], held: URL, presenter: Recorder, inPlace: Bool) async throws -> [Int: String] {
        let writerInside = Gate(), done = Gate()
        let writer = Task {
            try await FileCoordinator().coordinate(writingItemAt: held) { _ in
                writerInside.open()
                await done.wait()
            }
        }
        await writerInside.wait()
        let reader = FileCoordinator()
        reader.setClaimTimeout(.milliseconds(300))
        var seen: [Int: String] = [:]
        try await withPresenters([presenter]) {
            if inPlace {
                let partials = try await reader.readFiles(at: urls).forEachFile(perWorker: [Int: String]()) { seen, file in
                    seen[file.index] = outcome(file.bytes)
                }
                seen = partials.reduce(into: [:]) { $0.merge($1) { first, _ in first } }
            } else {
                for try await result in reader.readFiles(at: urls) { seen[result.index] = outcome(result.result) }
            }
        }
        done.open()
        try await writer.value
        return seen
    }

    @Test("a coordinated batch whose claim on one file times out fails only that file, in the sequence and in place; a presented file in the same window is read",
          .timeLimit(.minutes(3)), arguments: [false, true])
    func batchClaimTimeoutFailsOneFile(inPlace: Bool) async throws {
        let box = Sandbox(), log = EventLog()
        let urls = (0 ..< 40).map { box.file("f\($0)", "\($0)") }
        // The workers skip both; the consumer claims them together (one window), which
        // times out; the presented file, free, is claimed again and read.
        let seen = try await readWhileHeld(urls, held: urls[5], presenter: Recorder("P", url: urls[7], log: log), inPlace: inPlace)
        #expect(seen.count == urls.count)
        #expect(seen[5] == "timedOut")
        for index in urls.indices where index != 5 { #expect(seen[index] == "\(index)", "file \(index)") }
    }

    @Test("a claim timeout in a window of a presented directory's files: the free files are claimed again together (in place, the presenter is asked once, not per file), the held one fails",
          .timeLimit(.minutes(3)), arguments: [false, true])
    func batchClaimTimeoutInPresentedDirectory(inPlace: Bool) async throws {
        let box = Sandbox(), log = EventLog()
        let urls = (0 ..< 20).map { box.file("f\($0)", "\($0)") }
        // The presenter concerns every file: the workers skip them all, one window claims them.
        let seen = try await readWhileHeld(urls, held: urls[3], presenter: Recorder("D", url: box.url, log: log), inPlace: inPlace)
        #expect(seen[3] == "timedOut")
        for index in urls.indices where index != 3 { #expect(seen[index] == "\(index)", "file \(index)") }
        // In place, the skipped files are claimed once the workers are done: one window of
        // all 20, which times out before any presenter is asked (claims come first), then
        // one of the 19 free files, which asks the presenter once. (Through the sequence the
        // windows follow the consumer, so their number depends on how far the workers got.)
        if inPlace { #expect(log.all.filter { $0 == "D:relinquishToReader" }.count == 1, "\(log.all)") }
    }

    @Test("coordinated batch read in place: every file once with its bytes; a file a writer holds, and a presented one, take the full coordination",
          arguments: [false, true])
    func batchReadInPlace(byPath: Bool) async throws {
        let box = Sandbox(), log = EventLog()
        var urls = (0 ..< 200).map { box.file("f\($0)", "\($0)") }
        urls.insert(box.url.appendingPathComponent("missing"), at: 50)
        let held = urls[10], presented = urls[20]
        let writerInside = Gate(), othersRead = Gate()
        // A writer holds one file's claim until the batch has read every other file.
        let writer = Task {
            try await FileCoordinator().coordinate(writingItemAt: held) { url in
                writerInside.open()
                await othersRead.wait()
                try await Data("written".utf8).asyncWrite(to: url)
            }
        }
        await writerInside.wait()
        let delivered = Locked(0)
        let total = urls.count
        let partials = try await withPresenters([Recorder("P", url: presented, log: log)]) {
            try await reads(urls, byPath: byPath).forEachFile(perWorker: [Int: String]()) { seen, file in
                seen[file.index] = outcome(file.bytes)
                // Everything but the held and the presented file: read on the workers.
                if delivered.withLock({ $0 += 1; return $0 }) == total - 2 { othersRead.open() }
            }
        }
        try await writer.value
        let seen = partials.reduce(into: [Int: String]()) { $0.merge($1) { first, _ in first } }
        #expect(seen.count == urls.count)
        for (index, url) in urls.enumerated() where ![10, 50].contains(index) {
            #expect(seen[index] == url.lastPathComponent.dropFirst().description)
        }
        #expect(seen[50] == "notFound")
        // Read after the writer let go, through a claim that waited for it.
        #expect(seen[10] == "written")
        // The presenter was asked, as for any coordinated read.
        #expect(log.all.filter { $0.hasPrefix("P:") } == ["P:relinquishToReader", "P:save", "P:reacquire"])
    }

    /// The coordinated batch over `urls` (the held and the presented file's through a
    /// `.` component), or over their paths (those two relative to the current directory,
    /// through `..`): claims must name normalized paths.
    func reads(_ urls: [URL], byPath: Bool) -> CoordinatedFileReads {
        guard byPath else {
            let dotted = urls.enumerated().map { index, url in
                [10, 20].contains(index) ? URL(fileURLWithPath: url.deletingLastPathComponent().path + "/./" + url.lastPathComponent) : url
            }
            #expect(dotted[10].path.contains("/./"))
            return FileCoordinator().readFiles(at: dotted, window: 64)
        }
        let up = String(repeating: "../", count: FilePath(FileManager.default.currentDirectoryPath).components.count)
        let paths = urls.enumerated().map { index, url in
            [10, 20].contains(index) ? FilePath(up + url.path.dropFirst()) : FilePath(url.path)
        }
        return FileCoordinator().readFiles(at: paths, window: 64)
    }

    @Test("stress: many tasks, multi-item intents, random cancellation; no deadlock, no overlap, every claim released",
          arguments: 0 ..< 3)
    func stress(seed: Int) async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let files = (0 ..< 4).map { box.file("s\($0)") }
        let folder = box.url
        // Per item: how many readers and writers are inside right now.
        let active = Locked<[String: (readers: Int, writers: Int)]>([:])
        let violations = Locked(0)
        func enter(_ url: URL, writing: Bool) {
            active.withLock { table in
                var entry = table[url.path] ?? (0, 0)
                if entry.writers > 0 || (writing && entry.readers > 0) { violations.withLock { $0 += 1 } }
                if writing { entry.writers += 1 } else { entry.readers += 1 }
                table[url.path] = entry
            }
        }
        func leave(_ url: URL, writing: Bool) {
            active.withLock { table in
                if writing { table[url.path]!.writers -= 1 } else { table[url.path]!.readers -= 1 }
            }
        }
        await withTaskGroup(of: Void.self) { group in
            var generator = SeededGenerator(seed: UInt64(seed))
            for _ in 0 ..< 300 {
                let a = files.randomElement(using: &generator)!, b = files.randomElement(using: &generator)!
                let kind = Int.random(in: 0 ..< 5, using: &generator)
                let cancelAfter = Int.random(in: 0 ..< 4, using: &generator) == 0
                let task = Task {
                    let coordinator = privateCoordinator(center)
                    switch kind {
                    case 0:
                        try await coordinator.coordinate(readingItemAt: a) { url in enter(url, writing: false); await Task.yield(); leave(url, writing: false) }
                    case 1:
                        try await coordinator.coordinate(writingItemAt: a) { url in enter(url, writing: true); await Task.yield(); leave(url, writing: true) }
                    case 2 where a != b:
                        try await coordinator.coordinate(readingItemAt: a, writingItemAt: b) { r, w in
                            enter(r, writing: false); enter(w, writing: true); await Task.yield()
                            leave(r, writing: false); leave(w, writing: true)
                        }
                    case 3 where a != b:
                        try await coordinator.coordinate(writingItemAt: b, writingItemAt: a) { x, y in
                            enter(x, writing: true); enter(y, writing: true); await Task.yield()
                            leave(x, writing: true); leave(y, writing: true)
                        }
                    default:
                        // The directory itself, for moving: excludes everything inside.
                        try await coordinator.coordinate(writingItemAt: folder, options: .forMoving) { _ in
                            for file in files { enter(file, writing: true) }
                            await Task.yield()
                            for file in files { leave(file, writing: true) }
                        }
                    }
                }
                if cancelAfter { task.cancel() }
                group.addTask { _ = try? await task.value }
            }
        }
        #expect(violations.withLock { $0 } == 0)
        #expect(center.counts == (0, 0), "every claim released")
    }

    @Test("a path under a link to a directory resolves to its target from a cancelled task too (no name claimed but the item's)")
    func cancelledTaskResolves() async throws {
        let box = Sandbox()
        let real = box.directory("real")
        let link = box.url.appendingPathComponent("link")
        try FileManager.default.createSymbolicLink(at: link, withDestinationURL: real)
        let resolved = await Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await CanonicalPaths.canonical(FilePath(link.path + "/a"), followingLast: true)
        }.value
        #expect(resolved == CanonicalPaths.canonicalNow(FilePath(real.path + "/a"), followingLast: true), "\(resolved)")
    }

    @Test("a claim with a deadline whose task is cancelled as the claim is granted gives it back (300 tries)")
    func deadlineCancelledAsGranted() async throws {
        let center = CoordinationCenter(), box = Sandbox()
        let file = box.file("granted.txt")
        for _ in 0 ..< 300 {
            let holderIn = Gate(), releaseHolder = Gate()
            let holder = Task {
                try await privateCoordinator(center).coordinate(writingItemAt: file) { _ in
                    holderIn.open()
                    await releaseHolder.wait()
                }
            }
            await holderIn.wait()
            let waiter = Task {
                let coordinator = privateCoordinator(center)
                coordinator.setClaimTimeout(.seconds(60))
                try await coordinator.coordinate(readingItemAt: file) { _ in }
            }
            await center.waitUntilWaiting(1)
            releaseHolder.open()
            try await holder.value
            // The waiter was granted as the holder's claim went; cancelled right after.
            waiter.cancel()
            _ = await waiter.result
            let counts = center.counts
            #expect(counts == (0, 0))
            if counts != (0, 0) { break }
        }
    }
}
