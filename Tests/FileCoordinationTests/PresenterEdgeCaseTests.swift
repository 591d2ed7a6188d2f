@testable import FileCoordination
import Foundation
import Testing

/// What a presenter still hears when an accessor returns nil, or when it answers late.
@Suite("Presenter edge cases")
struct PresenterEdgeCaseTests {
    @Test("an accessor returning nil still counts as done: presenters hear didChange")
    func nilResult() async throws {
        let box = Sandbox(), log = EventLog()
        let file = box.file("n.txt")
        try await withPresenters([Recorder("P", url: file, log: log)]) {
            let result: Int? = try await FileCoordinator().coordinate(writingItemAt: file) { _ in nil }
            #expect(result == nil)
        }
        #expect(log.all.contains("P:didChange"))
    }

    /// Answers relinquish-to-writer only after a delay (a slow presenter, on purpose).
    final class SlowPresenter: FilePresenter {
        let presentedItemURL: URL?
        let reacquired: AsyncStream<Void>.Continuation
        init(url: URL, reacquired: AsyncStream<Void>.Continuation) {
            presentedItemURL = url
            self.reacquired = reacquired
        }
        func relinquishPresentedItem(toWriter writer: FileAccessRequest) async throws -> FileReacquirer? {
            try? await Task.sleep(for: .milliseconds(400)) // ok: models a presenter slower than the timeout
            return { [reacquired] in reacquired.yield() }
        }
    }

    @Test("a presenter that answers after the timeout still gets its item back")
    func lateAnswer() async throws {
        let box = Sandbox()
        let file = box.file("slow.txt")
        let (reacquired, continuation) = AsyncStream.makeStream(of: Void.self)
        try await withPresenters([SlowPresenter(url: file, reacquired: continuation)]) {
            let coordinator = FileCoordinator()
            coordinator.setPresenterTimeoutPolicy(PresenterTimeoutPolicy(timeout: .milliseconds(50), action: .proceed))
            try await coordinator.coordinate(writingItemAt: file) { _ in }
            // The write went ahead without the answer; the late reacquirer still runs.
            for await _ in reacquired { break }
        }
    }
}
