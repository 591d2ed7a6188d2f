@testable import FileCoordination
import Foundation
import SystemCalls
import SystemPackage
import Testing
import TestSupport

extension CrossProcessTests {
    /// Presenters under faults: writers that die or give up, and a process whose
    /// coordinations all start right after a presenter appears.
    @Suite("presenters under faults")
    struct PresenterFaultTests: CrossProcessFixture {
        let scratch = Scratch()
    }
}

extension CrossProcessTests.PresenterFaultTests {
    @Test("a writer killed (wrapper and command) after the presenter relinquished: the presenter gets its reacquire and hears changes again",
          .timeLimit(.minutes(2)))
    func writerDeathLeavesNoDeafPresenter() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file)
        var lines = stream
        let writer = try await holdingWriter(of: file)
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "save" } == ["relinquishToWriter", "save"])
        await killWriter(writer)
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["reacquire"])
        // Not coordinated: heard through the presenter's watch, which no longer drops it.
        // Renamed into place: one event (a write in place may be two, truncation and data).
        try await offThePool { try Data("changed outside".utf8).write(to: URL(fileURLWithPath: file), options: .atomic) }
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "didChange" } == ["didChange"])
        let coordinated = try await filecoord("write", file, "--space", space, stdin: Data("new".utf8))
        #expect(coordinated.status == 0, "\(coordinated.errorText)")
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["relinquishToWriter", "save", "didChange", "reacquire"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a writer killed while the presenter is still relinquishing: the presenter gets its item back and hears changes again",
          .timeLimit(.minutes(2)))
    func writerDeathDuringRelinquishLeavesNoDeafPresenter() async throws {
        let file = scratch.write("doc", "old")
        // The relinquish takes 2 s to answer: the writer dies in the middle of it.
        let (presenter, stream) = try await present(file, "--ack-delay", "2s")
        var lines = stream
        let writer = try Spawned([filecoordBinary, "exec", "--space", space, "--write", file, "--", "true"])
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "relinquishToWriter" } == ["relinquishToWriter"])
        kill(writer.pid, SIGKILL)
        _ = await writer.wait()
        // Its reacquirer runs once the relinquish is done, the asker being gone (and the
        // save the request asked for is not made: nobody is going to write).
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["reacquire"])
        try await offThePool { try Data("changed outside".utf8).write(to: URL(fileURLWithPath: file), options: .atomic) }
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "didChange" } == ["didChange"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a writer killed while the presenter's inotify queue overflows (its death among the events lost): the presenter still gets its item back",
          .timeLimit(.minutes(3)))
    func writerDeathLostInOverflowLeavesNoDeafPresenter() async throws {
        let (tmpfs, limit) = try overflowSetting()
        let file = tmpfs.path + "/doc"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("old".utf8)))
        // The presenter of the directory: the files created below queue events for it.
        let (presenter, stream) = try await present(tmpfs.path)
        var lines = stream
        let writer = try await holdingWriter(of: file)
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "save" } == ["relinquishToWriter", "save"])
        // Stopped, its queue fills up; the writer's death comes after the queue is full.
        presenter.signal(SIGSTOP)
        await createFiles(in: tmpfs.path, count: limit + 1000)
        await killWriter(writer)
        presenter.signal(SIGCONT)
        #expect(await events(of: presenter, &lines, within: .seconds(60)) { $0 == "reacquire" }.last == "reacquire")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("requests whose writers gave up (presenter timeout) while the presenter was stopped are not served: the next writer waits for one acknowledgement, not for every stale one",
          .timeLimit(.minutes(2)))
    func staleRequestsAreSkipped() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file, "--ack-delay", "1.5s")
        var lines = stream
        presenter.signal(SIGSTOP)
        for round in 0 ..< 4 {
            let gaveUp = try await filecoord("write", file, "--space", space, "--presenter-timeout", "0.2", stdin: Data("v\(round)".utf8))
            #expect(gaveUp.status == 0, "\(gaveUp.errorText)")
        }
        presenter.signal(SIGCONT)
        let clock = ContinuousClock()
        let start = clock.now
        let fresh = try await filecoord("write", file, "--space", space, stdin: Data("fresh".utf8))
        let elapsed = clock.now - start
        #expect(fresh.status == 0, "\(fresh.errorText)")
        // One stale relinquish may be under way when the presenter wakes (1.5 s), then the
        // fresh one's (1.5 s); serving all four stale ones would take 6 s more.
        #expect(elapsed < .milliseconds(4500), "the fresh writer waited \(elapsed)")
        presenter.signal(SIGTERM)
        var relinquished = 0
        while let line = await lines.next() {
            if event(line).event == "relinquishToWriter" { relinquished += 1 }
        }
        #expect(relinquished <= 2, "the presenter was asked \(relinquished) times")
        _ = await presenter.wait()
    }
}

extension CrossProcessTests.PresenterFaultTests {
    @Test("eight coordinations started together in another process, right after a presenter appears, ask it eight times, not once per proxy of it",
          .timeLimit(.minutes(2)))
    func concurrentCoordinationsAskOncePerCoordination() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file)
        var lines = stream
        let (status, output) = try await RemoteProxyChild.run([RemoteProxyChild.spaceVariable: space, RemoteProxyChild.fileVariable: file])
        #expect(status == 0, "\(output)")
        #expect(output.contains("Test run with 1 test"), "\(output)")
        presenter.signal(SIGTERM)
        var asked = 0
        while let line = await lines.next() {
            if event(line).event == "relinquishToWriter" { asked += 1 }
        }
        #expect(asked == RemoteProxyChild.writers)
        _ = await presenter.wait()
    }
}

/// The other process of the tests that need the library's API in a process of its own
/// (``CrossProcessTests/PresenterFaultTests/concurrentCoordinationsAskOncePerCoordination()``,
/// ``CrossProcessTests/PresenterFaultTests/moveReachesPresenterInAnotherProcess()``): this test binary
/// again, filtered to this suite, with its orders in its environment.
@Suite struct RemoteProxyChild {
    static let spaceVariable = "FILECOORD_CHILD_SPACE"
    static let fileVariable = "FILECOORD_CHILD_FILE"
    static let destinationVariable = "FILECOORD_CHILD_DESTINATION"
    /// Set: one write, whose task is cancelled inside its accessor.
    static let cancelVariable = "FILECOORD_CHILD_CANCEL"
    /// Set: one write, whose coordinator is cancelled as its request to the presenter goes out.
    static let cancelAskingVariable = "FILECOORD_CHILD_CANCEL_ASKING"
    /// Set to a directory: one write, whose messages after the accessor fail to be written
    /// once (ENOSPC); the child stays in the space until `leave` exists there.
    static let failingTellsVariable = "FILECOORD_CHILD_FAILING_TELLS"
    /// Set to a directory: the child presents the file, and its reply to the first writer
    /// fails to be written once (ENOSPC); it says it is `ready` and leaves once `leave`
    /// exists, both files in that directory.
    static let failingReplyVariable = "FILECOORD_CHILD_FAILING_REPLY"
    /// Set to a directory: the child presents the file, says it is `ready`, and leaves
    /// the space once `leave` exists there (a writer holding the file meanwhile); its
    /// presenter must then get its item back.
    static let leavingPresenterVariable = "FILECOORD_CHILD_LEAVING_PRESENTER"
    /// Set to a directory: the child presents the file, says it is `ready` there, and
    /// fails to read the first message after its relinquish once (EIO); its presenter
    /// must still hear the writer's steps, in order.
    static let failingReadVariable = "FILECOORD_CHILD_FAILING_READ"
    /// Set: two writes; the child's first open of a presenter record fails (EMFILE).
    static let failingRecordVariable = "FILECOORD_CHILD_FAILING_RECORD"
    /// Set to a path: a writer of the file waits behind a coordinator that moves the file
    /// to that path, then checks that another process cannot read it there meanwhile.
    static let movedWaiterVariable = "FILECOORD_CHILD_MOVED_WAITER"
    /// Set: the child reads the file while a writer in another process starts to wait for
    /// it, starts listening to the doorbell only then, and ends its read.
    static let lateListenerVariable = "FILECOORD_CHILD_LATE_LISTENER"
    /// Set to a directory: a write of the file waits in the kernel behind another
    /// process; once it does, the child's next two lock calls fail (ENOLCK) and it says
    /// `injected`; when the write has failed it says `failed`, and leaves once `leave`
    /// exists (files in that directory).
    static let failingTakeVariable = "FILECOORD_CHILD_FAILING_TAKE"
    static let writers = 8
    static var inChild: Bool { ProcessInfo.processInfo.environment[spaceVariable] != nil }
    static var environment: [String: String] { ProcessInfo.processInfo.environment }

    /// Runs this suite's test in a child process of the space at `space`, on `file`, with
    /// `variable` set to `value`; its status and output.
    static func run(space: String, file: String, _ variable: String, _ value: String) async throws -> (status: Int32, output: String) {
        try await run([spaceVariable: space, fileVariable: file, variable: value])
    }

    /// Runs this suite's test in a child process with `variables`; its status and output.
    static func run(_ variables: [String: String]) async throws -> (status: Int32, output: String) {
        let binary = try #require(ProcessInfo.processInfo.arguments.first)
        return try await runToEnd([binary, "--testing-library", "swift-testing", "--filter", "RemoteProxyChild"],
                                  environment: variables, includeStandardError: true)
    }

    @Test("the child's part", .enabled(if: inChild))
    func child() async throws {
        let space = try #require(Self.environment[Self.spaceVariable]), file = try #require(Self.environment[Self.fileVariable])
        _ = try await FileCoordinator.joinCoordinationSpace(at: FilePath(space))
        let coordinator = FileCoordinator()
        if let destination = Self.environment[Self.destinationVariable] {
            let (from, to) = (URL(fileURLWithPath: file), URL(fileURLWithPath: destination))
            try await coordinator.coordinate(writingItemAt: from, options: .forMoving, writingItemAt: to, options: .forReplacing) { from, to in
                try FileManager.default.moveItem(at: from, to: to)
                await coordinator.item(at: from, didMoveTo: to)
            }
        } else if Self.environment[Self.cancelAskingVariable] != nil {
            // The presenter is stopped: without cancel(), the wait would end at the timeout,
            // with `.timedOut`.
            coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .seconds(20), action: .fail))
            let observer = WaitObserver { coordinator.cancel() }
            let error = await #expect(throws: FileCoordinationError.self) {
                try await WaitObserver.$current.withValue(observer) {
                    try await coordinator.coordinate(writingItemAt: URL(fileURLWithPath: file)) { _ in }
                }
            }
            #expect(error?.code == .cancelled)
        } else if let signals = Self.environment[Self.failingTakeVariable] {
            let writing = Task { try await coordinator.coordinate(writingItemAt: URL(fileURLWithPath: file)) { _ in } }
            let space = try #require(CoordinationCenter.shared.transport as? CoordinationSpace)
            // No event says a thread is in its lock call: looked at every millisecond, 10 s at most.
            var waiting = false
            for _ in 0 ..< 10_000 where !waiting {
                waiting = space.locks.kernelWaitsInCall.load(ordering: .relaxed) > 0
                if !waiting { try await Task.sleep(for: .milliseconds(1)) } // ok: bounded, see above
            }
            try #require(waiting, "the write never waited in the kernel")
            // The lock that counts the byte the kernel grants, and the next try's.
            Faults.inject(.lock, .noLocks, times: 2)
            #expect(FileManager.default.createFile(atPath: signals + "/injected", contents: nil))
            await #expect(throws: (any Error).self) { try await writing.value }
            #expect(FileManager.default.createFile(atPath: signals + "/failed", contents: nil))
            try await awaitSignal("leave", in: signals)
        } else if Self.environment[Self.lateListenerVariable] != nil {
            let (released, release) = AsyncStream<Void>.makeStream()
            let (holding, held) = AsyncStream<Void>.makeStream()
            let reading = Task {
                try await coordinator.coordinate(readingItemAt: URL(fileURLWithPath: file)) { _ in
                    held.yield()
                    _ = await released.first { true }
                }
            }
            _ = await holding.first { true }
            let writer = Task {
                try await runToEnd(["sh", "-c", "printf z | '\(filecoordBinary)' write --space '\(space)' --timeout 10 '\(file)'"], includeStandardError: true)
            }
            // The writer raised the waiting flag and rang a doorbell this process, not
            // listening yet, could not hear.
            try await offThePool { try waitForWaitingFlag(in: space) }
            let space = try #require(CoordinationCenter.shared.transport as? CoordinationSpace)
            #expect(await space.startWatching())
            release.yield()
            try await reading.value
            let clock = ContinuousClock()
            let start = clock.now
            let written = try await writer.value
            #expect(written.status == 0, "\(written.output)")
            #expect(clock.now - start < .seconds(5), "the writer waited \(clock.now - start) after the read ended")
        } else if let destination = Self.environment[Self.movedWaiterVariable] {
            let (from, to) = (URL(fileURLWithPath: file), URL(fileURLWithPath: destination))
            let mover = FileCoordinator()
            let (holding, held) = AsyncStream<Void>.makeStream()
            let moving = Task {
                try await mover.coordinate(writingItemAt: from, options: .forMoving, writingItemAt: to, options: .forReplacing) { from, to in
                    held.yield()
                    await CoordinationCenter.shared.waitUntilWaiting(1)
                    try FileManager.default.moveItem(at: from, to: to)
                    await mover.item(at: from, didMoveTo: to)
                }
            }
            _ = await holding.first { true }
            // Waits here behind the mover; granted, it writes the item where it moved to.
            let read = try await coordinator.coordinate(writingItemAt: from) { url in
                #expect(url.path == destination)
                return try await runToEnd([filecoordBinary, "read", "--space", space, "--timeout", "0.5", destination], includeStandardError: true)
            }
            #expect(read.status == 3, "another process read the item while this one wrote it: \(read.output)")
            try await moving.value
        } else if Self.environment[Self.failingRecordVariable] != nil {
            Faults.inject(.open, .tooManyOpenFiles, times: 1, whereNameContains: "presenters/")
            for round in 0 ..< 2 {
                try await coordinator.coordinate(writingItemAt: URL(fileURLWithPath: file)) { url in
                    try Data("w\(round)".utf8).write(to: url)
                }
            }
        } else if let signals = Self.environment[Self.failingReadVariable] {
            let (events, continuation) = AsyncStream<String>.makeStream()
            let presenter = RecordingPresenter(URL(fileURLWithPath: file), events: continuation) {
                // The next message this process reads: the writer's `did-change`.
                Faults.inject(.read, .ioError, times: 1)
            }
            await FileCoordinator.addFilePresenter(presenter)
            #expect(FileManager.default.createFile(atPath: signals + "/ready", contents: nil))
            let heard = await first(within: .seconds(10), or: ["(no reacquire within 10 s)"]) {
                await events.prefix { $0 != "reacquire" }.reduce(into: []) { $0.append($1) } + ["reacquire"]
            }
            #expect(heard == ["relinquishToWriter", "didChange", "reacquire"])
            await FileCoordinator.removeFilePresenter(presenter)
        } else if let signals = Self.environment[Self.leavingPresenterVariable] {
            let (reacquired, continuation) = AsyncStream<Void>.makeStream()
            let presenter = ReacquiringPresenter(URL(fileURLWithPath: file), reacquired: continuation)
            await FileCoordinator.addFilePresenter(presenter)
            #expect(FileManager.default.createFile(atPath: signals + "/ready", contents: nil))
            try await awaitSignal("leave", in: signals)
            // The writer still holds the file: its `reacquire` cannot reach a process that left.
            await FileCoordinator.leaveCoordinationSpace()
            let ran = await first(within: .seconds(10), or: false) { await reacquired.first { _ in true } != nil }
            #expect(ran, "the presenter's reacquirer did not run after its process left the space")
        } else if let signals = Self.environment[Self.failingReplyVariable] {
            let presenter = ReplyFaultPresenter(URL(fileURLWithPath: file))
            await FileCoordinator.addFilePresenter(presenter)
            #expect(FileManager.default.createFile(atPath: signals + "/ready", contents: nil))
            try await awaitSignal("leave", in: signals)
            await FileCoordinator.removeFilePresenter(presenter)
        } else if let signals = Self.environment[Self.failingTellsVariable] {
            try await coordinator.coordinate(writingItemAt: URL(fileURLWithPath: file)) { _ in
                // The next two message writes of this process: its `did-change` and `reacquire`.
                Faults.inject(.write, .noSpace, times: 2)
            }
            // Alive, the presenter's item is its own to give back: a death would give it.
            try await awaitSignal("leave", in: signals)
        } else if Self.environment[Self.cancelVariable] != nil {
            let writer = Task {
                try await coordinator.coordinate(writingItemAt: URL(fileURLWithPath: file)) { url in
                    try Data("cancelled".utf8).write(to: url)
                    withUnsafeCurrentTask { $0?.cancel() }
                }
            }
            _ = await writer.result
        } else {
            // Eight coordinated writes started together, right after a presenter appeared.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0 ..< Self.writers {
                    group.addTask {
                        try await coordinator.coordinate(writingItemAt: URL(fileURLWithPath: file)) { url in
                            try await Data("w\(index)".utf8).asyncWrite(to: url)
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
        await FileCoordinator.leaveCoordinationSpace()
    }
}

extension CrossProcessTests.PresenterFaultTests {
    @Test("a writer in another process whose task is cancelled during its accessor still tells the presenter of the change and gives it its item back",
          .timeLimit(.minutes(2)))
    func cancelledWriterGivesBack() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file)
        var lines = stream
        let (status, output) = try await RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.cancelVariable, "1")
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["relinquishToWriter", "save", "didChange", "reacquire"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a writer in another process whose did-change and reacquire fail to be written once (ENOSPC) writes them again: the presenter hears both, in order, while the writer lives",
          .timeLimit(.minutes(2)))
    func failedTellsWrittenAgain() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file)
        var lines = stream
        let signals = try scratch.signals()
        async let child = RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.failingTellsVariable, signals)
        let heard = await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" }
        #expect(FileManager.default.createFile(atPath: signals + "/leave", contents: nil))
        let (status, output) = try await child
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
        #expect(heard == ["relinquishToWriter", "save", "didChange", "reacquire"])
        #expect(output.contains("could not be written; trying again") && output.contains("ENOSPC"), "\(output)")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a presenter's reply that fails to be written once (ENOSPC) is written again: the writer in another process goes on at once, not at its presenter timeout",
          .timeLimit(.minutes(2)))
    func failedReplyWrittenAgain() async throws {
        let file = scratch.write("doc", "old")
        let signals = try scratch.signals()
        async let child = RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.failingReplyVariable, signals)
        try await awaitSignal("ready", in: signals)
        let clock = ContinuousClock()
        let start = clock.now
        // Without the reply, --strict fails the write at the timeout (exit 3).
        let written = try await filecoord("write", file, "--space", space, "--presenter-timeout", "20", "--strict", stdin: Data("new".utf8))
        let elapsed = clock.now - start
        #expect(FileManager.default.createFile(atPath: signals + "/leave", contents: nil))
        let (status, output) = try await child
        #expect(written.status == 0, "\(written.errorText)")
        #expect(elapsed < .seconds(10), "the write took \(elapsed)")
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
        #expect(output.contains("a reply message to another process could not be written; trying again") && output.contains("ENOSPC"), "\(output)")
    }

    @Test("a presenter's process that leaves the space while a writer in another process holds its item gives the presenter its item back",
          .timeLimit(.minutes(2)))
    func leavingGivesBack() async throws {
        let file = scratch.write("doc", "old")
        let signals = try scratch.signals()
        async let child = RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.leavingPresenterVariable, signals)
        try await awaitSignal("ready", in: signals)
        // Its command runs once the presenter relinquished.
        let writer = try await holdingWriter(of: file)
        #expect(FileManager.default.createFile(atPath: signals + "/leave", contents: nil))
        let (status, output) = try await child
        await killWriter(writer)
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
    }

    @Test("a presenter record that a writer in another process fails to open once (EMFILE) is read by its next coordination: the presenter is asked, not ignored for good",
          .timeLimit(.minutes(2)))
    func failedRecordReadAgain() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, stream) = try await present(file)
        var lines = stream
        let (status, output) = try await RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.failingRecordVariable, "1")
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
        // The first write, made without asking it, is heard through its watch.
        let heard = await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" }
        #expect(heard.suffix(4) == ["relinquishToWriter", "save", "didChange", "reacquire"], "\(heard)")
        #expect(!output.contains("ignored a file"), "\(output)")
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a write granted its queue byte by the kernel that then fails to count it (ENOLCK) gives the byte back: another process's writer goes on while it lives",
          .timeLimit(.minutes(2)))
    func failedTakeGivesBack() async throws {
        let file = scratch.write("doc", "old")
        let signals = try scratch.signals()
        let holder = try await holdingWriter(of: file)
        async let child = RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.failingTakeVariable, signals)
        try await awaitSignal("injected", in: signals)
        await killWriter(holder)
        try await awaitSignal("failed", in: signals)
        let written = try await filecoord("write", file, "--space", space, "--timeout", "2", stdin: Data("new".utf8))
        #expect(FileManager.default.createFile(atPath: signals + "/leave", contents: nil))
        #expect(written.status == 0, "the queue byte stayed locked: \(written.errorText)")
        let (status, output) = try await child
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
    }

    @Test("a reader in a process that starts listening to the doorbell after a writer in another process rang it gives its byte back as its read ends: the writer goes on",
          .timeLimit(.minutes(2)))
    func lateListenerGivesBack() async throws {
        let file = scratch.write("doc", "old")
        let (status, output) = try await RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.lateListenerVariable, "1")
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
    }

    @Test("a writer that waited in its process behind a coordinator moving the item holds the item where it moved to, against other processes too")
    func movedWaiterClaimsNewPath() async throws {
        let file = scratch.write("a", "content")
        let (status, output) = try await RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.movedWaiterVariable, scratch.path + "/b")
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
    }

    @Test("a message the presenter's process fails to read once (EIO) is read again, not removed: its presenter hears the writer's did-change before its reacquire",
          .timeLimit(.minutes(2)))
    func failedReadReadAgain() async throws {
        let file = scratch.write("doc", "old")
        let signals = try scratch.signals()
        async let child = RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.failingReadVariable, signals)
        try await awaitSignal("ready", in: signals)
        let written = try await filecoord("write", file, "--space", space, stdin: Data("new".utf8))
        #expect(written.status == 0, "\(written.errorText)")
        let (status, output) = try await child
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
        #expect(output.contains("could not be read") && output.contains("EIO") && !output.contains("ignored a file"), "\(output)")
    }

    @Test("cancel() ends a coordination waiting for a stopped presenter in another process at once, not at the presenter timeout",
          .timeLimit(.minutes(2)))
    func cancelWhileAskingAnotherProcess() async throws {
        let file = scratch.write("doc", "old")
        let (presenter, _) = try await present(file)
        presenter.signal(SIGSTOP)
        let (status, output) = try await RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.cancelAskingVariable, "1")
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
        presenter.signal(SIGCONT)
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }

    @Test("a coordinated move in another process reaches the item's presenter (didMove), which is then asked by writers at the new place",
          .timeLimit(.minutes(2)))
    func moveReachesPresenterInAnotherProcess() async throws {
        try FileManager.default.createDirectory(atPath: scratch.path + "/a", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: scratch.path + "/b", withIntermediateDirectories: true)
        let file = scratch.write("a/doc", "old")
        let destination = scratch.path + "/b/moved"
        let (presenter, stream) = try await present(file)
        var lines = stream
        let (status, output) = try await RemoteProxyChild.run(space: space, file: file, RemoteProxyChild.destinationVariable, destination)
        #expect(status == 0 && output.contains("Test run with 1 test"), "\(output)")
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["relinquishToWriter", "save", "didMove", "reacquire"])
        let write = try await filecoord("write", destination, "--space", space, stdin: Data("new".utf8))
        #expect(write.status == 0, "\(write.errorText)")
        #expect(await events(of: presenter, &lines, within: .seconds(10)) { $0 == "reacquire" } == ["relinquishToWriter", "save", "didChange", "reacquire"])
        presenter.signal(SIGTERM)
        _ = await presenter.wait()
    }
}

extension CrossProcessTests.PresenterFaultTests {
    @Test("a batch of 600 files under a stopped directory presenter asks it once, not once per window; --strict names each file",
          .timeLimit(.minutes(2)))
    func stoppedDirectoryPresenterAskedOncePerBatch() async throws {
        try FileManager.default.createDirectory(atPath: scratch.path + "/D", withIntermediateDirectories: true)
        let files = (0 ..< 600).map { scratch.write("D/f\($0)", "\($0)") }
        let list = scratch.write("list", files.joined(separator: "\n") + "\n")
        let (presenter, _) = try await present(scratch.path + "/D")
        presenter.signal(SIGSTOP)
        defer { presenter.signal(SIGCONT); presenter.signal(SIGTERM) }
        for mode in ["--json", "--cat"] {
            let proceed = try await filecoord("read", mode, "--space", space, "--presenter-timeout", "0.3", "--from-list", list)
            #expect(proceed.status == 0, "\(proceed.errorText)")
            let warnings = proceed.errorText.split(separator: "\n").filter { $0.contains("did not answer") }
            #expect(warnings.count == 1, "\(mode): \(warnings.count) warnings")

            let strict = try await filecoord("read", mode, "--space", space, "--strict", "--presenter-timeout", "0.3", "--from-list", list)
            #expect(strict.status == 3, "\(strict.errorText)")
            let named = Set(strict.errorText.split(separator: "\n").compactMap { line -> String? in
                guard line.contains("did not answer"), let colon = line.dropFirst("filecoord: ".count).firstIndex(of: ":") else { return nil }
                return String(line[line.index(line.startIndex, offsetBy: "filecoord: ".count) ..< colon])
            })
            #expect(named == Set(files), "\(mode): \(named.count) names, e.g. \(Array(named.prefix(3)))")
        }
    }
}

/// A presenter whose process cannot write its reply to the first writer once: the next
/// message write of the process fails (ENOSPC).
final class ReplyFaultPresenter: FilePresenter {
    let presentedItemURL: URL?
    init(_ url: URL) { presentedItemURL = url }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        Faults.inject(.write, .noSpace, times: 1)
        return nil
    }
}

/// A presenter that says when its reacquirer runs.
final class ReacquiringPresenter: FilePresenter {
    let presentedItemURL: URL?
    let reacquired: AsyncStream<Void>.Continuation
    init(_ url: URL, reacquired: AsyncStream<Void>.Continuation) {
        (presentedItemURL, self.reacquired) = (url, reacquired)
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        { [reacquired] in reacquired.yield() }
    }
}

/// A presenter that says which of its callbacks ran, in order, and runs `onRelinquish`
/// as it relinquishes.
final class RecordingPresenter: FilePresenter {
    let presentedItemURL: URL?
    let events: AsyncStream<String>.Continuation
    let onRelinquish: @Sendable () -> Void
    init(_ url: URL, events: AsyncStream<String>.Continuation, onRelinquish: @escaping @Sendable () -> Void) {
        (presentedItemURL, self.events, self.onRelinquish) = (url, events, onRelinquish)
    }

    func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
        events.yield("relinquishToWriter")
        onRelinquish()
        return { [events] in events.yield("reacquire") }
    }

    func presentedItemDidChange() async {
        events.yield("didChange")
    }
}

/// Blocks until a process holds the waiting flag of the space at `space` (it waits for a
/// claim): looked at after each change of `claims.lock` (the doorbell a waiter rings after
/// raising the flag), for at most 30 s.
func waitForWaitingFlag(in space: String) throws {
    let path = space + "/claims.lock"
    let fd = open(path, O_RDONLY | O_CLOEXEC), watch = inotify_init1(Int32(IN_CLOEXEC))
    defer { close(fd); close(watch) }
    guard fd >= 0, watch >= 0, inotify_add_watch(watch, path, UInt32(IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB)) >= 0 else {
        throw FixtureError(path: path, operation: "open and watch", errno: errno)
    }
    let deadline = ContinuousClock.now + .seconds(30)
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        if case .success(let holder) = Syscall.conflictingLock(fd, Int16(F_WRLCK), SpaceLocks.waitingFlagOffset, 1), holder != Int16(F_UNLCK) { return }
        let left = deadline - ContinuousClock.now
        var ready = pollfd(fd: watch, events: Int16(POLLIN), revents: 0)
        guard left > .zero, poll(&ready, 1, Int32(left.components.seconds * 1000 + 1)) > 0 else {
            throw FixtureError(path: path, operation: "wait for the waiting flag", errno: ETIMEDOUT)
        }
        _ = buffer.withUnsafeMutableBytes { read(watch, $0.baseAddress, $0.count) }
    }
}

/// What `work` gives, or `fallback` once `limit` has passed without it.
func first<T: Sendable>(within limit: Duration, or fallback: T, _ work: @escaping @Sendable () async -> T) async -> T {
    await withTaskGroup(of: T.self) { group in
        group.addTask { await work() }
        group.addTask {
            try? await Task.sleep(for: limit) // ok: the bound on a wait for another process's step
            return fallback
        }
        defer { group.cancelAll() }
        return await group.next() ?? fallback
    }
}

/// Waits (60 s at most) until `name` exists in `directory`: a step another process signals.
func awaitSignal(_ name: String, in directory: String) async throws {
    try await offThePool { try waitForCreation(in: directory, within: .seconds(60)) { $0 == name } }
}

extension Scratch {
    /// A directory `signals` in it, where the processes of a test signal their steps with files.
    func signals() throws -> String {
        let signals = path + "/signals"
        try FileManager.default.createDirectory(atPath: signals, withIntermediateDirectories: false)
        return signals
    }
}
