import Foundation
import Testing
@testable import FileCoordination

/// The rendezvous of a request with its reply, shared by the directory space and the etcd
/// space: each way the wait can end, in either order of reply and parking.
@Suite("awaited replies")
struct AwaitedRepliesTests {
    @Test("a reply that arrives before its task parks, and one that arrives after, both reach the task")
    func replyInEitherOrder() async throws {
        let replies = AwaitedReplies()
        let early = try await replies.request(1, to: "p", timeout: nil) {
            replies.resolve(1, with: .success(.status))
        }
        #expect(early == .status)
        let late = Task { try await replies.request(2, to: "p", timeout: nil) {} }
        try await until { replies.isParked(2) }
        replies.resolve(2, with: .success(.status))
        #expect(try await late.value == .status)
        #expect(!replies.isAwaited(2))
    }

    @Test("a request whose target goes ends with no answer; requests to other processes go on")
    func targetGone() async throws {
        let replies = AwaitedReplies()
        async let toGone = replies.request(1, to: "gone", timeout: nil) {}
        async let toOther = replies.request(2, to: "other", timeout: nil) {}
        try await until { replies.targets == ["gone", "other"] }
        for id in replies.awaiting("gone") { replies.resolve(id, with: .success(nil)) }
        #expect(try await toGone == nil)
        #expect(replies.awaiting("other") == [2])
        replies.resolve(2, with: .success(.status))
        #expect(try await toOther == .status)
        #expect(replies.targets.isEmpty)
    }

    @Test("past its deadline a request throws RemoteNoAnswer, and a reply after that is dropped")
    func deadline() async throws {
        let replies = AwaitedReplies()
        await #expect(throws: RemoteNoAnswer.self) {
            try await replies.request(1, to: "p", timeout: .milliseconds(20)) {}
        }
        replies.resolve(1, with: .success(.status))
        #expect(!replies.isAwaited(1))
    }

    @Test("a cancelled request throws CancellationError, parked or not yet parked")
    func cancellation() async throws {
        let replies = AwaitedReplies()
        let parked = Task { try await replies.request(1, to: "p", timeout: nil) {} }
        try await until { replies.awaiting("p") == [1] }
        parked.cancel()
        await #expect(throws: CancellationError.self) { try await parked.value }
        let cancelledFirst = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await replies.request(2, to: "p", timeout: nil) {}
        }
        await #expect(throws: CancellationError.self) { try await cancelledFirst.value }
        #expect(replies.targets.isEmpty)
    }

    @Test("the pure table: park after arrival resumes at once; withdraw before park fails the park; a second arrival is ignored")
    func table() {
        var table = ReplyTable<Int>()
        table.register(1, target: "p")
        #expect(table.arrive(1, .success(.status)) == nil)
        guard case .resume(.success(.status)) = table.park(1, 10) else { Issue.record("not resumed"); return }
        table.register(2, target: "p")
        guard case .parked = table.park(2, 20) else { Issue.record("not parked"); return }
        #expect(table.arrive(2, .success(nil)) == 20)
        #expect(table.arrive(2, .success(nil)) == nil)
        table.register(3, target: "q")
        #expect(table.withdraw(3) == nil)
        guard case .resume(.failure(let error)) = table.park(3, 30) else { Issue.record("parked after withdrawal"); return }
        #expect(error is CancellationError)
        #expect(table.entries.isEmpty)
    }

    @Test("a reply from a process other than the one asked is not the request's: it stays awaited, and the asked one's reply resolves it")
    func replyFromAnotherProcess() {
        var table = ReplyTable<Int>()
        table.register(7, target: "10-ab")
        guard case .parked = table.park(7, 70) else { Issue.record("not parked"); return }
        #expect(table.arrive(7, from: "11-cd", .success(.status)) == nil)
        #expect(table.isParked(7))
        #expect(table.arrive(7, from: "10-ab", .success(nil)) == 70)
    }

    /// Waits, bounded, until `condition` holds.
    private func until(_ condition: () -> Bool) async throws {
        for _ in 0..<20_000 where !condition() {
            try await Task.sleep(for: .milliseconds(1)) // ok: in-process state with no event to await
        }
        #expect(condition())
    }
}
