import FileCoordination
import Foundation
import SystemPackage
import Testing
import TestSupport

extension CrossProcessTests {
    /// `status` lists what every live process holds: a process that does not read its
    /// mailbox, and one that is stopped, included.
    @Suite("status across processes")
    struct StatusTests: CrossProcessFixture {
        let scratch = Scratch()
    }
}

extension CrossProcessTests.StatusTests {
    @Test("status lists the claim of a library process that never waited (it does not read its mailbox)",
          .timeLimit(.minutes(2)))
    func statusListsClaimsOfProcessThatDoesNotListen() async throws {
        let item = scratch.write("held", "x")
        let binary = try #require(ProcessInfo.processInfo.arguments.first)
        let holder = try LineProcess(["--testing-library", "swift-testing", "--filter", "ClaimHolderWorker"], executable: binary,
                                     environment: [ClaimHolderWorker.spaceVariable: space, ClaimHolderWorker.itemVariable: item])
        var lines = holder.lines.makeAsyncIterator()
        while let line = await lines.next(), line != "held" {}
        try await waitForStatus { lists($0, claimOf: holder.pid, on: item) }
        holder.signal(SIGKILL)
        _ = await holder.wait()
    }

    @Test("status lists a claim that waits in the kernel (from its process's record), and the claims of a stopped process that listens (it asked a presenter), as not answering",
          .timeLimit(.minutes(2)))
    func statusListsClaimsOfStoppedProcess() async throws {
        let item = scratch.write("item", "x")
        let (first, second) = (scratch.path + "/first", scratch.path + "/second")
        #expect(mkfifo(second, 0o600) == 0)
        // A presenter of the item: the waiter asks it before its command, and so reads
        // its own mailbox from then on.
        let (presenter, _) = try await present(item)
        defer { presenter.signal(SIGTERM) }
        let holder = try await holdUntilReleased(["--write", item], fifo: first)
        // Waits behind the holder in the kernel: it reads no mailbox meanwhile, and its
        // record lists the wait.
        let waiter = try LineProcess(["exec", "--space", space, "--write", item, "--", "sh", "-c", "echo held; read x < '\(second)'"])
        try await waitForStatus { waitingPids(in: $0).contains(waiter.pid) }
        try await release(first)
        #expect(await holder.wait().status == 0)
        var lines = waiter.lines.makeAsyncIterator()
        #expect(await lines.next() == "held")
        waiter.signal(SIGSTOP)
        // Each attempt waits a second for the stopped process's answer.
        try await waitForStatus(attempts: 5) { status in
            lists(status, claimOf: waiter.pid, on: item) && ((status["unanswered"] as? [Int32]) ?? []).contains(waiter.pid)
        }
        waiter.signal(SIGCONT)
        try await release(second)
        #expect(await waiter.wait().status == 0)
    }
}

/// A process that holds a write claim through the library until it is killed, for
/// ``CrossProcessTests/StatusTests/statusListsClaimsOfProcessThatDoesNotListen()`` (this test binary
/// again, filtered to it).
@Suite struct ClaimHolderWorker {
    static let spaceVariable = "FILECOORD_HOLD_SPACE"
    static let itemVariable = "FILECOORD_HOLD_ITEM"
    static var inWorker: Bool { ProcessInfo.processInfo.environment[spaceVariable] != nil }

    @Test("a claim holder", .enabled(if: inWorker))
    func hold() async throws {
        let environment = ProcessInfo.processInfo.environment
        try await FileCoordinator.joinCoordinationSpace(at: FilePath(environment[Self.spaceVariable]!))
        try await FileCoordinator().coordinate(writingItemAt: URL(fileURLWithPath: environment[Self.itemVariable]!)) { _ in
            let line = Array("held\n".utf8)
            _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
            try await Task.sleep(for: .seconds(120)) // ok: holds the claim until the test kills it
        }
    }
}
